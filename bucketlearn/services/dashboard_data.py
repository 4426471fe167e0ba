"""The dashboard's read side: registry documents -> rows and frames the page shows.

Everything here is a plain function of documents (and ``now``), so it is unit-tested without
Streamlit or a backend. ``dashboard/app.py`` only lays the results out. The dashboard never writes
model state; it writes the upload form's CSV (``upload_csv``) and cancels a job with the core's
``cancel.cancel_job``, exactly what the CLI does.

Documents read (field names as written by split.py, aggregator.py and worker.py):

* job: status, phase, file/source, created_at, version, epoch, options, dataset, head,
  tasks_planned, tasks_applied, tasks_failed, started_at, error, error_detail;
* version: version, epoch, created_at, samples, tasks_applied/tasks_failed (task ids),
  holdout_accuracy, holdout_loss, train_loss, and (versions evaluated since they were recorded)
  holdout_macro_f1, holdout_roc_auc, holdout_majority_accuracy, holdout_report;
* task: task_id, epoch, task_index, state, attempts, worker_id, started_at, finished_at,
  fetch_seconds, train_seconds, write_seconds, error;
* worker heartbeat: worker_id, state, last_seen, job_id, task_id, tasks_done.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import pandas as pd

from bucketlearn import layout
from bucketlearn.bootstrap import Services, google_services
from bucketlearn.config import OPTION_SPECS, parse_option
from bucketlearn.domain import job as jobs
from bucketlearn.domain import task as attempt
from bucketlearn.domain.columns import kinds_text
from bucketlearn.domain.forecast import duration_text, plan_lines
from bucketlearn.domain.job import Job, Version
from bucketlearn.domain.metrics import confusion_rows, majority_warning
from bucketlearn.domain.target import CLASSIFICATION, REGRESSION
from bucketlearn.domain.task import TaskRecord
from bucketlearn.ports import BlobStore, Registry
from bucketlearn.services.status import status_object

ALIVE_SECONDS = 30.0          # a worker is alive if its heartbeat is at most this old
# What the page reads, and how often (issue #26, item 7): the newest VERSIONS_SHOWN versions of
# the job shown (enough for its charts and report) and ETA_VERSIONS of each training job in the
# overview (its rate and ETA), the tasks of the current epoch only; the counts come from the job
# document. A query's result is cached for CACHE_SECONDS, longer than the page's refresh, and
# the cache is shared by every session of the process: a tab left open costs a bounded read
# every CACHE_SECONDS, not every version and task of the job every few seconds.
VERSIONS_SHOWN = 200
ETA_VERSIONS = 50
REFRESH_SECONDS = 5.0
CACHE_SECONDS = 10.0
RATE_WINDOW_SECONDS = 60.0    # "current rate" = work committed in the last minute
ETA_WINDOW_SECONDS = 120.0    # the ETA extrapolates the throughput of the last two minutes
TASK_STATES = ("queued", "running", "retrying", "done", "failed")
_BIN_CHOICES = (5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 86400)
_MODEL_FILE_RE = re.compile(r"^v(?P<version>\d{6})\.keras$")
# The upload form (issue #26, item 8): a file of at most UPLOAD_MAX_BYTES (and the deployment's
# max_file_bytes), written under UPLOAD_PREFIX/<random>/ with its base name cut to
# UPLOAD_NAME_CHARS characters.
UPLOAD_MAX_BYTES = 100 * 2**20
UPLOAD_PREFIX = "dashboard/"
UPLOAD_NAME_CHARS = 200

VERSION_COLUMNS = ("version", "epoch", "time", "created_at", "holdout_accuracy",
                   "holdout_macro_f1", "holdout_loss", "train_loss", "samples", "tasks",
                   "holdout_rmse", "holdout_mae", "holdout_r2")  # (the last: numeric targets)
THROUGHPUT_COLUMNS = ("time", "samples_per_s", "tasks_per_min")
TASK_COLUMNS = ("task_id", "epoch", "task_index", "state", "attempts", "worker_id", "started",
                "seconds", "fetch_seconds", "train_seconds", "write_seconds", "rows", "error")


def get_services() -> Services:
    """The dashboard's Services (settings from the environment). Tests replace this function."""
    return google_services()


# --- small helpers -----------------------------------------------------------------------------

def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _int(value: Any) -> int:
    number = _float(value)
    return int(number) if number is not None else 0


def timestamp(value: Any) -> pd.Timestamp | None:
    """Float epoch seconds -> a UTC timestamp (None when missing)."""
    seconds = _float(value)
    return None if seconds is None else pd.Timestamp(seconds, unit="s", tz="UTC")


