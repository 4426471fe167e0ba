"""bucketlearn.domain.job: the changes of a job's life, each the field update its service writes
(start, publish, commit, fail, cancel; ``ending_fields`` in test_job.py), and what each expects
to find unchanged."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from bucketlearn.domain import job as J
from bucketlearn.domain import lifecycle as L
from bucketlearn.domain.forecast import ModelCost, forecast_plan
from bucketlearn.domain.head import Head
from bucketlearn.domain.plan import TrainingPlan

# 2 epochs of 3 rounds of 2 tasks (5 tasks an epoch: the last round has 1)
PLAN = TrainingPlan(parallel_tasks=2, shards_per_task=1, tasks_per_epoch=5, epochs=2,
                    serial_steps=40, decided="test")
COST = ModelCost(flops_per_row=1e4, parameters=500, layers=2)
TRAINING = J.Job("j1", status=L.RUNNING, phase=L.TRAINING, version=4, epoch=1, round=1,
                 plan=PLAN, head=Head(4, "w4", "c4", digest="d4"), tasks_applied=6,
                 tasks_failed=1, samples_seen=600, started_at=5.0, health={"worst": 1.0},
                 options={"max_failed_tasks": 2})


def test_training_starts_at_round_0_of_epoch_1_from_version_0() -> None:
    """``start_fields``: the split's last write; the job reads back trainable, with its plan."""
    # Prepare
    head = Head(0, "w0", "c0", digest="d0")
    forecast = forecast_plan(PLAN, 800, 32, COST)
    # Execute
    fields = J.start_fields(PLAN, head, 30.0, forecast, COST, {"rows": 1000}, {"kind": "mlp"},
                            {"function_invocations": 1.0})
    # Assert
    assert fields == {
        "phase": L.TRAINING, "version": 0, "epoch": 1, "round": 0, "published": None,
        "plan": PLAN.to_dict(), "tasks_per_epoch": 5,
        "forecast": {**forecast.to_dict(), "model": COST.to_dict(), "made_at": 30.0},
        "tasks_planned": 10, "dataset": {"rows": 1000}, "model": {"kind": "mlp"},
        "updated_at": 30.0, "head": head.to_doc(), "usage": {"function_invocations": 1.0}}
    started = J.Job("j1", phase=L.SPLITTING, claim="c").updated(fields)
    assert (started.plan, started.head, started.round_key, started.is_published) == (
        PLAN, head, "e0001r00000", False)
    assert J.unknown_fields(fields) == []


def test_training_starts_from_no_other_version_than_0() -> None:
    with pytest.raises(ValueError, match="version 0, not v3"):
        J.start_fields(PLAN, Head(3, "w3", "c3"), 1.0, forecast_plan(PLAN, 800, 32, COST), COST,
                       {}, {}, {})


def test_a_published_round_is_recorded_under_its_name_with_no_chain() -> None:
    """``publish_fields``: written only while the job stays at its ``position`` as read."""
    # Execute
    fields = J.publish_fields(TRAINING, 40.0)
    # Assert
    assert fields == {"published": "e0001r00001", "published_at": 40.0, "updated_at": 40.0,
                      "chained_by": None}
    assert TRAINING.updated(fields).is_published
    assert TRAINING.epoch_round_version == {"epoch": 1, "round": 1, "version": 4}


@pytest.mark.parametrize("job", [replace(TRAINING, plan=None), replace(TRAINING, head=None)],
                         ids=["no-plan", "no-head"])
def test_a_job_not_split_yet_has_no_round_to_publish(job: J.Job) -> None:
    with pytest.raises(ValueError, match="no round to publish"):
        J.publish_fields(job, 1.0)


def _commit(job: J.Job, failures: tuple[str, ...] = (), **kwargs: Any) -> dict[str, Any]:
    """The commit of v5 onto ``job`` (2 results applied, 200 rows), at t = 50."""
    head = Head(5, "w5", "c5", digest="d5")
    return J.commit_fields(job, head, 2, list(failures), 200, 0.5, {"worker_seconds": 3.0},
                           kwargs.pop("health", {"worst": 1.0}), 50.0, **kwargs)


def test_a_commit_advances_the_counters_and_opens_the_next_round_published() -> None:
    """A round folded mid-epoch: RUNNING at the new head, counters advanced, the next round
    recorded as published in the same commit (with the learner that chains into it)."""
    # Execute
    fields = _commit(TRAINING, chained_by="w-7")
    # Assert
    assert fields == {
        "version": 5, "status": L.RUNNING, "updated_at": 50.0, "tasks_applied": 8,
        "tasks_failed": 1, "samples_seen": 800, "delta_norm": 0.5,
        "head": Head(5, "w5", "c5", digest="d5").to_doc(), "usage": {"worker_seconds": 3.0},
        "epoch": 1, "round": 2, "published": "e0001r00002", "published_at": 50.0,
        "chained_by": "w-7"}
    moved = TRAINING.updated(fields)
    assert (moved.round_key, moved.is_published, moved.version) == ("e0001r00002", True, 5)


