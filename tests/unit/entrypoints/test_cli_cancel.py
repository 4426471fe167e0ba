"""``bucketlearn cancel`` and how the other commands treat a CANCELLED job:
messages and exit codes, on the in-memory ports (handed to ``cli.main`` by ``run_cli``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bucketlearn.domain.lifecycle import CANCELLED, DONE
from bucketlearn.entrypoints.cli import common, job_commands
from tests.unit.steps import run_rounds, start_job, train_pending


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    """A RUNNING job at v1 on in-memory services (the CLI's, through ``run_cli``)."""
    svc, job_id = start_job(tmp_path, epochs=2, parallel_tasks=2)
    train_pending(svc, 2)
    from bucketlearn.aggregation.writer import aggregate_job

    aggregate_job(svc, job_id)
    monkeypatch.setattr(job_commands, "canceller", lambda: "alice@laptop (bucketlearn cancel)")
    return svc, job_id


def test_cancel_says_what_it_did_and_exits_0(job, run_cli, capsys):
    # Prepare
    svc, job_id = job
    # Execute
    code = run_cli(svc, "cancel", job_id, "--reason", "wrong file")
    # Assert
    out = capsys.readouterr().out
    assert code == common.EXIT_OK == 0
    assert f"job {job_id} cancelled (it was RUNNING, training)" in out
    assert f"its last version, v1, stays downloadable: bucketlearn download {job_id}" in out
    stored = svc.registry.get_job(job_id)
    assert stored.status == CANCELLED and stored.cancel_reason == "wrong file"
    assert stored.cancelled_by == "alice@laptop (bucketlearn cancel)"


def test_cancel_json_and_a_second_cancel(job, run_cli, capsys):
    # Prepare
    svc, job_id = job
    assert run_cli(svc, "cancel", job_id) == 0
    capsys.readouterr()
    # Execute
    code = run_cli(svc, "cancel", job_id, "--json")
    # Assert
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["result"] == "already_cancelled" and report["status"] == "CANCELLED"
    assert report["version"] == 1


def test_cancel_of_a_finished_job_exits_6_saying_it_is_done(tmp_path, run_cli, capsys):
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=1)
    run_rounds(svc, job_id)
    # Execute
    code = run_cli(svc, "cancel", job_id)
    # Assert
    captured = capsys.readouterr()
    assert code == common.EXIT_ALREADY_ENDED == 6
    assert captured.err.startswith(f"job {job_id} is already DONE; only a job that has not "
                                   "ended can be cancelled")
    assert captured.out == ""
    assert svc.registry.get_job(job_id).status == DONE


def test_cancel_of_an_unknown_job_exits_1(job, run_cli, capsys):
    # Prepare
    svc, _ = job
    # Execute
    code = run_cli(svc, "cancel", "nope-000000000000")
    # Assert
    assert code == common.EXIT_JOB_FAILED == 1
    assert "error: job nope-000000000000: no such job" in capsys.readouterr().err


def test_submit_wait_ends_with_exit_5_for_a_cancelled_job(job, run_cli, capsys):
    """``follow`` (``submit --wait``, ``demo``) ends on CANCELLED with its own exit code."""
    # Prepare
    svc, job_id = job
    run_cli(svc, "cancel", job_id)
    capsys.readouterr()
    # Execute
    code = job_commands.follow(svc, job_id, timeout=5, as_json=True)
    # Assert
    status = json.loads(capsys.readouterr().out)
    assert code == common.EXIT_CANCELLED == 5
    assert status["status"] == "CANCELLED" and status["version"] == 1
    assert status["cancelled_by"] == "alice@laptop (bucketlearn cancel)"


def test_status_of_a_cancelled_job_says_who_and_how_to_get_its_model(job, run_cli, capsys):
    # Prepare
    svc, job_id = job
    run_cli(svc, "cancel", job_id)
    capsys.readouterr()
    # Execute
    code = run_cli(svc, "status", job_id)
    # Assert
    out = capsys.readouterr().out
    assert code == 0
    assert "status:    CANCELLED" in out
    assert "cancelled: cancelled by alice@laptop (bucketlearn cancel) at " in out
    assert f"model:     v1, built from its weights by: bucketlearn download {job_id}" in out


def test_download_of_a_cancelled_job_writes_its_last_version(job, run_cli, tmp_path, capsys):
    # Prepare
    svc, job_id = job
    run_cli(svc, "cancel", job_id)
    out = tmp_path / "model.keras"
    # Execute
    code = run_cli(svc, "download", job_id, "-o", str(out))
    # Assert
    assert code == 0
    assert f"wrote {out} (job {job_id}, version 1)" in capsys.readouterr().out
    import keras

    assert keras.models.load_model(out, safe_mode=True).output_shape[-1] == 3
