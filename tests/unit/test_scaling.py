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
from bucketlearn.domain.job import Epoch, Job, Version
from bucketlearn.domain.plan import TrainingPlan
from bucketlearn.errors import ConfigError
from bucketlearn.services import jobs
from bucketlearn.services.autoscale import (
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


def seed_job(registry: MemoryRegistry, job_id: str, planned: int, applied: list[int],
             status: str = "RUNNING", published: bool = True, failed: list[int] | None = None,
             parallel: int = 4, round_index: int = 0) -> None:
    registry.create_job(Job.from_doc({"job_id": job_id, "status": "QUEUED", "phase": "splitting",
                                 "claim": "c", "created_at": 1.0}))
    plan = TrainingPlan(parallel_tasks=parallel, shards_per_task=1, tasks_per_epoch=planned,
                        epochs=1, serial_steps=100, decided="test")
    registry.start_training(job_id, "c", {
        "phase": "training", "version": 0, "epoch": 1, "round": round_index,
        "published": jobs.round_key(1, round_index) if published else None,
        "plan": plan.to_dict(), "tasks_per_epoch": planned},
        Version(0, "w0"), Epoch(1, planned, applied=tuple(applied), failed=tuple(failed or ())))
    registry.update_job(job_id, {"status": status})


def test_outstanding_tasks_counts_unfinished_tasks_of_active_published_rounds() -> None:
    """Only the current round's tasks can be trained at once: those not yet done count."""
    # Prepare
    registry = MemoryRegistry()
    seed_job(registry, "a", planned=6, applied=[0, 1])                    # round 0-3: 2 left
    seed_job(registry, "b", planned=3, applied=[], failed=[2])            # round 0-2: 2 left
    seed_job(registry, "c", planned=9, applied=[], published=False)       # not published: 0
    seed_job(registry, "d", planned=9, applied=[], status="DONE")         # finished: 0
    seed_job(registry, "e", planned=10, applied=[0, 1, 2, 3, 8], round_index=2)  # 8-9: 1 left
    # Execute / Assert
    assert outstanding_tasks(registry) == 5


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
    seed_job(registry, "a", planned=7, applied=[])  # a round of 4 tasks
    pool = FakePool(0)
    state: dict[str, Any] = {}
    # Execute
    first = autoscale_once(registry, pool, POLICY, 100.0, state)
    registry.update_job("a", {"status": "DONE"})
    early = autoscale_once(registry, pool, POLICY, 130.0, state)
    late = autoscale_once(registry, pool, POLICY, 200.0, state)
    # Assert
    assert first["desired"] == 2 and pool.sets == [2, 0]  # 4 tasks, 2 per worker
    assert early["changed"] is False and early["desired"] == 2  # within the cool-down
    assert late["desired"] == 0 and state["last_change_at"] == 200.0


def test_autoscaler_settings_name_what_is_wrong() -> None:
    env = {"BUCKETLEARN_WORKER_POOL": "projects/p/locations/r/workerPools/w",
           "BUCKETLEARN_MIN_WORKERS": "1", "BUCKETLEARN_MAX_WORKERS": "8"}
    assert load_autoscaler_settings(env) == AutoscalerSettings(
        "projects/p/locations/r/workerPools/w", 1, 8, SCALE_DOWN_COOLDOWN_SECONDS)
    with pytest.raises(ConfigError) as excinfo:
        load_autoscaler_settings({**env, "BUCKETLEARN_WORKER_POOL": "learners"})
    assert "BUCKETLEARN_WORKER_POOL" in str(excinfo.value) and "learners" in str(excinfo.value)
    with pytest.raises(ConfigError):
        load_autoscaler_settings({**env, "BUCKETLEARN_MAX_WORKERS": "lots"})
