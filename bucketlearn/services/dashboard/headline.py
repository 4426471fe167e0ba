"""The top of a job's page: its summary (the status object, with progress and ETA), the
metric row, the progress bar's text, and what the charts leave out when only the newest
versions were read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bucketlearn.domain.job import DONE, TERMINAL, Job
from bucketlearn.domain.target import REGRESSION
from bucketlearn.domain.version import Version
from bucketlearn.services.dashboard.formats import (
    format_cost,
    format_duration,
    format_number,
    format_percent,
)
from bucketlearn.services.dashboard.jobs_list import reason, source_file
from bucketlearn.services.dashboard.throughput import eta_seconds, progress, remaining_tasks
from bucketlearn.services.status import status_object


def job_summary(job: Job, versions: list[Version], now: float
                ) -> dict[str, Any]:
    """The headline numbers of the job page."""
    status = status_object(job)
    options = job.options
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


def is_regression(summary: Mapping[str, Any]) -> bool:
    """A ``job_summary`` (or status object) of a numeric target (issue #15)."""
    return summary.get("task") == REGRESSION


def headline_metrics(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) of the job page's metric row, from ``job_summary``: accuracy and
    macro-F1 for classes, RMSE, MAE and R² for a numeric target."""
    figures = ([("Holdout RMSE", format_number(summary.get("rmse"))),
                ("Holdout MAE", format_number(summary.get("mae"))),
                ("Holdout R²", format_number(summary.get("r2")))] if is_regression(summary) else
               [("Holdout accuracy", format_percent(summary["accuracy"])),
                ("Holdout macro-F1", format_number(summary.get("macro_f1"))),
                *([("Holdout ROC AUC", format_number(summary.get("roc_auc")))]
                  if summary.get("binary") else [])])
    return [
        ("Status", str(summary["status"])),
        ("Version", "—" if summary["version"] is None else str(summary["version"])),
        ("Epoch", f"{summary['epoch'] or 0} / {summary['epochs'] or '—'}"),
        *figures,
        ("Holdout loss", format_number(summary["loss"])),
        ("Train loss", format_number(summary["train_loss"])),
        ("Est. cost", format_cost((summary.get("cost_usd") or {}).get("total"))),
    ]


def progress_text(summary: Mapping[str, Any]) -> str:
    """'6 of 12 tasks applied · ETA 1m 10s' (or '· finished')."""
    if summary["status"] == DONE:
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
