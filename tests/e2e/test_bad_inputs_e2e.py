"""Every bad-input case uploaded to a real local stack: each job REJECTED once, no crash loop,
and a good upload afterwards still trains to DONE.

Cases with ``limits`` in tests/data/bad/cases.json are left out here: a deployment has one set
of limits, and e.g. a 64-byte file limit would reject every other case for its size. They are
covered by tests/unit/services/test_bad_inputs.py (same ``handle_upload`` code path, in memory).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from bucketlearn import layout
from bucketlearn.bootstrap import google_services
from tests.unit.helpers import (
    REPO_DIR,
    assert_rejection_reason,
    bad_case_object_name,
    bad_case_path,
    load_bad_cases,
)

pytestmark = pytest.mark.e2e
TERMINAL = ("DONE", "REJECTED", "FAILED")


def wait_all_terminal(svc: Any, job_ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    done: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        for job_id in job_ids:
            if job_id not in done:
                job = svc.registry.get_job(job_id)
                if job and job.status in TERMINAL:
                    done[job_id] = job
        if len(done) == len(job_ids):
            return done
        time.sleep(0.5)
    missing = {j: getattr(svc.registry.get_job(j), "status", None) for j in job_ids
               if j not in done}
    raise AssertionError(f"{len(missing)} jobs not finished in {timeout}s: {missing}")


def test_every_bad_case_is_rejected_once_and_a_good_upload_still_trains(
        make_stack: Any, tmp_path: Path) -> None:
    """All cases uploaded at once: REJECTED with the manifest's reason, one event each, no
    Traceback in the upload function's log; then 600 rows of digits train to DONE."""
    # Prepare
    stack = make_stack("bad", workers=1)
    svc = google_services(stack.settings)
    bucket = stack.settings.uploads_bucket
    cases = [c for c in load_bad_cases() if not c.get("limits")]
    assert len(cases) >= 30
    # Execute: upload every case as its own object, with its metadata
    uploads = []
    for case in cases:
        name = bad_case_object_name(case)
        info = svc.store.write_file(bucket, name, str(bad_case_path(case, tmp_path)), "text/csv",
                                    dict(case["metadata"]))
        assert info.name == name
        uploads.append((case, name, layout.job_id_for(bucket, name, info.generation)))
    jobs_by_id = wait_all_terminal(svc, [job_id for _, _, job_id in uploads], 300)
    # Assert: each reason as the manifest says
    failures = []
    for case, name, job_id in uploads:
        try:
            assert_rejection_reason(jobs_by_id[job_id], case, bucket, name)
        except AssertionError as exc:
            failures.append(f"{case['id']}: {exc}")
    assert not failures, "\n".join(failures)
    # one job per upload, nothing else started; nothing left in the work bucket
    ours = [j for j in svc.registry.list_jobs(1000) if j.source.get("bucket") == bucket]
    assert sorted(j.job_id for j in ours) == sorted(job_id for _, _, job_id in uploads)
    # the upload function acked every event once: no crash, no retry loop. The job turns
    # REJECTED first (under its claim), then its partial shards go, then the outcome is logged.
    log_path = stack.home / "logs" / "upload_fn.log"
    expected_lines = [f"-> rejected (job {job_id})" for _, _, job_id in uploads]
    deadline = time.monotonic() + 30
    log_text = log_path.read_text(errors="replace")
    while time.monotonic() < deadline and not all(t in log_text for t in expected_lines):
        time.sleep(0.5)
        log_text = log_path.read_text(errors="replace")
    # every handler has returned: nothing is left in the work bucket
    assert list(svc.store.list(stack.settings.work_bucket)) == []
    assert "Traceback" not in log_text, log_text[log_text.index("Traceback"):][:9000][-2500:] if "Traceback" in log_text else ""
    for case, _, job_id in uploads:
        assert log_text.count(f"-> rejected (job {job_id})") == 1, case["id"]
        assert log_text.count(f"job {job_id} rejected:") == 1, case["id"]
    # Execute: a good upload afterwards
    good = tmp_path / "digits_600.csv"
    lines = (REPO_DIR / "data" / "digits.csv").read_text().splitlines()
    good.write_text("\n".join(lines[:601]) + "\n")
    info = svc.store.write_file(bucket, good.name, str(good), "text/csv", {"epochs": "1"})
    good_id = layout.job_id_for(bucket, good.name, info.generation)
    job = wait_all_terminal(svc, [good_id], 300)[good_id]
    # Assert
    assert job.status == "DONE", job.error
    assert job.dataset["rows"] == 600
