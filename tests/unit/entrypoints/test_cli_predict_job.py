"""``bucketlearn predict --job JOB FILE.csv -o OUT.csv`` on the in-memory ports: the upload to
predict/JOB/ is handed to the upload function's handler as the trigger would (a store whose
``write_file`` sends the event), the command waits for the record and downloads the CSV; exit
codes as the rest of the CLI's."""

from __future__ import annotations

import csv

import pytest

from bucketlearn import faults
from bucketlearn.bootstrap import memory_services
from bucketlearn.events import StorageEvent
from bucketlearn.local.simulation import simulate_pipeline
from bucketlearn.options import JobOptions
from bucketlearn.usecases.batch_predict import handle_predict
from tests.unit.helpers import write_blobs_csv


@pytest.fixture(scope="module")
def done_job(tmp_path_factory):
    path = write_blobs_csv(tmp_path_factory.mktemp("blobs") / "blobs.csv", n_rows=300)
    run = simulate_pipeline(str(path), JobOptions(epochs=1, rows_per_shard=64),
                            svc=memory_services())
    assert run["job"].status == "DONE"
    return run["svc"], run["job"].job_id


def triggering(svc):
    """``svc`` whose uploads under predict/ are predicted as soon as they are written."""

    def write_file(real, bucket, name, path, content_type, metadata=None):
        info = real(bucket, name, path, content_type, metadata)
        handle_predict(svc, StorageEvent(info.bucket, info.name, info.generation, info.size))
        return info

    return faults.inject(svc, "store", write_file=write_file)


def test_predict_job_uploads_waits_and_downloads(done_job, run_cli, tmp_path, capsys):
    svc, job_id = done_job
    rows = tmp_path / "my rows (1).csv"
    rows.write_text("f0,f1,f2,f3\n0.1,0.2,0.3,0.4\n1,2,3,4\n")
    out = tmp_path / "out" / "predicted.csv"
    # Execute
    code = run_cli(triggering(svc), "predict", "--job", job_id, str(rows), "-o", str(out))
    # Assert
    assert code == 0
    lines = list(csv.DictReader(out.open()))
    assert len(lines) == 2 and lines[1]["f3"] == "4"
    assert {"prediction", "probability_0", "probability_1", "probability_2"} <= set(lines[0])
    printed = capsys.readouterr().out
    assert f"wrote 2 predictions to {out}" in printed
    assert f"predictions/{job_id}/my rows _1_.csv" in printed


def test_a_failed_request_exits_1_with_its_reason(done_job, run_cli, tmp_path, capsys):
    svc, job_id = done_job
    rows = tmp_path / "bad.csv"
    rows.write_text("f0,f1,f2,f3\n0.1,0.2,0.3,0.4\n1,x,3,4\n")
    code = run_cli(triggering(svc), "predict", "--job", job_id, str(rows), "-o",
                   str(tmp_path / "o.csv"))
    assert code == 1 and not (tmp_path / "o.csv").exists()
    assert "FAILED" in capsys.readouterr().err and "row 2, column 'f1'" in \
        svc.registry.get_prediction(job_id, list(svc.registry.predictions)[-1][1]).error


def test_no_function_running_times_out_with_code_3(done_job, run_cli, tmp_path, capsys):
    svc, job_id = done_job
    rows = tmp_path / "rows.csv"
    rows.write_text("f0,f1,f2,f3\n1,2,3,4\n")
    code = run_cli(svc, "predict", "--job", job_id, str(rows), "--timeout", "0.2")
    assert code == 3 and "timed out" in capsys.readouterr().err


def test_usage_errors_exit_2(done_job, run_cli, tmp_path):
    svc, job_id = done_job
    rows = tmp_path / "rows.csv"
    rows.write_text("f0,f1,f2,f3\n1,2,3,4\n")
    assert run_cli(svc, "predict", str(rows)) == 2  # a model and no file, or a file and no job
    assert run_cli(svc, "predict", "--job", job_id, "m.keras", str(rows)) == 2
    assert run_cli(svc, "predict", "--job", job_id, str(tmp_path / "none.csv")) == 2
    assert run_cli(svc, "predict", "--job", "not a job", str(rows)) == 2
