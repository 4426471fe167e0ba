"""The whole flow on real emulators: upload -> split -> tasks -> workers -> deltas -> versions.

These tests drive the ``bucketlearn`` CLI in a subprocess, as a user would, against a LocalStack
whose function, aggregator and workers are real processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bucketlearn.bootstrap import google_services, memory_services
from bucketlearn.domain.version import Version
from bucketlearn.options import JobOptions
from tests.e2e.helpers import DIGITS, REPO, assert_ledger_consistent, cli, submit_and_wait

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(make_module_stack: Any) -> Any:
    return make_module_stack("main", workers=2)


def test_digits_trains_to_a_downloadable_model(stack: Any, tmp_path: Path) -> None:
    """make-demo path: digits reach >= 0.95 holdout accuracy; the .keras predicts from raw rows."""
    # Execute
    status = submit_and_wait(stack, DIGITS)
    # Assert
    assert status["status"] == "DONE", status
    assert status["accuracy"] >= 0.95
    # the plan's forecast, and what the job measured beside it; it stops once validation
    # stopped improving, and exports its best version
    assert status["actual"]["versions"] == status["version"] <= status["forecast"]["rounds"]
    assert status["model_version"] == status["selection"]["best"]["version"]
    assert status["forecast"]["suggested_workers"] == 1  # R = 1: one learner chains
    assert status["actual"]["training_seconds"] > 0 and status["actual"]["task_seconds"] > 0
    svc = google_services(stack.settings)
    assert_ledger_consistent(svc, status["job_id"])
    model_path = tmp_path / "digits.keras"
    result = cli(stack, "download", status["job_id"], "-o", str(model_path))
    assert result.returncode == 0, result.stderr
    import keras

    model = keras.models.load_model(model_path)  # plain Keras, no bucketlearn objects
    raw = np.loadtxt(DIGITS, delimiter=",", skiprows=1)
    predicted = model.predict(raw[:, :-1], verbose=0).argmax(axis=1)
    assert np.mean(predicted == raw[:, -1]) > 0.95
    predict = cli(stack, "predict", str(model_path), str(DIGITS), "--json")
    report = json.loads(predict.stdout)
    assert report["rows"] == 1797 and report["accuracy"] > 0.95
    assert set(report["predictions"]) == {str(d) for d in range(10)}
    # once DONE, only the exported version is kept: an earlier one says so
    earlier = cli(stack, "download", status["job_id"], "--version", "1", "-o",
                  str(tmp_path / "v1.keras"))
    assert earlier.returncode != 0
    assert f"only the version it exported is kept: expected a version with an exported model " \
           f"(v{status['model_version']}); found v1" in earlier.stderr


def test_sorted_csv_in_parallel_rounds_matches_serial_training(stack: Any, tmp_path: Path
                                                                ) -> None:
    """A label-sorted CSV trained by 2 workers in rounds of 3 tasks (each at 3 times the job's
    learning rate, folded by their mean) lands within 1 point of train-local, and every version
    folds exactly one whole round."""
    # Prepare
    lines = DIGITS.read_text().splitlines()
    rows = sorted(lines[1:], key=lambda line: int(line.rsplit(",", 1)[1]))
    sorted_csv = tmp_path / "digits_sorted.csv"
    sorted_csv.write_text("\n".join([lines[0], *rows]) + "\n")
    from bucketlearn.usecases.train_local import train_local

    # Execute
    # (a round's tasks take several steps each: 10 epochs in batches of 32)
    serial = train_local(str(sorted_csv), JobOptions(epochs=10, batch_size=32),
                         svc=memory_services())
    status = submit_and_wait(stack, sorted_csv, "--parallel-tasks", "3", "--epochs", "10",
                             "--batch-size", "32")
    # Assert
    assert status["status"] == "DONE", status
    assert abs(status["accuracy"] - serial.accuracy) <= 0.01 + 1e-9, (status["accuracy"],
                                                                       serial.accuracy)
    svc = google_services(stack.settings)
    job = svc.registry.get_job(status["job_id"])
    versions = svc.registry.list_versions(status["job_id"])[1:]
    epochs = max(v.epoch for v in versions)
    assert job.plan.parallel_tasks == 3 and job.plan.tasks_per_epoch == 5  # validation out
    assert [len(v.tasks_applied) for v in versions] == [3, 2] * epochs
    assert all(v.server_lr == 1.0 for v in versions) and job.plan.rates == "scaled"


def test_small_image_set_matches_serial_training_step_for_step(stack: Any,
                                                               tmp_path: Path) -> None:
    """Image-shaped rows (28x28x3, a CNN) that serial training gets about 0.9 right, not 1.0.
    At this size the plan trains one task at a time (parallel rounds would cost points here),
    so a learner chains the rounds from the state its last task ended with while the aggregator
    commits each version behind it (weights and optimizer state, written to storage and checked
    by digest). The stack then takes train-local's steps to the bit:
    every version is the simulation's (the same code in one process, the same TensorFlow thread
    settings: tests/conftest.py) byte for byte, weights and optimizer state, and the final model
    has train-local's accuracy exactly. A version that lost the optimizer state, the learning
    rate or the row order, a delta rounded to float32, or initial weights drawn from shared
    random state would each break it."""
    # Prepare
    from benchmarks.harness.datasets import hmnist4
    from bucketlearn import codec
    from bucketlearn.local.simulation import simulate_pipeline
    from bucketlearn.usecases.train_local import train_local

    data = hmnist4(tmp_path / "hmnist4_small.csv", "sorted", count=1600)
    options = JobOptions(epochs=4, rows_per_shard=128)
    serial = train_local(str(data), options, svc=memory_services())
    local = simulate_pipeline(str(data), options, workers=1, svc=memory_services())
    # Execute
    status = submit_and_wait(stack, data, "--epochs", "4", "--rows-per-shard", "128")
    # Assert
    assert 0.7 < serial.accuracy < 0.98, serial.accuracy
    assert status["status"] == "DONE", status
    svc = google_services(stack.settings)
    job = svc.registry.get_job(status["job_id"])
    versions = svc.registry.list_versions(status["job_id"])
    assert job.model["kind"] == "cnn" and job.plan.parallel_tasks == 1
    chained = [v for v in versions[1:] if any(t.get("chained") for t in v.task_stats.values())]
    assert len(chained) >= len(versions) // 2, "the rounds were not chained"
    assert len(versions) == len(local["versions"]) > 4

    def state(where: Any, bucket: str, version: Version) -> list[bytes]:
        weights, optimizer, _ = codec.decode_state(where.read_bytes(bucket,
                                                                    version.weights_path))
        return [np.asarray(a).tobytes() for a in weights + optimizer]

    # every version's arrays, by digest (only the last version's weights are kept once the job
    # has ended), and the last version's bytes themselves
    assert [v.digest for v in versions] == [v.digest for v in local["versions"]]
    assert all(v.digest for v in versions)
    assert state(svc.store, stack.settings.models_bucket, versions[-1]) == state(
        local["svc"].store, local["svc"].settings.models_bucket, local["versions"][-1])
    assert local["job"].head.holdout_accuracy == serial.accuracy
    assert status["accuracy"] == serial.accuracy, (status["accuracy"], serial.accuracy)


def test_bad_upload_is_rejected_and_next_upload_trains(stack: Any, tmp_path: Path) -> None:
    """A ragged row ends as REJECTED naming file, row and expectation; the next upload trains."""
    # Prepare
    bad = tmp_path / "ragged.csv"
    bad.write_text("a,b,label\n1,2,x\n3,4,y\n5,6\n7,8,x\n")
    good = tmp_path / "small.csv"
    lines = DIGITS.read_text().splitlines()
    good.write_text("\n".join(lines[:601]) + "\n")
    # Execute
    rejected = submit_and_wait(stack, bad)
    trained = submit_and_wait(stack, good, "--epochs", "2")
    # Assert
    assert rejected["status"] == "REJECTED"
    assert "ragged.csv" in rejected["error"] and "row 3" in rejected["error"]
    assert "expected 3 fields" in rejected["error"]
    assert rejected["error_detail"]["row"] == 3
    assert trained["status"] == "DONE" and trained["accuracy"] > 0.5


def test_a_table_with_text_and_missing_cells_trains_and_predicts_raw_rows(stack: Any,
                                                                           tmp_path: Path) -> None:
    """Text columns and missing cells as a user meets them: Palmer penguins exactly as published (text columns, NA
    cells) trains without editing, to train-local's accuracy; the status names the column
    kinds; the downloaded model predicts raw rows with empty cells and an unseen island."""
    penguins = REPO / "data" / "penguins.csv"
    from bucketlearn.usecases.train_local import train_local

    # Execute
    serial = train_local(str(penguins), JobOptions(label_column="species"),
                         svc=memory_services())
    status = submit_and_wait(stack, penguins, "--label-column", "species")
    # Assert
    assert status["status"] == "DONE", status
    assert status["accuracy"] == serial.accuracy and status["accuracy"] > 0.9
    assert status["columns"]["kinds"] == {"category": 2, "numeric": 5}
    assert {c["name"]: c["missing"] for c in status["columns"]["detail"]}["sex"] == 11
    model_path = tmp_path / "penguins.keras"
    assert cli(stack, "download", status["job_id"], "-o", str(model_path)).returncode == 0
    predict = cli(stack, "predict", str(model_path), str(REPO / "data" / "penguins_new.csv"),
                  "--json")
    assert predict.returncode == 0, predict.stderr
    report = json.loads(predict.stdout)
    assert report["rows"] == 4
    assert set(report["predictions"]) <= {"Adelie", "Chinstrap", "Gentoo"}
    assert report["predictions"][:2] == ["Gentoo", "Chinstrap"]  # clear-cut rows


def test_a_numeric_target_trains_to_train_locals_rmse_and_predicts_numbers(stack: Any,
                                                                           tmp_path: Path
                                                                           ) -> None:
    """Numeric targets end to end: penguins' ``body_mass_g`` (two rows ``NA``) is a
    regression under ``task=auto``; the job's RMSE is train-local's; the downloaded model
    predicts grams from raw rows, an unseen island and empty cells included."""
    penguins = REPO / "data" / "penguins.csv"
    from bucketlearn.usecases.train_local import train_local

    new_rows = tmp_path / "new_penguins.csv"
    new_rows.write_text("species,island,bill_length_mm,bill_depth_mm,flipper_length_mm,sex,year\n"
                        "Gentoo,Biscoe,47.5,14.2,217,male,2009\n"
                        "Adelie,Dream,36.0,18.0,185,female,2008\n"
                        "Chinstrap,Atlantis,NA,,200,,2010\n")
    # Execute
    serial = train_local(str(penguins), JobOptions(label_column="body_mass_g"),
                         svc=memory_services())
    status = submit_and_wait(stack, penguins, "--label-column", "body_mass_g")
    # Assert
    assert status["status"] == "DONE", status
    assert status["task"] == "regression" and status["missing_targets"] == 2
    assert status["rmse"] == pytest.approx(serial.report["rmse"], rel=1e-6)
    assert status["r2"] > 0.8 and status["mae"] < status["rmse"]
    model_path = tmp_path / "mass.keras"
    assert cli(stack, "download", status["job_id"], "-o", str(model_path)).returncode == 0
    predict = cli(stack, "predict", str(model_path), str(new_rows), "--json")
    assert predict.returncode == 0, predict.stderr
    grams = json.loads(predict.stdout)["predictions"]
    assert len(grams) == 3 and all(isinstance(g, float) for g in grams)
    assert grams[0] > grams[1] + 500  # a large Gentoo male outweighs a small Adelie female
    assert all(2000 < g < 7000 for g in grams)


def test_a_searched_upload_trains_its_candidates_on_the_pool(stack: Any, tmp_path: Path
                                                             ) -> None:
    """``submit --search 6`` on two learners: the candidates train side by side, the job
    selects what ``train-local --search 6`` selects (the same finalists, the same holdout
    accuracy), status says every candidate's standing, and the downloaded model (their mean)
    predicts raw rows."""
    penguins = REPO / "data" / "penguins.csv"
    from bucketlearn.usecases.local_search import search_local

    options = JobOptions(label_column="species", epochs=9)
    # Execute
    local = search_local(str(penguins), options, 6, svc=memory_services())
    status = submit_and_wait(stack, penguins, "--label-column", "species", "--epochs", "9",
                             "--search", "6")
    # Assert
    assert status["status"] == "DONE", status
    assert status["selected"]["candidates"] == local.selected["candidates"]
    assert status["accuracy"] == local.accuracy
    assert sorted(c["state"] for c in status["candidates"]) == ["finalist"] * 4 + ["pruned"] * 2
    assert {c["index"]: c["best"] for c in status["candidates"]} == {
        c["index"]: c["best"] for c in local.candidates}
    assert status["search"]["outstanding"] == 0 and status["model_version"] == 1
    assert len(status["feature_importance"]) >= 5  # the mean's ranking of the columns
    model_path = tmp_path / "searched.keras"
    assert cli(stack, "download", status["job_id"], "-o", str(model_path)).returncode == 0
    predict = cli(stack, "predict", str(model_path), str(REPO / "data" / "penguins_new.csv"),
                  "--json")
    assert predict.returncode == 0, predict.stderr
    assert json.loads(predict.stdout)["predictions"][:2] == ["Gentoo", "Chinstrap"]
