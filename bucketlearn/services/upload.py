"""The upload service: one finalized CSV upload -> one job, split into shards, epoch 1 published."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from bucketlearn import codec, layout
from bucketlearn.config import Limits
from bucketlearn.domain.columns import matrix_width
from bucketlearn.domain.forecast import ModelCost, choose_layout, forecast_plan
from bucketlearn.domain.head import Head
from bucketlearn.domain.job import (
    QUEUED,
    REJECTED,
    SPLITTING,
    TRAINING,
    Job,
    claim_renewal_due,
    ending_fields,
    fail_fields,
    may_start_training,
    splitting_under,
    start_fields,
)
from bucketlearn.domain.plan import (
    OverLimit,
    TrainingPlan,
    check_duration,
    check_total_tasks,
    plan_training,
)
from bucketlearn.domain.version import Version
from bucketlearn.errors import (
    BackendRejectedError,
    ConfigError,
    InputProblem,
    InvalidInputError,
    ObjectChangedError,
    TransientError,
    bounded,
)

# the event vocabulary (re-exported for the upload service's callers)
from bucketlearn.events import (  # noqa: F401
    MAX_OBJECT_NAME,
    Outcome,
    StorageEvent,
    display_uri,
    is_control,
)
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ingest.split import split_upload
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.ml.model import build_model, model_cost, spec_for
from bucketlearn.ml.training import optimizer_state
from bucketlearn.options import AUTO, JobOptions, resolve_options
from bucketlearn.ports import BlobInfo, Services
from bucketlearn.services.publish import publish_round

log = logging.getLogger(__name__)


def new_job(event: StorageEvent, job_id: str, claim: str, now: float, file: str) -> Job:
    """The job just created for an upload, claimed for splitting by ``claim``."""
    # (a longer name is rejected later; Cloud Storage allows 1024 bytes anyway)
    source = {"bucket": event.bucket, "name": event.name[:MAX_OBJECT_NAME],
              "generation": event.generation, "size": event.size}
    return Job(job_id=job_id, status=QUEUED, phase=SPLITTING, source=source,
               file=file, created_at=now, updated_at=now, claimed_at=now, claim=claim)


def _claim_existing(svc: Services, job_id: str, claim: str, now: float) -> Outcome | None:
    """The job already exists: the outcome of this event, or None once this invocation holds a
    stale split's claim and should split the upload itself.

    Raises:
        TransientError: another invocation is splitting it (or won the race to take it over).
    """
    existing = svc.registry.get_job(job_id)
    if existing is None:  # gone since the create found it: nothing to take over
        log.info("job %s: its document is gone: duplicate event ignored", job_id)
        return Outcome.DUPLICATE
    if existing.is_terminal:  # ended (CANCELLED included): nothing to take over
        log.info("job %s has ended (%s): duplicate event ignored", job_id, existing.status)
        return Outcome.DUPLICATE
    if existing.phase == SPLITTING:
        if now - (existing.claimed_at or 0.0) < svc.settings.lease_seconds:
            raise TransientError(f"job {job_id} is being split by another invocation")
        # the claim as read, renewal included: a splitter that renewed it since is alive
        if not svc.registry.update_job_if(
                job_id, {**splitting_under(existing.claim), "claimed_at": existing.claimed_at},
                {"claim": claim, "claimed_at": now}):
            raise TransientError(f"job {job_id}: lost the race to take over a stale split")
        log.warning("job %s: taking over a split abandoned since %s", job_id,
                    existing.claimed_at)
        return None
    if existing.phase == TRAINING and existing.published is None:
        publish_round(svc, existing)  # the invocation that split it died before publishing
        return Outcome.ACCEPTED
    log.info("job %s exists (%s): duplicate event ignored", job_id, existing.status)
    return Outcome.DUPLICATE


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
    if not svc.registry.create_job(new_job(event, job_id, claim, now, file)):
        settled = _claim_existing(svc, job_id, claim, now)
        if settled is not None:
            return settled, job_id
    held = SplitClaim(svc, job_id, claim, now)
    try:
        return _split_claimed(svc, event, held, file)
    except BackendRejectedError as exc:
        fail(svc, held, f"{file}: a backend refused to store the job's state, so it cannot "
                        f"go on: {exc}")
        return Outcome.FAILED, job_id


CLAIM_WRITE_ATTEMPTS = 3


class SplitClaim:
    """This invocation's claim on a job's split: the job document's ``claim`` and ``claimed_at``.

    A claim older than the lease counts as abandoned, and a retried event takes the split over.
    So while the split streams, ``renew`` keeps ``claimed_at`` fresh, and every write that moves
    the job on (options, the end of the split as REJECTED or FAILED) is conditional on the claim
    still being this one and the job still splitting: a splitter that lost its claim stops,
    writes nothing more and never touches a job another invocation has moved on.
    """

    def __init__(self, svc: Services, job_id: str, claim: str, claimed_at: float) -> None:
        self.svc, self.job_id, self.claim = svc, job_id, claim
        self.renewed_at = claimed_at

    def update(self, fields: dict[str, Any]) -> bool:
        """Write ``fields`` to the job if this claim still holds it; False (nothing written)
        otherwise.

        Raises:
            TransientError: the claim holds but the write was refused every time (Firestore
                refuses a conditional write when another write lands between its read and
                its write).
        """
        for _ in range(CLAIM_WRITE_ATTEMPTS):
            if self.svc.registry.update_job_if(self.job_id, splitting_under(self.claim), fields):
                return True
            if not self.holds():
                return False
        raise TransientError(f"job {self.job_id}: could not write {sorted(fields)} under this "
                             f"invocation's claim after {CLAIM_WRITE_ATTEMPTS} attempts (the "
                             "job document kept changing)")

    def holds(self) -> bool:
        """Whether the job is still splitting under this claim (one read): the rule the
        registries ask before training starts (``may_start_training``)."""
        return may_start_training(self.svc.registry.get_job(self.job_id), self.claim)

    def renew(self) -> None:
        """Renew ``claimed_at`` if it is due (``domain.job.claim_renewal_due``).

        Raises:
            TransientError: another invocation has taken the split over, or the job is no
                longer splitting (the split must stop; its event is retried and finds that).
        """
        now = self.svc.clock()
        if not claim_renewal_due(self.renewed_at, now, self.svc.settings.lease_seconds):
            return
        if not self.update({"claimed_at": now}):
            raise self.lost()
        self.renewed_at = now

    def lost(self) -> TransientError:
        """The error for a split whose claim is no longer this invocation's."""
        job = self.svc.registry.get_job(self.job_id)
        found = (f"claim {job.claim!r} in phase {job.phase!r}" if job is not None
                 else "no job document")
        return TransientError(
            f"job {self.job_id}: another invocation took over the split, so this one stops; "
            f"expected claim {self.claim!r} in phase {SPLITTING!r}; found {found}")


