"""The aggregator: fold each complete round into the next version, one writer per job.

Per result upload event: take the job's lease (a Firestore document created with a
precondition, no contended transaction), then repeat until nothing is foldable: read the job,
make sure its current round is published, list the epoch's result objects, decide with
``domain.rounds.plan_round`` (pure) whether the round is complete; if it is, read and check each
task's result (``domain.fold.check_delta``: a non-finite or outlying delta is refused and its
task trained again), fold them (``domain.fold.fold_round``), write the new version's weights and
optimizer state under a write-once name, and commit version doc + applied task ids + head + the
next round in one transaction. Then publish the next round, evaluate the version on the holdout
and watch for divergence (``domain.health``). After releasing the lease it looks once more, so a
result that arrived while another invocation held the lease is never stranded.

An invocation has a time budget (``Settings.aggregate_budget_seconds``, under the function's
timeout): once it is spent, no new fold or export starts; the invocation writes a *nudge* object
(the watchdog's way to start the aggregator) and returns, and the nudge's event carries on.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from bucketlearn import codec, layout
from bucketlearn.bootstrap import Services
from bucketlearn.codec import CorruptObjectError
from bucketlearn.domain import fold, health
from bucketlearn.domain.job import Job, Version, decide_after_fold
from bucketlearn.domain.metrics import (
    holdout_fields,
    regression_fields,
    regression_headline,
)
from bucketlearn.domain.rounds import DeltaRef, RoundPlan, plan_round
from bucketlearn.domain.target import REGRESSION
from bucketlearn.errors import NotFoundError, TransientError
from bucketlearn.events import Outcome
from bucketlearn.faults import crash_point
from bucketlearn.ml.model import export_keras, model_inputs
from bucketlearn.ml.training import evaluate_detail, evaluate_parts
from bucketlearn.ports import VersionCommit
from bucketlearn.services import jobs
from bucketlearn.services.publish import publish_round
from bucketlearn.services.runtime import JobRuntime, job_runtime

log = logging.getLogger(__name__)

MAX_REFUSALS = 3  # a task whose result is refused this many times fails for good


def handle_delta_event(svc: Services, bucket: str, name: str) -> tuple[Outcome, str | None]:
    """Entry for one result upload: aggregate its job if the object is one of ours."""
    nudged = layout.parse_nudge_path(name)
    if nudged is not None:  # the watchdog asks for a look at a stalled job
        outcome = aggregate_job(svc, nudged)
        if outcome is Outcome.ACCEPTED:
            _delete(svc, name)
        return outcome, nudged
    parsed = layout.parse_delta_path(name)
    if parsed is None:
        log.info("ignoring gs://%s/%s: not a bucketlearn delta", bucket, name)
        return Outcome.IGNORED, None
    outcome = aggregate_job(svc, parsed.job_id)
    if outcome is Outcome.ACCEPTED and jobs.is_terminal(svc.registry.get_job(parsed.job_id)):
        # A late or duplicate result of a job that has ended: nothing will ever read it, nor
        # the results a cancel left waiting for the rest of their round.
        _collect_job_garbage(svc, parsed.job_id)
    return outcome, parsed.job_id


def _collect_job_garbage(svc: Services, job_id: str) -> None:
    """Delete every object of an ended job from the deltas bucket."""
    prefix = layout.job_delta_prefix(job_id)
    for info in list(svc.store.list(svc.settings.deltas_bucket, prefix)):
        _delete(svc, info.name)


def aggregate_job(svc: Services, job_id: str) -> Outcome:
    """Fold everything foldable for one job within the invocation's time budget, holding its
    lease.

    Returns:
        ACCEPTED when it ran (with a nudge left for the next invocation if the budget ran out
        with work left); BUSY if another invocation holds the lease.
    """
    lease = f"aggregate-{job_id}"
    holder = f"{svc.identity}-{layout.new_nonce()}"
    budget = _Budget(svc.clock() + svc.settings.aggregate_budget_seconds)
    outcome = Outcome.BUSY
    for _ in range(1000):
        if not svc.registry.acquire_lease(lease, holder, svc.settings.lease_seconds):
            return outcome
        try:
            drained = _drain(svc, job_id, lease, holder, budget)
            outcome = Outcome.ACCEPTED
        finally:
            svc.registry.release_lease(lease, holder)
        if not drained:
            write_nudge(svc, job_id, f"an aggregation spent its budget of "
                                     f"{svc.settings.aggregate_budget_seconds:g} s with work left")
            return outcome
        if not _has_work(svc, job_id):
            return outcome
    return outcome


def write_nudge(svc: Services, job_id: str, reason: str) -> str:
    """Write a nudge object for a job to the deltas bucket: its event starts an aggregation of
    the job, as a task result's does. Returns its name."""
    path = layout.nudge_path(job_id, layout.new_nonce())
    svc.store.write_bytes(svc.settings.deltas_bucket, path, json.dumps({"reason": reason}).encode(),
                          "application/json")
    log.info("job %s: nudged (%s)", job_id, reason)
    return path


