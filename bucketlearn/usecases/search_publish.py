"""A searched job's (option ``search`` N) segments published on the learner pool: the first
rung's at the upload (``publish_first``, ``start_search``), those due as rungs settle
(``publish_due``), and those outstanding again (``republish_outstanding``, the watchdog's).

The search is ``train-local --search``'s (``usecases.local_search``, ``domain.search``), cut into
segments: a segment is one candidate trained through one rung, by whichever learner pulls it
(``loops.segment``). The job's record (``Job.search``: ``domain.search.search_record``) holds
the candidates, the rungs, the segments published and each candidate's line as its last
recorded segment left it; ``write_search`` is every write to it (its writer's fenced). The
writer that records the segments and settles the rungs is ``aggregation.search_writer``'s.
"""

from __future__ import annotations

import logging
from typing import Any

from bucketlearn.domain.job import Job
from bucketlearn.domain.search import (
    draw_candidates,
    due,
    lines_of,
    outstanding_pairs,
    pair,
    plan_of,
    rungs,
    search_record,
    settle,
)
from bucketlearn.errors import TransientError
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ports import Services, TaskMessage
from bucketlearn.services.caches import job_runtime
from bucketlearn.usecases.publish import publish_round

log = logging.getLogger(__name__)


def publish_first(svc: Services, job: Job, manifest: Manifest | None = None) -> None:
    """A job just split goes to the learners: a searched job's first rung (``start_search``),
    any other job's first round (``publish.publish_round``)."""
    if job.options.get("search"):
        start_search(svc, job)
    else:
        publish_round(svc, job, manifest)


def start_search(svc: Services, job: Job) -> None:
    """Give a job that has just been split its search record (candidates drawn from its seed,
    the rungs for its epochs) and publish the first rung. Idempotent: a record already
    written is kept, and only the segments not yet published go out."""
    record = job.search
    if not record or "candidates" not in record:
        spec = job_runtime(svc, job).spec
        options = job.options
        record = search_record(
            draw_candidates(int(options["search"]), int(options["seed"]),
                            int(options["batch_size"]), float(options["learning_rate"]),
                            spec.kind == "cnn", spec.regression),
            rungs(int(options["search"]), int(options["epochs"])))
        if not svc.registry.update_job_if(job.job_id, {**job.status_and_phase, "search": None},
                                          {"search": record}):
            current = svc.registry.get_job(job.job_id)
            if current is None or current.is_terminal or not current.search:
                return
            job = current
        else:
            job = job.updated({"search": record})
    publish_due(svc, job)


def publish_due(svc: Services, job: Job, pairs: list[tuple[int, int]] | None = None) -> Job:
    """Publish the segments due (``domain.search.due``; ``pairs`` when the caller has them),
    then record them published (and the job's round, so it counts as published); the job as
    it then stands."""
    record = dict(job.search or {})
    if pairs is None:
        pairs = due(record, settle(plan_of(record), lines_of(record)))
    if not pairs and job.is_published:
        return job
    svc.queue.publish(_messages(svc, job, pairs))
    record["published"] = list(record.get("published") or []) + [pair(c, r) for c, r in pairs]
    fields = {"search": record, "published": job.round_key, "published_at": svc.clock()}
    if not write_search(svc, job, fields, fenced=bool(job.aggregated_by)):
        raise TransientError(f"job {job.job_id}: could not record its segments published")
    log.info("job %s: published %d segments (%s)", job.job_id, len(pairs),
             ", ".join(f"candidate {c} rung {r}" for c, r in pairs))
    return job.updated(fields)


def write_search(svc: Services, job: Job, fields: dict[str, Any], fenced: bool = True) -> bool:
    """A write about the search while the job stands as read, its search record unchanged
    since (the upload's first publish and the writer never overwrite each other) and, for its
    writer (``fenced``), still held by the same one (``Job.aggregated_by``)."""
    return svc.registry.update_job_if(job.job_id, search_fence(job, fenced), fields)


def search_fence(job: Job, fenced: bool = True) -> dict[str, Any]:
    """What a write about the search expects unchanged since ``job`` was read: its status,
    phase and search record, and for its writer (``fenced``) its holder."""
    expect = {**job.status_and_phase, "search": job.search}
    return {**expect, "aggregated_by": job.aggregated_by} if fenced else expect


def republish_outstanding(svc: Services, job: Job) -> int:
    """Publish again the segments published and not yet recorded (a message lost for good);
    a second result of one is dropped by the writer. Returns how many."""
    record = job.search or {}
    pairs = outstanding_pairs(record)
    svc.queue.publish(_messages(svc, job, pairs))
    return len(pairs)


def _messages(svc: Services, job: Job, pairs: list[tuple[int, int]]) -> list[TaskMessage]:
    """The segment messages of ``pairs`` (candidate, rung): each from its line's last state."""
    lines = (job.search or {}).get("lines") or {}
    rows = job_runtime(svc, job).manifest.train_rows
    return [TaskMessage(job_id=job.job_id, epoch=r, task_index=c, parts=(), rows=rows, round=r,
                        weights_path=(lines.get(str(c)) or {}).get("weights_path", "")
                        if r else "", segment=True) for c, r in pairs]
