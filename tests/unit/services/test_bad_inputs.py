"""Every case in tests/data/bad/cases.json, uploaded and handled: REJECTED with a precise reason.

Each case goes through ``upload.handle_upload`` on the in-memory ports exactly as the upload
function would run it: the bytes (committed under tests/data/bad, or generated into tmp) are
uploaded with the case's object metadata under its object name, with the case's limits as the
deployment's limits. The job must end REJECTED, its error must name the file (gs://bucket/name)
and, where the manifest pins them, the row and column, what was expected and what was found;
nothing may be left in the work bucket and no Keras model may be built.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from bucketlearn import layout
from bucketlearn.bootstrap import memory_services
from bucketlearn.config import Limits, Settings
from bucketlearn.usecases.upload import Outcome, StorageEvent, handle_upload
from bucketlearn.usecases.upload_steps import UploadSteps
from tests.unit.helpers import (
    BAD_DIR,
    assert_rejection_reason,
    bad_case_id,
    bad_case_object_name,
    bad_case_path,
    load_bad_cases,
)

CASES = load_bad_cases()
FIELDS = {"id", "file", "metadata", "object_name", "limits", "generate", "row", "column",
          "message_contains", "expected_contains", "found_contains"}


@pytest.fixture(scope="module")
def generated_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("generated-bad-inputs")


def test_manifest_is_complete_and_well_formed() -> None:
    """30+ cases, unique ids and object names, every committed bad file used, known fields only."""
    # Prepare
    ids = [c["id"] for c in CASES]
    names = [bad_case_object_name(c) for c in CASES]
    used = {c["file"] for c in CASES if not c.get("generate") == "long_line"}
    committed = {p.name for p in BAD_DIR.glob("*.csv")}
    # Assert
    assert len(CASES) >= 30
    assert len(set(ids)) == len(ids)
    assert len(set(names)) == len(names), "each case needs its own object (e2e uploads them all)"
    assert committed == used, f"unused: {committed - used}; missing: {used - committed}"
    for case in CASES:
        assert set(case) <= FIELDS, case["id"]
        assert {"file", "metadata", "row", "column", "message_contains", "expected_contains",
                "found_contains"} <= set(case), case["id"]
        assert case.get("generate") in (None, "long_line", "long_name"), case["id"]
        assert set(case.get("limits", {})) <= {f.name for f in dataclasses.fields(Limits)}
        assert all(isinstance(v, str) for v in case["metadata"].values()), case["id"]
    json.dumps(CASES)  # machine-readable


@pytest.mark.parametrize("case", CASES, ids=bad_case_id)
def test_bad_upload_is_rejected_with_file_row_column_expected_found(
        case: dict[str, Any], generated_dir: Path) -> None:
    """handle_upload: REJECTED, the job says where and why, nothing left behind, no model built."""
    # Prepare
    def no_model(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a rejected upload must not build a Keras model")

    steps = UploadSteps(build=no_model)
    settings = dataclasses.replace(Settings(), limits=Limits(**case.get("limits", {})))
    svc = memory_services(settings)
    name = bad_case_object_name(case)
    data = bad_case_path(case, generated_dir).read_bytes()
    info = svc.store.write_bytes(settings.uploads_bucket, name, data, "text/csv",
                                 metadata=dict(case["metadata"]))
    event = StorageEvent(info.bucket, info.name, info.generation, info.size)
    # Execute
    outcome, job_id = handle_upload(svc, event, steps)
    # Assert
    assert outcome is Outcome.REJECTED
    assert job_id == layout.job_id_for(info.bucket, name, info.generation)
    assert layout.is_job_id(job_id)
    job = svc.registry.get_job(job_id)
    assert job is not None
    assert_rejection_reason(job, case, settings.uploads_bucket, name)
    assert list(svc.store.list(settings.work_bucket, layout.job_prefix(job_id))) == []
    assert list(svc.store.list(settings.models_bucket)) == []
    assert svc.queue.published == []
    assert handle_upload(svc, event, steps) == (Outcome.DUPLICATE, job_id)  # acked, not redone


def test_rejections_leave_other_jobs_alone(generated_dir: Path) -> None:
    """Every bad case handled on one set of services: one REJECTED job each, nothing else."""
    # Prepare
    svc = memory_services()
    events = []
    for case in CASES:
        if case.get("limits"):
            continue  # deployment limits differ per case
        info = svc.store.write_bytes(svc.settings.uploads_bucket, bad_case_object_name(case),
                                     bad_case_path(case, generated_dir).read_bytes(), "text/csv",
                                     metadata=dict(case["metadata"]))
        events.append((case, StorageEvent(info.bucket, info.name, info.generation, info.size)))
    # Execute
    results = [(case, event, handle_upload(svc, event)) for case, event in events]
    # Assert
    assert all(outcome is Outcome.REJECTED for _, _, (outcome, _) in results)
    job_ids = [job_id for _, _, (_, job_id) in results]
    assert len(set(job_ids)) == len(job_ids) == len(svc.registry.list_jobs(1000))
    for case, event, (_, job_id) in results:
        assert_rejection_reason(svc.registry.get_job(job_id), case, event.bucket, event.name)
    assert list(svc.store.list(svc.settings.work_bucket)) == []
