"""The aggregator: fold buffered deltas into the next version, one writer per job.

Per delta upload event: take the job's lease (a Firestore document created with a precondition,
no contended transaction), then repeat until nothing is foldable: read the head, list the current
epoch's deltas, decide with ``plan_fold`` (pure), fold with ``aggregation.fold`` (pure), write the
new weights under a write-once name, commit version doc + applied task ids + head in one
transaction, then evaluate the version on the holdout and record its accuracy (workers wait for
the commit, not for the evaluation). After releasing the lease it looks once more, so a delta
that arrived while another invocation held the lease is never stranded.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bucketlearn import aggregation, codec, jobs, layout
from bucketlearn.aggregation import DeltaUpdate
from bucketlearn.bootstrap import Services
from bucketlearn.codec import CorruptObjectError
from bucketlearn.errors import NotFoundError, TransientError
from bucketlearn.faults import crash_point
from bucketlearn.model import export_keras
from bucketlearn.ports import BlobInfo, VersionCommit
from bucketlearn.runtime import JobRuntime, job_runtime
from bucketlearn.split import Outcome, publish_pending_epoch
from bucketlearn.training import evaluate

log = logging.getLogger(__name__)

MAX_DELTAS_PER_VERSION_FACTOR = 4


@dataclass(frozen=True)
class DeltaRef:
    """A delta (or failure marker) object as listed, with what its metadata says."""

    name: str
    task_index: int
    failed: bool
    base_version: int = 0
    examples: int = 0


@dataclass
class FoldPlan:
    apply: list[DeltaRef] = field(default_factory=list)
    failed: list[DeltaRef] = field(default_factory=list)
    requeue: list[int] = field(default_factory=list)
    garbage: list[DeltaRef] = field(default_factory=list)

    @property
    def commits(self) -> bool:
        return bool(self.apply or self.failed)


def plan_fold(head_version: int, planned: int, applied: Iterable[int], failed: Iterable[int],
              deltas: Iterable[DeltaRef], buffer_size: int, max_staleness: int) -> FoldPlan:
    """Decide what the next version folds in. Pure: unit-tested without any backend.

    A task counts once: its freshest delta is used, the rest are garbage. Failure markers count
    only for tasks without a delta. Deltas more than ``max_staleness`` versions behind the head
    are not applied; their task is retrained (``requeue``). A version is cut when ``buffer_size``
    deltas are waiting, or when the waiting ones finish the epoch.
    """
    done = set(applied) | set(failed)
    by_task: dict[int, list[DeltaRef]] = {}
    plan = FoldPlan()
    for ref in deltas:
        if ref.task_index in done or not 0 <= ref.task_index < planned:
            plan.garbage.append(ref)
        else:
            by_task.setdefault(ref.task_index, []).append(ref)
    fresh: list[DeltaRef] = []
    failures: list[DeltaRef] = []
    for task_index, refs in sorted(by_task.items()):
        trained = sorted((r for r in refs if not r.failed), key=lambda r: -r.base_version)
        usable = [r for r in trained if head_version - r.base_version <= max_staleness]
        if usable:
            fresh.append(usable[0])
            plan.garbage.extend(r for r in refs if r is not usable[0])
        elif trained:
            plan.requeue.append(task_index)
        else:
            failures.append(refs[0])
    remaining = planned - len(done)
    finishes_epoch = len(fresh) + len(failures) == remaining and remaining > 0
    if failures or len(fresh) >= buffer_size or finishes_epoch:
        plan.apply = fresh[: max(buffer_size, 1) * MAX_DELTAS_PER_VERSION_FACTOR]
        plan.failed = failures
    return plan


def handle_delta_event(svc: Services, bucket: str, name: str) -> tuple[Outcome, str | None]:
    """Entry for one delta upload: aggregate its job if the object is one of ours."""
    parsed = layout.parse_delta_path(name)
    if parsed is None:
        log.info("ignoring gs://%s/%s: not a bucketlearn delta", bucket, name)
        return Outcome.IGNORED, None
    return aggregate_job(svc, parsed.job_id), parsed.job_id


def aggregate_job(svc: Services, job_id: str) -> Outcome:
    """Fold everything foldable for one job, holding its lease; BUSY if another holder has it."""
    lease = f"aggregate-{job_id}"
    holder = f"{svc.identity}-{layout.new_nonce()}"
    outcome = Outcome.BUSY
    for _ in range(1000):
        if not svc.registry.acquire_lease(lease, holder, svc.settings.lease_seconds):
            return outcome
        try:
            _drain(svc, job_id, lease, holder)
            outcome = Outcome.ACCEPTED
        finally:
            svc.registry.release_lease(lease, holder)
        if not _has_work(svc, job_id):
            return outcome
    return outcome


def list_deltas(svc: Services, job_id: str, epoch: int) -> list[DeltaRef]:
    """The deltas and failure markers of one job's epoch, as listed in the deltas bucket."""
    refs = []
    for info in svc.store.list(svc.settings.deltas_bucket, layout.epoch_delta_prefix(job_id, epoch)):
        parsed = layout.parse_delta_path(info.name)
        if parsed is None or parsed.job_id != job_id:
            continue
        refs.append(_ref(info, parsed.task_index, parsed.failed))
    return refs


