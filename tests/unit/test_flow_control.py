"""Bounded staleness: a worker pauses while ``max_pending`` deltas wait for the aggregator.

Workers are faster than the aggregator's version cycle. Without the pause they train task after
task from one head, and the fold of those same-base deltas overshoots (the CNN lost 7–32 points
on the local stack). The pause ends when the aggregator folds, or, so an aggregator outage cannot
stop training, after ``flow_stall_seconds`` without progress.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bucketlearn import aggregator, jobs, layout
from bucketlearn.worker import Decision, Learner, pending_deltas, pending_limit
from tests.unit.test_invariants import start_job


def with_stall(svc: Any, seconds: float) -> Any:
    return dataclasses.replace(svc, settings=dataclasses.replace(svc.settings,
                                                                 flow_stall_seconds=seconds))


def run_one(svc: Any, learner: Learner) -> dict[str, Any]:
    """Pull the next task, process it, ack it; return its task document."""
    received = svc.queue.pull(0)
    assert received is not None
    task = received.message
    assert learner.process(task) is Decision.ACK
    received.ack()
    doc = svc.registry.get_task(task.job_id, jobs.task_doc_id(task.job_id, task.epoch,
                                                              task.task_index))
    assert doc is not None and doc["state"] == "TRAINED"
    return doc


@pytest.mark.parametrize("options, expected", [
    ({"max_pending": 2, "buffer_size": 2}, 2),
    ({"max_pending": 3, "buffer_size": 2}, 3),
    ({"max_pending": 1, "buffer_size": 4}, 4),  # below K the aggregator would never cut a version
    ({"buffer_size": 1}, 2),                    # a job created before the option existed
])
def test_pending_limit(options: dict[str, int], expected: int) -> None:
    assert pending_limit(options) == expected


def test_pending_counts_unapplied_tasks_once(tmp_path: Path) -> None:
    # Prepare: task 0 applied; task 1 twice (a redelivery); task 2 failed for good; another
    # epoch's and another job's deltas
    svc, job_id = start_job(tmp_path)
    bucket = svc.settings.deltas_bucket
    for path, job, epoch, task in ((layout.delta_path, job_id, 1, 0),
                                   (layout.delta_path, job_id, 1, 1),
                                   (layout.delta_path, job_id, 1, 1),
                                   (layout.failure_marker_path, job_id, 1, 2),
                                   (layout.delta_path, job_id, 1, 3),
                                   (layout.delta_path, job_id, 2, 4),
                                   (layout.delta_path, job_id + "x", 1, 4)):
        svc.store.write_bytes(bucket, path(job, epoch, task, layout.new_nonce()), b"x",
                              "application/octet-stream")
    # Execute
    pending = pending_deltas(svc, job_id, 1, done={0})
    # Assert: tasks 1, 2 and 3
    assert pending == 3


def test_worker_pauses_until_the_aggregator_folds(tmp_path: Path) -> None:
    # Prepare: two deltas wait (the limit), nothing folded yet
    svc, job_id = start_job(tmp_path, buffer_size=2)
    svc = with_stall(svc, 60.0)
    learner = Learner(svc, "w1")
    first = [run_one(svc, learner) for _ in range(2)]
    assert [d["base_version"] for d in first] == [0, 0]
    assert all(d["flow_wait_seconds"] < 1.0 for d in first)
    folder = threading.Timer(0.5, aggregator.aggregate_job, args=(svc, job_id))
    # Execute
    folder.start()
    try:
        third = run_one(svc, learner)
    finally:
        folder.join(timeout=60)
    # Assert: it waited for v1 and trained from it, long before the stall limit
    assert third["base_version"] == 1
    assert 0.4 <= third["flow_wait_seconds"] < 30


def test_worker_goes_on_when_the_aggregator_stalls(tmp_path: Path) -> None:
    # Prepare: two deltas wait and no aggregator runs at all
    svc, job_id = start_job(tmp_path, buffer_size=2)
    svc = with_stall(svc, 0.5)
    learner = Learner(svc, "w1")
    for _ in range(2):
        run_one(svc, learner)
    # Execute
    started = time.monotonic()
    third = run_one(svc, learner)
    # Assert: it trained from the old head after the stall limit
    assert third["base_version"] == 0
    assert third["flow_wait_seconds"] >= 0.5 and time.monotonic() - started >= 0.5
    assert svc.registry.get_job(job_id)["version"] == 0


def test_stopping_worker_hands_a_waiting_task_back(tmp_path: Path) -> None:
    # Prepare: the limit is reached and the worker is told to stop while it waits
    svc, job_id = start_job(tmp_path, buffer_size=2)
    svc = with_stall(svc, 60.0)
    stop = threading.Event()
    learner = Learner(svc, "w1", stop=stop)
    for _ in range(2):
        run_one(svc, learner)
    received = svc.queue.pull(0)
    threading.Timer(0.3, stop.set).start()
    # Execute
    started = time.monotonic()
    decision = learner.process(received.message)
    # Assert: no training, no attempt counted, the message goes back
    assert decision is Decision.NACK and time.monotonic() - started < 30
    task = received.message
    assert svc.registry.get_task(job_id, jobs.task_doc_id(job_id, task.epoch,
                                                          task.task_index)) is None
