"""Transient backend failures do not push a healthy task towards FAILED; real failures do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bucketlearn.errors import TransientError
from bucketlearn.faults import inject
from bucketlearn.loops.heartbeat import LearnerTuning
from bucketlearn.loops.learner import Decision, Learner
from tests.unit.steps import start_job


@pytest.mark.parametrize("error, counted", [(ConnectionError("connection reset"), 0),
                                            (ValueError("not an npz"), 1)])
def test_attempts_count_only_real_failures(tmp_path: Path, error: Exception,
                                           counted: int) -> None:
    # Prepare: every shard read fails with ``error``; a transient one for longer than the worker
    # keeps a task through an outage
    svc, job_id = start_job(tmp_path)

    def failing_read(real: Any, bucket: str, name: str, offset: int, length: int) -> Any:
        if "/shards/" in name:
            raise error
        return real(bucket, name, offset, length)

    svc = inject(svc, "store", read_range=failing_read)  # a part is a range of its pack
    received = svc.queue.pull(0)
    # Execute
    tuning = LearnerTuning(transient_backoff_seconds=0.0, transient_retry_seconds=0.0)
    decision = Learner(svc, "w1", tuning=tuning).process(received.message)
    # Assert
    [task] = svc.registry.list_tasks(job_id)
    assert decision is Decision.NACK
    assert task.attempts == counted and task.state == "RETRYING"
    assert type(error).__name__ in task.error


def test_a_task_records_when_its_message_arrived(tmp_path: Path) -> None:
    """``pulled_at`` (the message's arrival) separates the queue's delivery from the worker's
    reads before training: it is taken when the message is handed over, before ``started_at``;
    the result's message says when training finished. The task's document is written once."""
    # Prepare
    svc, job_id = start_job(tmp_path)
    received = svc.queue.pull(0)
    # Execute
    decision = Learner(svc, "w1").handle(received)
    # Assert
    [task] = svc.registry.list_tasks(job_id)
    [result] = svc.results.published
    assert decision is Decision.ACK and task.state == "RUNNING"
    assert task.pulled_at <= task.started_at <= result.stats["finished_at"] <= result.sent_at
    assert (result.job_id, result.task_index, result.kind) == (job_id, task.task_index, "result")


def test_a_short_outage_is_ridden_out_holding_the_task(tmp_path: Path) -> None:
    """Two failed shard reads, then the storage is back: the worker keeps the message and trains
    (ACK) instead of nacking: every nack is a Pub/Sub delivery towards dead-lettering.
    One attempt is counted."""
    # Prepare
    svc, job_id = start_job(tmp_path)
    failures = iter([True, True])

    def flaky_read(real: Any, bucket: str, name: str, offset: int, length: int) -> Any:
        if "/shards/" in name and next(failures, False):
            raise ConnectionError("connection reset")
        return real(bucket, name, offset, length)

    svc = inject(svc, "store", read_range=flaky_read)  # a part is a range of its pack
    received = svc.queue.pull(0)
    # Execute
    tuning = LearnerTuning(transient_backoff_seconds=0.01)
    decision = Learner(svc, "w1", tuning=tuning).process(received.message)
    # Assert
    [task] = svc.registry.list_tasks(job_id)
    assert decision is Decision.ACK
    assert task.attempts == 1 and task.state == "RUNNING"  # its one write: the attempt
    assert [m.task_index for m in svc.results.published] == [task.task_index]


def test_a_lost_answer_to_record_attempt_does_not_spend_an_attempt(tmp_path: Path) -> None:
    """record_attempt's write lands but its answer is lost (an outage between the write and the
    read-back): the retry with the same attempt key counts once."""
    # Prepare
    svc, job_id = start_job(tmp_path)
    lost = iter([True])

    def answer_lost(real: Any, *args: Any, **kwargs: Any) -> int:
        count = real(*args, **kwargs)
        if next(lost, False):
            raise TransientError("deadline exceeded reading the attempt back")
        return count

    svc = inject(svc, "registry", record_attempt=answer_lost)
    received = svc.queue.pull(0)
    # Execute
    tuning = LearnerTuning(transient_backoff_seconds=0.0)
    decision = Learner(svc, "w1", tuning=tuning).process(received.message)
    # Assert
    [task] = svc.registry.list_tasks(job_id)
    assert decision is Decision.ACK and task.attempts == 1


def test_an_attempt_that_could_not_be_given_back_is_given_back_later(tmp_path: Path) -> None:
    """A transient failure outlasts the worker's patience and the refund fails too (the registry
    is down): the attempt is owed, and given back with the next task."""
    # Prepare
    svc, job_id = start_job(tmp_path)
    down = {"storage": True, "refunds": True}

    def read(real: Any, bucket: str, name: str, offset: int, length: int) -> Any:
        if "/shards/" in name and down["storage"]:
            raise ConnectionError("connection reset")
        return real(bucket, name, offset, length)

    def refund(real: Any, *args: Any, **kwargs: Any) -> None:
        if down["refunds"]:
            raise TransientError("firestore unavailable")
        real(*args, **kwargs)

    svc = inject(inject(svc, "store", read_range=read), "registry", refund_attempt=refund)
    tuning = LearnerTuning(transient_backoff_seconds=0.0, transient_retry_seconds=0.0)
    learner = Learner(svc, "w1", tuning=tuning)
    first = svc.queue.pull(0)
    # Execute: the outage
    assert learner.process(first.message) is Decision.NACK
    owed = svc.registry.list_tasks(job_id)[0].attempts
    # Execute: the backends are back; the next task settles what is owed
    down.update(storage=False, refunds=False)
    second = learner.process(first.message)
    # Assert
    [task] = svc.registry.list_tasks(job_id)
    assert owed == 1
    assert second is Decision.ACK and task.attempts == 1  # the outage's attempt was given back


def test_a_count_ahead_of_the_record_does_not_fail_the_task(tmp_path: Path) -> None:
    """The admission counts the keys it read and its own; a refund landing in between leaves
    the record one attempt lower. The learner reads the record again before failing the task:
    within the attempts allowed, the task trains and is announced."""
    # Prepare: the admission's count says one attempt over the limit; the record holds one
    svc, job_id = start_job(tmp_path)

    def ahead(real: Any, *args: Any, **kwargs: Any) -> int:
        real(*args, **kwargs)
        return svc.settings.max_task_attempts + 1

    svc = inject(svc, "registry", record_attempt=ahead)
    received = svc.queue.pull(0)
    # Execute
    decision = Learner(svc, "w1").process(received.message)
    # Assert
    [task] = svc.registry.list_tasks(job_id)
    assert decision is Decision.ACK
    assert task.attempts == 1 and task.state == "RUNNING"
    assert [m.kind for m in svc.results.published] == ["result"]
