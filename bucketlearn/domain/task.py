"""A task's attempt record: the states a worker moves it through, the fields each step writes,
and the record read back (``TaskRecord``). Pure: the task ledger (``ports.TaskLedger``) stores
what these functions return.

A worker that takes a task records an attempt (``started``): the one write a task's document
gets when all goes well (what the learner measured travels with its result message into the
version that folds it). A failed attempt is recorded ``retrying`` (the message goes back to the
queue) or, once the attempts are spent, ``failed`` (a failure marker tells the aggregator).
A task given up on leaves a failure marker in the deltas bucket (``FailureMarker``: written by
``publish.announce_failure``, read by the aggregator's ``results``). Whether a task's result is
folded is not decided here but by the round (``domain.rounds``) and
the job's position (``domain.job.done_tasks``): a record is what workers did, not what the model
holds. ``trained`` is what older documents say of a finished attempt, and is still read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bucketlearn.domain.job import MAX_ERROR_CHARS, Job
from bucketlearn.domain.lifecycle import EXPORTING

RUNNING, TRAINED, RETRYING, FAILED = "RUNNING", "TRAINED", "RETRYING", "FAILED"
ERROR_CHARS = 2000  # an attempt's error as stored (a document field, not a log)

# the timings a trained attempt records (seconds), in the order the worker takes them
PHASES = ("fetch", "train", "write")


def started(task_id: str, epoch: int, task_index: int, round_index: int, rows: int,
            worker_id: str, now: float, pulled_at: float | None,
            delivery_attempt: int | None) -> dict[str, Any]:
    """The fields of a new attempt (the ledger counts attempts by key beside them)."""
    return {"task_id": task_id, "epoch": epoch, "task_index": task_index, "round": round_index,
            "state": RUNNING, "worker_id": worker_id, "started_at": now, "rows": rows,
            "delivery_attempt": delivery_attempt,
            "pulled_at": pulled_at if pulled_at is not None else now}


def trained(now: float, timings: Mapping[str, Any]) -> dict[str, Any]:
    """An attempt that wrote its result (``timings``: ``<phase>_seconds`` and what the worker
    read and wrote)."""
    return {"state": TRAINED, "finished_at": now, "error": None, **timings}


def retrying(error: str, now: float) -> dict[str, Any]:
    """An attempt that failed; the task's message goes back to the queue."""
    return {"state": RETRYING, "error": error[:ERROR_CHARS], "finished_at": now}


def failed(error: str, now: float) -> dict[str, Any]:
    """The task given up on, after its last attempt."""
    return {"state": FAILED, "error": error[:ERROR_CHARS], "finished_at": now}


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def attempt_keys(doc: Mapping[str, Any]) -> list[str]:
    """The keys of the attempts a task document counts (an attempt is counted by its key, so a
    retried record does not count twice; a document written before keys has its ``attempts``
    only)."""
    return [str(k) for k in doc.get("attempt_keys") or []]


@dataclass(frozen=True)
class TaskRecord:
    """A task's attempt record as the ledger holds it (the newest attempt's fields)."""

    task_id: str
    epoch: int = 0
    task_index: int = 0
    state: str = ""
    attempts: int = 0
    worker_id: str | None = None
    rows: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    pulled_at: float | None = None
    error: str | None = None
    base_version: int | None = None  # the version a trained attempt started from
    seconds: Mapping[str, float | None] = field(default_factory=dict)  # by phase, once trained
    # the keys of the attempts it counts: a result is written under its attempt's key, and
    # only a result under one of these is ever folded (``services.results``)
    keys: tuple[str, ...] = ()

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> TaskRecord:
        return cls(task_id=str(doc.get("task_id") or ""), epoch=int(doc.get("epoch") or 0),
                   task_index=int(doc.get("task_index") or 0),
                   state=str(doc.get("state") or "").upper(),
                   attempts=len(attempt_keys(doc)) if "attempt_keys" in doc
                   else int(doc.get("attempts") or 0), worker_id=doc.get("worker_id"),
                   rows=int(doc.get("rows") or 0), started_at=_number(doc.get("started_at")),
                   finished_at=_number(doc.get("finished_at")),
                   pulled_at=_number(doc.get("pulled_at")), error=doc.get("error") or None,
                   base_version=(int(doc["base_version"]) if doc.get("base_version") is not None
                                 else None),
                   seconds={p: _number(doc.get(f"{p}_seconds")) for p in PHASES},
                   keys=tuple(attempt_keys(doc)))

    def phase_seconds(self, phase: str) -> float | None:
        """Seconds the attempt spent fetching, training or writing (None if not recorded)."""
        return self.seconds.get(phase)

    def busy_seconds(self, now: float) -> float | None:
        """How long the attempt ran: until now while RUNNING, else until it finished."""
        if self.started_at is None:
            return None
        if self.state == RUNNING:
            return now - self.started_at
        return self.finished_at - self.started_at if self.finished_at is not None else None


def skip_reason(job: Job | None, base_version: int, names_a_base: bool) -> str | None:
    """Why a delivered task needs no training (None: train it).

    The job is gone or has ended, or its training has (it is being exported: it stopped early,
    or its last round is folded); the message predates rounds (no base version, or no weights
    or state digest to start from: ``names_a_base`` false); or the job has moved past the
    task's round (its version is newer than the task's base: the round was folded, so this
    task was applied or failed for good).
    """
    if job is None:
        return "the job is gone"
    if job.is_terminal:
        return f"the job is {job.status}"
    if job.phase == EXPORTING:
        return "the job's training has ended (it is being exported)"
    if base_version < 0 or not names_a_base:
        return "the message names no version to train from"
    if (job.version or 0) > base_version:
        return f"its round was folded (the job is at v{job.version})"
    return None


FAILURE_REASON = "task failed"  # a marker's reason when it names none, or cannot be read


@dataclass(frozen=True)
class FailureMarker:
    """A task given up on, as its failure marker (a JSON object in the deltas bucket) says: the
    one shape it is written in (``to_doc``) and read back as (``from_doc``); the round that
    folds it counts the task failed, ``error`` the reason.

    Attributes:
        task_index: the task, within its epoch.
        error: why it was given up on.
        job_id, task_id, epoch: whose task it is (written for people and tools reading the
            bucket; the aggregator takes them from the object's name).
        detail: what else its writer recorded (a learner's ``attempts`` and ``worker_id``).
    """

    task_index: int
    error: str = FAILURE_REASON
    job_id: str = ""
    task_id: str = ""
    epoch: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "task_id": self.task_id, "epoch": self.epoch,
                "task_index": self.task_index, "error": self.error, **self.detail}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], task_index: int) -> FailureMarker:
        """The marker of task ``task_index`` (its object's name says which task it is): its
        reason as stored, at most ``MAX_ERROR_CHARS`` (``FAILURE_REASON`` when it names none)."""
        known = ("job_id", "task_id", "epoch", "task_index", "error")
        return cls(task_index=task_index,
                   error=str(doc.get("error") or FAILURE_REASON)[:MAX_ERROR_CHARS],
                   job_id=str(doc.get("job_id") or ""), task_id=str(doc.get("task_id") or ""),
                   epoch=int(_number(doc.get("epoch")) or 0),
                   detail={k: v for k, v in doc.items() if k not in known})
