"""Results refused at a fold (``services.results`` says why): never folded; their tasks trained
again, or failed for good once refused ``domain.fold.MAX_REFUSALS`` times in an epoch."""

from __future__ import annotations

import logging
from typing import Any

from bucketlearn import layout
from bucketlearn.domain import fold
from bucketlearn.domain.job import Job
from bucketlearn.domain.rounds import DeltaRef, RoundObjects
from bucketlearn.services import task_messages
from bucketlearn.services.caches import job_runtime
from bucketlearn.services.results import HeardResult
from bucketlearn.usecases.publish import announce_failure

log = logging.getLogger(__name__)


def refuse(aggregator: Any, job: Job, objects: RoundObjects, refused: dict[int, str]) -> None:
    """Never fold a refused result: delete it and train its task again, or fail the task for
    good once its results were refused ``MAX_REFUSALS`` times in this epoch
    (``domain.fold.count_refusals``). The refusal counts are written first, on condition
    that the job is where it was read and still ``aggregator``'s (a ``JobAggregator``): one
    that lost the job (or a round folded meanwhile) deletes, announces and publishes nothing."""
    job_id, epoch = job.job_id, job.epoch
    tally = fold.count_refusals(job.refusals, epoch, refused)
    first = min(refused)
    last = f"{layout.task_id_for(job_id, epoch, first)}: {refused[first]}"
    fields = {"refusals": tally.counts, "deltas_refused": job.deltas_refused + len(refused),
              "last_refusal": last[:2000], "updated_at": aggregator.svc.clock()}
    expect = {**job.epoch_round_version, "status": job.status, "aggregated_by": job.aggregated_by}
    if not aggregator.svc.registry.update_job_if(job_id, expect, fields):
        log.warning("job %s: refusals not recorded: the job changed or was taken over",
                    job_id)
        aggregator.refresh()
        return
    aggregator.job = job.updated(fields)
    retrain = []
    for task_index, reason in sorted(refused.items()):
        task_id = layout.task_id_for(job_id, epoch, task_index)
        log.error("job %s: refused the result of %s (%s)", job_id, task_id, reason)
        aggregator.drop([objects.results[task_index]], delete=True)
        if task_index in tally.failed:
            times = tally.times(epoch, task_index)
            path = announce_failure(aggregator.svc, job_id, epoch, task_index,
                                    f"task {task_id}: its result was refused {times} "
                                    f"times, last because {reason}", round_index=job.round)
            aggregator.heard.setdefault(path, HeardResult(DeltaRef(path, task_index, True), epoch))
        else:
            retrain.append(task_index)
    if retrain:
        shards = job_runtime(aggregator.svc, job).manifest.shards
        aggregator.svc.queue.publish(task_messages.round_messages(job, shards, retrain))
