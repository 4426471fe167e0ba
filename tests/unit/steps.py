"""Driving the pipeline on the in-memory ports one step at a time: upload, train, fold."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bucketlearn import codec, layout
from bucketlearn.aggregation import writer as aggregate
from bucketlearn.bootstrap import memory_services
from bucketlearn.domain import task as attempt
from bucketlearn.loops.learner import Decision, Learner
from bucketlearn.services import task_messages
from bucketlearn.usecases.upload import Outcome, StorageEvent, handle_upload
from tests.unit.helpers import write_blobs_csv


def upload(svc: Any, path: Path, metadata: Mapping[str, str]) -> tuple[Outcome, str | None]:
    """Upload ``path`` to the uploads bucket under its file name with ``metadata`` (the options)
    and hand its storage event to the upload service: (outcome, job id)."""
    info = svc.store.write_bytes(svc.settings.uploads_bucket, path.name, path.read_bytes(),
                                 "text/csv", metadata)
    return handle_upload(svc, StorageEvent(info.bucket, info.name, info.generation, info.size))


def start_job(tmp_path: Path, epochs: int = 1, parallel_tasks: int = 2,
              settings: Any = None, validation: str = "none") -> tuple[Any, str]:
    """A 400-row, 3-class upload split into 64-row shards (no validation rows unless
    ``validation`` says a share): (services, job id), round 1 published."""
    svc = memory_services(settings)
    path = write_blobs_csv(tmp_path / "blobs.csv", n_rows=400)
    _, job_id = upload(svc, path, {"epochs": str(epochs), "rows_per_shard": "64",
                                   "parallel_tasks": str(parallel_tasks),
                                   "validation_fraction": validation})
    assert job_id is not None
    return svc, job_id


def train_pending(svc: Any, count: int) -> None:
    """Train and acknowledge ``count`` task messages with one learner."""
    learner = Learner(svc, "w1")
    for _ in range(count):
        received = svc.queue.pull(0)
        assert received is not None
        assert learner.process(received.message) is Decision.ACK
        received.ack()


def run_rounds(svc: Any, job_id: str, limit: int = 100, scoring: Any = None) -> None:
    """Train and fold every published round until the queue stays empty (the folds measure
    with ``scoring``, an ``evaluate.Scoring``; None: production's)."""
    for _ in range(limit):
        if not len(svc.queue):
            return
        train_pending(svc, len(svc.queue))
        aggregate.aggregate_job(svc, job_id, scoring)
    raise AssertionError(f"job {job_id}: still publishing rounds after {limit}")


def write_bad_result(svc: Any, job_id: str, poison: str) -> str:
    """Train the round's first task for real, then write its result with ``poison`` in it:
    a NaN in the weights, or a delta 1,000 times its own size."""
    received = svc.queue.pull(0)
    task = received.message
    received.ack()
    job = svc.registry.get_job(job_id)
    learner = Learner(svc, "w-bad")
    written = learner.announce(learner.train(task, job)).path
    bucket = svc.settings.deltas_bucket
    delta, optimizer, meta = codec.decode_state(svc.store.read_bytes(bucket, written))
    svc.store.delete(bucket, written)  # written again under the same attempt, with the poison
    if poison == "nan":
        delta[0] = delta[0].copy()
        delta[0].flat[0] = np.nan
    else:
        delta = [d * 1000.0 for d in delta]
    path = written
    svc.store.write_bytes(bucket, path, codec.encode_state(delta, optimizer, meta),
                          "application/octet-stream")
    return path


def record_attempt(svc: Any, task: Any, worker_id: str = "w-test") -> str:
    """Count an attempt at ``task`` as a learner's admission does; returns its key (the nonce
    a result of that attempt is written under)."""
    key = layout.new_nonce()
    svc.registry.record_attempt(
        task.job_id, task_messages.task_doc_id(task.job_id, task.epoch, task.task_index),
        attempt.started(task.task_id, task.epoch, task.task_index, task.round, task.rows,
                        worker_id, 0.0, None, None), key)
    return key
