"""The task messages of a job's round (``round_messages``, ``position_messages``), the tasks
its current round spans (``current_round_tasks``) and a task's record id (``task_doc_id``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bucketlearn import layout
from bucketlearn.domain.job import Job
from bucketlearn.domain.plan import epoch_tasks
from bucketlearn.ports import TaskMessage

# What this module defines, and all it offers: it re-exports nothing.
__all__ = ["current_round_tasks", "position_messages", "round_messages", "task_doc_id"]


def round_messages(job: Job, shards: Sequence[Any],
                   task_indices: Sequence[int] | None = None) -> list[TaskMessage]:
    """The task messages of the job's current round (or of ``task_indices`` in it), each naming
    the head version it trains from and the share of the job its round spans.

    Args:
        job: the job document (its plan, options, epoch, round and head).
        shards: the manifest's shards (``ingest.manifest.Shard``), in shard order.
        task_indices: only these tasks of the round (a retry); all of them when None.
    """
    head = job.head
    if head is None or job.plan is None:
        raise ValueError(f"job {job.job_id} has no head version to train from (not split yet)")
    return position_messages(job, shards, job.epoch, job.round, head.version, head.weights_path,
                             head.digest, task_indices)


def position_messages(job: Job, shards: Sequence[Any], epoch: int, round_index: int,
                      base_version: int, weights_path: str, base_digest: str,
                      task_indices: Sequence[int] | None = None) -> list[TaskMessage]:
    """The task messages of round ``round_index`` of ``epoch`` from the version named (the
    current round's from the head, or, for a learner chaining at R = 1, the next round's from
    the state its task ended with, which the fold makes the next version)."""
    plan = job.plan
    if plan is None:
        raise ValueError(f"job {job.job_id} has no plan to train (not split yet)")
    tasks = epoch_tasks(plan, len(shards), int(job.options["seed"]), epoch)
    span = plan.span(epoch, round_index)
    wanted = plan.round_range(round_index) if task_indices is None else task_indices
    messages = []
    for task_index in wanted:
        members = [shards[i] for i in tasks[task_index]]
        messages.append(TaskMessage(
            job_id=job.job_id, epoch=epoch, task_index=int(task_index),
            parts=tuple(part for shard in members for part in shard.parts),
            rows=sum(int(shard.rows) for shard in members), round=round_index,
            base_version=base_version, weights_path=weights_path, span=span,
            base_digest=base_digest))
    return messages


def current_round_tasks(job: Job) -> range:
    """The task indices (within the epoch) of the job's current round."""
    if job.plan is None:
        raise ValueError(f"job {job.job_id} has no rounds (not split yet)")
    return job.plan.round_range(job.round)


def task_doc_id(job_id: str, epoch: int, task_index: int) -> str:
    return layout.task_id_for(job_id, epoch, task_index).split(":", 1)[1]
