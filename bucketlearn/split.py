"""The upload service: one finalized CSV upload -> one job, split into shards, epoch 1 published."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

from bucketlearn import codec, jobs, layout
from bucketlearn.bootstrap import Services
from bucketlearn.config import AUTO, JobOptions, resolve_options
from bucketlearn.domain.plan import plan_training
from bucketlearn.errors import (
    BackendRejectedError,
    ConfigError,
    InputProblem,
    InvalidInputError,
    ObjectChangedError,
    TransientError,
    bounded,
)
from bucketlearn.ingest import Manifest, SourceFile, split_upload
from bucketlearn.model import build_model, choose_spec

log = logging.getLogger(__name__)

MAX_OBJECT_NAME = 1024
_SHOWN_NAME = 200


def _is_control(ch: str) -> bool:
    code = ord(ch)
    return code < 32 or 127 <= code < 160 or code in (0x2028, 0x2029)


def _escaped(ch: str) -> str:
    if not _is_control(ch):
        return ch
    return f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}"


def display_uri(bucket: str, name: str) -> str:
    """``gs://bucket/name`` for messages and logs: control characters escaped, long names cut.

    An object name is user input; a newline in it must not forge a log line or a second line
    in a job's error.
    """
    shown = "".join(_escaped(ch) for ch in name)
    if len(name) > MAX_OBJECT_NAME:
        shown = f"{shown[:_SHOWN_NAME]}…({len(name)} characters)"
    return f"gs://{bucket}/{shown}"


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    FAILED = "failed"
    IGNORED = "ignored"
    CANCELLED = "cancelled"  # the job was cancelled while its upload was being split
    BUSY = "busy"


@dataclass(frozen=True)
class StorageEvent:
    """The fields of an Eventarc ``object.finalized`` event that bucketlearn uses."""

    bucket: str
    name: str
    generation: int
    size: int = 0
    event_time: float | None = None

    @classmethod
    def from_cloudevent_data(cls, data: dict[str, Any], event_time: float | None = None
                             ) -> StorageEvent:
        return cls(bucket=str(data["bucket"]), name=str(data["name"]),
                   generation=int(data.get("generation") or 0), size=int(data.get("size") or 0),
                   event_time=event_time)


def handle_upload(svc: Services, event: StorageEvent) -> tuple[Outcome, str | None]:
    """Turn one upload event into (at most) one job.

    Returns:
        (outcome, job id). ACCEPTED: the job was split and epoch 1 published; DUPLICATE: a
        re-delivered event for a job that exists; REJECTED: the job ended with a reason;
        FAILED: a backend refused a write for good (e.g. a document over Firestore's 1 MiB),
        and the job ended FAILED with that reason; CANCELLED: the job was cancelled during the
        split, which stopped there; IGNORED: not an upload bucketlearn trains on.

    Raises:
        TransientError: another invocation is splitting the same upload right now, or a backend
            failed; the event should be retried.
        BackendRejectedError: a backend refused the job document itself; there is no job to end.
    """
    file = display_uri(event.bucket, event.name)
    if not event.name.lower().endswith(".csv"):
        log.info("ignoring %s: not a .csv object", file)
        return Outcome.IGNORED, None
    now = svc.clock()
    if event.event_time and now - event.event_time > svc.settings.max_event_age_seconds:
        log.warning("dropping event for %s: older than %ss", file,
                    svc.settings.max_event_age_seconds)
        return Outcome.IGNORED, None
    job_id = layout.job_id_for(event.bucket, event.name, event.generation)
    claim = layout.new_nonce()
    doc = {
        "job_id": job_id, "status": jobs.QUEUED, "phase": jobs.SPLITTING,
        # (a longer name is rejected below; Cloud Storage allows 1024 bytes anyway)
        "source": {"bucket": event.bucket, "name": event.name[:MAX_OBJECT_NAME],
                   "generation": event.generation, "size": event.size},
        "file": file, "created_at": now, "updated_at": now, "claimed_at": now, "claim": claim,
        "version": None, "epoch": 0, "round": 0, "published": None, "tasks_applied": 0,
        "tasks_failed": 0, "samples_seen": 0, "error": None,
    }
    if not svc.registry.create_job(job_id, doc):
        existing = svc.registry.get_job(job_id) or {}
        if jobs.is_terminal(existing):  # ended (CANCELLED included): nothing to take over
            log.info("job %s has ended (%s): duplicate event ignored", job_id,
                     existing.get("status"))
            return Outcome.DUPLICATE, job_id
        if existing.get("phase") == jobs.SPLITTING:
            if now - float(existing.get("claimed_at") or 0) < svc.settings.lease_seconds:
                raise TransientError(f"job {job_id} is being split by another invocation")
            if not svc.registry.update_job_if(job_id, {"claim": existing.get("claim")},
                                              {"claim": claim, "claimed_at": now}):
                raise TransientError(f"job {job_id}: lost the race to take over a stale split")
            log.warning("job %s: taking over a split abandoned since %s", job_id,
                        existing.get("claimed_at"))
        elif existing.get("phase") == jobs.TRAINING and existing.get("published") is None:
            publish_round(svc, existing)  # the invocation that split it died before publishing
            return Outcome.ACCEPTED, job_id
        else:
            log.info("job %s exists (%s): duplicate event ignored", job_id, existing.get("status"))
            return Outcome.DUPLICATE, job_id
    try:
        return _split_claimed(svc, event, job_id, claim, file)
    except BackendRejectedError as exc:
        fail(svc, job_id, f"{file}: a backend refused to store the job's state, so it cannot "
                          f"go on: {exc}")
        return Outcome.FAILED, job_id


def _split_claimed(svc: Services, event: StorageEvent, job_id: str, claim: str,
                   file: str) -> tuple[Outcome, str | None]:
    """The split of an upload whose job this invocation has claimed (see handle_upload)."""
    if len(event.name) > MAX_OBJECT_NAME or any(_is_control(ch) for ch in event.name):
        found = (f"a name of {len(event.name)} characters" if len(event.name) > MAX_OBJECT_NAME
                 else "control characters: " + ", ".join(
                     sorted({f"U+{ord(ch):04X}" for ch in event.name if _is_control(ch)})))
        reject(svc, job_id, InputProblem(file=file, message="the object name is not usable",
                                         expected="a name without control characters, at most "
                                                  f"{MAX_OBJECT_NAME} characters",
                                         found=found))
        return Outcome.REJECTED, job_id
    info = svc.store.stat(event.bucket, event.name)
    if info is None or info.generation != event.generation:
        found = "no object" if info is None else f"generation {info.generation}"
        reject(svc, job_id, InputProblem(
            file=file, message="the upload was deleted or replaced before it could be read",
            expected=f"generation {event.generation}", found=found))
        return Outcome.REJECTED, job_id
    try:
        options = resolve_options(metadata=info.metadata)
    except ConfigError as exc:
        found = repr(exc.found)
        reject(svc, job_id, InputProblem(file=file, message=f"invalid upload option '{exc.key}'",
                                         column=None, expected=exc.expected,
                                         found=found if len(found) <= 80 else found[:80] + "…"))
        return Outcome.REJECTED, job_id
    svc.registry.update_job(job_id, {"options": options.to_dict(), "updated_at": svc.clock()})
    # every pass reads the event's generation: a re-upload of the same name during the split
    # must not mix two files (it raises ObjectChangedError instead)
    source = SourceFile(display_name=file, size=info.size,
                        opener=lambda: svc.store.open_read(event.bucket, event.name,
                                                           generation=event.generation))
    settings = svc.settings
    try:
        manifest = split_upload(source, svc.store, settings.work_bucket, job_id, options,
                                settings.limits)
        spec = choose_spec(options.model, len(manifest.feature_names), len(manifest.classes),
                           options.seed, options.learning_rate, file)
    except ObjectChangedError as exc:
        reject(svc, job_id, _replaced_while_read(file, exc.expected_generation, exc.found))
        return Outcome.REJECTED, job_id
    except InvalidInputError as exc:
        # a store that cannot pin reads could have mixed two generations into a bogus problem
        now = svc.store.stat(event.bucket, event.name)
        if now is None or now.generation != event.generation:
            reject(svc, job_id, _replaced_while_read(
                file, event.generation, "no object" if now is None else
                f"generation {now.generation}"))
        else:
            reject(svc, job_id, exc.problem)
        return Outcome.REJECTED, job_id
    job = start_training(svc, job_id, claim, manifest, spec.to_dict(), options)
    if job is None:  # cancelled while it was being split: it stays CANCELLED, untrained
        log.warning("job %s ended during its split; its shards are removed", job_id)
        _remove_partial_shards(svc, job_id)
        return Outcome.CANCELLED, job_id
    publish_round(svc, job, manifest)
    return Outcome.ACCEPTED, job_id


def _replaced_while_read(file: str, generation: int, found: str) -> InputProblem:
    """The reason for an upload whose generation went away while it was being split."""
    if found != "no object":
        found += " (a newer upload of the same name; it gets its own job)"
    return InputProblem(file=file, message="the upload was replaced or deleted while it was "
                                           "being read",
                        expected=f"generation {generation} until the split ends", found=found)


def start_training(svc: Services, job_id: str, claim: str, manifest: Manifest,
                   spec: dict[str, Any], options: JobOptions) -> dict[str, Any] | None:
    """Plan the job, write version 0 (initial weights and optimizer state) and make the job
    trainable, if this invocation still owns the split; return the job document, or None when
    the job ended (was cancelled) during the split.

    Raises:
        TransientError: another invocation took the split over.
    """
    from bucketlearn.model import ModelSpec  # noqa: PLC0415
    from bucketlearn.training import optimizer_state  # noqa: PLC0415

    plan = plan_training([s.rows for s in manifest.shards], options.epochs, options.batch_size,
                         None if options.parallel_tasks == AUTO else options.parallel_tasks)
    model = build_model(ModelSpec.from_dict(spec), manifest.mean, manifest.variance)
    data = codec.encode_state(model.get_weights(), optimizer_state(model),
                              {"job_id": job_id, "version": 0})
    weights_path = layout.weights_path(job_id, 0, layout.new_nonce())
    svc.store.write_bytes(svc.settings.models_bucket, weights_path, data,
                          "application/octet-stream")
    now = svc.clock()
    version_doc = {
        "version": 0, "parent": None, "weights_path": weights_path,
        "checksum": codec.checksum(data), "epoch": 0, "tasks_applied": [], "samples": 0,
        "train_loss": None, "holdout_accuracy": None, "holdout_loss": None, "created_at": now,
    }
    epoch_doc = {"epoch": 1, "planned": plan.tasks_per_epoch, "applied": [], "failed": [],
                 "created_at": now}
    job_fields = {
        "phase": jobs.TRAINING, "version": 0, "epoch": 1, "round": 0, "published": None,
        "plan": plan.to_dict(), "tasks_per_epoch": plan.tasks_per_epoch,
        "tasks_planned": plan.total_tasks,
        "dataset": manifest.summary(), "model": spec, "updated_at": now,
        "head": {"version": 0, "weights_path": weights_path, "checksum": codec.checksum(data),
                 "holdout_accuracy": None, "holdout_loss": None, "train_loss": None},
    }
    if not svc.registry.start_training(job_id, claim, job_fields, version_doc, epoch_doc):
        if jobs.is_terminal(svc.registry.get_job(job_id)):
            return None  # version 0's weights stay behind, unreferenced (never a dangling pointer)
        raise TransientError(f"job {job_id}: another invocation took over the split")
    log.info("job %s: %d tasks per epoch, %d at once (%s)", job_id, plan.tasks_per_epoch,
             plan.parallel_tasks, plan.decided)
    job = svc.registry.get_job(job_id)
    if job is None:
        raise TransientError(f"job {job_id}: its document went missing")
    return job


def publish_round(svc: Services, job: dict[str, Any], manifest: Manifest | None = None) -> None:
    """Publish the tasks of the job's current round, then record that it is published.

    Idempotent in effect: publishing a round twice (a crash between the two steps) trains its
    tasks twice at most, and the aggregator applies each once.
    """
    if manifest is None:
        from bucketlearn.runtime import job_runtime  # noqa: PLC0415

        manifest = job_runtime(svc, job).manifest
    epoch_doc = svc.registry.get_epoch(job["job_id"], int(job["epoch"])) or {}
    done = jobs.done_tasks(epoch_doc)
    pending = [t for t in jobs.current_round_tasks(job) if t not in done]
    messages = jobs.round_messages(job, manifest.shards, pending)
    svc.queue.publish(messages)
    key = jobs.round_key(int(job["epoch"]), int(job.get("round") or 0))
    now = svc.clock()
    svc.registry.update_job(job["job_id"], {"published": key, "published_at": now,
                                            "updated_at": now})
    log.info("job %s: published %d tasks of round %s from v%s", job["job_id"], len(messages),
             key, job["head"]["version"])


def reject(svc: Services, job_id: str, problem: InputProblem) -> None:
    """End a job as REJECTED with a reason naming file, row and column (unless it has ended
    already, e.g. cancelled during the split); remove its partial shards."""
    now = svc.clock()
    ended, job = jobs.end_job(svc.registry, job_id, {
        "status": jobs.REJECTED, "phase": "rejected", "error": problem.describe(),
        "error_detail": problem.to_dict(), "updated_at": now, "finished_at": now,
    })
    if ended:
        log.warning("job %s rejected: %s", job_id, problem.describe())
    else:
        log.warning("job %s: not rejected, it has ended already (%s): %s", job_id,
                    (job or {}).get("status"), problem.describe())
    _remove_partial_shards(svc, job_id)


def fail(svc: Services, job_id: str, reason: str) -> None:
    """End a job as FAILED with ``reason`` (bounded) and remove its partial shards.

    Used when a backend refuses a write for good: the job must end (with a reason the dashboard
    shows) rather than the event being retried for a day. Should even this small write be
    refused, the failure is logged and the job left as it is.
    """
    now = svc.clock()
    error = bounded(reason, 2000)
    try:
        jobs.end_job(svc.registry, job_id, {"status": jobs.FAILED, "phase": "failed",
                                            "error": error, "updated_at": now,
                                            "finished_at": now})
    except BackendRejectedError:
        log.exception("job %s: could not record its failure (%s)", job_id, error)
    log.error("job %s failed: %s", job_id, error)
    _remove_partial_shards(svc, job_id)


def _remove_partial_shards(svc: Services, job_id: str) -> None:
    try:
        for info in list(svc.store.list(svc.settings.work_bucket, layout.job_prefix(job_id))):
            svc.store.delete(svc.settings.work_bucket, info.name)
    except Exception:  # noqa: BLE001 - cleanup is best effort; lifecycle rules catch the rest
        log.exception("job %s: could not remove partial shards", job_id)
