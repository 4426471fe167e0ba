"""The job's pace: the current rate, the tasks left, the ETA and progress (the jobs overview
and the job page's headline use them), the Throughput tab's samples/s and tasks/min over time,
and the plan and its forecast by number of learners."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from bucketlearn.domain.forecast import duration_text, plan_lines
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import DONE
from bucketlearn.domain.recipe import selection_sentence
from bucketlearn.domain.version import Version

RATE_WINDOW_SECONDS = 60.0    # "current rate" = work committed in the last minute
ETA_WINDOW_SECONDS = 120.0    # the ETA extrapolates the throughput of the last two minutes
_BIN_CHOICES = (5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 86400)
THROUGHPUT_COLUMNS = ("time", "samples_per_s", "tasks_per_min")


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
    if job.is_terminal:
        return None
    remaining = remaining_tasks(job)
    if remaining is None:
        return None
    if remaining == 0:
        return 0.0
    per_minute = current_rate(versions, now, window)["tasks_per_min"]
    return remaining * 60.0 / per_minute if per_minute > 0 else None


def average_eta_seconds(job: Job, now: float) -> float | None:
    """Seconds until every planned task is applied, at the job's average rate since training
    started (its counters and ``started_at``: no version read); None when unknown."""
    remaining = remaining_tasks(job)
    if job.is_terminal or remaining is None or job.started_at is None:
        return None
    done = job.tasks_applied + job.tasks_failed
    elapsed = now - job.started_at
    if remaining == 0:
        return 0.0
    return remaining * elapsed / done if done > 0 and elapsed > 0 else None


def progress(job: Job) -> float | None:
    """tasks_applied / tasks_planned in [0, 1] (1 once DONE: a job that stopped early has
    applied fewer than planned); None before the job is split."""
    planned = job.tasks_planned or 0
    if planned <= 0:
        return None
    if job.status == DONE:
        return 1.0
    return min(1.0, job.tasks_applied / planned)


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
    """The plan, the forecast, what the job measured and which version it selected, as the
    CLI's ``status`` says them."""
    lines = plan_lines(summary.get("plan"), summary.get("forecast"), summary.get("actual"))
    chosen = selection_sentence(summary)
    return [*lines, ("selected", chosen)] if chosen else lines
