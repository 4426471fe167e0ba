"""Ending a job and building its task messages: ``end_job`` (an ending written unless the job
has ended already), and the task messages of a round (``round_messages``,
``position_messages``, ``current_round_tasks``, ``task_doc_id``).

The vocabulary, the rules and the changes of a job's life (statuses, ``Job`` and its ``plan``,
``ending_fields`` and the other transitions) live in ``bucketlearn.domain.job``; the status object in ``services.status``; waiting for a job
to end in ``services.waiting``."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from bucketlearn import layout
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import TERMINAL
from bucketlearn.domain.plan import epoch_tasks
from bucketlearn.errors import TransientError
from bucketlearn.ports import TaskMessage

# What this module defines, and all it offers: it re-exports nothing (a job's vocabulary is
# imported from the domain, where it lives).
__all__ = ["END_ATTEMPTS", "current_round_tasks", "end_job", "position_messages",
           "round_messages", "task_doc_id"]

END_ATTEMPTS = 20  # conditional writes of an ending before giving up (the job kept changing)


def end_job(registry: Any, job_id: str, fields: Mapping[str, Any],
            expect: Mapping[str, Any] | None = None,
            attempts: int = END_ATTEMPTS) -> tuple[bool, Job | None]:
    """End the job with ``fields`` (an ending: ``domain.job.ending_fields``, ``fail_fields`` or
    ``cancel_fields``) unless it has ended already or no longer stands as its caller
    ``expect``s (document fields and their values: a split's claim, a writer's fence): the one
    path every ending takes, so no ending ever overwrites another (a cancel, a rejection, DONE).

    A conditional update on the status and phase just read (and ``expect``); when something else
    wrote the job in between, it reads again and retries. The move itself is checked against
    ``domain.lifecycle`` by the registries.

    Returns:
        (True, the document before this ending) when this call ended the job; (False, the
        current document) when it had ended already or does not stand as expected; (False,
        None) when there is no such job.

    Raises:
        ValueError: ``fields`` is not an ending.
        TransientError: the job kept changing for ``attempts`` reads in a row.
    """
    if fields.get("status") not in TERMINAL:
        raise ValueError(f"job {job_id}: expected an ending (one of {', '.join(TERMINAL)}); "
                         f"found status {fields.get('status')!r}")
    for attempt in range(attempts):
        job = registry.get_job(job_id)
        if job is None or job.is_terminal:
            return False, job
        doc = job.to_doc()
        if expect and any(doc.get(key) != value for key, value in expect.items()):
            return False, job
        if registry.update_job_if(job_id, {**job.status_and_phase, **(expect or {})}, fields):
            return True, job
        time.sleep(min(0.02 * (attempt + 1), 0.2))
    raise TransientError(f"job {job_id}: its document changed on each of {attempts} attempts to "
                         f"end it as {fields.get('status')}; try again")


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
