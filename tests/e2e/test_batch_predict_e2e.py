"""Batch prediction on the whole local stack: a job trained, then ``bucketlearn predict --job``
in a subprocess as a user runs it: the upload to predict/JOB/, the relay's event, the upload
function's predictions, the download; a bad row's request ends FAILED naming it."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import REPO, cli, submit_and_wait

pytestmark = pytest.mark.e2e

PENGUINS = REPO / "data" / "penguins.csv"
PENGUINS_NEW = REPO / "data" / "penguins_new.csv"


@pytest.fixture(scope="module")
def stack(make_module_stack: Any) -> Any:
    return make_module_stack("predict", workers=1)


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
