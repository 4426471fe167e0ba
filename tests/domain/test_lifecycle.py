"""A job's life as a table: which status and phase moves are allowed, what an ended job may
still record, and that both the registries and the one end path ask it."""

from __future__ import annotations

from typing import Any

import pytest

from bucketlearn.adapters.memory import MemoryRegistry
from bucketlearn.domain import lifecycle as L
from bucketlearn.domain.job import Job, ending_fields, fail_fields
from bucketlearn.services.endings import end_job

SPLITTING = {"job_id": "j", "status": "QUEUED", "phase": "splitting"}
TRAINING = {"job_id": "j", "status": "RUNNING", "phase": "training"}


@pytest.mark.parametrize(("stored", "fields"), [
    ({}, {"status": "QUEUED", "phase": "splitting"}),
    (SPLITTING, {"status": "RUNNING", "phase": "training"}),
    (SPLITTING, ending_fields("REJECTED", 1.0, error="bad file")),
    (SPLITTING, fail_fields(1.0, "a backend refused")),
    (SPLITTING, ending_fields("CANCELLED", 1.0)),
    (TRAINING, {"phase": "exporting"}),
    (TRAINING, {"epoch": 2, "round": 0}),
    (TRAINING, ending_fields("DONE", 1.0)),
    ({**TRAINING, "phase": "exporting"}, ending_fields("DONE", 1.0)),
    ({**TRAINING, "status": "CANCELLED", "phase": "cancelled"}, {"model_path": "m"}),
    ({**TRAINING, "status": "FAILED", "phase": "failed"}, {"head": {"version": 3}}),
])
def test_the_moves_the_table_allows(stored: dict[str, Any], fields: dict[str, Any]) -> None:
    assert L.move_refusal(stored, fields) is None


@pytest.mark.parametrize(("stored", "fields", "says"), [
    ({}, {"status": "RUNNING", "phase": "training"}, "starts QUEUED and splitting"),
    (SPLITTING, ending_fields("DONE", 1.0), "from QUEUED to DONE"),
    (TRAINING, {"status": "QUEUED"}, "from RUNNING to QUEUED"),
    (TRAINING, ending_fields("REJECTED", 1.0), "from RUNNING to REJECTED"),
    (TRAINING, {"phase": "splitting"}, "from phase training to splitting"),
    ({**TRAINING, "phase": "exporting"}, {"phase": "training"}, "exporting to training"),
    (TRAINING, {"status": "DONE"}, "ends DONE in phase done"),
    ({**TRAINING, "status": "DONE", "phase": "done"}, fail_fields(2.0, "late"), "has ended DONE"),
    ({**TRAINING, "status": "DONE", "phase": "done"}, {"head": {"version": 3}}, "['head']"),
    ({**TRAINING, "status": "CANCELLED", "phase": "cancelled"}, {"epoch": 3}, "['epoch']"),
])
def test_the_moves_the_table_refuses(stored: dict[str, Any], fields: dict[str, Any],
                                     says: str) -> None:
    refusal = L.move_refusal(stored, fields)
    assert refusal is not None and says in refusal


def test_every_ending_ends_in_its_own_phase_and_moves_no_more() -> None:
    for status in L.TERMINAL:
        assert L.STATUS_MOVES[status] == frozenset()
        assert L.PHASE_MOVES[L.ENDING_PHASES[status]] == frozenset()
        assert ending_fields(status, 1.0)["phase"] == L.ENDING_PHASES[status]
    assert set(L.STATUS_MOVES) == set(L.Status) and set(L.PHASE_MOVES) - {None} == set(L.Phase)


def test_statuses_are_stored_and_compared_as_their_values() -> None:
    job = Job.from_doc({**TRAINING})
    assert job.status is L.Status.RUNNING and job.phase is L.Phase.TRAINING
    assert job.status == "RUNNING" and job.to_doc()["status"] == "RUNNING"
    assert f"{job.status} {job.phase!r}" == "RUNNING 'training'"


def test_the_registry_refuses_a_move_the_table_does_not_allow() -> None:
    registry = MemoryRegistry()
    registry.create_job(Job.from_doc(SPLITTING))
    with pytest.raises(ValueError, match="from QUEUED to DONE"):
        registry.update_job("j", ending_fields("DONE", 1.0))
    assert registry.get_job("j").status == "QUEUED"


def test_a_conditional_write_never_moves_an_ended_job() -> None:
    registry = MemoryRegistry()
    registry.create_job(Job.from_doc(SPLITTING))
    assert end_job(registry, "j", ending_fields("CANCELLED", 1.0))[0]
    assert not registry.update_job_if("j", {"status": "CANCELLED"}, {"epoch": 2})
    assert registry.update_job_if("j", {"status": "CANCELLED"}, {"model_path": "m"})
    assert registry.get_job("j").epoch == 0


def test_the_end_path_ends_once_and_only_as_expected() -> None:
    registry = MemoryRegistry()
    registry.create_job(Job.from_doc({**SPLITTING, "claim": "mine"}))
    with pytest.raises(ValueError, match="expected an ending"):
        end_job(registry, "j", {"status": "RUNNING"})
    assert end_job(registry, "j", fail_fields(1.0, "x"), expect={"claim": "theirs"}) \
        == (False, registry.get_job("j"))
    ended, before = end_job(registry, "j", fail_fields(1.0, "x"), expect={"claim": "mine"})
    assert ended and before is not None and before.status == "QUEUED"
    again, now = end_job(registry, "j", ending_fields("CANCELLED", 2.0))
    assert not again and now is not None and now.status == "FAILED" and now.error == "x"