def format_duration(seconds: float | None) -> str:
    """'45s', '3m 20s', '2h 05m', '1d 3h'; an em dash when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    total = max(0, round(seconds))
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m {total % 60:02d}s"
    if total < 86400:
        return f"{total // 3600}h {total % 3600 // 60:02d}m"
    return f"{total // 86400}d {total % 86400 // 3600}h"


def format_percent(value: Any) -> str:
    number = _float(value)
    return "—" if number is None else f"{number:.1%}"


def format_number(value: Any, digits: int = 4) -> str:
    number = _float(value)
    return "—" if number is None else f"{number:.{digits}f}"


def source_file(job: Job) -> str:
    """The uploaded object, as gs://bucket/name."""
    if job.file:
        return job.file
    source = job.source
    if source.get("bucket") and source.get("name"):
        return f"gs://{source['bucket']}/{source['name']}"
    return ""


def reason(job: Job) -> str:
    """Why a job ended without a model of its own (REJECTED/FAILED), or who cancelled it when
    (CANCELLED), in one plain sentence; '' otherwise."""
    ended = (jobs.REJECTED, jobs.FAILED, jobs.CANCELLED)
    return str(job.error or "") if job.status in ended else ""


def rejection_details(job: Job) -> list[dict[str, str]]:
    """The structured reason of a REJECTED job (file, row, column, expected, found)."""
    detail = job.error_detail or {}
    order = ("file", "row", "column", "message", "expected", "found")
    return [{"field": key, "value": str(detail[key])} for key in order
            if detail.get(key) is not None]


# --- rates, ETA ----------------------------------------------------------------------------------

def _version_times(versions: Iterable[Version]) -> list[tuple[float, Version]]:
    return sorted(((v.created_at, v) for v in versions), key=lambda item: item[0])


def current_rate(versions: Iterable[Version], now: float,
                 window: float = RATE_WINDOW_SECONDS) -> dict[str, float]:
    """Samples/s and tasks/min committed in the last ``window`` seconds.

    The window never reaches back before training started (version 0), so a job that began
    ten seconds ago is not diluted over a whole minute.
    """
    timed = _version_times(versions)
    if not timed:
        return {"samples_per_s": 0.0, "tasks_per_min": 0.0}
    span = min(window, now - timed[0][0])
    if span <= 0:
        return {"samples_per_s": 0.0, "tasks_per_min": 0.0}
    recent = [v for t, v in timed if now - window < t <= now]
    samples = sum(v.samples for v in recent)
    tasks = sum(v.tasks for v in recent)
    return {"samples_per_s": samples / span, "tasks_per_min": tasks * 60.0 / span}


def remaining_tasks(job: Job) -> int | None:
    planned = job.tasks_planned or 0
    if planned <= 0:
        return None
    return max(0, planned - job.tasks_applied - job.tasks_failed)


def eta_seconds(job: Job, versions: Iterable[Version], now: float,
                window: float = ETA_WINDOW_SECONDS) -> float | None:
    """Seconds until every planned task is applied, at the recent rate; None when unknown."""
    if jobs.is_terminal(job):
        return None
    remaining = remaining_tasks(job)
    if remaining is None:
        return None
    if remaining == 0:
        return 0.0
    per_minute = current_rate(versions, now, window)["tasks_per_min"]
    return remaining * 60.0 / per_minute if per_minute > 0 else None


def progress(job: Job) -> float | None:
    """tasks_applied / tasks_planned in [0, 1]; None before the job is split."""
    planned = job.tasks_planned or 0
    if planned <= 0:
        return None
    return min(1.0, job.tasks_applied / planned)


# --- jobs overview -------------------------------------------------------------------------------

def overview_rows(job_docs: Iterable[Job],
                  versions_by_job: Mapping[str, list[Version]], now: float
                  ) -> list[dict[str, Any]]:
    """One row per job, newest first: what the jobs table shows."""
    rows = []
    for job in job_docs:
        job_id = job.job_id
        head = job.head
        eta = eta_seconds(job, versions_by_job.get(job_id, []), now)
        status = job.status
        if status == jobs.DONE:
            eta_text = "finished"
        elif jobs.is_terminal(job):
            eta_text = ""
        else:
            eta_text = format_duration(eta)
        rows.append({
            "job_id": job_id,
            "link": f"?job={job_id}",
            "status": status,
            "phase": str(job.phase or ""),
            "source": source_file(job),
            "created": timestamp(job.created_at),
            "created_at": job.created_at,
            "version": job.version,
            "accuracy": _float(head.holdout_accuracy) if head else None,
            "r2": _float(head.holdout_r2) if head else None,  # a numeric target's (no accuracy)
            "progress": progress(job),
            "tasks": (f"{job.tasks_applied}/{job.tasks_planned}"
                      if job.tasks_planned else ""),
            "eta": eta_text,
            "eta_seconds": eta,
            "reason": reason(job),
        })
    rows.sort(key=lambda r: r["created_at"] or 0.0, reverse=True)
    return rows


def overview_bundle(registry: Registry, limit: int = 100) -> dict[str, Any]:
    """The documents the overview needs: the jobs, and the newest ``ETA_VERSIONS`` versions of
    each job still training (its recent rate, hence its ETA)."""
    job_docs = registry.list_jobs(limit)
    versions = {job.job_id: registry.list_versions(job.job_id, last=ETA_VERSIONS)
                for job in job_docs if not jobs.is_terminal(job) and job.phase == jobs.TRAINING}
    return {"jobs": job_docs, "versions": versions}