def _ref(info: BlobInfo, task_index: int, failed: bool) -> DeltaRef:
    meta = info.metadata or {}
    try:
        base = int(meta.get("base_version", 0))
        examples = int(meta.get("examples", 0))
    except ValueError:
        base, examples = 0, 0
    return DeltaRef(info.name, task_index, failed, base, examples)


def _has_work(svc: Services, job_id: str) -> bool:
    job = svc.registry.get_job(job_id)
    if job is None or jobs.is_terminal(job) or job.get("phase") not in (jobs.TRAINING,
                                                                         jobs.EXPORTING):
        return False
    if job.get("phase") == jobs.EXPORTING:
        return True
    epoch = int(job["epoch"])
    if int(job.get("published_epoch") or 0) < epoch:
        return True
    return _plan(svc, job, _epoch_doc(svc, job)).commits


def _epoch_doc(svc: Services, job: dict[str, Any]) -> dict[str, Any]:
    """The job's current epoch document ({} if missing)."""
    return svc.registry.get_epoch(job["job_id"], int(job["epoch"])) or {}


def _plan(svc: Services, job: dict[str, Any], epoch_doc: dict[str, Any]) -> FoldPlan:
    options = job["options"]
    return plan_fold(int(job["version"]), int(epoch_doc.get("planned", job["tasks_per_epoch"])),
                     epoch_doc.get("applied", []), epoch_doc.get("failed", []),
                     list_deltas(svc, job["job_id"], int(job["epoch"])),
                     int(options["buffer_size"]), int(options["max_staleness"]))


def _drain(svc: Services, job_id: str, lease: str, holder: str) -> None:
    registry = svc.registry
    for _ in range(100_000):
        planning_started = svc.clock()
        job = registry.get_job(job_id)
        if job is None or jobs.is_terminal(job):
            return
        if job.get("phase") == jobs.EXPORTING:
            export_final(svc, job)
            return
        if job.get("phase") != jobs.TRAINING:
            return
        if int(job.get("published_epoch") or 0) < int(job["epoch"]):
            publish_pending_epoch(svc, job)
            continue
        epoch_doc = _epoch_doc(svc, job)  # only this lease holder's commits change it
        plan = _plan(svc, job, epoch_doc)
        _collect_garbage(svc, plan.garbage)
        if plan.requeue:
            _requeue(svc, job, plan.requeue)
        if not plan.commits:
            return
        if not registry.acquire_lease(lease, holder, svc.settings.lease_seconds):
            raise TransientError(f"job {job_id}: lost the aggregation lease")
        if _commit(svc, job, epoch_doc, plan, planning_started):
            _collect_garbage(svc, plan.apply + plan.failed)


