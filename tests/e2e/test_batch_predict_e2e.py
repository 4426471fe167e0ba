"""Batch prediction on the whole local stack: a job trained, then ``bucketlearn predict --job``
in a subprocess as a user runs it: the upload to predict/JOB/, the relay's event, the upload
function's predictions, the download; a bad row's request ends FAILED naming it. A file larger
than a part (16 KiB here) is fanned out over the two learners, also with a learner killed at
each step of a part (``predict.*`` crash points, armed by that test only); the rows and
predictions are those of the model run locally, each row once. The fault rows go to
``tests/artifacts/reliability-predictions.json``."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import requests

from bucketlearn import layout
from bucketlearn.bootstrap import google_services
from bucketlearn.local.relay import cloudevent_for
from tests.e2e import faults
from tests.e2e.faults import Supervisor
from tests.e2e.helpers import REPO, cli, submit_and_wait

pytestmark = pytest.mark.e2e

PENGUINS = REPO / "data" / "penguins.csv"
PENGUINS_NEW = REPO / "data" / "penguins_new.csv"
PART_POINTS = ("predict.mid_part", "predict.before_record", "predict.before_ack")
RESULTS: list[dict[str, Any]] = []
reliability_summary = faults.reliability_summary("predictions", RESULTS)


@pytest.fixture(scope="module")
def fault_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The crash points' markers, each made fired (disarmed) until a test removes it."""
    folder = tmp_path_factory.mktemp("predict-faults")
    for point in PART_POINTS:
        (folder / f"{point}.fired").write_text("disarmed")
    return folder


@pytest.fixture(scope="module")
def stack(make_module_stack: Any, fault_dir: Path) -> Any:
    return make_module_stack("predict", workers=2, extra_env={
        "BUCKETLEARN_PREDICT_PART_BYTES": "16384", "BUCKETLEARN_FAULTS": ",".join(PART_POINTS),
        "BUCKETLEARN_FAULT_DIR": str(fault_dir), "BUCKETLEARN_ACK_DEADLINE_SECONDS": "10"})


def unlabeled_copies(path: Path, copies: int) -> int:
    """Penguins' rows without their label, ``copies`` times, written to ``path``: the rows."""
    lines = PENGUINS.read_text().splitlines()
    rows = [",".join(line.split(",")[1:]) for line in lines[1:]] * copies
    path.write_text(",".join(lines[0].split(",")[1:]) + "\n" + "\n".join(rows) + "\n")
    return len(rows)


def predicted_here(stack: Any, job: str, path: Path, tmp_path: Path) -> list[str]:
    """The job's model downloaded and run locally on ``path``: its predictions."""
    local = cli(stack, "download", job, "-o", str(tmp_path / "here.keras"))
    assert local.returncode == 0, local.stderr
    return json.loads(cli(stack, "predict", str(tmp_path / "here.keras"), str(path),
                          "--json").stdout)["predictions"]


@pytest.fixture(scope="module")
def penguins(stack: Any) -> str:
    status = submit_and_wait(stack, PENGUINS, "--label-column", "species", "--epochs", "3")
    assert status["status"] == "DONE", status
    return status["job_id"]


