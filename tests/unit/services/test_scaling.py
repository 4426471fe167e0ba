"""The scaling policy shared by the local supervisor and the cloud autoscaler."""

from __future__ import annotations

from typing import Any

import pytest

from bucketlearn.adapters.memory import MemoryRegistry
from bucketlearn.config import (
    SCALE_DOWN_COOLDOWN_SECONDS,
    AutoscalerSettings,
    load_autoscaler_settings,
)
from bucketlearn.domain.job import Job, ending_fields, round_key
from bucketlearn.domain.plan import TrainingPlan
from bucketlearn.domain.version import Version
from bucketlearn.errors import ConfigError
from bucketlearn.loops.autoscale import (
    ScalingPolicy,
    autoscale_once,
    desired_workers,
    outstanding_tasks,
)

POLICY = ScalingPolicy(min_workers=0, max_workers=4, tasks_per_worker=2,
                       scale_down_cooldown_seconds=60)


@pytest.mark.parametrize("outstanding, current, expected", [
    (0, 0, 0),      # idle stays at zero
    (1, 0, 1),      # any work wakes one worker
    (5, 1, 3),      # ceil(5 / 2)
    (100, 2, 4),    # capped at max
    (3, 4, 4),      # scale-down waits for the cool-down (last change 10 s ago)
])
def test_desired_workers(outstanding: int, current: int, expected: int) -> None:
    """Up at once, bounded, down only after the cool-down."""
    assert desired_workers(POLICY, outstanding, current, last_change_at=990.0, now=1000.0) \
        == expected


def test_scale_down_after_cooldown_and_to_min() -> None:
    policy = ScalingPolicy(min_workers=1, max_workers=4, scale_down_cooldown_seconds=60)
    assert desired_workers(policy, 0, 4, last_change_at=900.0, now=1000.0) == 1
    assert desired_workers(policy, 0, 4, last_change_at=950.0, now=1000.0) == 4
    assert desired_workers(policy, 0, 0, last_change_at=None, now=1000.0) == 1  # min is a floor


