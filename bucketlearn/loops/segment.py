"""A learner's part in a searched job (``usecases.search_publish``): one segment trained and announced.

A segment message names a candidate (``task_index``), a rung (``epoch``) and the state the
candidate's line ended its previous rung with (``weights_path``; none for the first rung). The
learner builds the candidate's line as ``train-local --search`` builds it
(``services.candidates.candidate_line``), restores the state, trains it up to the rung's epochs
(``candidates.train_to``: or until it stops early or diverges), writes the state it ended with
to the deltas bucket (``encode_line``, under ``layout.segment_path``) and announces it on the
results topic; only then is the message acknowledged. What it trains depends on the message
alone, so a segment trained twice (a redelivery, a learner killed before its ack) writes the
same state, and the job's writer records one.

Attempts are counted in the task ledger as a round's tasks are, a backend outage's given back;
a segment that fails ``max_task_attempts`` times is announced as the candidate dropped, with
the last error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from bucketlearn import codec, layout
from bucketlearn.domain import task as attempt
from bucketlearn.domain.search import Candidate, plan_of, recorded_rung
from bucketlearn.options import JobOptions
from bucketlearn.ports import SEGMENT, ResultMessage, Services, TaskMessage
from bucketlearn.services import task_messages
from bucketlearn.services.caches import job_runtime, part_cache
from bucketlearn.services.candidates import Standing, candidate_line, train_to
from bucketlearn.services.line import TrainingLine

log = logging.getLogger(__name__)

DROPPED = "dropped"


def encode_line(line: TrainingLine | None, standing: Standing, meta: Mapping[str, Any]) -> bytes:
    """A segment's end state (``codec.encode_segment``): what the line ``saved``, with its
    standing in the metadata (``line`` None: a segment given up on, no arrays)."""
    arrays: Mapping[str, list[Any]] = {"w": [], "o": [], "b": []}
    doc: dict[str, Any] = {**meta, "state": standing.state, "reason": standing.reason,
                           "dropped_at": standing.dropped_at, "scores": [], "epoch": 0,
                           "finished": False, "train_loss": None, "tasks_per_epoch": 0}
    if line is not None:
        arrays, saved = line.saved()
        doc.update(saved)
    return codec.encode_segment(arrays["w"], arrays["o"], arrays["b"], doc)


def train_segment(svc: Services, job: Any, task: TaskMessage) -> bytes:
    """Train the segment ``task`` names and return its end state (``codec.encode_segment``)."""
    search = job.search
    candidate = Candidate.from_dict(search["candidates"][task.task_index])
    rung = plan_of(search)[task.epoch]
    runtime = job_runtime(svc, job)
    began, cpu = time.perf_counter(), time.process_time()
    with runtime.lock:
        line = candidate_line(svc, runtime.manifest, JobOptions.from_dict(job.options),
                              runtime.spec, svc.settings.limits, runtime.validation(), candidate,
                              rows=lambda parts: part_cache(svc).rows(svc, parts))
        svc.cache.models_built += 1
        standing = Standing(candidate)
        if task.weights_path:
            raw = svc.store.read_bytes(svc.settings.models_bucket, task.weights_path)
            line.resume(*codec.decode_segment(raw, task.weights_path))
        train_to(line, rung, standing)
    return encode_line(line, standing, {
        "candidate": candidate.index, "rung": rung.index,
        "seconds": round(time.perf_counter() - began, 6),
        "cpu_seconds": round(time.process_time() - cpu, 6),
        "tasks": standing.rung_tasks[-1] if standing.rung_tasks else 0})


# trains the segment a task names and returns its end state: ``train_segment``'s contract
SegmentTrainer = Callable[[Services, Any, TaskMessage], bytes]


def announce_segment(svc: Services, task: TaskMessage, data: bytes, worker_id: str,
                     seconds: float) -> None:
    """Write a segment's end state under a new name, then announce it."""
    path = layout.segment_path(task.job_id, task.task_index, task.epoch, layout.new_nonce())
    svc.store.write_bytes(svc.settings.deltas_bucket, path, data, "application/octet-stream")
    svc.results.publish([ResultMessage(
        job_id=task.job_id, kind=SEGMENT, epoch=task.epoch, task_index=task.task_index,
        round=task.epoch, path=path, worker_id=worker_id, sent_at=svc.clock(),
        stats={"train_seconds": round(seconds, 6), "usage": {
            **svc.usage(task.job_id), "worker_seconds": round(seconds, 6)}})])


def run_segment(svc: Services, task: TaskMessage, worker_id: str,
                delivery_attempt: int | None = None,
                train: SegmentTrainer = train_segment) -> bool:
    """Process one segment message, trained by ``train`` (``train_segment``'s contract; a test
    hands in its own); True to acknowledge it, False to have it delivered again (its training
    failed and attempts remain)."""
    job = svc.registry.get_job(task.job_id)
    if job is None or job.is_terminal or not job.search:
        log.info("segment %s: the job is %s; nothing to do", task.task_id,
                 job.status if job is not None else "gone")
        return True
    if recorded_rung(job.search, task.task_index) >= task.epoch:
        log.info("segment %s: already recorded", task.task_id)
        return True
    doc_id = task_messages.task_doc_id(task.job_id, task.epoch, task.task_index)
    now, key = svc.clock(), layout.new_nonce()
    attempts = svc.registry.record_attempt(task.job_id, doc_id, attempt.started(
        task.task_id, task.epoch, task.task_index, task.epoch, task.rows, worker_id, now, now,
        delivery_attempt), key)
    if attempts > svc.settings.max_task_attempts:
        previous = svc.registry.get_task(task.job_id, doc_id)
        error = (previous.error if previous is not None else None) or "unknown error"
        standing = Standing(Candidate.from_dict(job.search["candidates"][task.task_index]),
                            state=DROPPED, reason=f"failed after {attempts - 1} attempts: "
                                                  f"{error}"[:500])
        data = encode_line(None, standing, {"candidate": task.task_index, "rung": task.epoch})
        announce_segment(svc, task, data, worker_id, 0.0)
        svc.registry.update_task(task.job_id, doc_id, attempt.failed(error, svc.clock()))
        return True
    began = time.perf_counter()
    try:
        data = train(svc, job, task)
        announce_segment(svc, task, data, worker_id, time.perf_counter() - began)
    except Exception as exc:  # noqa: BLE001 - every failure is retried, then the line dropped
        transient = svc.transient(exc)
        log.warning("segment %s failed (%s)", task.task_id,
                    "transient" if transient else "counted", exc_info=True)
        if transient:  # a backend outage is not the segment's fault: the attempt given back
            svc.registry.refund_attempt(task.job_id, doc_id, key)
        svc.registry.update_task(task.job_id, doc_id, attempt.retrying(
            f"{type(exc).__name__}: {exc}", svc.clock()))
        return False
    svc.registry.update_task(task.job_id, doc_id, attempt.trained(svc.clock(), {
        "train_seconds": round(time.perf_counter() - began, 6)}))
    return True