def may_start(now: float, deadline: float, started_before: bool) -> bool:
    """Whether an invocation whose budget ends at ``deadline`` may start a fold or the export:
    before the deadline, and always for its first (a budget shorter than one fold must still
    make progress, not nudge forever)."""
    return not started_before or now < deadline


@dataclass
class _Budget:
    """One invocation's time budget for folds and the export."""

    deadline: float
    started: bool = False

    def start(self, now: float) -> bool:
        """True (and counted) if a fold or the export may start now (``may_start``)."""
        if not may_start(now, self.deadline, self.started):
            return False
        self.started = True
        return True


def list_deltas(svc: Services, job_id: str, epoch: int) -> list[DeltaRef]:
    """The result objects and failure markers of one job's epoch, as listed in the deltas
    bucket."""
    refs = []
    for info in svc.store.list(svc.settings.deltas_bucket, layout.epoch_delta_prefix(job_id, epoch)):
        parsed = layout.parse_delta_path(info.name)
        if parsed is None or parsed.job_id != job_id:
            continue
        refs.append(DeltaRef(info.name, parsed.task_index, parsed.failed))
    return refs


def _has_work(svc: Services, job_id: str) -> bool:
    job = svc.registry.get_job(job_id)
    if job is None or jobs.is_terminal(job) or job.phase not in (jobs.TRAINING,
                                                                         jobs.EXPORTING):
        return False
    if job.phase == jobs.EXPORTING or not job.is_published:
        return True
    return _plan(svc, job).complete


def _plan(svc: Services, job: Job) -> RoundPlan:
    """The current round's plan, from the epoch's ledger and the deltas written."""
    epoch = svc.registry.get_epoch(job.job_id, job.epoch)
    return plan_round(jobs.current_round_tasks(job), jobs.done_tasks(epoch),
                      list_deltas(svc, job.job_id, job.epoch),
                      jobs.job_plan(job).tasks_per_epoch)


def _drain(svc: Services, job_id: str, lease: str, holder: str, budget: _Budget) -> bool:
    """Fold complete rounds (and export) until nothing is foldable: True; False when the
    budget was spent with a fold or the export still to start."""
    registry = svc.registry
    for _ in range(100_000):
        planning_started = svc.clock()
        job = registry.get_job(job_id)
        if job is None or jobs.is_terminal(job):
            return True
        if job.phase == jobs.EXPORTING:
            if not budget.start(planning_started):
                return False
            export_final(svc, job)
            return True
        if job.phase != jobs.TRAINING:
            return True
        if not job.is_published:
            publish_round(svc, job)
            continue
        plan = _plan(svc, job)  # only this lease holder's commits change its epoch
        _collect_garbage(svc, plan.garbage)
        if not plan.complete:
            return True
        if not budget.start(svc.clock()):
            return False
        if not registry.acquire_lease(lease, holder, svc.settings.lease_seconds):
            raise TransientError(f"job {job_id}: lost the aggregation lease")
        if _fold(svc, job, plan, planning_started):
            _collect_garbage(svc, list(plan.results.values()) + list(plan.failures.values()))
    return True


