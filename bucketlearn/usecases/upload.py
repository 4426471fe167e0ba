"""The upload service: one finalized CSV upload -> one job, split into shards, epoch 1 published."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from bucketlearn import codec, layout
from bucketlearn.config import Limits
from bucketlearn.domain.columns import is_matrix
from bucketlearn.domain.forecast import ModelCost, choose_layout, forecast_plan
from bucketlearn.domain.head import Head
from bucketlearn.domain.job import Job, ending_fields, fail_fields, splitting_under, start_fields
from bucketlearn.domain.lifecycle import QUEUED, REJECTED, SPLITTING, TRAINING
from bucketlearn.domain.plan import (
    OverLimit,
    TrainingPlan,
    check_duration,
    check_model_columns,
    check_total_tasks,
)
from bucketlearn.domain.recipe import Budget
from bucketlearn.domain.version import Version
from bucketlearn.errors import (
    BackendRejectedError,
    ConfigError,
    InputProblem,
    InvalidInputError,
    ObjectChangedError,
    PermanentError,
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
    skipped,
)
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ingest.split import Outline
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.ml.model import model_cost, spec_for
from bucketlearn.ml.training import optimizer_state
from bucketlearn.options import AUTO, SEARCH_AUTO, JobOptions, resolve_options
from bucketlearn.ports import BlobInfo, Services
from bucketlearn.services.planning import (
    auto_search_off,
    budgeted,
    chained_plan,
    outline_of,
    plan_for,
    search_refusal,
    searched_over,
    searched_plan,
)
from bucketlearn.usecases.continue_from import Parent, continued_options, find_parent
from bucketlearn.usecases.search_publish import publish_first
from bucketlearn.usecases.split_claim import SplitClaim
from bucketlearn.usecases.upload_steps import UploadSteps

log = logging.getLogger(__name__)


def new_job(event: StorageEvent, job_id: str, claim: str, now: float, file: str) -> Job:
    """The job just created for an upload, claimed for splitting by ``claim``."""
    # (a longer name is rejected later; Cloud Storage allows 1024 bytes anyway)
    source = {"bucket": event.bucket, "name": event.name[:MAX_OBJECT_NAME],
              "generation": event.generation, "size": event.size}
    return Job(job_id=job_id, status=QUEUED, phase=SPLITTING, source=source,
               file=file, created_at=now, updated_at=now, claimed_at=now, claim=claim,
               split_attempts=1)


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
                {"claim": claim, "claimed_at": now,
                 "split_attempts": existing.split_attempts + 1}):
            raise TransientError(f"job {job_id}: lost the race to take over a stale split")
        log.warning("job %s: taking over a split abandoned since %s", job_id,
                    existing.claimed_at)
        return None
    if existing.phase == TRAINING and existing.published is None:
        publish_first(svc, existing)  # the invocation that split it died before publishing
        return Outcome.ACCEPTED
    log.info("job %s exists (%s): duplicate event ignored", job_id, existing.status)
    return Outcome.DUPLICATE


def handle_upload(svc: Services, event: StorageEvent, steps: UploadSteps | None = None
                  ) -> tuple[Outcome, str | None]:
    """Turn one upload event into (at most) one job, split and its model built with ``steps``
    (``upload_steps.UploadSteps``; None: production's).

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
    file, now = display_uri(event.bucket, event.name), svc.clock()
    if (why := skipped(event, now, svc.settings.max_event_age_seconds)) is not None:
        log.info("ignoring %s: %s", file, why)
        return Outcome.IGNORED, None
    job_id = layout.job_id_for(event.bucket, event.name, event.generation)
    claim = layout.new_nonce()
    if not svc.registry.create_job(new_job(event, job_id, claim, now, file)):
        settled = _claim_existing(svc, job_id, claim, now)
        if settled is not None:
            return settled, job_id
    held = SplitClaim(svc, job_id, claim, now)
    try:
        return _split_claimed(svc, event, held, file, steps or UploadSteps())
    except BackendRejectedError as exc:
        fail(svc, held, f"{file}: a backend refused to store the job's state, so it cannot "
                        f"go on: {exc}")
        return Outcome.FAILED, job_id
    except (TransientError, PermanentError):
        raise
    except Exception as exc:  # noqa: BLE001 - a failure no one foresaw: bounded retries
        if svc.transient(exc):
            raise TransientError(f"{file}: the split met {type(exc).__name__}: {exc}") from exc
        return _split_crashed(svc, held, file, exc), job_id


MAX_SPLIT_ATTEMPTS = 3  # splits that failed unforeseen before the job is FAILED


def _split_crashed(svc: Services, held: SplitClaim, file: str, exc: Exception) -> Outcome:
    """A split failed with an error that is neither transient nor the input's fault (a bug, a
    library's surprise): FAILED once the job's splits have failed ``MAX_SPLIT_ATTEMPTS`` times,
    else the claim is let go (so the retried event takes the split over at once) and the event
    is retried; never an endless stream of retries.

    Raises:
        TransientError: the event is to be retried.
    """
    log.error("job %s: the split failed", held.job_id, exc_info=exc)
    what = f"{type(exc).__name__}: {bounded(str(exc), 500)}"
    job = svc.registry.get_job(held.job_id)
    attempts = job.split_attempts if job is not None else MAX_SPLIT_ATTEMPTS
    if attempts >= MAX_SPLIT_ATTEMPTS:
        fail(svc, held, f"{file}: the split failed on each of its {attempts} attempts, last "
                        f"with {what}")
        return Outcome.FAILED
    held.update({"claimed_at": 0.0})
    raise TransientError(f"{file}: the split failed (attempt {attempts} of "
                         f"{MAX_SPLIT_ATTEMPTS}) with {what}; the event is retried") from exc


def _check_upload(svc: Services, event: StorageEvent, file: str
                  ) -> InputProblem | tuple[BlobInfo, JobOptions, Parent | None]:
    """The upload's object and options, and the job it continues (``continue_from``), before
    any row is read; or why it cannot be split."""
    if len(event.name) > MAX_OBJECT_NAME or any(is_control(ch) for ch in event.name):
        found = (f"a name of {len(event.name)} characters" if len(event.name) > MAX_OBJECT_NAME
                 else "control characters: " + ", ".join(
                     sorted({f"U+{ord(ch):04X}" for ch in event.name if is_control(ch)})))
        return InputProblem(file=file, message="the object name is not usable",
                            expected="a name without control characters, at most "
                                     f"{MAX_OBJECT_NAME} characters", found=found)
    # this event's generation, also once replaced: a versioned bucket keeps it readable, and
    # each generation is its own job
    info = svc.store.stat(event.bucket, event.name, event.generation)
    if info is None or info.generation != event.generation:
        live = svc.store.stat(event.bucket, event.name)
        found = "no object" if live is None else f"generation {live.generation}"
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
    try:
        options = continued_options(options, file)
        return info, options, find_parent(svc, options, file)
    except InvalidInputError as exc:
        return exc.problem


def _split_claimed(svc: Services, event: StorageEvent, held: SplitClaim,
                   file: str, steps: UploadSteps) -> tuple[Outcome, str | None]:
    """The split of an upload whose job this invocation has claimed (see handle_upload)."""
    job_id = held.job_id
    checked = _check_upload(svc, event, file)
    if isinstance(checked, InputProblem):
        reject(svc, held, checked)
        return Outcome.REJECTED, job_id
    info, options, parent = checked
    if not held.update({"options": options.to_dict(), "updated_at": svc.clock()}):
        raise held.lost()
    # every pass reads the event's generation: a re-upload of the same name during the split
    # must not mix two files (it raises ObjectChangedError instead)
    source = SourceFile(display_name=file, size=info.size,
                        opener=lambda: svc.store.open_read(event.bucket, event.name,
                                                           generation=event.generation))
    settings = svc.settings
    try:
        manifest = steps.split(source, svc.store, settings.work_bucket, job_id, options,
                               settings.limits, progress=held.renew,
                               check=lambda outline: check_outline(outline, options,
                                                                   settings.limits, file),
                               **({} if parent is None else {"frozen": parent.manifest}))
        auto = options.search == SEARCH_AUTO
        options, budget = budgeted(options, outline_of(manifest), file)
        _refuse_if_over(search_refusal(manifest, options), file)
        spec = spec_for(manifest, options, file) if parent is None else \
            parent.child_spec(options)
        plan = plan_within_limits(outline_of(manifest), options, settings.limits, file)
        model = _built(steps, spec, manifest, parent)
        cost = model_cost(model)
        plan = automatic_layout(plan, manifest, options, settings.limits, cost)
        over = searched_over(over_limits(searched_plan(plan, options), manifest, options,
                                         settings.limits, cost.parameters), plan, options)
        if over is not None and auto and options.search:  # auto stays within the limits
            options, budget = auto_search_off(options, budget, over)
            over = over_limits(plan, manifest, options, settings.limits, cost.parameters)
        _refuse_if_over(over, file)
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
                         cost, options, budget, None if parent is None else parent.record())
    if job is None:  # cancelled while it was being split: it stays CANCELLED, untrained
        log.warning("job %s ended during its split; its shards are removed", job_id)
        _remove_partial_shards(svc, job_id)
        return Outcome.CANCELLED, job_id
    publish_first(svc, job, manifest)
    return Outcome.ACCEPTED, job_id