def _requeue(svc: Services, job: dict[str, Any], task_indices: list[int]) -> None:
    """Retrain tasks whose only deltas are too stale to apply."""
    shards = {s.index: s for s in job_runtime(svc, job).manifest.shards}
    job_id, epoch = job["job_id"], int(job["epoch"])
    svc.queue.publish([jobs.task_message(job_id, epoch, shards[i]) for i in task_indices])
    requeued = set(task_indices)
    for ref in list_deltas(svc, job_id, epoch):  # the stale deltas have served their purpose
        if ref.task_index in requeued and not ref.failed:
            svc.store.delete(svc.settings.deltas_bucket, ref.name)
    log.info("job %s: requeued %d stale tasks of epoch %d", job_id, len(task_indices), epoch)


def _collect_garbage(svc: Services, refs: list[DeltaRef]) -> None:
    for ref in refs:
        try:
            svc.store.delete(svc.settings.deltas_bucket, ref.name)
        except Exception:  # noqa: BLE001 - leftover deltas are ignored and expire by lifecycle
            log.debug("could not delete %s", ref.name, exc_info=True)


def _commit(svc: Services, job: dict[str, Any], epoch_doc: dict[str, Any], plan: FoldPlan,
            planning_started: float | None = None) -> bool:
    """Fold, write and commit one version, then evaluate it. False when the head moved meanwhile.

    The version document records when planning the fold began and how long each step took
    (``aggregator``), so the latency from a delta to its version is measured, not estimated.
    """
    job_id, registry, settings = job["job_id"], svc.registry, svc.settings
    steps = _Stopwatch()
    runtime = job_runtime(svc, job)
    head = job["head"]
    head_version = int(job["version"])
    base = runtime.weights(head["weights_path"])
    updates = []
    corrupt: list[int] = []
    for ref in plan.apply:
        try:
            weights, meta = codec.decode_weights(
                svc.store.read_bytes(settings.deltas_bucket, ref.name), ref.name)
            if [w.shape for w in weights] != [b.shape for b in base]:
                raise CorruptObjectError(f"{ref.name}: expected layer shapes "
                                         f"{[b.shape for b in base]}; found "
                                         f"{[w.shape for w in weights]}")
        except (CorruptObjectError, NotFoundError) as exc:
            log.error("job %s: unusable delta %s (%s); retraining task %d", job_id, ref.name, exc,
                      ref.task_index)
            corrupt.append(ref.task_index)
            continue
        updates.append(DeltaUpdate(task_index=ref.task_index,
                                   base_version=int(meta.get("base_version", ref.base_version)),
                                   examples=int(meta.get("examples", ref.examples)),
                                   delta=weights, train_loss=meta.get("train_loss"),
                                   base_applied=_optional_int(meta.get("base_applied"))))
    if corrupt:
        _requeue(svc, job, corrupt)
    if not updates and not plan.failed:
        return False
    steps.lap("read_seconds")
    failures = []
    for ref in plan.failed:
        try:
            failures.append(json.loads(svc.store.read_bytes(settings.deltas_bucket, ref.name)))
        except Exception:  # noqa: BLE001 - the marker's existence is what counts
            failures.append({"task_index": ref.task_index, "error": "task failed"})
    nominal = max(1, math.ceil(job["dataset"]["train_rows"] / max(1, job["tasks_per_epoch"])))
    new_version = head_version + 1
    policy = aggregation.policy_for(str((job.get("model") or {}).get("kind", "")))
    if updates:
        delays, weights = aggregation.weigh(updates, head_version, nominal,
                                            int(job.get("tasks_applied") or 0), policy)
        folded = (aggregation.project_shared_bases(updates, weights)
                  if policy.project_shared_bases else updates)
        new = aggregation.fold(base, folded, weights)
        assert new is not None
        data = codec.encode_weights(new, {"job_id": job_id, "version": new_version})
        steps.lap("fold_seconds")
        weights_path = layout.weights_path(job_id, new_version, layout.new_nonce())
        svc.store.write_bytes(settings.models_bucket, weights_path, data,
                              "application/octet-stream")
        steps.lap("write_seconds")
        accuracy, loss = None, None  # evaluated once the version is committed
        checksum = codec.checksum(data)
    else:  # only failures: the version records them, the weights stay the parent's
        weights, delays, new = [], [], base
        weights_path, checksum = head["weights_path"], head.get("checksum")
        accuracy, loss = head.get("holdout_accuracy"), head.get("holdout_loss")
    epoch = int(job["epoch"])
    done_after = len(jobs.done_tasks(epoch_doc)) + len(updates) + len(failures)
    epoch_complete = done_after >= int(epoch_doc.get("planned", job["tasks_per_epoch"]))
    train_loss = aggregation.weighted_mean_loss(updates)
    samples = sum(u.examples for u in updates)
    now = svc.clock()
    version_doc = {
        "version": new_version, "parent": head_version, "weights_path": weights_path,
        "checksum": checksum, "epoch": epoch,
        "tasks_applied": [layout.task_id_for(job_id, epoch, u.task_index) for u in updates],
        "tasks_failed": [layout.task_id_for(job_id, epoch, int(f["task_index"]))
                         for f in failures],
        "staleness": [aggregation.staleness(head_version, u.base_version) for u in updates],
        "delays": delays, "delay_unit": policy.unit,
        "delta_weights": [round(w, 6) for w in weights], "samples": samples,
        "train_loss": train_loss, "holdout_accuracy": accuracy, "holdout_loss": loss,
        "created_at": now, "aggregator": {"planning_started_at": planning_started, **steps.laps},
    }
    tasks_failed = int(job.get("tasks_failed") or 0) + len(failures)
    job_fields: dict[str, Any] = {
        "version": new_version, "status": jobs.RUNNING, "updated_at": now,
        "tasks_applied": int(job.get("tasks_applied") or 0) + len(updates),
        "tasks_failed": tasks_failed,
        "samples_seen": int(job.get("samples_seen") or 0) + samples,
        "head": {"version": new_version, "weights_path": weights_path, "checksum": checksum,
                 "holdout_accuracy": accuracy, "holdout_loss": loss,
                 "train_loss": train_loss if train_loss is not None else head.get("train_loss")},
    }
    if job.get("started_at") is None:
        job_fields["started_at"] = now
    next_epoch_doc = None
    if tasks_failed > int(job["options"].get("max_failed_tasks", 0)):
        reason = failures[0].get("error") if failures else "tasks failed"
        job_fields.update(status=jobs.FAILED, phase="failed", finished_at=now,
                          error=f"{tasks_failed} task(s) failed for good (the job allows "
                                f"{job['options'].get('max_failed_tasks', 0)}): {reason}")
    elif epoch_complete and epoch >= int(job["options"]["epochs"]):
        job_fields["phase"] = jobs.EXPORTING
    elif epoch_complete:
        job_fields["epoch"] = epoch + 1
        next_epoch_doc = {"epoch": epoch + 1, "planned": job["tasks_per_epoch"], "applied": [],
                          "failed": [], "created_at": now}
    crash_point(settings, "aggregator.before_commit")
    commit = VersionCommit(job_id=job_id, base_version=head_version, version_doc=version_doc,
                           epoch=epoch, applied=[u.task_index for u in updates],
                           failed=[int(f["task_index"]) for f in failures],
                           job_fields=job_fields, next_epoch_doc=next_epoch_doc)
    if not registry.commit_version(commit):
        log.warning("job %s: head moved past v%d during the fold; retrying", job_id, head_version)
        return False
    crash_point(settings, "aggregator.after_commit")
    if next_epoch_doc is not None:  # the workers start the next epoch before the evaluation
        publish_pending_epoch(svc, {**job, **job_fields})
    if updates:
        accuracy = _evaluate_version(svc, job_id, runtime, new, new_version, job_fields["head"],
                                     version_doc["aggregator"])
    log.info("job %s: v%d (epoch %d, %d deltas, %d failed) holdout accuracy %s", job_id,
             new_version, epoch, len(updates), len(failures), accuracy)
    return True


