"""``bucketlearn cancel`` on the whole local stack: a job followed by
``submit --wait`` is cancelled while RUNNING; it ends CANCELLED, no version follows, the workers
stop training it, and its last version downloads as a model plain Keras loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bucketlearn import layout
from bucketlearn.bootstrap import google_services

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "data" / "digits.csv"
EXIT_CANCELLED = 5
SETTLE_SECONDS = 15  # longer than a task and a fold on this machine


def cli_env(stack: Any) -> dict[str, str]:
    return {**os.environ, "BUCKETLEARN_HOME": str(stack.home)}


def cli(stack: Any, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bucketlearn.entrypoints.cli", *args], capture_output=True,
                          text=True, env=cli_env(stack), timeout=timeout, cwd=REPO)


def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return bool(predicate())


def test_a_running_job_cancelled_from_the_cli_stops_and_keeps_its_model(make_stack: Any,
                                                                        tmp_path: Path) -> None:
    # Prepare: a long job (100 epochs), followed by submit --wait
    stack = make_stack("cancel", workers=2)
    svc = google_services(stack.settings)
    out_path, err_path = tmp_path / "submit.out", tmp_path / "submit.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        submit = subprocess.Popen(
            [sys.executable, "-m", "bucketlearn.entrypoints.cli", "submit", str(DIGITS), "--wait",
             "--epochs", "100", "--timeout", "600"],
            stdout=out, stderr=err, env=cli_env(stack), cwd=REPO)
    try:
        assert wait_until(lambda: out_path.read_text().strip(), 120), err_path.read_text()
        job_id = out_path.read_text().split()[0]

        def trained_a_while() -> bool:
            job = svc.registry.get_job(job_id)
            return job is not None and job.status == "RUNNING" and (job.version or 0) >= 3

        assert wait_until(trained_a_while, 240), svc.registry.get_job(job_id)
        # Execute
        cancel = cli(stack, "cancel", job_id, "--reason", "e2e")
        cancelled_at = time.time()
        # Assert: the CLI says so, submit --wait ends with the cancelled exit code
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        assert f"job {job_id} cancelled (it was RUNNING" in cancel.stdout
        code = submit.wait(timeout=60)
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.wait(timeout=10)
    assert code == EXIT_CANCELLED, err_path.read_text()[-2000:]
    assert "CANCELLED" in out_path.read_text() + err_path.read_text()
    # Assert: nothing moves any more (results in flight at the cancel are not folded)
    job = svc.registry.get_job(job_id)
    assert (job.status, job.phase) == ("CANCELLED", "cancelled")
    head = int(job.version)
    time.sleep(SETTLE_SECONDS)
    job = svc.registry.get_job(job_id)
    versions = svc.registry.list_versions(job_id)
    assert (job.status, job.version) == ("CANCELLED", head)
    assert [v.version for v in versions] == list(range(head + 1))
    assert job.head.version == head and job.tasks_applied < job.tasks_planned
    late = [t.task_id for t in svc.registry.list_tasks(job_id)
            if (t.started_at or 0.0) > cancelled_at + 2]
    assert late == [], "workers trained tasks of the cancelled job"
    # Assert: status and a second cancel say what happened
    status = json.loads(cli(stack, "status", job_id, "--json").stdout)
    assert status["status"] == "CANCELLED" and status["version"] == head
    assert status["cancel_reason"] == "e2e" and "(bucketlearn cancel)" in status["cancelled_by"]
    again = cli(stack, "cancel", job_id)
    assert again.returncode == 0 and "is already CANCELLED" in again.stdout
    # Assert: the aggregator, told of the cancel, exported the last version (so that
    # it downloads from the models bucket alone), and plain Keras loads it
    assert wait_until(lambda: svc.registry.get_job(job_id).model_path is not None, 60)
    assert svc.store.stat(stack.settings.models_bucket, layout.model_path(job_id, head))
    model_path = tmp_path / "cancelled.keras"
    download = cli(stack, "download", job_id, "-o", str(model_path))
    assert download.returncode == 0, download.stderr
    assert f"version {head})" in download.stdout
    import keras

    model = keras.models.load_model(model_path, safe_mode=True)
    assert model.output_shape[-1] == 10
    predict = cli(stack, "predict", str(model_path), str(DIGITS), "--json")
    assert predict.returncode == 0, predict.stderr
    report = json.loads(predict.stdout)
    assert report["rows"] == 1797 and 0.0 <= report["accuracy"] <= 1.0
    assert set(report["predictions"]) <= {str(d) for d in range(10)}
