"""A job's life: its statuses and phases, which moves between them are allowed, and the one way
an ending is spelled.

A job is created QUEUED while its upload is split, RUNNING once training starts, and ends once:
DONE (its model exported), REJECTED (a bad file, at the split), FAILED (a reason recorded) or
CANCELLED (by a user). The phase refines what the pipeline is doing; each ending has its own.

``STATUS_MOVES`` and ``PHASE_MOVES`` are the from → to tables; ``move_refusal`` asks them of a
field update against the document it changes: both registries on every write that reads the
job first (a conditional write, the start and the commit transactions, an evaluation's record),
the in-memory one on every job write (the suite's check), so a disallowed move is refused
wherever it is attempted and a conditional write never moves an ended job. An ended job changes no more, but for
``AFTER_ENDING``: what its wind-up may still record. ``ending_fields`` is the one place an
ending's fields are spelled; ``services.endings.end_job`` the one path that writes them (with the
guard its caller expects), the version commit's FAILED excepted: that one is written inside the
commit's transaction, under ``job.commit_refusal``. Pure: mappings in, answers out.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class _Stored(StrEnum):
    """A value stored in a job document as its text; messages show that text ('RUNNING')."""

    def __repr__(self) -> str:
        return repr(self.value)


class Status(_Stored):
    """How a job stands for its user (stored as its value: ``"RUNNING"``)."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    DONE = "DONE"
    REJECTED = "REJECTED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class Phase(_Stored):
    """What the pipeline is doing with a job (stored as its value: ``"training"``)."""

    SPLITTING = "splitting"
    TRAINING = "training"
    EXPORTING = "exporting"
    DONE = "done"
    REJECTED = "rejected"
    FAILED = "failed"
    CANCELLED = "cancelled"


QUEUED, RUNNING, DONE = Status.QUEUED, Status.RUNNING, Status.DONE
REJECTED, FAILED, CANCELLED = Status.REJECTED, Status.FAILED, Status.CANCELLED
SPLITTING, TRAINING, EXPORTING = Phase.SPLITTING, Phase.TRAINING, Phase.EXPORTING
DONE_PHASE, REJECTED_PHASE = Phase.DONE, Phase.REJECTED
FAILED_PHASE, CANCELLED_PHASE = Phase.FAILED, Phase.CANCELLED

STATUSES = tuple(Status)
TERMINAL = (DONE, REJECTED, FAILED, CANCELLED)
ENDING_PHASES: Mapping[str, Phase] = {DONE: DONE_PHASE, REJECTED: REJECTED_PHASE,
                                      FAILED: FAILED_PHASE, CANCELLED: CANCELLED_PHASE}

# from → to: the statuses a job may move to (staying is always allowed)
STATUS_MOVES: Mapping[str, frozenset[Status]] = {
    QUEUED: frozenset({RUNNING, REJECTED, FAILED, CANCELLED}),
    RUNNING: frozenset({DONE, FAILED, CANCELLED}),
    DONE: frozenset(), REJECTED: frozenset(), FAILED: frozenset(), CANCELLED: frozenset(),
}
# from → to: the phases a job may move to (staying is always allowed); an ending's phase comes
# with its status (``ENDING_PHASES``)
PHASE_MOVES: Mapping[str | None, frozenset[Phase]] = {
    None: frozenset({SPLITTING}),
    SPLITTING: frozenset({TRAINING, REJECTED_PHASE, FAILED_PHASE, CANCELLED_PHASE}),
    TRAINING: frozenset({EXPORTING, DONE_PHASE, FAILED_PHASE, CANCELLED_PHASE}),
    EXPORTING: frozenset({DONE_PHASE, FAILED_PHASE, CANCELLED_PHASE}),
    DONE_PHASE: frozenset(), REJECTED_PHASE: frozenset(), FAILED_PHASE: frozenset(),
    CANCELLED_PHASE: frozenset(),
}
# what an ended job may still record: its last version's evaluation, finishing after a failure
# or a cancel (``head``), and a cancelled job's last version, exported after the cancel by its
# aggregator (``model_path``); a DONE job's head is the export's, final
AFTER_ENDING: Mapping[str, frozenset[str]] = {FAILED: frozenset({"head"}),
                                              CANCELLED: frozenset({"head", "model_path"})}


def is_terminal(status: str | None) -> bool:
    """The job has ended (its ending stands: nothing moves it on)."""
    return status in TERMINAL


def ended_refuses(stored: Mapping[str, Any], fields: Mapping[str, Any]) -> bool:
    """A conditional write ``fields`` that the ended job ``stored`` refuses as an unmet
    condition (False for a job that has not ended, or a write ``AFTER_ENDING`` allows)."""
    return is_terminal(stored.get("status")) and move_refusal(stored, fields) is not None


def move_refusal(stored: Mapping[str, Any], fields: Mapping[str, Any]) -> str | None:
    """Why the field update ``fields`` may not be applied to the job document ``stored`` (a
    status or phase move the tables do not allow, or a write to an ended job beyond
    ``AFTER_ENDING``); None when it may.

    A new document (``stored`` empty) may start only QUEUED and splitting.
    """
    status, phase = stored.get("status"), stored.get("phase")
    to_status, to_phase = fields.get("status", status), fields.get("phase", phase)
    if not stored:
        if (to_status, to_phase) != (QUEUED, SPLITTING):
            return f"a job starts QUEUED and splitting, not {to_status} and {to_phase}"
        return None
    if is_terminal(status):
        late = sorted(set(fields) - AFTER_ENDING.get(str(status), frozenset()))
        return None if not late else f"the job has ended {status}: {late} may not change"
    if to_status != status and to_status not in STATUS_MOVES.get(str(status), frozenset()):
        return f"a job may not move from {status} to {to_status}"
    if to_phase != phase and to_phase not in PHASE_MOVES.get(phase, frozenset()):
        return f"a job may not move from phase {phase} to {to_phase}"
    if is_terminal(to_status) and to_phase != ENDING_PHASES[str(to_status)]:
        return f"a job ends {to_status} in phase {ENDING_PHASES[str(to_status)]}, not {to_phase}"
    return None
