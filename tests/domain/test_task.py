"""A task's attempt record: the fields each step writes and the record read back."""

from __future__ import annotations

import pytest

from bucketlearn.domain import task as T
from bucketlearn.domain.job import MAX_ERROR_CHARS


def test_each_step_writes_its_state_and_the_record_reads_them_back() -> None:
    """started -> trained, as the ledger merges them, reads back as one TaskRecord."""
    # Prepare
    doc = {"attempts": 1, **T.started("j:e0001:t00003", 1, 3, 0, 250, "w-1", now=10.0,
                                      pulled_at=9.5, delivery_attempt=2)}
    # Execute
    running = T.TaskRecord.from_doc(doc)
    doc.update(T.trained(12.5, {"fetch_seconds": 0.5, "train_seconds": 1.5,
                                "write_seconds": 0.25, "base_version": 7}))
    done = T.TaskRecord.from_doc(doc)
    # Assert
    assert (running.state, running.busy_seconds(now=11.0), running.pulled_at) == (T.RUNNING, 1.0,
                                                                                  9.5)
    assert (done.state, done.busy_seconds(now=99.0), done.base_version) == (T.TRAINED, 2.5, 7)
    assert [done.phase_seconds(p) for p in T.PHASES] == [0.5, 1.5, 0.25]
    assert (done.task_id, done.epoch, done.task_index, done.rows, done.worker_id,
            done.attempts, done.error) == ("j:e0001:t00003", 1, 3, 250, "w-1", 1, None)


def test_a_message_arriving_unannounced_counts_from_its_start() -> None:
    """No pull time (a test harness calling the worker directly): pulled_at is the start."""
    assert T.started("t", 1, 0, 0, 1, "w", now=5.0, pulled_at=None,
                     delivery_attempt=None)["pulled_at"] == 5.0


def test_a_failed_attempt_keeps_a_bounded_error() -> None:
    """retrying and failed store the error cut to ERROR_CHARS (a document, not a log)."""
    # Execute
    retry, gave_up = T.retrying("x" * 5000, now=3.0), T.failed("bad shard", now=4.0)
    # Assert
    assert (retry["state"], len(retry["error"]), retry["finished_at"]) == (T.RETRYING,
                                                                           T.ERROR_CHARS, 3.0)
    assert (gave_up["state"], gave_up["error"]) == (T.FAILED, "bad shard")


def test_a_sparse_or_odd_document_reads_without_guessing_at_call_sites() -> None:
    """A record written before timings existed, or with a number stored as text, still reads:
    missing times are None, a lower-case state is the state."""
    # Execute
    record = T.TaskRecord.from_doc({"task_id": "t", "state": "running", "started_at": "7.5",
                                    "fetch_seconds": "n/a"})
    # Assert
    assert (record.state, record.started_at, record.finished_at) == (T.RUNNING, 7.5, None)
    assert record.phase_seconds("fetch") is None and record.base_version is None
    assert T.TaskRecord.from_doc({"task_id": "t"}).busy_seconds(now=1.0) is None


def test_a_delivered_task_is_skipped_only_with_a_reason_that_says_why() -> None:
    """``skip_reason``: train a task of the current round; skip one whose job is gone or
    ended, whose message names no base, or whose round was folded already."""
    from bucketlearn.domain.job import Job

    running = Job("j", status="RUNNING", phase="training", version=3)
    assert T.skip_reason(running, 3, True) is None
    assert T.skip_reason(None, 3, True) == "the job is gone"
    assert T.skip_reason(Job("j", status="CANCELLED", version=3), 3, True) == \
        "the job is CANCELLED"
    assert T.skip_reason(running, -1, True) == "the message names no version to train from"
    assert T.skip_reason(running, 3, False) == "the message names no version to train from"
    assert T.skip_reason(running, 2, True) == "its round was folded (the job is at v3)"


def test_a_failure_marker_is_written_and_read_in_one_shape() -> None:
    """``FailureMarker``: the object a task given up on leaves, read back as written; a marker
    naming no reason reads as "task failed", a long reason is cut to ``MAX_ERROR_CHARS``."""
    # Prepare
    marker = T.FailureMarker(3, "task j:e0001:t00003 failed after 3 attempts: boom", "j",
                             "j:e0001:t00003", 1, {"attempts": 3, "worker_id": "w-1"})
    # Execute
    doc = marker.to_doc()
    # Assert
    assert doc == {"job_id": "j", "task_id": "j:e0001:t00003", "epoch": 1, "task_index": 3,
                   "error": "task j:e0001:t00003 failed after 3 attempts: boom", "attempts": 3,
                   "worker_id": "w-1"}
    assert T.FailureMarker.from_doc(doc, 3) == marker
    assert T.FailureMarker.from_doc({}, 4) == T.FailureMarker(4, T.FAILURE_REASON)
    assert T.FailureMarker.from_doc({"error": "x" * 3000}, 4).error == "x" * MAX_ERROR_CHARS


@pytest.mark.parametrize("doc, attempts", [
    ({"attempt_keys": ["a", "b"]}, 2),
    ({"attempts": 3, "attempt_keys": ["a"]}, 1),   # a record of the old code, then a refund
    ({"attempts": 2, "attempt_keys": []}, 0),
    ({"attempts": 2}, 2),                           # written before attempt keys
    ({}, 0),
])
def test_a_tasks_attempts_are_its_keys_where_it_has_them(doc, attempts) -> None:
    assert T.TaskRecord.from_doc(doc).attempts == attempts
