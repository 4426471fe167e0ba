"""One scaling policy for the learners, used by the local supervisor and the cloud autoscaler.

Cloud Run worker pools scale on CPU, not on a queue's backlog, so an external controller sets the
instance count: ``bucketlearn autoscale`` (a Cloud Run job run every minute by Cloud Scheduler)
in the cloud, the ``bucketlearn local up --min-workers/--max-workers`` supervisor locally. Both
ask ``desired_workers`` (pure, unit-tested) with the number of *outstanding* tasks, read from the
registry: tasks of every active job's current, published round that are neither applied nor
failed. This is exact (no metric delay), counts in-flight tasks too, and reads one document per
active job.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Protocol

from bucketlearn.config import SCALE_DOWN_COOLDOWN_SECONDS
from bucketlearn.errors import ConfigError
from bucketlearn.ports import Registry
from bucketlearn.services import jobs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScalingPolicy:
    """Desired workers from outstanding tasks, within bounds, with a cool-down on scale-down."""

    min_workers: int = 0
    max_workers: int = 4
    tasks_per_worker: int = 1
    scale_down_cooldown_seconds: float = SCALE_DOWN_COOLDOWN_SECONDS

    def __post_init__(self) -> None:
        if self.min_workers < 0:
            raise ConfigError("min_workers", "a whole number >= 0", self.min_workers)
        if self.max_workers < max(1, self.min_workers):
            raise ConfigError("max_workers", f"a whole number >= max(1, min_workers="
                              f"{self.min_workers})", self.max_workers)
        if self.tasks_per_worker < 1:
            raise ConfigError("tasks_per_worker", "a whole number >= 1", self.tasks_per_worker)


def desired_workers(policy: ScalingPolicy, outstanding_tasks: int, current: int,
                    last_change_at: float | None, now: float) -> int:
    """How many workers to run now.

    Up immediately to ``ceil(outstanding / tasks_per_worker)`` (bounded); down only once the
    cool-down since the last change has passed, so a short gap between epochs does not tear
    workers down; to ``min_workers`` (zero where the platform allows) when nothing is outstanding.
    """
    target = math.ceil(max(0, outstanding_tasks) / policy.tasks_per_worker)
    target = max(policy.min_workers, min(policy.max_workers, target))
    if target >= current:
        return target
    if last_change_at is not None and now - last_change_at < policy.scale_down_cooldown_seconds:
        return current
    return target


def outstanding_tasks(registry: Registry, limit: int = 500) -> int:
    """Tasks of active jobs' current rounds that are neither applied nor failed yet (only a
    round's tasks can be trained at once, so more workers than that would wait)."""
    total = 0
    for job in registry.list_jobs(limit):
        if jobs.is_terminal(job) or job.phase != jobs.TRAINING or not job.plan:
            continue
        epoch = job.epoch
        if epoch < 1 or not job.is_published:
            continue
        done = jobs.done_tasks(registry.get_epoch(job.job_id, epoch))
        total += sum(1 for t in jobs.current_round_tasks(job) if t not in done)
    return total


class WorkerPool(Protocol):
    """The platform's pool of learners (``adapters.cloudrun.CloudRunWorkerPool`` in the cloud)."""

    def current(self) -> int: ...

    def set(self, count: int) -> None: ...


def autoscale_once(registry: Registry, pool: WorkerPool, policy: ScalingPolicy, now: float,
                   state: dict[str, Any]) -> dict[str, Any]:
    """One controller step: read outstanding work and the pool, resize if the policy says so.

    ``state`` carries ``last_change_at`` between runs (the caller persists it).
    """
    outstanding = outstanding_tasks(registry)
    current = pool.current()
    desired = desired_workers(policy, outstanding, current, state.get("last_change_at"), now)
    if desired != current:
        pool.set(desired)
        state["last_change_at"] = now
    decision = {"outstanding_tasks": outstanding, "current": current, "desired": desired,
                "changed": desired != current, **state}
    log.info("autoscale: %s", decision)
    return decision
