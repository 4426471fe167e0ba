"""Job document shapes and the status object every client (CLI, dashboard) shows."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bucketlearn import layout
from bucketlearn.domain.forecast import actual

# The vocabulary and the rules live in the domain; re-exported here for the services.
from bucketlearn.domain.job import (  # noqa: F401
    CANCELLED,
    CANCELLED_PHASE,
    DONE,
    DONE_PHASE,
    EXPORTING,
    FAILED,
    FAILED_PHASE,
    QUEUED,
    REJECTED,
    REJECTED_PHASE,
    RUNNING,
    SPLITTING,
    STATUSES,
    TERMINAL,
    TRAINING,
    Job,
    commit_refusal,
    done_tasks,
    ending_fields,
    is_terminal,
    round_key,
)
from bucketlearn.domain.metrics import beats_majority, confusion_rows, majority_warning
from bucketlearn.domain.plan import TrainingPlan, epoch_tasks
from bucketlearn.domain.target import CLASSIFICATION
from bucketlearn.domain.usage import summary as usage_summary
from bucketlearn.errors import TransientError, UnreachableError
from bucketlearn.ports import TaskMessage

END_ATTEMPTS = 20  # conditional writes of an ending before giving up (the job kept changing)


def end_job(registry: Any, job_id: str, fields: Mapping[str, Any],
            attempts: int = END_ATTEMPTS) -> tuple[bool, Job | None]:
    """Write ``fields`` (an ending, built by ``ending_fields``) unless the job has ended
    already, so no ending ever overwrites another (a cancel, a rejection, DONE).

    A conditional update on the status and phase just read; when something else wrote the job
    in between, it reads again and retries.

    Returns:
        (True, the document before this ending) when this call ended the job; (False, the
        current document) when it had ended already; (False, None) when there is no such job.

    Raises:
        TransientError: the job kept changing for ``attempts`` reads in a row.
    """
    for attempt in range(attempts):
        job = registry.get_job(job_id)
        if job is None or is_terminal(job):
            return False, job
        if registry.update_job_if(job_id, {"status": job.status,
                                           "phase": job.phase}, fields):
            return True, job
        time.sleep(min(0.02 * (attempt + 1), 0.2))
    raise TransientError(f"job {job_id}: its document changed on each of {attempts} attempts to "
                         f"end it as {fields.get('status')}; try again")


class _Read:
    """One ``get_job`` in a daemon thread, so that a caller can stop waiting for it: a Google
    client retries a read for minutes (Firestore's ``BatchGetDocuments``: 300 s) when its
    backend is gone, longer than a watch may wait. An abandoned read ends by itself."""

    def __init__(self, registry: Any, job_id: str) -> None:
        self.done = threading.Event()
        self.job: Job | None = None
        self.error: Exception | None = None
        threading.Thread(target=self._run, args=(registry, job_id), daemon=True,
                         name=f"read-job-{job_id}").start()

    def _run(self, registry: Any, job_id: str) -> None:
        try:
            self.job = registry.get_job(job_id)
        except Exception as exc:  # noqa: BLE001 - handed to the waiting thread, which raises it
            self.error = exc
        finally:
            self.done.set()


class _ReadTimedOut(Exception):
    """A read did not answer within its budget (``_read_within``)."""


def _read_within(registry: Any, job_id: str, budget: float, poll: float,
                 check: Callable[[], None] | None) -> Job | None:
    """The job, read within ``budget`` seconds (else _ReadTimedOut); ``check`` runs every
    ``poll`` seconds while the read is out, so a gone stack ends the wait at once."""
    read = _Read(registry, job_id)
    end = time.monotonic() + max(0.0, budget)
    while not read.done.wait(max(0.0, min(poll, end - time.monotonic()))):
        if time.monotonic() >= end:
            raise _ReadTimedOut
        if check is not None:
            check()
    if read.error is not None:
        raise read.error
    return read.job


def wait_terminal(registry: Any, job_id: str, timeout: float, poll: float = 0.5,
                  on_update: Callable[[Job], None] | None = None,
                  check: Callable[[], None] | None = None,
                  unreachable_after: float | None = None) -> Job | None:
    """Read the job every ``poll`` seconds until it has ended (DONE, REJECTED, FAILED or
    CANCELLED) or ``timeout`` passes; return the last document read (None if the job never
    appeared).

    Args:
        on_update: sees every document read.
        check: runs before every read, and every ``poll`` seconds while a read is out; it
            raises when whatever serves the job is gone (the CLI's watch on the local stack),
            which ends the wait.
        unreachable_after: a read that fails with a TransientError is retried until reads have
            failed for this many seconds in a row, then UnreachableError ends the wait (None:
            the first such error does). A read still unanswered when that budget (or the
            timeout) runs out is abandoned: each read is bounded by what is left of the watch's
            budget, whatever the client's own retries would do.
    """
    deadline = time.monotonic() + timeout
    job: Job | None = None
    failing_since: float | None = None
    while time.monotonic() < deadline:
        if check is not None:
            check()
        started = time.monotonic()
        budget = deadline - started
        if unreachable_after is not None:
            budget = min(budget, unreachable_after - (started - (failing_since or started)))
        try:
            job = _read_within(registry, job_id, budget, poll, check)
        except (TransientError, _ReadTimedOut) as exc:
            now = time.monotonic()
            failing_since = started if failing_since is None else failing_since
            if unreachable_after is None and isinstance(exc, TransientError):
                raise
            if unreachable_after is not None and now - failing_since >= unreachable_after:
                last = (f"last error: {exc}" if isinstance(exc, TransientError) else
                        f"a read was still unanswered after {now - started:.0f} s")
                raise UnreachableError(f"job {job_id}: the registry has not answered for "
                                       f"{now - failing_since:.0f} s (expected an answer within "
                                       f"{unreachable_after:.0f} s); {last}") from exc
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
            continue
        failing_since = None
        if job is not None and on_update is not None:
            on_update(job)
        if is_terminal(job):
            break
        time.sleep(poll)
    return job


def status_object(job: Job, models_bucket: str | None = None) -> dict[str, Any]:
    """The status a user sees (``bucketlearn status --json``); stable keys, documented in README."""
    dataset = job.dataset or {}
    options = job.options
    head = job.head.to_doc() if job.head is not None else {}
    result: dict[str, Any] = {
        "job_id": job.job_id,
        "status": job.status,
        "phase": job.phase,
        "version": job.version,
        "epoch": job.epoch,
        "epochs": options.get("epochs"),
        "accuracy": head.get("holdout_accuracy"),
        "loss": head.get("holdout_loss"),
        "train_loss": head.get("train_loss"),
        "tasks_planned": job.tasks_planned,
        "tasks_applied": job.tasks_applied,
        "tasks_failed": job.tasks_failed,
        "samples_seen": job.samples_seen,
        "error": job.error,
        "error_detail": job.error_detail,
        "cancelled_by": job.cancelled_by,
        "cancel_reason": job.cancel_reason,
        "source": job.source,
        "classes": dataset.get("classes"),
        "rows": dataset.get("rows"),
        "columns": dataset.get("columns"),
        "dropped_columns": dataset.get("dropped_columns"),
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "finished_at": job.finished_at,
        "model_path": job.model_path,
        **head_figures(head, job.classes),
        # numeric targets (issue #15): the task, how it was decided, the head's RMSE/MAE/R²
        "task": dataset.get("task") or CLASSIFICATION,
        "task_reason": dataset.get("task_reason"),
        "rmse": head.get("holdout_rmse"),
        "mae": head.get("holdout_mae"),
        "r2": head.get("holdout_r2"),
        "missing_targets": dataset.get("missing_targets"),
        # which version the figures above are of (the newest is evaluated off the critical
        # path, so they may be of the one before)
        "evaluated_version": job.head.evaluated_version if job.head is not None else None,
        # how training was laid out, and what the job used and cost (issue #24)
        "plan": dict(job.plan) if job.plan else None,
        **usage_summary(job.usage or {}),
        # how long the plan should train, on how many learners, and what it measured (#25)
        "forecast": dict(job.forecast) if job.forecast else None,
        "actual": (actual(job.forecast, job.finished_at if job.is_terminal else job.updated_at,
                          job.version or 0, float((job.usage or {}).get("worker_seconds") or 0),
                          job.tasks_applied, job.is_terminal) if job.forecast else None),
    }
    if models_bucket and result["model_path"]:
        result["model_uri"] = f"gs://{models_bucket}/{result['model_path']}"
    return result


def head_figures(head: Mapping[str, Any], class_names: Sequence[Any]) -> dict[str, Any]:
    """The head version's figures beyond accuracy, for the status object: macro-F1, the
    majority-class baseline (and the class), ROC AUC (two classes), per-class precision and
    recall, the confusion matrix (rows: true class, columns: predicted, in ``report_classes``
    order) and a ``warning`` when the accuracy is not above the majority baseline. None (or
    empty) for a head not evaluated yet or evaluated before these figures were recorded."""
    report = head.get("holdout_report") or {}
    kept = [int(i) for i in report.get("class_index") or []]
    names = [str(class_names[i]) if i < len(class_names) else str(i) for i in kept]
    majority = report.get("majority_class")
    majority_name = (str(class_names[int(majority)]) if majority is not None
                     and int(majority) < len(class_names) else majority)
    return {
        "macro_f1": head.get("holdout_macro_f1"),
        "majority_accuracy": head.get("holdout_majority_accuracy"),
        "majority_class": majority_name,
        "roc_auc": head.get("holdout_roc_auc"),
        "beats_majority": beats_majority(head.get("holdout_accuracy"),
                                         head.get("holdout_majority_accuracy")),
        "warning": majority_warning(head.get("holdout_accuracy"),
                                    head.get("holdout_majority_accuracy"), majority_name),
        "report_classes": names,
        "report_truncated": bool(report.get("truncated")),
        "precision": dict(zip(names, report.get("precision") or [], strict=False)),
        "recall": dict(zip(names, report.get("recall") or [], strict=False)),
        "confusion": confusion_rows(report),
    }


def round_position(job: Job) -> dict[str, Any]:
    """Where a job is in its training (epoch, round, version), as its document stores them:
    what a write about its current round expects to find unchanged."""
    return {"epoch": job.epoch, "round": job.round, "version": job.version}


def job_plan(job: Job) -> TrainingPlan:
    return TrainingPlan.from_dict(job.plan)


def round_messages(job: Job, shards: Sequence[Any],
                   task_indices: Sequence[int] | None = None) -> list[TaskMessage]:
    """The task messages of the job's current round (or of ``task_indices`` in it), each naming
    the head version it trains from and the share of the job its round spans.

    Args:
        job: the job document (its plan, options, epoch, round and head).
        shards: the manifest's shards (``ingest.manifest.Shard``), in shard order.
        task_indices: only these tasks of the round (a retry); all of them when None.
    """
    head = job.head
    if head is None or job.training_plan is None:
        raise ValueError(f"job {job.job_id} has no head version to train from (not split yet)")
    return position_messages(job, shards, job.epoch, job.round, head.version, head.weights_path,
                             head.digest, task_indices)


def position_messages(job: Job, shards: Sequence[Any], epoch: int, round_index: int,
                      base_version: int, weights_path: str, base_digest: str,
                      task_indices: Sequence[int] | None = None) -> list[TaskMessage]:
    """The task messages of round ``round_index`` of ``epoch`` from the version named (the
    current round's from the head, or, for a learner chaining at R = 1, the next round's from
    the state its task ended with, which the fold makes the next version)."""
    plan = job.training_plan
    assert plan is not None
    tasks = epoch_tasks(plan, len(shards), int(job.options["seed"]), epoch)
    span = plan.span(epoch, round_index)
    wanted = plan.round_range(round_index) if task_indices is None else task_indices
    messages = []
    for task_index in wanted:
        members = [shards[i] for i in tasks[task_index]]
        messages.append(TaskMessage(
            job_id=job.job_id, epoch=epoch, task_index=int(task_index),
            parts=tuple(part for shard in members for part in shard.parts),
            rows=sum(int(shard.rows) for shard in members), round=round_index,
            base_version=base_version, weights_path=weights_path, span=span,
            base_digest=base_digest))
    return messages


def current_round_tasks(job: Job) -> range:
    """The task indices (within the epoch) of the job's current round."""
    return job_plan(job).round_range(job.round)


def task_doc_id(job_id: str, epoch: int, task_index: int) -> str:
    return layout.task_id_for(job_id, epoch, task_index).split(":", 1)[1]