def _built(steps: UploadSteps, spec: Any, manifest: Manifest, parent: Parent | None) -> Any:
    """The job's model, built once the cheap checks passed (a rejected upload builds none); a
    continued job's holds its parent's version's weights (its version 0)."""
    model = steps.build(spec, manifest.mean, manifest.variance, manifest.schema,
                        manifest.preprocessing)
    if parent is not None:
        model.set_weights(parent.weights)
    return model


def _replaced_while_read(file: str, generation: int, found: str) -> InputProblem:
    """The reason for an upload whose generation went away while it was being split."""
    if found != "no object":
        found += " (a newer upload of the same name; it gets its own job)"
    return InputProblem(file=file, message="the upload was replaced or deleted while it was "
                                           "being read",
                        expected=f"generation {generation} until the split ends", found=found)


def check_outline(outline: Outline, options: JobOptions, limits: Limits, file: str) -> None:
    """Refuse, from pass 1's outline and before pass 2 writes a shard, a job over the
    deployment's limits on its total tasks (``plan_within_limits``) or on the columns its model
    takes layers for (``check_model_columns``).

    Raises:
        InvalidInputError: over a limit; the problem names the numbers and what to change.
    """
    _refuse_if_over(check_model_columns(len(outline.schema), not is_matrix(outline.schema),
                                        limits.max_model_columns), file)
    plan_within_limits(outline, budgeted(options, outline, file)[0], limits, file)


