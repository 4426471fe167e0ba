"""The status object every client shows (``bucketlearn status --json``, ``submit --wait``, the
dashboard): a job document's figures under stable keys (documented in docs/CLI.md), and the head
version's holdout report (``head_figures``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bucketlearn.domain.forecast import actual
from bucketlearn.domain.job import Job
from bucketlearn.domain.metrics import beats_majority, confusion_rows, majority_warning
from bucketlearn.domain.search import outstanding, standings
from bucketlearn.domain.target import CLASSIFICATION
from bucketlearn.domain.usage import summary as usage_summary
from bucketlearn.prediction_ports import PredictionRecords

RECENT_PREDICTIONS = 5  # the requests one job's status lists (the dashboard lists more)


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
        # the version the figures and the model are of once DONE: the best by validation
        "model_version": job.head.version if job.head is not None else None,
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
        # a continued job's parent {job_id, version} (and at DONE, ``parent_holdout``: the
        # parent's model's figures on this job's holdout)
        "continued_from": dict(job.continued_from) if job.continued_from else None,
        **head_figures(head, job.classes),
        # numeric targets: the task, how it was decided, the head's RMSE/MAE/R²
        "task": dataset.get("task") or CLASSIFICATION,
        "task_reason": dataset.get("task_reason"),
        "rmse": head.get("holdout_rmse"),
        "mae": head.get("holdout_mae"),
        "r2": head.get("holdout_r2"),
        "missing_targets": dataset.get("missing_targets"),
        # which version the figures above are of (the newest is evaluated off the critical
        # path, so they may be of the one before)
        "evaluated_version": job.head.evaluated_version if job.head is not None else None,
        **training_fields(job),
        **usage_summary(job.usage or {}),
    }
    if job.search:  # a searched job: every candidate, best first, and what the model is
        result.update(candidates=standings(job.search), selected=job.search.get("selected"),
                      search={"count": job.search.get("count"), "rungs": job.search["rungs"],
                              "outstanding": outstanding(job.search)})
    if models_bucket and result["model_path"]:
        result["model_uri"] = f"gs://{models_bucket}/{result['model_path']}"
    return result


def prediction_summary(records: PredictionRecords, job_id: str,
                       models_bucket: str | None = None) -> dict[str, Any]:
    """The job's batch prediction requests for its status (``predictions``): ``count`` (every
    state) and ``recent``, the newest ``RECENT_PREDICTIONS`` records' ``status()`` (with
    ``output_uri`` once DONE, given the bucket). Two reads at most: a count, then, when there is
    any, one limited query."""
    count = records.count_predictions(job_id)
    recent = records.list_predictions(job_id, RECENT_PREDICTIONS) if count else []
    shown = [record.status() for record in recent]
    for entry in shown:
        if models_bucket and entry.get("output"):
            entry["output_uri"] = f"gs://{models_bucket}/{entry['output']}"
    return {"count": count, "recent": shown}


def training_fields(job: Job) -> dict[str, Any]:
    """How training was laid out (``plan``), what each auto option became (``budget``), the
    selection by validation, which columns the exported model relies on (once DONE), and how
    long the plan should train and what it measured (``forecast``, ``actual``)."""
    return {
        "plan": job.plan.to_dict() if job.plan is not None else None,
        "budget": dict(job.budget) if job.budget else None,
        "selection": dict(job.selection) if job.selection else None,
        "validation": (job.dataset or {}).get("validation"),
        "feature_importance": (list(job.feature_importance.get("columns") or [])
                               if job.feature_importance else None),
        "forecast": dict(job.forecast) if job.forecast else None,
        "actual": (actual(job.forecast, job.finished_at if job.is_terminal else job.updated_at,
                          job.version or 0, float((job.usage or {}).get("worker_seconds") or 0),
                          job.tasks_applied, job.is_terminal) if job.forecast else None),
    }


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