def _collect_garbage(svc: Services, refs: list[DeltaRef]) -> None:
    for ref in refs:
        _delete(svc, ref.name)


def _delete(svc: Services, name: str) -> None:
    try:
        svc.store.delete(svc.settings.deltas_bucket, name)
    except Exception:  # noqa: BLE001 - leftover objects are ignored and expire by lifecycle
        log.debug("could not delete %s", name, exc_info=True)


@dataclass
class _Read:
    """A complete round's objects, read and checked."""

    results: list[fold.TaskResult]
    failures: list[dict[str, Any]]
    refused: dict[int, str]


def _read_round(svc: Services, job: Job, plan: RoundPlan, base: list[Any],
                base_optimizer: list[Any]) -> _Read:
    """Decode and check every result of a complete round; read its failure markers."""
    bucket = svc.settings.deltas_bucket
    read = _Read([], [], {})
    shapes = [tuple(b.shape) for b in base]
    optimizer_shapes = [tuple(o.shape) for o in base_optimizer]
    recent = job.delta_norm
    for task_index, ref in sorted(plan.results.items()):
        try:
            arrays, optimizer, meta = codec.decode_state(svc.store.read_bytes(bucket, ref.name),
                                                         ref.name)
            delta = fold.task_delta(arrays, base, meta.get("content"))
            result = fold.TaskResult(task_index, delta, optimizer,
                                     _int(meta.get("examples"), 0),
                                     _float(meta.get("train_loss")))
            problem = fold.check_delta(result, shapes, optimizer_shapes,
                                       None if recent is None else float(recent))
        except (CorruptObjectError, NotFoundError) as exc:
            problem = f"unreadable: {exc}"
        except ValueError as exc:  # end weights of the wrong shapes (task_delta)
            problem = str(exc)
        if problem is None:
            read.results.append(result)
        else:
            read.refused[task_index] = problem
    for task_index, ref in sorted(plan.failures.items()):
        try:
            marker = json.loads(svc.store.read_bytes(bucket, ref.name))
            reason = str(marker.get("error") or "task failed")
        except Exception:  # noqa: BLE001 - the marker's existence is what counts
            reason = "task failed"
        read.failures.append({"task_index": task_index, "error": reason[:2000]})
    return read


def _refuse(svc: Services, job: Job, plan: RoundPlan, refused: dict[int, str]) -> None:
    """Never fold a refused result: delete it and train its task again, or fail the task for
    good once its results were refused ``MAX_REFUSALS`` times in this epoch."""
    job_id, epoch = job.job_id, job.epoch
    prefix = f"{epoch}-"
    counts = {k: int(v) for k, v in (job.refusals or {}).items() if k.startswith(prefix)}
    retrain = []
    for task_index, reason in sorted(refused.items()):
        task_id = layout.task_id_for(job_id, epoch, task_index)
        key = f"{prefix}{task_index}"
        counts[key] = counts.get(key, 0) + 1
        log.error("job %s: refused the result of %s (%s)", job_id, task_id, reason)
        svc.store.delete(svc.settings.deltas_bucket, plan.results[task_index].name)
        if counts[key] >= MAX_REFUSALS:
            _write_failure(svc, job_id, epoch, task_index,
                           f"task {task_id}: its result was refused {counts[key]} times, last "
                           f"because {reason}")
        else:
            retrain.append(task_index)
    if retrain:
        shards = job_runtime(svc, job).manifest.shards
        svc.queue.publish(jobs.round_messages(job, shards, retrain))
    first = min(refused)
    last = f"{layout.task_id_for(job_id, epoch, first)}: {refused[first]}"
    svc.registry.update_job(job_id, {
        "refusals": counts, "deltas_refused": job.deltas_refused + len(refused),
        "last_refusal": last[:2000], "updated_at": svc.clock()})


