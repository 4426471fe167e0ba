"""The local supervisor scales learners on backlog with the same policy as the cloud autoscaler."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bucketlearn import layout
from bucketlearn.bootstrap import google_services
from bucketlearn.loops.autoscale import ScalingPolicy

pytestmark = pytest.mark.e2e
DIGITS = Path(__file__).resolve().parents[2] / "data" / "digits.csv"


def test_queued_work_grows_workers_and_idle_shrinks_them_to_zero(make_stack: Any) -> None:
    # Prepare: scale to zero when idle, at most 2 workers, short cool-down
    policy = ScalingPolicy(min_workers=0, max_workers=2, tasks_per_worker=2,
                           scale_down_cooldown_seconds=3)
    stack = make_stack("scale", scaling=policy)
    stop = threading.Event()
    supervisor = threading.Thread(target=stack.supervise, kwargs={"stop": stop, "interval": 0.5},
                                  daemon=True)
    supervisor.start()
    svc = google_services(stack.settings)
    try:
        assert len(stack.live_workers()) == 0
        # Execute: queue a job (6 tasks per epoch, rounds of 4: 4 outstanding at a time)
        info = svc.store.write_file(stack.settings.uploads_bucket, "digits.csv", str(DIGITS),
                                    "text/csv", {"epochs": "2", "parallel_tasks": "4"})
        job_id = layout.job_id_for(info.bucket, info.name, info.generation)
        peak = 0
        deadline = time.monotonic() + 400
        job: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            peak = max(peak, len(stack.live_workers()))
            job = svc.registry.get_job(job_id)
            if job and job.status in ("DONE", "FAILED", "REJECTED"):
                break
            time.sleep(0.25)
        # Assert: the backlog brought workers up to the cap, and they trained the job
        assert job is not None and job.status == "DONE", job
        assert peak == 2
        # Execute: nothing outstanding any more
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and stack.live_workers():
            time.sleep(0.25)
        # Assert: scaled back to zero after the cool-down
        assert stack.live_workers() == []
    finally:
        stop.set()
        supervisor.join(timeout=30)