def _evaluate_version(svc: Services, job_id: str, runtime: JobRuntime, weights: list[Any],
                      version: int, head: dict[str, Any], timings: dict[str, Any]
                      ) -> float | None:
    """Evaluate a committed version on the holdout and record it on the version (and on the
    job's head while it is still the head).

    After the commit, not before: workers wait for the commit (flow control), and a CNN's
    evaluation was the largest step between a delta and its version. The version's accuracy
    arrives a moment after the version. If this fails or the process dies first, the version
    keeps no accuracy; training is unaffected and the export evaluates the final model anyway.
    """
    started = time.perf_counter()
    try:
        x_eval, y_eval = runtime.holdout(svc.settings.eval_max_rows)
        accuracy, loss = evaluate(runtime.model, weights, x_eval, y_eval)
        svc.registry.record_evaluation(
            job_id, version,
            {"holdout_accuracy": accuracy, "holdout_loss": loss, "evaluated_at": svc.clock(),
             "aggregator": {**timings, "eval_seconds": round(time.perf_counter() - started, 6)}},
            {**head, "holdout_accuracy": accuracy, "holdout_loss": loss})
    except Exception:  # noqa: BLE001 - an unevaluated version is still a good version
        log.warning("job %s: could not evaluate v%d", job_id, version, exc_info=True)
        return None
    return accuracy


