"""What the dashboard reads, and how often: the documents of the jobs overview
(``overview_bundle``) and of one job's page (``job_bundle``), read from the registry the page is
handed (its entry point, ``dashboard/app.py``, picks the Services), the read limits and the
cache and refresh periods the page (``bucketlearn.entrypoints.dashboard``) uses.

Documents read (field names as written by ingest/split.py, aggregation/writer.py and loops/learner.py):

* job: status, phase, file/source, created_at, version, epoch, options, dataset, head,
  tasks_planned, tasks_applied, tasks_failed, started_at, error, error_detail;
* version: version, epoch, created_at, samples, tasks_applied/tasks_failed (task ids),
  holdout_accuracy, holdout_loss, train_loss, and (versions evaluated since they were recorded)
  holdout_macro_f1, holdout_roc_auc, holdout_majority_accuracy, holdout_report;
* task: task_id, epoch, task_index, state, attempt_keys (counted as its attempts), worker_id,
  started_at, finished_at,
  fetch_seconds, train_seconds, write_seconds, error;
* worker heartbeat: worker_id, state, last_seen, job_id, task_id, tasks_done;
* batch prediction request (``domain.prediction.PredictionRecord``): source, state, rows,
  seconds, parts, output, error, created_at.
"""

from __future__ import annotations

from typing import Any

from bucketlearn.domain.head import attach_head
from bucketlearn.ports import Registry

# What the page reads, and how often: the overview only the newest jobs' documents (each job's
# rate and ETA come from its own counters); a job's page its newest VERSIONS_SHOWN versions
# (enough for its charts and report), the tasks of its current epoch, the workers seen in the
# last WORKERS_SEEN_SECONDS and its newest PREDICTIONS_SHOWN batch prediction requests; the
# counts come from the job document (and a count query of the requests when there may be more).
# A query's result is cached for CACHE_SECONDS, longer than the page's refresh, and the cache is
# shared by every session of the process: a tab left open costs a bounded read every
# CACHE_SECONDS, whatever the number of jobs, versions, workers or requests there ever were.
VERSIONS_SHOWN = 200
PREDICTIONS_SHOWN = 20
WORKERS_SEEN_SECONDS = 3600.0
REFRESH_SECONDS = 5.0
CACHE_SECONDS = 10.0


def overview_bundle(registry: Registry, limit: int = 100) -> dict[str, Any]:
    """The documents the overview needs: the newest ``limit`` jobs, one read each."""
    return {"jobs": registry.list_jobs(limit)}


def job_bundle(registry: Registry, job_id: str, now: float) -> dict[str, Any] | None:
    """The documents the job page shows, read in one go (None if there is no such job): the
    job, its newest ``VERSIONS_SHOWN`` versions, the task documents of its current epoch and
    the workers seen since ``WORKERS_SEEN_SECONDS`` before ``now``, its newest
    ``PREDICTIONS_SHOWN`` batch prediction requests and how many it has (counted only when
    there may be more). Counts over the whole job come from the job's counters, not from
    documents.

    Figures a version's evaluation is carried by a later version's commit: the newest versions
    read have theirs (the commits carrying them are newer still, or read), while the oldest
    read may lack figures carried by a version not read; its charts start a little later. The
    head's figures are put on the version they are of (``domain.head.attach_head``): a
    finished job's final figures are on its head only.
    """
    job = registry.get_job(job_id)
    if job is None:
        return None
    predictions = registry.list_predictions(job_id, PREDICTIONS_SHOWN)
    return {
        "job": job,
        "versions": attach_head(registry.list_versions(job_id, last=VERSIONS_SHOWN), job.head),
        "tasks": registry.list_tasks(job_id, epoch=job.epoch) if job.epoch >= 1 else [],
        "workers": registry.list_workers(seen_since=now - WORKERS_SEEN_SECONDS),
        "predictions": predictions,
        "prediction_count": (registry.count_predictions(job_id)
                             if len(predictions) >= PREDICTIONS_SHOWN else len(predictions)),
    }