def test_predict_job_writes_the_predictions_a_user_downloads(stack: Any, penguins: str,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "new.predictions.csv"
    # Execute
    result = cli(stack, "predict", "--job", penguins, str(PENGUINS_NEW), "-o", str(out),
                 "--timeout", "300")
    # Assert
    assert result.returncode == 0, result.stderr
    assert f"wrote 4 predictions to {out}" in result.stdout
    rows = list(csv.DictReader(out.open()))
    assert [r["island"] for r in rows] == ["Biscoe", "Dream", "Torgersen", "Atlantis"]
    assert all(r["prediction"] in ("Adelie", "Chinstrap", "Gentoo") for r in rows)
    total = [sum(float(r[f"probability_{c}"]) for c in ("Adelie", "Chinstrap", "Gentoo"))
             for r in rows]
    assert all(abs(t - 1) < 1e-5 for t in total)
    local = cli(stack, "download", penguins, "-o", str(tmp_path / "m.keras"))
    assert local.returncode == 0, local.stderr
    here = json.loads(cli(stack, "predict", str(tmp_path / "m.keras"), str(PENGUINS_NEW),
                          "--json").stdout)
    assert [r["prediction"] for r in rows] == here["predictions"]


def test_a_bad_row_fails_the_request_naming_its_row_and_column(stack: Any, penguins: str,
                                                               tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    lines = PENGUINS_NEW.read_text().splitlines()
    lines[2] = lines[2].replace("49.0", "forty-nine")
    bad.write_text("\n".join(lines) + "\n")
    result = cli(stack, "predict", "--job", penguins, str(bad), "-o", str(tmp_path / "o.csv"),
                 "--json", "--timeout", "300")
    assert result.returncode == 1, result.stdout + result.stderr
    record = json.loads(result.stdout)
    assert record["state"] == "FAILED" and record["output"] is None
    assert record["problem"]["row"] == 2 and record["problem"]["column"] == "bill_length_mm"
    assert not (tmp_path / "o.csv").exists()


def test_a_large_file_is_fanned_out_over_the_learners(stack: Any, penguins: str,
                                                      tmp_path: Path) -> None:
    big = tmp_path / "big.csv"
    rows = unlabeled_copies(big, 3)  # 1,032 rows, about 45 KB: 3 parts
    out = tmp_path / "big.predictions.csv"
    # Execute
    result = cli(stack, "predict", "--job", penguins, str(big), "-o", str(out), "--json",
                 "--timeout", "300")
    # Assert
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(result.stdout)
    assert record["state"] == "DONE" and record["rows"] == rows and record["parts"] == 3
    got = list(csv.DictReader(out.open()))
    given = list(csv.DictReader(big.open()))
    assert [{c: r[c] for c in given[0]} for r in got] == given
    assert [r["prediction"] for r in got] == predicted_here(stack, penguins, big, tmp_path)
    svc = google_services(stack.settings)
    assert list(svc.store.list(stack.settings.models_bucket,
                               f"{layout.PREDICTION_PARTS_PREFIX}{penguins}/")) == []
    # the same upload event again (a re-delivery): answered, and nothing done twice
    info = svc.store.stat(stack.settings.uploads_bucket, f"predict/{penguins}/big.csv")
    output = svc.store.stat(stack.settings.models_bucket, record["output"])
    headers, body = cloudevent_for(info)
    answer = requests.post(stack.urls["upload_fn"], json=body, headers=headers, timeout=60)
    assert answer.status_code < 300
    again = svc.registry.get_prediction(penguins, record["request_id"])
    assert (again.state, again.rows, again.updated_at) == ("DONE", rows, record["updated_at"])
    assert svc.store.stat(stack.settings.models_bucket, record["output"]).generation == \
        output.generation
    faults.record(RESULTS, "a fanned-out request's upload event delivered again",
                  "the storage event of a DONE 3-part request posted to the upload function a "
                  "second time", "the record unchanged (DONE, its rows, its updated_at); the "
                  "output not rewritten (same generation); nothing published", rows=rows,
                  parts=3)


def test_a_learner_killed_at_each_step_of_a_part_loses_no_row(stack: Any, penguins: str,
                                                               fault_dir: Path,
                                                               tmp_path: Path) -> None:
    """A learner dies (``os._exit``) half way through a part, after writing a part before
    recording it, and after recording one before acknowledging it (each point fires once, in
    one request of 4 parts); the supervisor restarts it, the messages come back after the ack
    deadline (10 s): DONE, every row once, the predictions the model's."""
    big = tmp_path / "crash.csv"
    rows = unlabeled_copies(big, 4)
    for point in PART_POINTS:  # armed
        (fault_dir / f"{point}.fired").unlink()
    workers = [p for name, p in stack.procs.items() if name.startswith("worker")]
    restarts = sum(p.restarts for p in workers)
    # Execute
    with Supervisor(stack):
        result = cli(stack, "predict", "--job", penguins, str(big), "-o",
                     str(tmp_path / "o.csv"), "--json", "--timeout", "300")
    # Assert
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(result.stdout)
    assert record["state"] == "DONE" and record["rows"] == rows and record["parts"] == 4
    for point in PART_POINTS:
        assert (fault_dir / f"{point}.fired").read_text() != "disarmed", f"{point} never fired"
    assert sum(p.restarts for p in workers) - restarts >= len(PART_POINTS)
    got = list(csv.DictReader((tmp_path / "o.csv").open()))
    assert len(got) == rows
    svc = google_services(stack.settings)
    assert list(svc.store.list(stack.settings.models_bucket,
                               f"{layout.PREDICTION_PARTS_PREFIX}{penguins}/")) == []
    assert [r["prediction"] for r in got] == predicted_here(stack, penguins, big, tmp_path)
    for point, what in zip(PART_POINTS, ("half way through predicting a part",
                                         "after writing a part's object, before recording it",
                                         "after recording a part, before acknowledging it"),
                           strict=True):
        faults.record(RESULTS, f"learner killed {what}",
                      f"os._exit at {point} (once; in one request of 4 parts on 2 learners; "
                      "ack deadline 10 s); the stack's supervisor restarts it",
                      "request DONE; every row once, in order; predictions equal to the "
                      "model's run locally; no part object left", rows=rows, parts=4,
                      seconds=record["seconds"])
