"""The Workers & tasks tab: which workers are alive and what they do, the tasks' states over
the whole job and in the current epoch, and the per-task timings."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from bucketlearn.domain import task as attempt
from bucketlearn.domain.job import Job, done_tasks
from bucketlearn.domain.lifecycle import DONE
from bucketlearn.domain.task import TaskRecord
from bucketlearn.domain.version import Version
from bucketlearn.views.formats import as_float, as_int, format_duration, timestamp

ALIVE_SECONDS = 30.0          # a worker is alive if its heartbeat is at most this old
TASK_STATES = ("queued", "running", "retrying", "done", "failed")
TASK_COLUMNS = ("task_id", "epoch", "task_index", "state", "attempts", "worker_id", "started",
                "seconds", "fetch_seconds", "train_seconds", "write_seconds", "rows", "error")


def is_alive(worker: Mapping[str, Any], now: float, alive_seconds: float = ALIVE_SECONDS) -> bool:
    seen = as_float(worker.get("last_seen"))
    return seen is not None and now - seen <= alive_seconds and worker.get("state") != "stopped"


def worker_rows(workers: Iterable[Mapping[str, Any]], now: float, job_id: str | None = None,
                alive_seconds: float = ALIVE_SECONDS) -> list[dict[str, Any]]:
    """One row per worker: alive or not, and what it is doing (alive first)."""
    rows = []
    for worker in workers:
        alive = is_alive(worker, now, alive_seconds)
        state = str(worker.get("state") or "")
        seen = as_float(worker.get("last_seen"))
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
            "tasks_done": as_int(worker.get("tasks_done")),
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
    return (job.status == DONE or task.epoch < job.epoch
            or (task.epoch == job.epoch and task.task_index in done_tasks(job)))


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


def epoch_progress(job: Job, versions: Iterable[Version],
                   tasks: Iterable[TaskRecord] = ()) -> dict[str, int] | None:
    """Tasks planned/applied/failed in the current epoch: the rounds before the job's current
    one are done (``domain.job.done_tasks``); the versions that folded them say which failed,
    and so do the epoch's task documents (the versions read may not reach back to its start)."""
    if job.epoch < 1 or job.tasks_per_epoch is None:
        return None
    done = (job.tasks_per_epoch if job.status == DONE
            else len(done_tasks(job)))
    failed = {t for v in versions if v.epoch == job.epoch for t in v.tasks_failed}
    failed |= {t.task_id for t in tasks if t.epoch == job.epoch and t.state == attempt.FAILED
               and folded(job, t)}
    return {"epoch": job.epoch, "planned": job.tasks_per_epoch,
            "applied": max(0, done - len(failed)), "failed": len(failed)}


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
        **{f"{phase}_seconds": as_float(stats.get(task.task_id, {}).get(f"{phase}_seconds"))
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
        values = [v for v in (as_float(t.get(f"{phase}_seconds")) for t in trained)
                  if v is not None]
        if values:
            rows.append({"phase": phase, "tasks": len(values),
                         "median_s": float(np.median(values)),
                         "p90_s": float(np.percentile(values, 90)), "max_s": float(max(values))})
    return pd.DataFrame(rows, columns=["phase", "tasks", "median_s", "p90_s", "max_s"])
