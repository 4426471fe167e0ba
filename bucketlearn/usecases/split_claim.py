"""A split's claim on its job: which invocation of the upload function splits an upload, and
every write it makes while it does."""

from __future__ import annotations

from typing import Any

from bucketlearn.domain.job import claim_renewal_due, may_start_training, splitting_under
from bucketlearn.domain.lifecycle import SPLITTING
from bucketlearn.errors import TransientError
from bucketlearn.ports import Services
from bucketlearn.services.endings import end_job

CLAIM_WRITE_ATTEMPTS = 3


class SplitClaim:
    """This invocation's claim on a job's split: the job document's ``claim`` and ``claimed_at``.

    A claim older than the lease counts as abandoned, and a retried event takes the split over.
    So while the split streams, ``renew`` keeps ``claimed_at`` fresh, and every write that moves
    the job on (options, the end of the split as REJECTED or FAILED) is conditional on the claim
    still being this one and the job still splitting (``end`` for the endings): a splitter that lost its claim stops,
    writes nothing more and never touches a job another invocation has moved on.
    """

    def __init__(self, svc: Services, job_id: str, claim: str, claimed_at: float) -> None:
        self.svc, self.job_id, self.claim = svc, job_id, claim
        self.renewed_at = claimed_at

    def update(self, fields: dict[str, Any]) -> bool:
        """Write ``fields`` to the job if this claim still holds it; False (nothing written)
        otherwise.

        Raises:
            TransientError: the claim holds but the write was refused every time (Firestore
                refuses a conditional write when another write lands between its read and
                its write).
        """
        for _ in range(CLAIM_WRITE_ATTEMPTS):
            if self.svc.registry.update_job_if(self.job_id, splitting_under(self.claim), fields):
                return True
            if not self.holds():
                return False
        raise TransientError(f"job {self.job_id}: could not write {sorted(fields)} under this "
                             f"invocation's claim after {CLAIM_WRITE_ATTEMPTS} attempts (the "
                             "job document kept changing)")

    def end(self, fields: dict[str, Any]) -> bool:
        """End the job with ``fields`` (REJECTED or FAILED: ``endings.end_job``) if this claim still
        holds it; False (nothing written) when it does not or the job has ended.

        Raises:
            TransientError: the job kept changing (``endings.end_job``).
        """
        return end_job(self.svc.registry, self.job_id, fields,
                       expect=splitting_under(self.claim))[0]

    def holds(self) -> bool:
        """Whether the job is still splitting under this claim (one read): the rule the
        registries ask before training starts (``may_start_training``)."""
        return may_start_training(self.svc.registry.get_job(self.job_id), self.claim)

    def renew(self) -> None:
        """Renew ``claimed_at`` if it is due (``domain.job.claim_renewal_due``).

        Raises:
            TransientError: another invocation has taken the split over, or the job is no
                longer splitting (the split must stop; its event is retried and finds that).
        """
        now = self.svc.clock()
        if not claim_renewal_due(self.renewed_at, now, self.svc.settings.lease_seconds):
            return
        if not self.update({"claimed_at": now}):
            raise self.lost()
        self.renewed_at = now

    def lost(self) -> TransientError:
        """The error for a split whose claim is no longer this invocation's."""
        job = self.svc.registry.get_job(self.job_id)
        found = (f"claim {job.claim!r} in phase {job.phase!r}" if job is not None
                 else "no job document")
        return TransientError(
            f"job {self.job_id}: another invocation took over the split, so this one stops; "
            f"expected claim {self.claim!r} in phase {SPLITTING!r}; found {found}")
