"""Waiting for a job to end: ``wait_terminal`` reads the job until it has ended or time runs out
(``submit --wait``, ``demo``, the benchmarks and the tests), each read in a thread of its own so
that a read a client keeps retrying cannot hold the wait past its budget."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from bucketlearn.domain.job import Job
from bucketlearn.errors import TransientError, UnreachableError


class _Read:
    """One ``get_job`` in a daemon thread, so that a caller can stop waiting for it: a Google
    client retries a read for minutes (Firestore's ``BatchGetDocuments``: 300 s) when its
    backend is gone, longer than a watch may wait. An abandoned read ends by itself."""

    def __init__(self, registry: Any, job_id: str) -> None:
        self.done = threading.Event()
        self.job: Job | None = None
        self.error: Exception | None = None
        threading.Thread(target=self._run, args=(registry, job_id), daemon=True,
                         name=f"read-job-{job_id}").start()

    def _run(self, registry: Any, job_id: str) -> None:
        try:
            self.job = registry.get_job(job_id)
        except Exception as exc:  # noqa: BLE001 - handed to the waiting thread, which raises it
            self.error = exc
        finally:
            self.done.set()


class _ReadTimedOut(Exception):
    """A read did not answer within its budget (``_read_within``)."""


def _read_within(registry: Any, job_id: str, budget: float, poll: float,
                 check: Callable[[], None] | None) -> Job | None:
    """The job, read within ``budget`` seconds (else _ReadTimedOut); ``check`` runs every
    ``poll`` seconds while the read is out, so a gone stack ends the wait at once."""
    read = _Read(registry, job_id)
    end = time.monotonic() + max(0.0, budget)
    while not read.done.wait(max(0.0, min(poll, end - time.monotonic()))):
        if time.monotonic() >= end:
            raise _ReadTimedOut
        if check is not None:
            check()
    if read.error is not None:
        raise read.error
    return read.job


def wait_terminal(registry: Any, job_id: str, timeout: float, poll: float = 0.5,
                  on_update: Callable[[Job], None] | None = None,
                  check: Callable[[], None] | None = None,
                  unreachable_after: float | None = None) -> Job | None:
    """Read the job every ``poll`` seconds until it has ended (DONE, REJECTED, FAILED or
    CANCELLED) or ``timeout`` passes; return the last document read (None if the job never
    appeared).

    Args:
        on_update: sees every document read.
        check: runs before every read, and every ``poll`` seconds while a read is out; it
            raises when whatever serves the job is gone (the CLI's watch on the local stack),
            which ends the wait.
        unreachable_after: a read that fails with a TransientError is retried until reads have
            failed for this many seconds in a row, then UnreachableError ends the wait (None:
            the first such error does). A read still unanswered when that budget (or the
            timeout) runs out is abandoned: each read is bounded by what is left of the watch's
            budget, whatever the client's own retries would do.
    """
    deadline = time.monotonic() + timeout
    job: Job | None = None
    failing_since: float | None = None
    while time.monotonic() < deadline:
        if check is not None:
            check()
        started = time.monotonic()
        budget = deadline - started
        if unreachable_after is not None:
            budget = min(budget, unreachable_after - (started - (failing_since or started)))
        try:
            job = _read_within(registry, job_id, budget, poll, check)
        except (TransientError, _ReadTimedOut) as exc:
            now = time.monotonic()
            failing_since = started if failing_since is None else failing_since
            if unreachable_after is None and isinstance(exc, TransientError):
                raise
            if unreachable_after is not None and now - failing_since >= unreachable_after:
                last = (f"last error: {exc}" if isinstance(exc, TransientError) else
                        f"a read was still unanswered after {now - started:.0f} s")
                raise UnreachableError(f"job {job_id}: the registry has not answered for "
                                       f"{now - failing_since:.0f} s (expected an answer within "
                                       f"{unreachable_after:.0f} s); {last}") from exc
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
            continue
        failing_since = None
        if job is not None and on_update is not None:
            on_update(job)
        if job is not None and job.is_terminal:
            break
        time.sleep(poll)
    return job
