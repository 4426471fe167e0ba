"""Transient backend failures do not push a healthy task towards FAILED; real failures do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bucketlearn import worker
from bucketlearn.worker import Decision, Learner
from tests.unit.test_invariants import start_job


@pytest.mark.parametrize("error, counted", [(ConnectionError("connection reset"), 0),
                                            (ValueError("not an npz"), 1)])
def test_attempts_count_only_real_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           error: Exception, counted: int) -> None:
    # Prepare: every shard read fails with ``error``
    monkeypatch.setattr(worker, "TRANSIENT_BACKOFF_SECONDS", 0.0)
    svc, job_id = start_job(tmp_path)
    real_read = svc.store.read_bytes

    def failing_read(bucket: str, name: str) -> Any:
        if "/shards/" in name:
            raise error
        return real_read(bucket, name)

    monkeypatch.setattr(svc.store, "read_bytes", failing_read)
    received = svc.queue.pull(0)
    # Execute
    decision = Learner(svc, "w1").process(received.message)
    # Assert
    [task] = svc.registry.list_tasks(job_id)
    assert decision is Decision.NACK
    assert task["attempts"] == counted and task["state"] == "RETRYING"
    assert type(error).__name__ in task["error"]


def test_a_task_records_when_its_message_arrived(tmp_path: Path) -> None:
    """``pulled_at`` (the message's arrival) separates the queue's delivery from the worker's
    reads before training: it is taken when the message is handed over, before ``started_at``."""
    # Prepare
    svc, job_id = start_job(tmp_path)
    received = svc.queue.pull(0)
    # Execute
    decision = Learner(svc, "w1").handle(received)
    # Assert
    [task] = svc.registry.list_tasks(job_id)
    assert decision is Decision.ACK and task["state"] == "TRAINED"
    assert task["pulled_at"] <= task["started_at"] <= task["finished_at"]