def _check_upload(svc: Services, event: StorageEvent, file: str
                  ) -> InputProblem | tuple[BlobInfo, JobOptions]:
    """The upload's object and options before any row is read, or why it cannot be split."""
    if len(event.name) > MAX_OBJECT_NAME or any(is_control(ch) for ch in event.name):
        found = (f"a name of {len(event.name)} characters" if len(event.name) > MAX_OBJECT_NAME
                 else "control characters: " + ", ".join(
                     sorted({f"U+{ord(ch):04X}" for ch in event.name if is_control(ch)})))
        return InputProblem(file=file, message="the object name is not usable",
                            expected="a name without control characters, at most "
                                     f"{MAX_OBJECT_NAME} characters", found=found)
    info = svc.store.stat(event.bucket, event.name)
    if info is None or info.generation != event.generation:
        found = "no object" if info is None else f"generation {info.generation}"
        return InputProblem(
            file=file, message="the upload was deleted or replaced before it could be read",
            expected=f"generation {event.generation}", found=found)
    try:
        options = resolve_options(metadata=info.metadata)
    except ConfigError as exc:
        found = repr(exc.found)
        return InputProblem(file=file, message=f"invalid upload option '{exc.key}'", column=None,
                            expected=exc.expected,
                            found=found if len(found) <= 80 else found[:80] + "…")
    return info, options


def _split_claimed(svc: Services, event: StorageEvent, held: SplitClaim,
                   file: str) -> tuple[Outcome, str | None]:
    """The split of an upload whose job this invocation has claimed (see handle_upload)."""
    job_id = held.job_id
    checked = _check_upload(svc, event, file)
    if isinstance(checked, InputProblem):
        reject(svc, held, checked)
        return Outcome.REJECTED, job_id
    info, options = checked
    if not held.update({"options": options.to_dict(), "updated_at": svc.clock()}):
        raise held.lost()
    # every pass reads the event's generation: a re-upload of the same name during the split
    # must not mix two files (it raises ObjectChangedError instead)
    source = SourceFile(display_name=file, size=info.size,
                        opener=lambda: svc.store.open_read(event.bucket, event.name,
                                                           generation=event.generation))
    settings = svc.settings
    try:
        manifest = split_upload(source, svc.store, settings.work_bucket, job_id, options,
                                settings.limits, progress=held.renew)
        spec = spec_for(manifest, options, file)
        plan = plan_within_limits(manifest, options, settings.limits, file)
        # the model is built once the cheap checks passed (a rejected upload builds none)
        model = build_model(spec, manifest.mean, manifest.variance, manifest.schema)
        cost = model_cost(model)
        plan = automatic_layout(plan, manifest, options, settings.limits, cost)
        _refuse_if_over(over_limits(plan, manifest, options, settings.limits, cost.parameters),
                        file)
    except ObjectChangedError as exc:
        reject(svc, held, _replaced_while_read(file, exc.expected_generation, exc.found))
        return Outcome.REJECTED, job_id
    except InvalidInputError as exc:
        # a store that cannot pin reads could have mixed two generations into a bogus problem
        now = svc.store.stat(event.bucket, event.name)
        if now is None or now.generation != event.generation:
            reject(svc, held, _replaced_while_read(
                file, event.generation, "no object" if now is None else
                f"generation {now.generation}"))
        else:
            reject(svc, held, exc.problem)
        return Outcome.REJECTED, job_id
    job = start_training(svc, job_id, held.claim, manifest, spec.to_dict(), plan, model,
                         options.batch_size, cost)
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