def _write_failure(svc: Services, job_id: str, epoch: int, task_index: int, reason: str) -> None:
    """A failure marker for a task, as a worker writes one after its last attempt."""
    marker = {"job_id": job_id, "task_id": layout.task_id_for(job_id, epoch, task_index),
              "epoch": epoch, "task_index": task_index, "error": reason}
    path = layout.failure_marker_path(job_id, epoch, task_index, layout.new_nonce())
    svc.store.write_bytes(svc.settings.deltas_bucket, path, json.dumps(marker).encode(),
                          "application/json", metadata={"failed": "true"})


def _fold(svc: Services, job: Job, plan: RoundPlan,
          planning_started: float | None = None) -> bool:
    """Fold a complete round, write and commit its version, publish the next round and evaluate
    the version. False when a result was refused (its task trains again) or the head moved.

    The version document records when planning began and how long each step took
    (``aggregator``), so the latency from a result to its version is measured, not estimated.
    """
    job_id, settings = job.job_id, svc.settings
    steps = _Stopwatch()
    runtime = job_runtime(svc, job)
    head = job.head
    assert head is not None  # a trainable job has its head since the split
    base, base_optimizer = runtime.state(head.weights_path)
    read = _read_round(svc, job, plan, base, base_optimizer)
    if read.refused:
        _refuse(svc, job, plan, read.refused)
        return False
    steps.lap("read_seconds")
    new_version = int(job.version) + 1
    server_lr = fold.server_learning_rate(str(job.model["kind"]), len(read.results))
    folded = fold.fold_round(base, base_optimizer, read.results, server_lr)
    if folded is not None:
        weights, optimizer = folded
        data = codec.encode_state(weights, optimizer, {"job_id": job_id, "version": new_version})
        steps.lap("fold_seconds")
        weights_path = layout.weights_path(job_id, new_version, layout.new_nonce())
        svc.store.write_bytes(settings.models_bucket, weights_path, data,
                              "application/octet-stream")
        steps.lap("write_seconds")
        checksum = codec.checksum(data)
    else:  # every task of the round failed: the version records it, the weights stay
        weights, weights_path, checksum = base, head.weights_path, head.checksum
    commit, job_fields = _version_commit(svc, job, read, new_version, weights_path, checksum,
                                         planning_started, steps.laps)
    crash_point(settings, "aggregator.before_commit")
    if not svc.registry.commit_version(commit):
        log.warning("job %s: v%d not committed: the head moved past v%d or the job ended "
                    "during the fold", job_id, new_version, new_version - 1)
        return False
    crash_point(settings, "aggregator.after_commit")
    updated = job.updated(job_fields)
    if updated.phase == jobs.TRAINING and updated.status == jobs.RUNNING:
        publish_round(svc, updated)  # the workers start the next round before the evaluation
    headline = None
    if read.results:
        headline = _evaluate_version(svc, updated, runtime, weights, new_version,
                                     commit.version.aggregator)
    log.info("job %s: v%d (epoch %d round %d, %d results, %d failed) holdout %s",
             job_id, new_version, commit.epoch, job.round, len(read.results),
             len(read.failures), headline)
    return True


