"""The jobs overview: one row per job (status, source, head version and figure, progress,
ETA, why it ended), what a job's source and reason read as, a REJECTED job's details, and
which job the ``?job=`` parameter names."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bucketlearn import layout
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import CANCELLED, DONE, FAILED, REJECTED
from bucketlearn.views.formats import as_float, format_duration, plain, timestamp
from bucketlearn.views.throughput import average_eta_seconds, progress


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
    ended = (REJECTED, FAILED, CANCELLED)
    return str(job.error or "") if job.status in ended else ""


def rejection_details(job: Job) -> list[dict[str, str]]:
    """The structured reason of a REJECTED job (file, row, column, expected, found)."""
    detail = job.error_detail or {}
    order = ("file", "row", "column", "message", "expected", "found")
    return [{"field": key, "value": str(detail[key])} for key in order
            if detail.get(key) is not None]


def overview_rows(job_docs: Iterable[Job], now: float) -> list[dict[str, Any]]:
    """One row per job, newest first: what the jobs table shows (from the job documents
    alone: the ETA at the job's own average rate, ``average_eta_seconds``)."""
    rows = []
    for job in job_docs:
        job_id = job.job_id
        head = job.head
        eta = average_eta_seconds(job, now)
        status = job.status
        if status == DONE:
            eta_text = "finished"
        elif job.is_terminal:
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
            # the model's version: once DONE, the one exported (the best by validation)
            "version": head.version if head is not None and status == DONE else job.version,
            "accuracy": as_float(head.holdout_accuracy) if head else None,
            "r2": as_float(head.holdout_r2) if head else None,  # a numeric target's (no accuracy)
            "progress": progress(job),
            "tasks": (f"{job.tasks_applied}/{job.tasks_planned}"
                      if job.tasks_planned else ""),
            "eta": eta_text,
            "eta_seconds": eta,
            "reason": reason(job),
        })
    rows.sort(key=lambda r: r["created_at"] or 0.0, reverse=True)
    return rows


def wanted_job(param: str | None) -> tuple[str | None, str | None]:
    """The ``?job=`` parameter: (the job id, None) when it is one, (None, what to say) when it
    is not (it is shown as text, never looked up)."""
    if not param:
        return None, None
    if layout.is_job_id(param):
        return param, None
    return None, f"The link names no job: {plain(param[:200])} is not a job id."