def plan_within_limits(manifest: Manifest, options: JobOptions, limits: Limits,
                       file: str) -> TrainingPlan:
    """The job's training plan (``plan_training``), within the deployment's total-task limit.

    Raises:
        InvalidInputError: the plan has more tasks over all its epochs than
            ``limits.max_total_tasks``; the problem names the numbers and what to change.
    """
    plan = plan_for(manifest, options, limits,
                    None if options.parallel_tasks == AUTO else options.parallel_tasks)
    # an automatic plan may still become one task at a time, which has fewer tasks: the limit
    # is checked here on the fewer, and again on the plan the job trains (``_split_claimed``)
    fewest = (chained_plan(manifest, options, limits)
              if options.parallel_tasks == AUTO and plan.parallel_tasks > 1 else plan)
    _refuse_if_over(check_total_tasks(fewest, limits.max_total_tasks, options.rows_per_shard),
                    file)
    return plan


def over_limits(plan: TrainingPlan, manifest: Manifest, options: JobOptions, limits: Limits,
                parameters: int) -> OverLimit | None:
    """Which of the deployment's limits ``plan`` is over, for a model of ``parameters``
    parameters: its total tasks (``check_total_tasks``), else its predicted duration against
    half of the work bucket's retention (``check_duration``); None when within both."""
    return (check_total_tasks(plan, limits.max_total_tasks, options.rows_per_shard)
            or check_duration(plan, parameters, manifest.train_rows, limits.worker_flops,
                              limits.work_retention_days))


def plan_for(manifest: Manifest, options: JobOptions, limits: Limits,
             requested: int | None) -> TrainingPlan:
    """``plan_training`` for a split upload: its shards, epochs and batch size, its target, and
    the bytes a task may hold (``limits.max_shard_bytes``). ``requested``: R, or None for auto."""
    return plan_training([s.rows for s in manifest.shards], options.epochs, options.batch_size,
                         requested, regression=manifest.target is not None,
                         shard_cells=matrix_width(manifest.schema),
                         max_task_bytes=limits.max_shard_bytes)


def chained_plan(manifest: Manifest, options: JobOptions, limits: Limits) -> TrainingPlan:
    """The job's plan one task at a time: what ``automatic_layout`` may choose instead, and
    what ``train-local`` trains (so both group shards into tasks the same way)."""
    return plan_for(manifest, options, limits, 1)


def automatic_layout(plan: TrainingPlan, manifest: Manifest, options: JobOptions,
                     limits: Limits, cost: ModelCost) -> TrainingPlan:
    """An automatic plan's layout once the model is known: its parallel rounds, or one task
    at a time where the forecast says that ends sooner (``domain.forecast.choose_layout``);
    the other of the two where the deployment's limits (total tasks, predicted duration) would
    refuse the choice and not the other. A ``parallel_tasks`` the user set is kept as set."""
    if options.parallel_tasks != AUTO or plan.parallel_tasks <= 1:
        return plan
    chained = chained_plan(manifest, options, limits)
    chosen = choose_layout(plan, chained, manifest.train_rows, options.batch_size, cost)
    other = chained if chosen is plan else plan

    def refused(candidate: TrainingPlan) -> bool:
        return over_limits(candidate, manifest, options, limits, cost.parameters) is not None

    if not refused(chosen) or refused(other):
        return chosen
    if other is plan:
        return plan
    return dataclasses.replace(chained, decided=(
        f"auto: one task at a time: rounds of {plan.parallel_tasks} tasks "
        f"({plan.decided.removeprefix('auto: ')}) would be over the deployment's limits"))


def _refuse_if_over(over: OverLimit | None, file: str) -> None:
    """Raise the REJECTED reason of a job over one of the deployment's limits."""
    if over is not None:
        raise InvalidInputError(InputProblem(file=file, message=over.message,
                                             expected=over.expected, found=over.found))