class _Stopwatch:
    """Seconds between successive ``lap`` calls, by name (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 6)
        self._last = now


def _optional_int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def export_final(svc: Services, job: dict[str, Any]) -> None:
    """Export the head as ``models/<job>/latest.keras`` (and ``v<N>.keras``), then mark DONE."""
    runtime = job_runtime(svc, job)
    weights = runtime.weights(job["head"]["weights_path"])
    model = runtime.model
    model.set_weights(weights)
    x, y = runtime.holdout()
    accuracy, loss = evaluate(model, None, x, y)
    manifest = runtime.manifest
    sidecar = model_sidecar(job, manifest, accuracy)
    data = export_keras(model, sidecar)
    version = int(job["version"])
    bucket = svc.settings.models_bucket
    svc.store.write_bytes(bucket, layout.model_path(job["job_id"], version), data,
                          "application/octet-stream")
    svc.store.write_bytes(bucket, layout.model_path(job["job_id"]), data,
                          "application/octet-stream")
    now = svc.clock()
    head = dict(job["head"], holdout_accuracy=accuracy, holdout_loss=loss)
    svc.registry.update_job(job["job_id"], {
        "status": jobs.DONE, "phase": "done", "model_path": layout.model_path(job["job_id"]),
        "head": head, "finished_at": now, "updated_at": now,
        "final_holdout_rows": int(len(y)),
    })
    log.info("job %s: DONE at v%d, holdout accuracy %.4f", job["job_id"], version, accuracy)


def model_sidecar(job: dict[str, Any], manifest: Any, accuracy: float | None) -> dict[str, Any]:
    return {
        "format": 1,
        "job_id": job["job_id"],
        "version": int(job["version"]),
        "feature_names": manifest.feature_names,
        "label_column": manifest.label_column,
        "class_names": manifest.classes,
        "label_kind": manifest.label_kind,
        "holdout_accuracy": accuracy,
        "options": job["options"],
        "source": manifest.source,
    }
