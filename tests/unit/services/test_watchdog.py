"""Every job ends (invariant 8): the watchdog finds stalled jobs and gets them moving, on the
in-memory ports. Before, a lost task hung its job forever."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from bucketlearn.adapters.memory import MemoryQueue
from bucketlearn.aggregation import writer as aggregator
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import DONE, FAILED, FAILED_PHASE, QUEUED, SPLITTING
from bucketlearn.domain.watchdog import AGGREGATE, FAIL, PUBLISH, REPUBLISH, decide
from bucketlearn.loops.learner import Learner
from bucketlearn.loops.watchdog import drain_dead_letters, watchdog_pass
from bucketlearn.ports import NUDGE
from tests.unit.steps import run_rounds, start_job

STALL = 600.0


def later(svc: Any, seconds: float) -> Any:
    """The same services with a clock ``seconds`` ahead."""
    return dataclasses.replace(svc, clock=lambda: time.time() + seconds)


def train(svc: Any, received: Any) -> None:
    Learner(svc, "w1").handle(received)
    received.ack()


def test_a_lost_task_is_published_again_and_the_job_ends(tmp_path: Path) -> None:
    """One task message of a round is lost (never trained, never acknowledged). The round
    waits; a watchdog pass within the stall time does nothing; one after it publishes that
    task again, and the job finishes with every task applied once."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    lost = svc.queue.pull(0)  # gone for good
    train(svc, svc.queue.pull(0))
    aggregator.aggregate_job(svc, job_id)
    assert svc.registry.get_job(job_id).version == 0  # the round waits for the lost task
    # Execute
    early = watchdog_pass(svc)
    actions = watchdog_pass(later(svc, STALL + 1))
    run_rounds(svc, job_id)
    # Assert
    assert early == []
    assert [(a["action"], a["tasks"]) for a in actions] == [(REPUBLISH,
                                                             [lost.message.task_index])]
    job = svc.registry.get_job(job_id)
    assert job.status == DONE and job.watchdog_actions == 1
    applied = [t for v in svc.registry.list_versions(job_id) for t in v.tasks_applied]
    assert sorted(applied) == sorted(set(applied)) and len(applied) == job.tasks_planned


def test_a_round_never_published_is_published_through_a_nudge(tmp_path: Path) -> None:
    """The aggregator died between committing a version and publishing the next round, and no
    later result came: the watchdog publishes a nudge on the results topic, on which the
    aggregator reads the job again and publishes the round; the job then finishes."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    train(svc, svc.queue.pull(0))
    train(svc, svc.queue.pull(0))
    aggregator.aggregate_job(svc, job_id)
    svc.queue._items.clear()  # the next round's messages never got out
    svc.registry.update_job(job_id, {"published": None})
    # Execute
    actions = watchdog_pass(later(svc, STALL + 1))
    nudges = [m for m in svc.results.published if m.kind == NUDGE]
    outcome = aggregator.aggregate_job(svc, job_id)
    run_rounds(svc, job_id)
    # Assert
    assert [a["action"] for a in actions] == [PUBLISH]
    assert [(m.job_id, m.reason.startswith("round e0001r00001 was never published"))
            for m in nudges] == [(job_id, True)]
    assert outcome.value == "accepted"
    assert svc.registry.get_job(job_id).status == DONE


def test_a_dead_lettered_task_becomes_a_failure_marker(tmp_path: Path) -> None:
    """A task message Pub/Sub gave up on (in the dead-letter sink) becomes a failure marker:
    the round folds without it, and with max_failed_tasks=0 the job ends FAILED naming it."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    dead = MemoryQueue()
    dead.publish([svc.queue.pull(0).message])  # dead-lettered
    train(svc, svc.queue.pull(0))
    # Execute
    written = drain_dead_letters(svc, dead)
    again = drain_dead_letters(svc, dead)
    aggregator.aggregate_job(svc, job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    assert (written, again, len(dead)) == (1, 0, 0)
    assert job.status == FAILED and "dead-lettered" in job.error


def test_a_split_that_never_finished_fails_the_job(tmp_path: Path) -> None:
    """A job still SPLITTING longer than events are retried for ends FAILED with a reason, and
    its ``updated_at`` says when, as every ending's does."""
    # Prepare
    svc, _ = start_job(tmp_path)
    svc.registry.create_job(Job.from_doc({
        "job_id": "stuck-000000000001", "status": QUEUED, "phase": SPLITTING,
        "created_at": time.time(), "claimed_at": time.time(), "updated_at": time.time()}))
    created = svc.registry.get_job("stuck-000000000001").updated_at
    # Execute
    actions = watchdog_pass(later(svc, svc.settings.max_event_age_seconds + 1))
    # Assert
    stuck = svc.registry.get_job("stuck-000000000001")
    assert [a["action"] for a in actions if a["job_id"] == stuck.job_id] == [FAIL]
    assert stuck.status == FAILED and "upload the file again" in stuck.error
    # the watchdog's ending records what every ending does (``ending_fields``)
    assert stuck.phase == FAILED_PHASE
    assert stuck.finished_at is not None and stuck.finished_at > created
    assert stuck.updated_at == stuck.finished_at


def test_a_split_retried_for_a_day_still_ends() -> None:
    """A split whose every retry took it over (each resetting ``claimed_at``) is timed from the
    upload, not from its last attempt: past the bound the job fails naming its attempts."""
    # Prepare
    now = 100_000.0
    job = Job("j1", status=QUEUED, phase=SPLITTING, created_at=now - 90_000,
              claimed_at=now - 30, split_attempts=40)
    # Execute
    decided = decide(job, [], [], [], now - 30, now, STALL, 86_400)
    # Assert
    assert decided is not None and decided.action == FAIL
    assert "within 86400 s of the upload" in decided.reason and "40 attempt(s)" in decided.reason
    assert decide(dataclasses.replace(job, created_at=now - 600), [], [], [], 0, now, STALL,
                  86_400) is None


def test_decide_leaves_moving_and_finished_jobs_alone() -> None:
    """Activity within the stall time, or an ended job: nothing to do. A complete round that
    nobody folded, or an export that stopped: nudge the aggregator."""
    job = Job("j1", status="RUNNING", phase="training", epoch=1, round=0,
              published="e0001r00000")
    now = 10_000.0
    assert decide(job, [0, 1], [], [], now - 10, now, STALL, 86400) is None
    assert decide(dataclasses.replace(job, status="DONE"), [0, 1], [], [], 0, now, STALL, 86400) is None
    complete = decide(job, [0, 1], [], [0, 1], 0, now, STALL, 86400)
    assert complete is not None and complete.action == AGGREGATE
    exporting = decide(dataclasses.replace(job, phase="exporting"), [], [], [], 0, now, STALL, 86400)
    assert exporting is not None and exporting.action == AGGREGATE
    assert decide(job, [0, 1], [0, 1], [], 0, now, STALL, 86400) is None  # folded already