def start_training(svc: Services, job_id: str, claim: str, manifest: Manifest,
                   spec: dict[str, Any], plan: TrainingPlan, model: Any,
                   batch_size: int, cost: ModelCost) -> Job | None:
    """Write version 0 (initial weights and optimizer state) and make the job trainable with
    ``plan``, if this invocation still owns the split; return the job document, or None when
    the job ended (was cancelled) during the split. ``model``: ``spec``'s model as built; the
    job records the plan's forecast (``domain.forecast``) with ``cost``, what it costs.

    Raises:
        TransientError: another invocation took the split over.
    """
    weights, optimizer = model.get_weights(), optimizer_state(model)
    data = codec.encode_state(weights, optimizer, {"job_id": job_id, "version": 0})
    weights_path = layout.weights_path(job_id, 0, layout.new_nonce())
    svc.store.write_bytes(svc.settings.models_bucket, weights_path, data,
                          "application/octet-stream")
    now = svc.clock()
    checksum = codec.checksum(data)
    digest = codec.state_digest(weights, optimizer)
    first = Version(0, weights_path, checksum, created_at=now, digest=digest)
    job_fields = start_fields(
        plan, Head(0, weights_path, checksum, digest=digest), now,
        forecast_plan(plan, manifest.train_rows, batch_size, cost), cost, manifest.summary(),
        spec,
        # what the split used: its calls, and one invocation of the upload function
        {**svc.usage(job_id), "function_invocations": 1.0})
    if not svc.registry.start_training(job_id, claim, job_fields, first):
        current = svc.registry.get_job(job_id)
        if current is not None and current.is_terminal:
            return None  # version 0's weights stay behind, unreferenced (never a dangling pointer)
        raise TransientError(f"job {job_id}: another invocation took over the split")
    log.info("job %s: %d tasks per epoch, %d at once (%s)", job_id, plan.tasks_per_epoch,
             plan.parallel_tasks, plan.decided)
    job = svc.registry.get_job(job_id)
    if job is None:
        raise TransientError(f"job {job_id}: its document went missing")
    return job


def reject(svc: Services, held: SplitClaim, problem: InputProblem) -> None:
    """End a job as REJECTED with a reason naming file, row and column; remove its partial shards.

    Only while ``held`` is still the job's claim and the job is still splitting (one conditional
    update); only then are the shards removed.

    Raises:
        TransientError: the claim was lost: another invocation owns the split (or the job has
            moved on); nothing was written or removed.
    """
    now = svc.clock()
    if not held.update(ending_fields(REJECTED, now, error=problem.describe(),
                                     error_detail=problem.to_dict())):
        if _ended(svc, held.job_id, f"not rejected ({problem.describe()})"):
            return
        raise held.lost()
    log.warning("job %s rejected: %s", held.job_id, problem.describe())
    _remove_partial_shards(svc, held.job_id)


def _ended(svc: Services, job_id: str, what: str) -> bool:
    """The job has ended meanwhile (e.g. cancelled during its split): its ending stands and its
    partial shards go; True. False when it has not (the claim was taken over)."""
    job = svc.registry.get_job(job_id)
    if job is None or not job.is_terminal:
        return False
    log.warning("job %s: %s: it ended first (%s)", job_id, what, job.status)
    _remove_partial_shards(svc, job_id)
    return True


def fail(svc: Services, held: SplitClaim, reason: str) -> None:
    """End a job as FAILED with ``reason`` (bounded) and remove its partial shards.

    Used when a backend refuses a write for good: the job must end (with a reason the dashboard
    shows) rather than the event being retried for a day. As with ``reject``, only while
    ``held`` is still the job's claim and the job is still splitting. Should even this small
    write be refused, the failure is logged and the job left as it is.

    Raises:
        TransientError: the claim was lost; nothing was written or removed.
    """
    now = svc.clock()
    error = bounded(reason, 2000)
    try:
        ended = held.update(fail_fields(now, error))
    except BackendRejectedError:
        log.exception("job %s: could not record its failure (%s)", held.job_id, error)
        ended = held.holds()
    if not ended:
        if _ended(svc, held.job_id, f"not failed ({error})"):
            return
        raise held.lost()
    log.error("job %s failed: %s", held.job_id, error)
    _remove_partial_shards(svc, held.job_id)


def _remove_partial_shards(svc: Services, job_id: str) -> None:
    try:
        for info in list(svc.store.list(svc.settings.work_bucket, layout.job_prefix(job_id))):
            svc.store.delete(svc.settings.work_bucket, info.name)
    except Exception:  # noqa: BLE001 - cleanup is best effort; lifecycle rules catch the rest
        log.exception("job %s: could not remove partial shards", job_id)