def _version_commit(svc: Services, job: Job, read: _Read, new_version: int,
                    weights_path: str, checksum: str | None, planning_started: float | None,
                    timings: dict[str, float]) -> tuple[VersionCommit, dict[str, Any]]:
    """The version document, the job's new fields and the next round, as one commit."""
    job_id, head = job.job_id, job.head
    plan = jobs.job_plan(job)
    epoch, round_index = job.epoch, job.round
    results, failures = read.results, read.failures
    train_loss = fold.weighted_mean_loss(results)
    samples = sum(r.examples for r in results)
    now = svc.clock()
    norms = [round(fold.delta_norm(r.delta), 6) for r in results]
    version = Version(  # its holdout figures are filled in once it is committed
        new_version, weights_path, checksum, parent=new_version - 1, epoch=epoch,
        round=round_index,
        tasks_applied=tuple(layout.task_id_for(job_id, epoch, r.task_index) for r in results),
        tasks_failed=tuple(layout.task_id_for(job_id, epoch, int(f["task_index"]))
                           for f in failures),
        samples=samples, train_loss=train_loss, created_at=now, delta_norms=tuple(norms),
        server_lr=fold.server_learning_rate(str(job.model["kind"]), len(results)),
        aggregator={"planning_started_at": planning_started, **timings})
    tasks_failed = job.tasks_failed + len(failures)
    job_fields: dict[str, Any] = {
        "version": new_version, "status": jobs.RUNNING, "updated_at": now,
        "tasks_applied": job.tasks_applied + len(results),
        "tasks_failed": tasks_failed,
        "samples_seen": job.samples_seen + samples,
        "delta_norm": fold.running_norm(job.delta_norm, results),
        "head": head.advanced(new_version, weights_path, checksum or "", bool(results),
                              train_loss).to_doc(),
    }
    if job.started_at is None:
        job_fields["started_at"] = now
    after = decide_after_fold(epoch, round_index, plan.rounds_per_epoch, plan.epochs,
                              plan.tasks_per_epoch, tasks_failed,
                              int(job.options.get("max_failed_tasks", 0)),
                              failures[0]["error"] if failures else None, now)
    job_fields.update(after.job_fields)
    commit = VersionCommit(job_id=job_id, base_version=new_version - 1, version=version,
                           epoch=epoch, applied=[r.task_index for r in results],
                           failed=[int(f["task_index"]) for f in failures],
                           job_fields=job_fields, next_epoch=after.next_epoch)
    return commit, job_fields


def _figures(found: Any, regression: bool) -> dict[str, Any]:
    """A version's holdout figures as its document stores them (classes or a numeric target)."""
    return regression_fields(found.report) if regression else holdout_fields(found.report)


def _headline(found: Any) -> str:
    """The holdout figures of a log line: accuracy, or a regression's RMSE, MAE and R²."""
    if found.accuracy is not None:
        return f"accuracy {found.accuracy:.4f}"
    report = found.report
    return regression_headline(report.get("rmse"), report.get("mae"), report.get("r2"))


def _evaluate_version(svc: Services, job: Job, runtime: JobRuntime,
                      weights: list[Any], version: int, timings: dict[str, Any]) -> str | None:
    """Evaluate a committed version on the holdout, record it on the version (and on the job's
    head while it is still the head), and fail the job if its training has diverged.

    After the commit, not before: workers wait for the next round, not for the evaluation. If
    this fails or the process dies first, the version keeps no accuracy; training is unaffected
    and the export evaluates the final model anyway. Returns the figures for the log line.
    """
    job_id = job.job_id
    started = time.perf_counter()
    try:
        x_eval, y_eval = runtime.holdout(svc.settings.eval_max_rows)
        found = evaluate_detail(runtime.model, weights, x_eval, y_eval, runtime.spec.task)
        figures = _figures(found, runtime.spec.regression)
        assert job.head is not None
        head = job.head.evaluated(found.accuracy, found.loss, figures)
        svc.registry.record_evaluation(
            job_id, version,
            {"holdout_accuracy": found.accuracy, "holdout_loss": found.loss, **figures,
             "evaluated_at": svc.clock(),
             "aggregator": {**timings, "eval_seconds": round(time.perf_counter() - started, 6)}},
            head)
    except Exception:  # noqa: BLE001 - an unevaluated version is still a good version
        log.warning("job %s: could not evaluate v%d", job_id, version, exc_info=True)
        return None
    _watch_health(svc, job, version, found.loss, runtime.spec)
    return _headline(found)


def _watch_health(svc: Services, job: Job, version: int, loss: float,
                  spec: Any) -> None:
    """Record the version's loss in the job's health; fail a diverging job (invariant 9)."""
    before = health.Health.from_dict(job.health)
    chance = spec.target_std ** 2 if spec.regression else None
    after, reason = health.observe(before, version, loss, len(job.classes),
                                   float(job.options["learning_rate"]), chance)
    fields: dict[str, Any] = {"health": after.to_dict()}
    if reason is not None:
        now = svc.clock()
        fields.update(status=jobs.FAILED, phase="failed", error=reason, finished_at=now,
                      updated_at=now)
        log.error("job %s: %s", job.job_id, reason)
    # Only while training: an export or another ending already decided the job's fate.
    svc.registry.update_job_if(job.job_id, {"status": jobs.RUNNING}, fields)


