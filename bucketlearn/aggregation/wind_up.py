"""What happens once a job has ended: keep its model, delete what nothing will read again.

The aggregator calls ``wind_up`` when it finds one of its jobs ended (DONE after the export;
FAILED; CANCELLED, which the canceller announces with a nudge). It is idempotent, so a second
call (a redelivered nudge, another aggregator) changes nothing:

* a CANCELLED job's last version is exported as ``models/<job>/latest.keras`` and
  ``v<N>.keras``, as a DONE job's is, so its model downloads from the models bucket (the
  dashboard's account cannot read the work bucket the model would otherwise be built from);
* the manifest and the head's state are kept beside the model (``models/<job>/manifest.json``,
  ``v<N>.safetensors``; a DONE job's since its export), for a job continued from it;
* the job's work prefix (shards, holdout, manifest) is deleted, rather than left to the work
  bucket's lifecycle, which could otherwise delete a long-running job's shards under it;
* every version's weights but the head's are deleted: a job of a million tasks would otherwise
  keep a million states. ``download --version N`` serves the exported versions (the head's),
  and says so for the others;
* the job's leftover results in the deltas bucket are deleted.
"""

from __future__ import annotations

import logging

from bucketlearn import layout
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import CANCELLED
from bucketlearn.errors import NotFoundError
from bucketlearn.ports import Services
from bucketlearn.services.export import keep_for_continuing, write_model

log = logging.getLogger(__name__)


def wind_up(svc: Services, job: Job) -> None:
    """Export a cancelled job's head, then delete its work objects, old weights and results."""
    if not job.is_terminal:
        return
    if job.status == CANCELLED and job.version is not None and job.model_path is None \
            and not job.search:  # a search cancelled has no one model to keep
        _export_cancelled(svc, job)
    if job.status == CANCELLED and job.head is not None and not job.search:
        _keep_for_continuing(svc, job)  # a FAILED job is never continued from
    _delete(svc, svc.settings.work_bucket, layout.job_prefix(job.job_id))
    head = job.head.weights_path if job.head is not None else None
    _delete(svc, svc.settings.models_bucket, f"weights/{job.job_id}/", keep=head)
    _delete(svc, svc.settings.deltas_bucket, layout.job_delta_prefix(job.job_id))


def _export_cancelled(svc: Services, job: Job) -> None:
    """The head version as ``latest.keras`` and ``v<N>.keras``; ``model_path`` recorded."""
    from bucketlearn.usecases.model_files import model_bytes  # noqa: PLC0415

    try:
        data, version = model_bytes(svc, job.job_id, job.version)
    except NotFoundError as exc:
        log.warning("job %s: its last version could not be exported: %s", job.job_id, exc)
        return
    write_model(svc, job.job_id, version, data)
    svc.registry.update_job_if(job.job_id, {"status": CANCELLED},
                               {"model_path": layout.model_path(job.job_id)})
    log.info("job %s: cancelled at v%d; that version exported", job.job_id, version)


def _keep_for_continuing(svc: Services, job: Job) -> None:
    """The job's manifest and head's state kept beside its model (``keep_for_continuing``),
    before the work prefix and old weights are deleted: a cancelled job's (a DONE job's were
    kept at its export: nothing to do). Its manifest already deleted: nothing to do."""
    assert job.head is not None
    bucket = svc.settings.models_bucket
    if svc.store.stat(bucket, layout.kept_weights_path(job.job_id, job.head.version)):
        return
    try:
        raw = svc.store.read_bytes(svc.settings.work_bucket, layout.manifest_path(job.job_id))
        keep_for_continuing(svc, job.job_id, job.head, raw)
    except NotFoundError:
        log.warning("job %s: not kept for continued training (its manifest or head's state is "
                    "gone)", job.job_id)


def _delete(svc: Services, bucket: str, prefix: str, keep: str | None = None) -> int:
    """Delete every object under ``prefix`` (but ``keep``); return how many."""
    deleted = 0
    for info in list(svc.store.list(bucket, prefix)):
        if info.name == keep:
            continue
        try:
            svc.store.delete(bucket, info.name)
            deleted += 1
        except Exception:  # noqa: BLE001 - the bucket's lifecycle removes what is left
            log.debug("could not delete gs://%s/%s", bucket, info.name, exc_info=True)
    return deleted
