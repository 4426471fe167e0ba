"""One scaling policy for the learners, used by the local supervisor and the cloud autoscaler.

Cloud Run worker pools scale on CPU, not on a queue's backlog, so an external controller sets the
instance count: ``bucketlearn autoscale`` (a Cloud Run job run every minute by Cloud Scheduler)
in the cloud, the ``bucketlearn local up --min-workers/--max-workers`` supervisor locally. Both
ask ``desired_workers`` (pure, unit-tested) with the number of *outstanding* tasks, read from the
registry: tasks of every active job's current, published round that are neither applied nor
failed, and parts of batch predictions not yet predicted. This is exact (no metric delay),
counts in-flight tasks too, and reads one document per active job or running request.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Protocol

from bucketlearn.config import SCALE_DOWN_COOLDOWN_SECONDS
from bucketlearn.domain.lifecycle import TRAINING
from bucketlearn.domain.search import outstanding
from bucketlearn.errors import ConfigError
from bucketlearn.ports import Registry
from bucketlearn.services import task_messages

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


def outstanding_tasks(registry: Registry) -> int:
    """Tasks of active jobs' current rounds (a round is folded whole, so all of its tasks are
    outstanding until it is; only a round's tasks can be trained at once, so more workers than
    that would wait). Every job that has not ended counts, however many newer ones exist."""
    total = 0
    for job in registry.list_active_jobs():
        if job.is_terminal or job.phase != TRAINING or job.plan is None:
            continue
        if job.epoch < 1 or not job.is_published:
            continue
        total += outstanding(job.search) if job.search else len(task_messages.current_round_tasks(job))
    return total + outstanding_parts(registry)


def outstanding_parts(registry: Registry) -> int:
    """Parts of running batch prediction requests fanned out over the learners that are not
    recorded yet (``usecases.predict_parts``); 0, with a warning, when they cannot be read
    (the jobs' tasks are still served)."""
    try:
        running = registry.running_predictions()
    except Exception:  # noqa: BLE001 - e.g. its index still building after a deployment
        log.warning("autoscale: could not read the running batch predictions", exc_info=True)
        return 0
    return sum(len(record.unrecorded_parts()) for record in running)


def active_jobs(registry: Registry) -> int:
    """Jobs that have not ended: the aggregator pool runs while there is one."""
    return len(registry.list_active_jobs())


class WorkerPool(Protocol):
    """The platform's pool of learners (``adapters.cloudrun.CloudRunWorkerPool`` in the cloud)."""

    def current(self) -> int: ...

    def set(self, count: int) -> None: ...


JOBS_PER_AGGREGATOR = 20  # jobs one aggregator serves before the pool asks for another


def autoscale_once(registry: Registry, pool: WorkerPool, policy: ScalingPolicy, now: float,
                   state: dict[str, Any], aggregators: WorkerPool | None = None,
                   aggregator_policy: ScalingPolicy | None = None) -> dict[str, Any]:
    """One controller step: read outstanding work and the pools, resize if the policy says so.

    The learners follow the outstanding tasks; the aggregators (when given) the jobs that have
    not ended, ``JOBS_PER_AGGREGATOR`` each (one while any job runs, none when idle), with the
    same bounds-and-cool-down policy. ``state`` carries ``last_change_at`` (and
    ``aggregators_changed_at``) between runs (the caller persists it).
    """
    outstanding = outstanding_tasks(registry)
    current = pool.current()
    desired = desired_workers(policy, outstanding, current, state.get("last_change_at"), now)
    if desired != current:
        pool.set(desired)
        state["last_change_at"] = now
    decision = {"outstanding_tasks": outstanding, "current": current, "desired": desired,
                "changed": desired != current, **state}
    if aggregators is not None and aggregator_policy is not None:
        active = active_jobs(registry)
        running = aggregators.current()
        wanted = desired_workers(aggregator_policy, active, running,
                                 state.get("aggregators_changed_at"), now)
        if wanted != running:
            aggregators.set(wanted)
            state["aggregators_changed_at"] = now
        decision.update(active_jobs=active, aggregators=running, aggregators_desired=wanted,
                        aggregators_changed_at=state.get("aggregators_changed_at"))
    log.info("autoscale: %s", decision)
    return decision
