"""What goes on the topics: a job's round of tasks (tasks topic), a task given up on (results
topic).

``publish_round`` is used by the upload service (round 1 of epoch 1), the aggregator (every next
round, its publish record already in the commit that opened it; a round a chain left; a takeover)
and a nudge (a round whose publish was lost). ``announce_failure`` by the learner after a task's
last attempt, the aggregator after its last refused result and the watchdog for a dead-lettered
task.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from bucketlearn import layout
from bucketlearn.domain.job import Job, publish_fields
from bucketlearn.domain.task import FailureMarker
from bucketlearn.errors import TransientError
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ports import FAILED, ResultMessage, Services
from bucketlearn.services import task_messages
from bucketlearn.services.caches import job_runtime

log = logging.getLogger(__name__)


def publish_round(svc: Services, job: Job, manifest: Manifest | None = None,
                  task_indices: list[int] | None = None, record: bool = True) -> None:
    """Publish the tasks of the job's current round (or ``task_indices`` of it), then, with
    ``record``, record that the round is published (the aggregator records it in the commit
    that opens the round instead).

    Idempotent in effect: publishing a round twice (a crash between the two steps) trains its
    tasks twice at most, and the aggregator applies each once.
    """
    if manifest is None:
        manifest = job_runtime(svc, job).manifest
    messages = task_messages.round_messages(job, manifest.shards, task_indices)
    svc.queue.publish(messages)
    key = job.round_key
    if record and not _record_published(svc, job, key):
        log.warning("job %s: published %d tasks of round %s, but the job has moved on since it "
                    "was read; its 'published' is left as it is", job.job_id, len(messages),
                    key)
        return
    log.info("job %s: published %d tasks of round %s from v%s", job.job_id, len(messages),
             key, job.head.version if job.head else None)


PUBLISH_RECORD_ATTEMPTS = 3


def _record_published(svc: Services, job: Job, key: str) -> bool:
    """Record ``key`` as the job's last published round, only while the job is still where it
    was when the round was published (epoch, round and version), so ``published`` never goes
    back to an older round; False when the job has moved on or ended (an ended job records no
    round)."""
    position = job.epoch_round_version
    for _ in range(PUBLISH_RECORD_ATTEMPTS):
        if svc.registry.update_job_if(job.job_id, position, publish_fields(job, svc.clock())):
            return True
        # refused: the job moved on, or (Firestore) another write landed between read and write
        current = svc.registry.get_job(job.job_id)
        if current is None or current.is_terminal or current.epoch_round_version != position:
            return False
    raise TransientError(f"job {job.job_id}: could not record round {key} as published "
                         f"after {PUBLISH_RECORD_ATTEMPTS} attempts (the job document kept "
                         "changing)")


def announce_failure(svc: Services, job_id: str, epoch: int, task_index: int, reason: str,
                     detail: dict[str, Any] | None = None, round_index: int = 0) -> str:
    """Tell the aggregator a task failed for good: write its failure marker (which the
    watchdog's listing finds too), then announce it on the results topic. Returns the marker's
    name."""
    marker = FailureMarker(task_index, reason, job_id, layout.task_id_for(job_id, epoch, task_index),
                           epoch, detail or {})
    path = layout.failure_marker_path(job_id, epoch, task_index, layout.new_nonce())
    svc.store.write_bytes(svc.settings.deltas_bucket, path, json.dumps(marker.to_doc()).encode(),
                          "application/json", metadata={"failed": "true"})
    svc.results.publish([ResultMessage(job_id=job_id, kind=FAILED, epoch=epoch,
                                       task_index=task_index, round=round_index, path=path,
                                       reason=reason[:2000], sent_at=svc.clock())])
    return path