@pytest.mark.parametrize("kwargs, key", [
    ({"min_workers": -1}, "min_workers"),
    ({"min_workers": 3, "max_workers": 2}, "max_workers"),
    ({"max_workers": 0}, "max_workers"),
    ({"tasks_per_worker": 0}, "tasks_per_worker"),
])
def test_policy_validates_bounds(kwargs: dict[str, int], key: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        ScalingPolicy(**kwargs)
    assert excinfo.value.key == key


def seed_job(registry: MemoryRegistry, job_id: str, planned: int, status: str = "RUNNING",
             published: bool = True, parallel: int = 4, round_index: int = 0,
             created_at: float = 1.0) -> None:
    registry.create_job(Job.from_doc({"job_id": job_id, "status": "QUEUED", "phase": "splitting",
                                 "claim": "c", "created_at": created_at}))
    plan = TrainingPlan(parallel_tasks=parallel, shards_per_task=1, tasks_per_epoch=planned,
                        epochs=1, serial_steps=100, decided="test")
    registry.start_training(job_id, "c", {
        "phase": "training", "version": 0, "epoch": 1, "round": round_index,
        "published": round_key(1, round_index) if published else None,
        "plan": plan.to_dict(), "tasks_per_epoch": planned},
        Version(0, "w0"))
    registry.update_job(job_id, {"status": "RUNNING"})
    if status != "RUNNING":
        registry.update_job(job_id, ending_fields(status, 2.0))


def test_outstanding_tasks_counts_the_tasks_of_active_published_rounds() -> None:
    """Only the current round's tasks can be trained at once, and a round is folded whole:
    all of its tasks count until it is."""
    # Prepare
    registry = MemoryRegistry()
    seed_job(registry, "a", planned=6)                                    # round 0-3: 4
    seed_job(registry, "b", planned=3)                                    # round 0-2: 3
    seed_job(registry, "c", planned=9, published=False)                   # not published: 0
    seed_job(registry, "d", planned=9, status="DONE")                     # finished: 0
    seed_job(registry, "e", planned=10, round_index=2)                    # round 8-9: 2
    # Execute / Assert
    assert outstanding_tasks(registry) == 9


def test_newer_ended_jobs_never_hide_a_running_one() -> None:
    """600 newer jobs that ended (empty uploads, rejected in seconds) do not
    push an older running job out of what the autoscaler counts (before: it read the newest 500
    jobs only, counted 0 outstanding tasks and shrank the pool to its minimum)."""
    # Prepare
    registry = MemoryRegistry()
    seed_job(registry, "old", planned=8, created_at=1.0)
    for i in range(600):
        registry.create_job(Job.from_doc({"job_id": f"new-{i}", "status": "REJECTED",
                                          "phase": "rejected", "created_at": 10.0 + i}))
    # Execute / Assert
    assert "old" not in {j.job_id for j in registry.list_jobs(500)}
    assert outstanding_tasks(registry) == 4
    assert [j.job_id for j in registry.list_active_jobs()] == ["old"]


class FakePool:
    def __init__(self, count: int) -> None:
        self.count = count
        self.sets: list[int] = []

    def current(self) -> int:
        return self.count

    def set(self, count: int) -> None:
        self.sets.append(count)
        self.count = count


def test_autoscale_once_resizes_the_pool_and_remembers_when() -> None:
    # Prepare
    registry = MemoryRegistry()
    seed_job(registry, "a", planned=7)  # a round of 4 tasks
    pool = FakePool(0)
    state: dict[str, Any] = {}
    # Execute
    first = autoscale_once(registry, pool, POLICY, 100.0, state)
    registry.update_job("a", ending_fields("DONE", 120.0))
    early = autoscale_once(registry, pool, POLICY, 130.0, state)
    late = autoscale_once(registry, pool, POLICY, 200.0, state)
    # Assert
    assert first["desired"] == 2 and pool.sets == [2, 0]  # 4 tasks, 2 per worker
    assert early["changed"] is False and early["desired"] == 2  # within the cool-down
    assert late["desired"] == 0 and state["last_change_at"] == 200.0


def test_the_aggregator_pool_runs_while_a_job_is_active_and_stops_when_idle() -> None:
    """One aggregator while any job has not ended, within its bounds; none once all ended
    (after the cool-down), so an idle deployment runs no aggregator."""
    # Prepare
    registry = MemoryRegistry()
    seed_job(registry, "a", planned=7)
    workers, aggregators = FakePool(0), FakePool(0)
    policy = ScalingPolicy(0, 1, 20, 60.0)
    state: dict[str, Any] = {}
    # Execute
    first = autoscale_once(registry, workers, POLICY, 100.0, state, aggregators, policy)
    registry.update_job("a", ending_fields("DONE", 120.0))
    early = autoscale_once(registry, workers, POLICY, 130.0, state, aggregators, policy)
    late = autoscale_once(registry, workers, POLICY, 200.0, state, aggregators, policy)
    # Assert
    assert (first["active_jobs"], first["aggregators_desired"]) == (1, 1)
    assert early["aggregators_desired"] == 1  # within the cool-down
    assert late["aggregators_desired"] == 0 and aggregators.sets == [1, 0]


def test_autoscaler_settings_name_what_is_wrong() -> None:
    env = {"BUCKETLEARN_WORKER_POOL": "projects/p/locations/r/workerPools/w",
           "BUCKETLEARN_MIN_WORKERS": "1", "BUCKETLEARN_MAX_WORKERS": "8"}
    assert load_autoscaler_settings(env) == AutoscalerSettings(
        "projects/p/locations/r/workerPools/w", 1, 8, SCALE_DOWN_COOLDOWN_SECONDS)
    pool = "projects/p/locations/r/workerPools/agg"
    with_aggregators = load_autoscaler_settings({**env, "BUCKETLEARN_AGGREGATOR_POOL": pool,
                                                 "BUCKETLEARN_MAX_AGGREGATORS": "2"})
    assert (with_aggregators.aggregator_pool, with_aggregators.max_aggregators) == (pool, 2)
    with pytest.raises(ConfigError) as bad_pool:
        load_autoscaler_settings({**env, "BUCKETLEARN_AGGREGATOR_POOL": "agg"})
    assert "BUCKETLEARN_AGGREGATOR_POOL" in str(bad_pool.value)
    with pytest.raises(ConfigError) as excinfo:
        load_autoscaler_settings({**env, "BUCKETLEARN_WORKER_POOL": "learners"})
    assert "BUCKETLEARN_WORKER_POOL" in str(excinfo.value) and "learners" in str(excinfo.value)
    with pytest.raises(ConfigError):
        load_autoscaler_settings({**env, "BUCKETLEARN_MAX_WORKERS": "lots"})