@pytest.mark.parametrize(("job", "failures", "expected"), [
    (replace(TRAINING, round=2), (), {"epoch": 2, "round": 0, "published": "e0002r00000"}),
    (replace(TRAINING, epoch=2, round=2), (), {"phase": L.EXPORTING}),
    (TRAINING, ("task t2: bad shard", "task t3: gone"),
     {"status": L.FAILED, "phase": L.FAILED_PHASE, "finished_at": 50.0,
      "error": "3 task(s) failed for good (the job allows 2): task t2: bad shard"}),
], ids=["next-epoch", "export", "too-many-failures"])
def test_a_commit_takes_the_job_where_its_fold_leads(job: J.Job, failures: tuple[str, ...],
                                                     expected: dict[str, Any]) -> None:
    """The last round of an epoch opens the next epoch; of the last epoch, the export (nothing
    published); more failed tasks than the job allows end it FAILED, with the first reason."""
    # Execute
    fields = _commit(job, failures)
    # Assert
    assert {k: fields[k] for k in expected} == expected
    assert ("published" in fields) == ("round" in expected)
    assert fields["tasks_failed"] == 1 + len(failures)


def test_a_commit_records_a_changed_health_and_the_first_commit_when_training_started() -> None:
    """``health`` only when the watch changed it; ``started_at`` only at the job's first commit."""
    # Execute
    same = _commit(TRAINING)
    changed = _commit(TRAINING, health={"worst": 2.0})
    first = _commit(replace(TRAINING, started_at=None))
    # Assert
    assert "health" not in same and changed["health"] == {"worst": 2.0}
    assert "started_at" not in same and first["started_at"] == 50.0


@pytest.mark.parametrize(("job", "match"), [
    (replace(TRAINING, status=L.CANCELLED), "it is CANCELLED"),
    (replace(TRAINING, plan=None), "not split yet"),
    (replace(TRAINING, version=3), "onto v3 makes v4, not v5"),
], ids=["ended", "no-plan", "not-the-next-version"])
def test_a_commit_refuses_a_job_it_cannot_advance(job: J.Job, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _commit(job)


def test_a_failure_ends_the_job_failed_with_its_reason_bounded() -> None:
    """``fail_fields``: the ending FAILED, its reason at most ``MAX_ERROR_CHARS``, the caller's
    fields beside it."""
    # Execute
    fields = J.fail_fields(60.0, "x" * 2500, health={"worst": 9.0})
    # Assert
    assert fields == {"status": L.FAILED, "phase": L.FAILED_PHASE, "finished_at": 60.0,
                      "updated_at": 60.0, "error": "x" * J.MAX_ERROR_CHARS,
                      "health": {"worst": 9.0}}
    assert J.fail_fields(60.0, "diverged") == J.ending_fields(L.FAILED, 60.0, error="diverged")


@pytest.mark.parametrize(("error", "extra"), [(" ", {}), ("why", {"phase": "x"})],
                         ids=["no-reason", "its-own-phase"])
def test_a_failure_refuses_no_reason_and_fields_an_ending_sets(error: str,
                                                               extra: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="reason|ending"):
        J.fail_fields(1.0, error, **extra)


def test_a_cancel_says_who_when_and_why() -> None:
    """``cancel_fields``: the ending CANCELLED, its sentence naming who, when (UTC) and why."""
    # Execute
    fields = J.cancel_fields("  ana@host ", " too slow ", 0.0)
    # Assert
    assert fields == {"status": L.CANCELLED, "phase": L.CANCELLED_PHASE, "finished_at": 0.0,
                      "updated_at": 0.0,
                      "error": "cancelled by ana@host at 1970-01-01 00:00:00 UTC: too slow",
                      "cancelled_at": 0.0, "cancelled_by": "ana@host", "cancel_reason": "too slow"}
    assert TRAINING.updated(fields).is_terminal


def test_a_cancel_bounds_what_the_user_typed_and_names_someone() -> None:
    # Execute
    blank = J.cancel_fields("   ", None, 0.0)
    long = J.cancel_fields("a" * 600, "r" * 900, 0.0)
    # Assert
    assert blank["cancelled_by"] == "someone" and blank["cancel_reason"] is None
    assert blank["error"] == "cancelled by someone at 1970-01-01 00:00:00 UTC"
    assert len(long["cancel_reason"]) == len(long["cancelled_by"]) == J.MAX_CANCEL_CHARS
    assert long["cancel_reason"].endswith("…(900 characters)")
    assert long["cancelled_by"].endswith("…(600 characters)")


def test_what_an_ending_and_a_split_expect_to_find_unchanged() -> None:
    """An ending is written only while the job stands as read (``standing``); a split's writes
    only while it is still splitting under its claim (``splitting_under``)."""
    assert TRAINING.status_and_phase == {"status": L.RUNNING, "phase": L.TRAINING}
    assert J.splitting_under("c1") == {"claim": "c1", "phase": L.SPLITTING}
