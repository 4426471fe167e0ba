"""Cancelling a job: the one service the CLI (``bucketlearn cancel``) and the dashboard call.

Cancelling is one conditional write to the job document (``endings.end_job``): any status that has
not ended becomes CANCELLED, with who cancelled it, when and why (``domain.job.cancel_fields``). Everything else follows from
CANCELLED being terminal: workers acknowledge the job's tasks without training them
(``domain.task.skip_reason``), the aggregator stops (``_drain``) and neither registry commits a
version onto it (``domain.job.commit_refusal``, so a fold already in flight cannot advance it), the
export does not mark it DONE, a split in progress does not make it trainable
(``start_training`` refuses), the watchdog leaves it alone and the autoscaler counts none of its
tasks. The cancel announces itself to the aggregator (a nudge on the results topic), which
exports the head version as ``models/<job>/latest.keras`` and winds the job up
(``aggregation.wind_up``); until then ``model_files.model_bytes`` builds the ``.keras`` from the stored
weights.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

from bucketlearn.domain.job import cancel_fields
from bucketlearn.domain.lifecycle import CANCELLED
from bucketlearn.errors import NotFoundError
from bucketlearn.ports import Services
from bucketlearn.services import endings

log = logging.getLogger(__name__)

class CancelResult(enum.Enum):
    CANCELLED = "cancelled"  # this call cancelled the job
    ALREADY_CANCELLED = "already_cancelled"
    ALREADY_ENDED = "already_ended"  # DONE, REJECTED or FAILED: nothing to cancel


@dataclass(frozen=True)
class CancelOutcome:
    """What ``cancel_job`` did, and the sentence to show for it."""

    result: CancelResult
    job_id: str
    status: str  # the job's status now
    previous_status: str | None  # before this call (None unless it cancelled the job)
    version: int | None  # the head version: the model that stays downloadable
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result.value, "job_id": self.job_id, "status": self.status,
                "previous_status": self.previous_status, "version": self.version,
                "message": self.message}


def _tell_the_aggregator(svc: Services, job_id: str, by: str) -> None:
    """A nudge on the results topic: the aggregator exports the cancelled job's last version
    and winds it up (``aggregation.wind_up``). Best effort: the cancel has happened either way."""
    from bucketlearn.ports import NUDGE, ResultMessage  # noqa: PLC0415

    try:
        svc.results.publish([ResultMessage(job_id=job_id, kind=NUDGE,
                                           reason=f"cancelled by {by}"[:500],
                                           sent_at=svc.clock())])
    except Exception:  # noqa: BLE001 - the model still downloads, built from its weights
        log.warning("job %s: cancelled, but the aggregator could not be told", job_id,
                    exc_info=True)


def cancel_job(svc: Services, job_id: str, by: str, reason: str | None = None) -> CancelOutcome:
    """Cancel a job that has not ended.

    Args:
        svc: the services (only the registry is used).
        job_id: the job to cancel.
        by: who cancels it, as shown to users ("alice@host (bucketlearn cancel)").
        reason: why, if given.

    Returns:
        CANCELLED when this call cancelled it; ALREADY_CANCELLED (nothing to do); ALREADY_ENDED
        when it is DONE, REJECTED or FAILED (refused: its outcome stands).

    Raises:
        NotFoundError: there is no such job.
        TransientError: the registry is unavailable, or the job changed on every attempt.
    """
    ended, job = endings.end_job(svc.registry, job_id, cancel_fields(by, reason, svc.clock()))
    if job is None:
        raise NotFoundError(f"job {job_id}: no such job")
    version = job.version
    if ended:
        _tell_the_aggregator(svc, job_id, by)
        kept = (f"its last version, v{version}, stays downloadable: bucketlearn download "
                f"{job_id}" if version is not None else "it had no model version yet")
        log.warning("job %s cancelled by %s (was %s, %s at v%s)", job_id, by, job.status,
                    job.phase, version)
        return CancelOutcome(CancelResult.CANCELLED, job_id, CANCELLED, job.status,
                             version, f"job {job_id} cancelled (it was {job.status}, "
                                      f"{job.phase}); {kept}")
    status = str(job.status)
    if status == CANCELLED:
        return CancelOutcome(CancelResult.ALREADY_CANCELLED, job_id, status, None, version,
                             f"job {job_id} is already CANCELLED ({job.error})")
    return CancelOutcome(CancelResult.ALREADY_ENDED, job_id, status, None, version,
                         f"job {job_id} is already {status}; only a job that has not ended "
                         "can be cancelled")
