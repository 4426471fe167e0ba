"""The top of a job's page and its layout: its summary (the status object, with progress and
ETA), the header's status badge and headline rows, the progress bar's text, what the charts
leave out when only the newest versions were read, and the page's tabs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import (
    CANCELLED,
    DONE,
    FAILED,
    QUEUED,
    REJECTED,
    RUNNING,
    TERMINAL,
)
from bucketlearn.domain.target import REGRESSION
from bucketlearn.domain.version import Version
from bucketlearn.usecases.status import status_object
from bucketlearn.views.formats import (
    format_cost_short,
    format_duration,
    format_number,
    format_percent,
)
from bucketlearn.views.jobs_list import reason, source_file
from bucketlearn.views.throughput import eta_seconds, progress, remaining_tasks


def job_summary(job: Job, versions: list[Version], now: float
                ) -> dict[str, Any]:
    """The headline numbers of the job page."""
    status = status_object(job)
    options = job.options
    if status["train_loss"] is None:  # a head set by the export carries no training loss
        status["train_loss"] = next((v.train_loss for v in versions
                                     if v.version == status["model_version"]), None)
    return {
        **status,
        "source": source_file(job),
        "epochs": options.get("epochs"),
        "progress": progress(job),
        "remaining": remaining_tasks(job),
        "eta_seconds": eta_seconds(job, versions, now),
        "reason": reason(job),
        "binary": len(job.classes) == 2,
    }


def lineage_text(summary: Mapping[str, Any]) -> str | None:
    """For a continued job, the job and version it started from, linked to that job's page,
    and (once DONE) the parent's model beside this job's on this job's holdout; None for
    any other job."""
    parent = summary.get("continued_from")
    if not parent:
        return None
    text = f"Continued from [{parent['job_id']}](?job={parent['job_id']}) v{parent['version']}"
    theirs = parent.get("parent_holdout") or {}
    if is_regression(summary) and theirs.get("rmse") is not None:
        return (f"{text}: on this job's holdout its model's RMSE {format_number(theirs['rmse'])}, "
                f"this job's {format_number(summary.get('rmse'))}")
    if theirs.get("accuracy") is not None:
        return (f"{text}: on this job's holdout its model's accuracy "
                f"{format_percent(theirs['accuracy'])}, this job's "
                f"{format_percent(summary.get('accuracy'))}")
    return text


def is_regression(summary: Mapping[str, Any]) -> bool:
    """A ``job_summary`` (or status object) of a numeric target."""
    return summary.get("task") == REGRESSION


# The most figures a headline row holds: each keeps a quarter of the page's width, which shows
# a figure whole at 1280 px with the sidebar open (the browser test measures it)
ROW_FIGURES = 4
STATUS_COLORS = {DONE: "green", RUNNING: "blue", QUEUED: "gray", CANCELLED: "orange",
                 FAILED: "red", REJECTED: "red"}


def status_badge(summary: Mapping[str, Any]) -> tuple[str, str]:
    """The job's status as the page's header shows it: (text, colour)."""
    status = str(summary["status"])
    return status, STATUS_COLORS.get(status, "gray")


def headline_rows(summary: Mapping[str, Any]) -> list[list[tuple[str, str]]]:
    """(label, value) of the job page's headline, from ``job_summary``, in rows of at most
    ``ROW_FIGURES``: where training is (version, or the model's of the last once DONE, epoch,
    train loss) and what it cost, then the
    head's holdout figures (accuracy and macro-F1, ROC AUC for two classes, loss; RMSE, MAE
    and R² for a numeric target). The status is the header's badge (``status_badge``)."""
    figures = ([("Holdout RMSE", format_number(summary.get("rmse"))),
                ("Holdout MAE", format_number(summary.get("mae"))),
                ("Holdout R²", format_number(summary.get("r2")))] if is_regression(summary) else
               [("Holdout accuracy", format_percent(summary["accuracy"])),
                ("Holdout macro-F1", format_number(summary.get("macro_f1"))),
                *([("Holdout ROC AUC", format_number(summary.get("roc_auc")))]
                  if summary.get("binary") else [])])
    model, last = summary.get("model_version"), summary["version"]
    selected = summary["status"] == DONE and model is not None and model != last
    stopped = (summary.get("selection") or {}).get("stop_epoch")
    training = [
        ("Model version", f"{model} of {last}") if selected else
        ("Version", "—" if last is None else str(last)),
        ("Epoch", f"{stopped if selected and stopped else summary['epoch'] or 0} / "
                  f"{summary['epochs'] or '—'}"),
        ("Train loss", format_number(summary["train_loss"])),
        ("Est. cost", format_cost_short((summary.get("cost_usd") or {}).get("total"))),
    ]
    holdout = [*figures, ("Holdout loss", format_number(summary["loss"]))]
    return [row[i:i + ROW_FIGURES] for row in (training, holdout)
            for i in range(0, len(row), ROW_FIGURES)]


# The job page: a header (status, source, the headline), then one tab per part of the page, in
# this order. A part only some jobs have (batch predictions; to come: continued training and a
# model's lineage) is a tab named here, shown for the jobs that have one, and drawn by the
# page's function of that name: the header stays as it is.
JOB_TABS = ("Training", "Throughput", "Workers & tasks", "Usage & cost", "Options & data",
            "Model")
PREDICTIONS_TAB = "Batch predictions"


def job_tabs(job: Job, predictions: int = 0) -> list[str]:
    """The tabs of ``job``'s page, in order: ``JOB_TABS``, then ``PREDICTIONS_TAB`` for a job
    with ``predictions`` (its batch prediction requests) above 0."""
    return [*JOB_TABS, *([PREDICTIONS_TAB] if predictions > 0 else [])]


def progress_text(summary: Mapping[str, Any]) -> str:
    """'6 of 12 tasks applied · ETA 1m 10s' (or '· finished', and why it stopped before its
    last epoch: '· finished: validation stopped improving after epoch 12')."""
    stop = (summary.get("selection") or {}).get("stop_epoch")
    if summary["status"] == DONE and stop is not None and stop < (summary.get("epochs") or 0):
        eta = (f"finished: stopped after epoch {stop} of {summary['epochs']}, validation "
               "stopped improving")
    elif summary["status"] == DONE:
        eta = "finished"
    elif summary["status"] in TERMINAL:
        eta = str(summary["status"]).lower()
    else:
        eta = f"{summary['phase']} · ETA {format_duration(summary['eta_seconds'])}"
    return f"{summary['tasks_applied'] or 0} of {summary['tasks_planned']} tasks applied · {eta}"


def versions_note(job: Job, versions: list[Version]) -> str:
    """What the charts leave out when only the newest versions were read; '' otherwise."""
    if not versions or min(v.version for v in versions) <= 0:
        return ""
    first, newest = min(v.version for v in versions), max(v.version for v in versions)
    total = max(newest, job.version or 0) + 1
    return (f"Charts, throughput and timings show the newest {len(versions)} of the job's "
            f"{total} versions (v{first}–v{newest}); older versions are not shown.")
