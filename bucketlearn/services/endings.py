"""Ending a job: ``end_job``, the one path every ending takes (an ending written unless the job
has ended already or no longer stands as its caller expects). What an ending records is
``domain.job.ending_fields``'s; which moves a job may make, ``domain.lifecycle``'s."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import TERMINAL
from bucketlearn.errors import TransientError

# What this module defines, and all it offers: it re-exports nothing.
__all__ = ["END_ATTEMPTS", "end_job"]

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