# --- one job -----------------------------------------------------------------------------------

def job_bundle(registry: Registry, job_id: str) -> dict[str, Any] | None:
    """The documents the job page shows, read in one go (None if there is no such job): the
    job, its newest ``VERSIONS_SHOWN`` versions, the task documents of its current epoch and
    the workers. Counts over the whole job come from the job's counters, not from documents.

    Figures a version's evaluation is carried by a later version's commit: the newest versions
    read have theirs (the commits carrying them are newer still, or read), while the oldest
    read may lack figures carried by a version not read; its charts start a little later.
    """
    job = registry.get_job(job_id)
    if job is None:
        return None
    return {
        "job": job,
        "versions": registry.list_versions(job_id, last=VERSIONS_SHOWN),
        "tasks": registry.list_tasks(job_id, epoch=job.epoch) if job.epoch >= 1 else [],
        "workers": registry.list_workers(),
    }


def versions_note(job: Job, versions: list[Version]) -> str:
    """What the charts leave out when only the newest versions were read; '' otherwise."""
    if not versions or min(v.version for v in versions) <= 0:
        return ""
    first, newest = min(v.version for v in versions), max(v.version for v in versions)
    total = max(newest, job.version or 0) + 1
    return (f"Charts, throughput and timings show the newest {len(versions)} of the job's "
            f"{total} versions (v{first}–v{newest}); older versions are not shown.")


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


def format_cost(usd: Any) -> str:
    """Dollars for the page: '$0.0123', '< $0.000001' for a trace, '—' when unknown."""
    value = _float(usd)
    if value is None:
        return "—"
    if value == 0:
        return "$0"
    if value < 0.000001:
        return "< $0.000001"
    return f"${value:.2f}" if value >= 1 else f"${value:.6f}".rstrip("0")


# what each counted quantity of ``Job.usage`` is called on the page, in this order
USAGE_LABELS = {
    "worker_seconds": "Learner seconds (on its tasks)",
    "worker_cpu_seconds": "Learner CPU seconds",
    "aggregator_seconds": "Aggregator seconds (folds)",
    "function_invocations": "Function invocations",
    "firestore_reads": "Firestore reads",
    "firestore_writes": "Firestore writes",
    "firestore_deletes": "Firestore deletes",
    "storage_class_a": "Storage writes and listings (class A)",
    "storage_class_b": "Storage reads (class B)",
    "storage_bytes_written": "Storage bytes written",
    "pubsub_messages": "Pub/Sub messages",
    "pubsub_bytes": "Pub/Sub bytes",
}
COST_LABELS = {"learners": "Learners", "aggregator": "Aggregator", "functions": "Functions",
               "firestore": "Firestore", "storage": "Cloud Storage", "pubsub": "Pub/Sub"}


def usage_rows(summary: Mapping[str, Any]) -> list[dict[str, str]]:
    """What the job used (``status --json``'s ``usage``), one row per counted quantity: the
    known ones first, in ``USAGE_LABELS``' order, then any other under its own key."""
    usage = summary.get("usage") or {}
    keys = [k for k in USAGE_LABELS if k in usage] + sorted(k for k in usage
                                                            if k not in USAGE_LABELS)
    rows = []
    for key in keys:
        value = _float(usage[key])
        shown = "—" if value is None else (f"{value:,.1f}" if key.endswith("seconds")
                                           else f"{value:,.0f}")
        rows.append({"used": USAGE_LABELS.get(key, key), "amount": shown})
    return rows


def cost_rows(summary: Mapping[str, Any]) -> list[dict[str, str]]:
    """The estimated cost by item, then the total (``status --json``'s ``cost_usd``)."""
    cost = summary.get("cost_usd") or {}
    rows = [{"item": label, "usd": format_cost(cost.get(key))}
            for key, label in COST_LABELS.items() if key in cost]
    if "total" in cost:
        rows.append({"item": "Total", "usd": format_cost(cost["total"])})
    return rows


def cost_note(summary: Mapping[str, Any]) -> str:
    """Where the dollars come from, said under the table."""
    return (f"An estimate at list prices as of {summary.get('prices_as_of') or 'an unknown date'}"
            " of what this job added: idle instances, storage kept over time, network egress "
            "and free tiers are not in it. The counts come from the job's own processes.")


def forecast_rows(summary: Mapping[str, Any]) -> list[dict[str, str]]:
    """The plan's forecast by number of learners (``status --json``'s ``forecast``), one row
    each, the suggested one marked; then one process. Empty for a job planned before
    forecasts."""
    found = summary.get("forecast") or {}
    suggested = found.get("suggested_workers")
    rows = [{"learners": str(r["workers"]),
             "forecast": duration_text(float(r["seconds"])),
             "": "suggested" if r["workers"] == suggested else ""}
            for r in found.get("by_workers") or []]
    if rows and found.get("one_process_seconds") is not None:
        rows.append({"learners": "one process (train-local)",
                     "forecast": duration_text(float(found["one_process_seconds"])), "": ""})
    return rows