class _Stopwatch:
    """Seconds between successive ``lap`` calls, by name (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 6)
        self._last = now


def _int(value: Any, default: int) -> int:
    try:
        return default if value is None else int(value)
    except (TypeError, ValueError):
        return default


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def export_final(svc: Services, job: Job) -> None:
    """Export the head as ``models/<job>/latest.keras`` (and ``v<N>.keras``), then mark DONE;
    a degenerate final model ends the job FAILED instead (``domain.health``)."""
    runtime = job_runtime(svc, job)
    weights = runtime.weights(job.head.weights_path)
    model = runtime.model
    # the whole holdout, one part at a time: never all of it in memory
    found = evaluate_parts(model, weights, runtime.holdout_parts(), runtime.spec.task)
    manifest = runtime.manifest
    now = svc.clock()
    rate = float(job.options["learning_rate"])
    problem = (health.degenerate_regression(found.loss, rate) if runtime.spec.regression else
               health.degenerate_model(found.predicted_counts, found.true_counts,
                                       manifest.classes, found.loss, rate))
    if problem is not None:
        if jobs.end_job(svc.registry, job.job_id, {
                "status": jobs.FAILED, "phase": "failed", "error": problem, "finished_at": now,
                "updated_at": now})[0]:
            log.error("job %s: %s", job.job_id, problem)
        return
    if jobs.is_terminal(svc.registry.get_job(job.job_id)):
        log.info("job %s ended during its final evaluation: not exported", job.job_id)
        return
    figures = _figures(found, runtime.spec.regression)
    data = export_keras(model, model_sidecar(job, manifest, found.accuracy, figures))
    version = int(job.version)
    bucket = svc.settings.models_bucket
    svc.store.write_bytes(bucket, layout.model_path(job.job_id, version), data,
                          "application/octet-stream")
    svc.store.write_bytes(bucket, layout.model_path(job.job_id), data,
                          "application/octet-stream")
    head = job.head.evaluated(found.accuracy, found.loss, figures)  # the whole holdout's
    ended, current = jobs.end_job(svc.registry, job.job_id, {
        "status": jobs.DONE, "phase": "done", "model_path": layout.model_path(job.job_id),
        "head": head.to_doc(), "finished_at": now, "updated_at": now,
        "final_holdout_rows": found.rows,
    })
    if not ended:  # cancelled during the export: it stays so (the files are its head version)
        log.info("job %s ended (%s) during its export: not marked DONE", job.job_id,
                 current.status if current is not None else None)
        return
    log.info("job %s: DONE at v%d, holdout %s", job.job_id, version, _headline(found))


def model_sidecar(job: Job, manifest: Any, accuracy: float | None,
                  figures: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``bucketlearn.json`` in the exported archive says about the model: its columns,
    classes (or numeric target: ``task``, the target's training mean and std) and figures."""
    return {
        "format": 1,
        "job_id": job.job_id,
        "version": int(job.version),
        "feature_names": manifest.feature_names,
        "label_column": manifest.label_column,
        "class_names": manifest.classes,
        "label_kind": manifest.label_kind,
        "holdout_accuracy": accuracy,
        "options": job.options,
        "source": manifest.source,
        **model_inputs(manifest.columns, manifest.missing_values),
        **target_sidecar(manifest, figures),
    }


def target_sidecar(manifest: Any, figures: dict[str, Any] | None) -> dict[str, Any]:
    """A regression model's part of the sidecar (nothing for classes, as before)."""
    if manifest.target is None:
        return {}
    return {"task": REGRESSION, "target_mean": manifest.target_mean,
            "target_std": manifest.target_std,
            **{k: (figures or {}).get(k) for k in ("holdout_rmse", "holdout_mae", "holdout_r2")}}