def plan_within_limits(outline: Outline, options: JobOptions, limits: Limits,
                       file: str) -> TrainingPlan:
    """The job's training plan (``plan_training``), within the deployment's total-task limit.

    Raises:
        InvalidInputError: the plan has more tasks over all its epochs than
            ``limits.max_total_tasks``; the problem names the numbers and what to change.
    """
    plan = plan_for(outline, options, limits,
                    None if options.parallel_tasks == AUTO else options.parallel_tasks)
    # an automatic plan may still become one task at a time, which has fewer tasks: the limit
    # is checked here on the fewer, and again on the plan the job trains (``_split_claimed``)
    fewest = (plan_for(outline, options, limits, 1)
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
                   spec: dict[str, Any], plan: TrainingPlan, model: Any, cost: ModelCost,
                   options: JobOptions, budget: Budget,
                   continued_from: dict[str, Any] | None = None) -> Job | None:
    """Write version 0 (initial weights and optimizer state) and make the job trainable with
    ``plan``, if this invocation still owns the split; return the job document, or None when
    the job ended (was cancelled) during the split. ``model``: ``spec``'s model as built; the
    job records the plan's forecast (``domain.forecast``) with ``cost``, what it costs, and
    its ``options`` as its ``budget`` resolved them, and the job it continues
    (``continued_from``: {job_id, version}; None: a new model).

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
        forecast_plan(plan, manifest.train_rows, options.batch_size, cost), cost,
        manifest.summary(), spec,
        # what the split used: its calls, and one invocation of the upload function
        {**svc.usage(job_id), "function_invocations": 1.0})
    job_fields.update(options=options.to_dict(), budget=budget.to_dict())
    if continued_from is not None:
        job_fields["continued_from"] = continued_from
    if not svc.registry.start_training(job_id, claim, job_fields, first):
        _delete_quietly(svc, svc.settings.models_bucket, weights_path)  # never referenced
        current = svc.registry.get_job(job_id)
        if current is not None and current.is_terminal:
            return None
        raise TransientError(f"job {job_id}: another invocation took over the split")
    log.info("job %s: %d tasks per epoch, %d at once (%s)", job_id, plan.tasks_per_epoch,
             plan.parallel_tasks, plan.decided)
    job = svc.registry.get_job(job_id)
    if job is None:
        raise TransientError(f"job {job_id}: its document went missing")
    return job


def _delete_quietly(svc: Services, bucket: str, name: str) -> None:
    """Delete an object no document refers to; one left behind is logged (nothing points at
    it, and the bucket's lifecycle rules remove it in the end)."""
    try:
        svc.store.delete(bucket, name)
    except Exception:  # noqa: BLE001 - best effort: an unreferenced object harms nothing
        log.warning("could not delete gs://%s/%s", bucket, name, exc_info=True)


def reject(svc: Services, held: SplitClaim, problem: InputProblem) -> None:
    """End a job as REJECTED with a reason naming file, row and column; remove its partial shards.

    Only while ``held`` is still the job's claim and the job is still splitting (one conditional
    update); only then are the shards removed.

    Raises:
        TransientError: the claim was lost: another invocation owns the split (or the job has
            moved on); nothing was written or removed.
    """
    now = svc.clock()
    if not held.end(ending_fields(REJECTED, now, error=problem.describe(),
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
        ended = held.end(fail_fields(now, error))
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