def plan_text(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The plan, the forecast and what the job measured, as the CLI's ``status`` says them."""
    return plan_lines(summary.get("plan"), summary.get("forecast"), summary.get("actual"))


def progress_text(summary: Mapping[str, Any]) -> str:
    """'6 of 12 tasks applied · ETA 1m 10s' (or '· finished')."""
    if summary["status"] == jobs.DONE:
        eta = "finished"
    elif summary["status"] in jobs.TERMINAL:
        eta = str(summary["status"]).lower()
    else:
        eta = f"{summary['phase']} · ETA {format_duration(summary['eta_seconds'])}"
    return f"{summary['tasks_applied'] or 0} of {summary['tasks_planned']} tasks applied · {eta}"


def epoch_progress(job: Job, versions: Iterable[Version],
                   tasks: Iterable[TaskRecord] = ()) -> dict[str, int] | None:
    """Tasks planned/applied/failed in the current epoch: the rounds before the job's current
    one are done (``domain.job.done_tasks``); the versions that folded them say which failed,
    and so do the epoch's task documents (the versions read may not reach back to its start)."""
    if job.epoch < 1 or job.tasks_per_epoch is None:
        return None
    done = (job.tasks_per_epoch if job.status == jobs.DONE
            else len(jobs.done_tasks(job)))
    failed = {t for v in versions if v.epoch == job.epoch for t in v.tasks_failed}
    failed |= {t.task_id for t in tasks if t.epoch == job.epoch and t.state == attempt.FAILED
               and folded(job, t)}
    return {"epoch": job.epoch, "planned": job.tasks_per_epoch,
            "applied": max(0, done - len(failed)), "failed": len(failed)}


def version_frame(versions: Iterable[Version]) -> pd.DataFrame:
    """Accuracy and losses per version (and its commit time), sorted by version."""
    rows = [{
        "version": v.version, "epoch": v.epoch, "time": timestamp(v.created_at),
        "created_at": v.created_at, "train_loss": v.train_loss, "samples": v.samples,
        "tasks": v.tasks,
        **{name: _float(v.figure(name)) for name in ("holdout_accuracy", "holdout_macro_f1",
                                                      "holdout_loss", "holdout_rmse",
                                                      "holdout_mae", "holdout_r2")},
    } for v in versions]
    frame = pd.DataFrame(rows, columns=list(VERSION_COLUMNS))
    for column in ("holdout_accuracy", "holdout_macro_f1", "holdout_loss", "train_loss",
                   "created_at", "holdout_rmse", "holdout_mae", "holdout_r2"):
        frame[column] = frame[column].astype("float64")
    return frame.sort_values("version", kind="stable").reset_index(drop=True)


def evaluated_versions(versions: Iterable[Version]) -> list[int]:
    """Numbers of the versions with a holdout evaluation, newest first (the report picker)."""
    found = [v.version for v in versions
             if _float(v.figure("holdout_accuracy")) is not None
             or _float(v.figure("holdout_rmse")) is not None]
    return sorted(found, reverse=True)


def version_report(version: Version | None, class_names: Iterable[Any]) -> dict[str, Any]:
    """One version's holdout figures beyond accuracy, as the page shows them.

    Keys: ``metrics`` ((label, value) pairs: accuracy, macro-F1, the majority baseline, ROC AUC
    for two classes; "—" for a figure the version does not have), ``warning`` (accuracy not
    above the majority baseline; None otherwise), ``per_class`` (a frame: class, precision,
    recall, F1, holdout rows; empty for a version evaluated before per-class figures were
    recorded), ``confusion`` (a frame, true classes down, predicted across; empty likewise) and
    ``note`` (what the tables leave out, or why there are none).
    """
    figures = version.figures if version is not None else {}
    if figures.get("holdout_rmse") is not None:
        return regression_report(figures)
    names = [str(c) for c in class_names]
    report = figures.get("holdout_report") or {}
    kept = [_int(i) for i in report.get("class_index") or []]
    labels = [names[i] if i < len(names) else str(i) for i in kept]
    majority = report.get("majority_class")
    majority_name = (names[_int(majority)] if majority is not None and _int(majority)
                     < len(names) else None)
    metrics = [("Accuracy", format_percent(figures.get("holdout_accuracy"))),
               ("Macro-F1", format_number(figures.get("holdout_macro_f1"))),
               ("Majority baseline", format_percent(figures.get("holdout_majority_accuracy")))]
    if len(names) == 2:
        metrics.append(("ROC AUC", format_number(figures.get("holdout_roc_auc"))))
    per_class = pd.DataFrame({
        "class": labels,
        "precision": _floats(report.get("precision"), len(labels)),
        "recall": _floats(report.get("recall"), len(labels)),
        "f1": _floats(report.get("f1"), len(labels)),
        "holdout rows": [_int(v) for v in (report.get("support") or [0] * len(labels))],
    }, columns=["class", "precision", "recall", "f1", "holdout rows"])
    rows = confusion_rows(report)
    square = len(rows) == len(labels) > 0 and all(len(row) == len(labels) for row in rows)
    confusion = (pd.DataFrame(rows, index=pd.Index(labels, name="true"),
                              columns=pd.Index(labels, name="predicted"))
                 if square else pd.DataFrame())
    return {
        "metrics": metrics,
        "warning": majority_warning(_float(figures.get("holdout_accuracy")),
                                    _float(figures.get("holdout_majority_accuracy")),
                                    majority_name),
        "per_class": per_class, "confusion": confusion, "note": _report_note(report, labels),
    }


def regression_report(figures: Mapping[str, Any]) -> dict[str, Any]:
    """A numeric target's version (its ``figures``; ``version_report``'s keys): RMSE, MAE, R²
    and the mean squared error; no per-class tables."""
    return {
        "metrics": [("RMSE", format_number(figures.get("holdout_rmse"))),
                    ("MAE", format_number(figures.get("holdout_mae"))),
                    ("R²", format_number(figures.get("holdout_r2"))),
                    ("MSE (loss)", format_number(figures.get("holdout_loss")))],
        "warning": None, "per_class": pd.DataFrame(), "confusion": pd.DataFrame(),
        "note": "A numeric target: RMSE, MAE and R² on the holdout, in the target's units "
                "(R² = 1 − MSE / the holdout target's variance).",
    }


def _floats(values: Any, count: int) -> list[float | None]:
    values = list(values or [])
    return [_float(values[i]) if i < len(values) else None for i in range(count)]


def _report_note(report: Mapping[str, Any], labels: list[str]) -> str:
    if not report:
        return ("No per-class figures for this version (evaluated before they were recorded, "
                "or not evaluated yet).")
    if report.get("truncated"):
        return (f"Per-class figures for the {len(labels)} classes with the most holdout rows, of "
                f"{_int(report.get('classes'))}; the confusion matrix is restricted to them.")
    return ""


def choose_bin_seconds(span: float, target_bins: int = 40) -> int:
    """A round bin width giving about ``target_bins`` bins over ``span`` seconds."""
    wanted = max(span, 1.0) / target_bins
    return next((b for b in _BIN_CHOICES if b >= wanted), _BIN_CHOICES[-1])


def throughput_frame(versions: Iterable[Version], now: float | None = None,
                     bin_seconds: int | None = None) -> pd.DataFrame:
    """Samples/s and tasks/min per time bin, from training start (version 0) to ``now``.

    Empty bins are kept (as zeros) so a stall shows as a drop, not as a straight line.
    """
    timed = _version_times(versions)
    if not timed:
        return pd.DataFrame(columns=list(THROUGHPUT_COLUMNS))
    start = timed[0][0]
    end = max(timed[-1][0], now if now is not None else timed[-1][0])
    width = bin_seconds or choose_bin_seconds(end - start)
    count = int((end - start) // width) + 1
    index = np.array([min(int((t - start) // width), count - 1) for t, _ in timed])
    samples = np.bincount(index, weights=[v.samples for _, v in timed],
                          minlength=count)
    tasks = np.bincount(index, weights=[v.tasks for _, v in timed], minlength=count)
    times = pd.to_datetime(start + np.arange(count) * width, unit="s", utc=True)
    return pd.DataFrame({"time": times, "samples_per_s": samples / width,
                         "tasks_per_min": tasks * 60.0 / width})


# --- workers and tasks ---------------------------------------------------------------------------

def is_alive(worker: Mapping[str, Any], now: float, alive_seconds: float = ALIVE_SECONDS) -> bool:
    seen = _float(worker.get("last_seen"))
    return seen is not None and now - seen <= alive_seconds and worker.get("state") != "stopped"


def worker_rows(workers: Iterable[Mapping[str, Any]], now: float, job_id: str | None = None,
                alive_seconds: float = ALIVE_SECONDS) -> list[dict[str, Any]]:
    """One row per worker: alive or not, and what it is doing (alive first)."""
    rows = []
    for worker in workers:
        alive = is_alive(worker, now, alive_seconds)
        state = str(worker.get("state") or "")
        seen = _float(worker.get("last_seen"))
        if not alive:
            doing = "stopped" if state == "stopped" else "gone (no heartbeat)"
        elif state == "busy" and worker.get("task_id"):
            doing = f"training {worker['task_id']}"
        else:
            doing = state or "idle"
        rows.append({
            "worker_id": str(worker.get("worker_id") or ""),
            "alive": alive,
            "doing": doing,
            "job_id": worker.get("job_id") if alive else None,
            "this_job": bool(alive and job_id and worker.get("job_id") == job_id),
            "tasks_done": _int(worker.get("tasks_done")),
            "last_seen_ago": format_duration(now - seen) if seen is not None else "—",
        })
    rows.sort(key=lambda r: (not r["alive"], not r["this_job"], r["worker_id"]))
    return rows


def alive_count(workers: Iterable[Mapping[str, Any]], now: float,
                alive_seconds: float = ALIVE_SECONDS) -> int:
    return sum(is_alive(w, now, alive_seconds) for w in workers)


_STATE_NAMES = {attempt.RUNNING: "running", attempt.RETRYING: "retrying",
                attempt.TRAINED: "done", "APPLIED": "done", attempt.FAILED: "failed"}


def folded(job: Job, task: TaskRecord) -> bool:
    """Whether the job has folded the task's round (applied the task, or given up on it)."""
    return (job.status == jobs.DONE or task.epoch < job.epoch
            or (task.epoch == job.epoch and task.task_index in jobs.done_tasks(job)))


def shown_state(job: Job, task: TaskRecord) -> str:
    """A task's state as the page shows it: a learner writes its task's document once, when it
    starts an attempt, so a task of a round the job has folded shows as APPLIED (TRAINED on
    older documents), whatever its document last said."""
    if task.state in (attempt.FAILED,):
        return task.state
    return "APPLIED" if folded(job, task) else task.state


def task_state_counts(job: Job, tasks: Iterable[TaskRecord]) -> dict[str, int]:
    """queued (planned but never started), running, retrying, done, failed, over the whole job.

    The folded tasks are counted by the job's counters (``tasks_applied``, ``tasks_failed``);
    ``tasks`` (the current epoch's documents) add what its rounds not folded yet are doing
    (running, retrying, trained and waiting for the fold: done, given up on: failed)."""
    counts = dict.fromkeys(TASK_STATES, 0)
    counts["done"], counts["failed"] = job.tasks_applied, job.tasks_failed
    for task in tasks:
        key = _STATE_NAMES.get(task.state)
        if key and task.epoch == job.epoch and not folded(job, task):
            counts[key] += 1
    counts["queued"] = max(0, (job.tasks_planned or 0) - sum(counts.values()))
    return counts


def task_frame(job: Job, tasks: Iterable[TaskRecord], versions: Iterable[Version],
               now: float) -> pd.DataFrame:
    """Per-task timings, most recently started first. ``seconds`` runs on for a RUNNING task;
    a folded task's phase timings come from the version that folded it (``task_stats``)."""
    tasks = list(tasks)
    stats = task_stats(versions)
    rows = [{
        "task_id": task.task_id, "epoch": task.epoch, "task_index": task.task_index,
        "state": shown_state(job, task), "attempts": task.attempts,
        "worker_id": task.worker_id,
        "started": timestamp(task.started_at), "seconds": task.busy_seconds(now),
        **{f"{phase}_seconds": _float(stats.get(task.task_id, {}).get(f"{phase}_seconds"))
           if task.phase_seconds(phase) is None else task.phase_seconds(phase)
           for phase in attempt.PHASES},
        "rows": task.rows, "error": task.error or "",
    } for task in tasks]
    frame = pd.DataFrame(rows, columns=list(TASK_COLUMNS))
    for column in ("seconds", "fetch_seconds", "train_seconds", "write_seconds"):
        frame[column] = frame[column].astype("float64")
    frame["_started"] = [t.started_at or 0.0 for t in tasks]
    frame = frame.sort_values(["_started", "task_id"], ascending=[False, True], kind="stable")
    return frame.drop(columns="_started").reset_index(drop=True)


def task_stats(versions: Iterable[Version]) -> dict[str, Mapping[str, Any]]:
    """What each folded task's learner measured, by task id (``Version.task_stats``)."""
    return {task_id: stats for version in versions
            for task_id, stats in version.task_stats.items()}


def timing_summary(versions: Iterable[Version]) -> pd.DataFrame:
    """Median, 90th percentile and max of fetch/train/write seconds over folded tasks (as
    their learners measured them; the versions record it)."""
    trained = list(task_stats(list(versions)).values())
    rows = []
    for phase in attempt.PHASES:
        values = [v for v in (_float(t.get(f"{phase}_seconds")) for t in trained)
                  if v is not None]
        if values:
            rows.append({"phase": phase, "tasks": len(values),
                         "median_s": float(np.median(values)),
                         "p90_s": float(np.percentile(values, 90)), "max_s": float(max(values))})
    return pd.DataFrame(rows, columns=["phase", "tasks", "median_s", "p90_s", "max_s"])


# --- options and dataset facts -----------------------------------------------------------------

def option_rows(job: Job) -> list[dict[str, str]]:
    """The job's options (every OPTION_SPECS entry), marking those that differ from the default."""
    options = job.options
    rows = []
    for spec in OPTION_SPECS:
        value = options.get(spec.name, spec.default)
        rows.append({"option": spec.name, "value": "" if value is None else str(value),
                     "default": "" if spec.default is None else str(spec.default),
                     "changed": "yes" if value != spec.default else ""})
    return rows


def dataset_facts(job: Job) -> dict[str, Any]:
    """Rows, columns, classes and shards of the job's dataset (empty before the split)."""
    dataset = job.dataset or {}
    if not dataset:
        return {}
    classes = list(dataset.get("classes") or [])
    features = _int(dataset.get("features"))
    shown = ", ".join(str(c) for c in classes[:20]) + (" …" if len(classes) > 20 else "")
    return {
        "rows": _int(dataset.get("rows")),
        "train rows": _int(dataset.get("train_rows")),
        "holdout rows": _int(dataset.get("holdout_rows")),
        "columns": features + 1,
        "feature columns": features,
        "feature kinds": column_kinds(job),
        "label column": str(dataset.get("label_column") or ""),
        "classes": len(classes),
        "class names": shown,
        "shards": _int(dataset.get("shards")),
        "tasks per epoch": job.tasks_per_epoch or 0,
        **target_facts(dataset),
    }


def target_facts(dataset: Mapping[str, Any]) -> dict[str, Any]:
    """How the label column was taken (issue #15), and a numeric target's statistics."""
    facts: dict[str, Any] = {"task": str(dataset.get("task") or CLASSIFICATION)}
    if dataset.get("task_reason"):
        facts["task decided"] = str(dataset["task_reason"])
    if dataset.get("task") == REGRESSION:
        facts.update({"target mean (training rows)": _float(dataset.get("target_mean")),
                      "target std (training rows)": _float(dataset.get("target_std")),
                      "rows without a target (left out)": _int(dataset.get("missing_targets")),
                      "stratified by": f"{len(dataset.get('bin_counts') or [])} quantile bins"})
    return facts


def column_rows(job: Job) -> list[dict[str, str]]:
    """The feature columns worth naming (text, dates, missing cells) and those left out, with
    why; empty for a table of complete numbers (and for jobs split before column kinds)."""
    dataset = job.dataset or {}
    columns = dataset.get("columns") or {}
    rows = []
    for column in columns.get("detail") or []:
        kind = str(column.get("kind") or "")
        note = (f"{_int(column.get('categories'))} categories of "
                f"{_int(column.get('distinct'))} distinct values" if kind == "category" else "")
        rows.append({"column": str(column.get("name")), "kind": kind,
                     "missing cells": str(_int(column.get("missing"))), "note": note})
    for dropped in dataset.get("dropped_columns") or []:
        rows.append({"column": str(dropped.get("name")), "kind": "left out",
                     "missing cells": "", "note": str(dropped.get("reason") or "")})
    return rows


def column_kinds(job: Job) -> str:
    """Kept feature columns by kind, e.g. '2 category, 1 datetime, 2 numeric'."""
    return kinds_text(((job.dataset or {}).get("columns") or {}).get("kinds") or {})


# --- model downloads ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelFile:
    """One exported ``.keras`` model in the models bucket."""

    path: str
    version: int | None  # None: latest.keras
    size: int

    @property
    def label(self) -> str:
        return "latest" if self.version is None else f"v{self.version}"

    @property
    def file_name(self) -> str:
        job_id = self.path.split("/")[1] if self.path.count("/") >= 2 else "model"
        return f"{job_id}-{self.label}.keras"


def model_files(store: BlobStore, models_bucket: str, job_id: str) -> list[ModelFile]:
    """Exported models of a job: latest first, then numbered versions, newest first."""
    latest = layout.model_path(job_id)
    prefix = latest.rsplit("/", 1)[0] + "/"
    found = []
    for info in store.list(models_bucket, prefix):
        base = info.name[len(prefix):]
        if info.name == latest:
            found.append(ModelFile(info.name, None, info.size))
        elif (match := _MODEL_FILE_RE.match(base)) is not None:
            found.append(ModelFile(info.name, int(match["version"]), info.size))
    return sorted(found, key=lambda f: (f.version is not None, -(f.version or 0)))


def download_note(job: Job, versions: Iterable[Version],
                  files: list[ModelFile]) -> str:
    """Which versions can be downloaded, and why the others cannot."""
    exported = {f.version for f in files if f.version is not None}
    numbers = (list(range(job.version + 1)) if job.version is not None  # versions are dense
               else sorted(v.version for v in versions))
    missing = [n for n in numbers if n not in exported]
    if job.status == jobs.CANCELLED and not files:
        if job.version is None:
            return "This job was cancelled before its first version: there is no model."
        return (f"This job was cancelled at v{job.version}. Its model is built from that "
                "version's stored weights when you download it (or run `bucketlearn download "
                f"{job.job_id}`).")
    if not any(f.version is None for f in files):
        if job.status in (jobs.REJECTED, jobs.FAILED):
            return "This job ended without a model, so there is nothing to download."
        return ("No model exported yet: the final version is exported as "
                f"{layout.model_path(job.job_id)} when training finishes.")
    if not missing:
        return ""
    span = f"v{missing[0]}" if len(missing) == 1 else f"v{missing[0]}–v{missing[-1]}"
    if len(missing) != missing[-1] - missing[0] + 1:
        span = f"{len(missing)} versions"
    return (f"Only exported versions can be downloaded; {span} exist only as internal "
            "training weights (no .keras export), so only the latest model is offered for them.")


# --- cancel ------------------------------------------------------------------------------------

IAP_USER_HEADER = "X-Goog-Authenticated-User-Email"  # "accounts.google.com:alice@example.com"


def canceller(headers: Mapping[str, str] | None) -> str:
    """Who cancels a job from the dashboard, as the job records it: the signed-in user when
    Identity-Aware Proxy names one, else just "the dashboard"."""
    found = {k.lower(): v for k, v in (headers or {}).items()}.get(IAP_USER_HEADER.lower())
    user = str(found or "").rsplit(":", 1)[-1].strip()
    user = "".join(ch for ch in user if ch.isprintable())[:200]
    return f"{user} (dashboard)" if user else "the dashboard"


def cancel_prompt(job: Job) -> str:
    """What the confirmation step says will happen."""
    version = job.version
    kept = (f"its last version, v{version}, stays downloadable" if version is not None
            else "it has no model version yet, so it will end without a model")
    return (f"Cancel job `{job.job_id}`? It ends as CANCELLED: workers skip its tasks "
            f"and no new version is made; {kept}. This cannot be undone.")


# --- upload ------------------------------------------------------------------------------------

def option_metadata(raw: Mapping[str, Any]) -> dict[str, str]:
    """Form values -> object metadata. Blank means default (left out); bad values raise
    ConfigError naming the option, as the CLI does."""
    metadata = {}
    for name, value in raw.items():
        if value is None or str(value).strip() == "":
            continue
        metadata[name] = str(parse_option(name, value, "upload form"))
    return metadata


def upload_object_name(file_name: str) -> str:
    """A sanitized base name for an uploaded file: no folders, printable, at most
    ``UPLOAD_NAME_CHARS`` characters, ending in .csv."""
    base = re.split(r"[\\/]", file_name.strip())[-1].strip()
    base = "".join(ch for ch in base if ch.isprintable()) or "upload.csv"
    suffix = base[-4:] if base.lower().endswith(".csv") else ".csv"
    stem = base[:-4] if base.lower().endswith(".csv") else base
    return (stem or "upload")[:UPLOAD_NAME_CHARS - 4] + suffix


def upload_object_path(file_name: str) -> str:
    """Where the upload form writes a file: ``dashboard/<16 random hex>/<sanitized name>``, so
    two people uploading the same name never overwrite each other (issue #26, item 3)."""
    return f"{UPLOAD_PREFIX}{layout.new_nonce()}/{upload_object_name(file_name)}"


def upload_limit_bytes(settings: Any) -> int:
    """The largest file the upload form takes: the deployment's ``max_file_bytes``, and at most
    ``UPLOAD_MAX_BYTES`` (Streamlit holds an upload in the dashboard's memory until it is
    written; larger files go through ``bucketlearn submit`` or straight to the bucket)."""
    return min(int(settings.limits.max_file_bytes), UPLOAD_MAX_BYTES)


def upload_limit_mb(settings: Any) -> int:
    """``upload_limit_bytes`` in Streamlit's unit (``max_upload_size``: whole MB of 2**20 bytes,
    rounded down, at least 1)."""
    return max(1, upload_limit_bytes(settings) // 2**20)


def upload_size_problem(settings: Any, size: int) -> str | None:
    """Why the form refuses a file of ``size`` bytes (None: it takes it)."""
    limit = upload_limit_bytes(settings)
    if size <= limit:
        return None
    return (f"expected a file of at most {limit:,} bytes here; found {size:,} bytes. Upload "
            "larger files with `bucketlearn submit` or straight to the uploads bucket.")


def upload_csv(svc: Services, file_name: str, stream: IO[bytes], size: int,
               metadata: Mapping[str, str]) -> tuple[str, str]:
    """Write an uploaded CSV to the uploads bucket with its options, streamed from ``stream``
    (no second copy in memory) under a name of its own (``upload_object_path``); return
    (job id, gs:// uri). The upload function picks the object up from there, exactly as for
    ``bucketlearn submit``.

    Raises:
        ValueError: the file is larger than the form takes (``upload_size_problem``).
    """
    problem = upload_size_problem(svc.settings, size)
    if problem is not None:
        raise ValueError(problem)
    bucket = svc.settings.uploads_bucket
    name = upload_object_path(file_name)
    info = svc.store.write_stream(bucket, name, stream, "text/csv", dict(metadata), size=size)
    return layout.job_id_for(bucket, name, info.generation), f"gs://{bucket}/{name}"


# --- user strings on the page ----------------------------------------------------------------

_MARKDOWN_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character


def plain(value: Any) -> str:
    """A string from users (object, column and class names, reasons, a URL parameter, an
    error's text) made safe to put into Markdown (``st.error``, ``st.caption``, ...): every
    ASCII punctuation character backslash-escaped (CommonMark allows it for each), so the
    string shows as the text it is, never as a link, an image, emphasis or a directive, and
    line breaks as spaces, so it opens no block."""
    text = re.sub(r"\s*[\r\n]+\s*", " ", str(value))
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def wanted_job(param: str | None) -> tuple[str | None, str | None]:
    """The ``?job=`` parameter: (the job id, None) when it is one, (None, what to say) when it
    is not (it is shown as text, never looked up)."""
    if not param:
        return None, None
    if layout.is_job_id(param):
        return param, None
    return None, f"The link names no job: {plain(param[:200])} is not a job id."
