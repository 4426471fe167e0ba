"""Publishing a job's current round: its task messages, then ``published`` recorded once.

Used by the upload service (round 1 of epoch 1), the aggregator (every next round) and the
watchdog's nudge (a round whose publish was lost).
"""

from __future__ import annotations

import logging

from bucketlearn.bootstrap import Services
from bucketlearn.domain.job import Job
from bucketlearn.errors import TransientError
from bucketlearn.ingest.split import Manifest
from bucketlearn.services import jobs
from bucketlearn.services.runtime import job_runtime

log = logging.getLogger(__name__)


def publish_round(svc: Services, job: Job, manifest: Manifest | None = None) -> None:
    """Publish the tasks of the job's current round, then record that it is published.

    Idempotent in effect: publishing a round twice (a crash between the two steps) trains its
    tasks twice at most, and the aggregator applies each once.
    """
    if manifest is None:
        manifest = job_runtime(svc, job).manifest
    done = jobs.done_tasks(svc.registry.get_epoch(job.job_id, job.epoch))
    pending = [t for t in jobs.current_round_tasks(job) if t not in done]
    messages = jobs.round_messages(job, manifest.shards, pending)
    svc.queue.publish(messages)
    key = job.round_key
    if not _record_published(svc, job, key):
        log.warning("job %s: published %d tasks of round %s, but the job has moved on since it "
                    "was read; its 'published' is left as it is", job.job_id, len(messages),
                    key)
        return
    log.info("job %s: published %d tasks of round %s from v%s", job.job_id, len(messages),
             key, job.head.version)


PUBLISH_RECORD_ATTEMPTS = 3


def _record_published(svc: Services, job: Job, key: str) -> bool:
    """Record ``key`` as the job's last published round, only while the job is still where it
    was when the round was published (epoch, round and version), so ``published`` never goes
    back to an older round; False when the job has moved on."""
    position = jobs.round_position(job)
    for _ in range(PUBLISH_RECORD_ATTEMPTS):
        now = svc.clock()
        if svc.registry.update_job_if(job.job_id, position,
                                      {"published": key, "published_at": now, "updated_at": now}):
            return True
        # refused: the job moved on, or (Firestore) another write landed between read and write
        current = svc.registry.get_job(job.job_id)
        if current is None or jobs.round_position(current) != position:
            return False
    raise TransientError(f"job {job.job_id}: could not record round {key} as published "
                         f"after {PUBLISH_RECORD_ATTEMPTS} attempts (the job document kept "
                         "changing)")
