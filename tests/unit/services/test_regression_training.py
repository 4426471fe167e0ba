"""Numeric targets end to end on the in-memory ports: the pipeline takes
train-local's steps to the bit with one task at a time, versions record RMSE, MAE and R², the
status object says so, and the exported model predicts numbers in the target's units from raw
rows (loading with plain Keras in safe mode)."""

from __future__ import annotations

import numpy as np
import pytest

from bucketlearn import codec
from bucketlearn.bootstrap import memory_services
from bucketlearn.local.simulation import simulate_pipeline
from bucketlearn.ml.model import export_keras, read_sidecar
from bucketlearn.options import JobOptions
from bucketlearn.usecases.model_files import model_bytes, predict_file, serial_sidecar
from bucketlearn.usecases.status import status_object
from bucketlearn.usecases.train_local import train_local
from tests.unit.helpers import REPO_DIR, csv_bytes, outputs_without_bucketlearn

PENGUINS = REPO_DIR / "data" / "penguins.csv"


def write_target_csv(path, n: int = 400, seed: int = 0, offset: float = 1000.0):
    """y = 30 a - 20 b + 10 a b + offset + noise: learnable, far from 0 (the model must undo
    its standardization), rows in random order."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(size=n)
    y = 30 * a - 20 * b + 10 * a * b + offset + rng.normal(scale=2.0, size=n)
    path.write_bytes(csv_bytes(["a", "b", "y"], [[f"{a[i]:.5f}", f"{b[i]:.5f}", f"{y[i]:.3f}"]
                                                 for i in range(n)]))
    return path


def test_one_task_at_a_time_takes_train_locals_steps_to_the_bit_for_a_numeric_target(tmp_path):
    """As for classes (test_aggregator_service): with R = 1 the version the pipeline exports
    (the best by validation RMSE) is train-local's model bit for bit, and so are its holdout
    figures."""
    # Prepare
    path = write_target_csv(tmp_path / "target.csv", n=300)
    options = JobOptions(epochs=4, rows_per_shard=24, parallel_tasks=1)
    serial = train_local(str(path), options, svc=memory_services())
    # Execute
    run = simulate_pipeline(str(path), options, workers=2, svc=memory_services())
    # Assert
    svc, job, last = run["svc"], run["job"], run["versions"][-1]
    weights, _, _ = codec.decode_state(svc.store.read_bytes(svc.settings.models_bucket,
                                                            job.head.weights_path))
    assert job.status == "DONE" and last.version >= 4
    assert job.head.version == serial.selection["best"]["version"]
    assert [w.tobytes() for w in weights] == [np.asarray(w).tobytes() for w in serial.weights]
    assert serial.accuracy is None and job.head.holdout_accuracy is None
    assert job.head.holdout_rmse == serial.report["rmse"]
    assert last.figure("holdout_r2") == serial.report["r2"] and last.figure("holdout_mae") == serial.report["mae"]
    assert last.figure("holdout_loss") == pytest.approx(serial.report["rmse"] ** 2)
    evaluated = [v for v in run["versions"][1:] if v.figure("holdout_rmse") is not None]
    assert len(evaluated) == len(run["versions"]) - 1  # every version has its figures
    # the status object and the head carry them (the DONE head: the whole holdout)
    status = status_object(job)
    assert status["task"] == "regression" and status["task_reason"].startswith("auto: ")
    assert status["rmse"] == serial.report["rmse"] and status["r2"] == serial.report["r2"]
    assert status["accuracy"] is None and status["warning"] is None and status["classes"] == []
    # the exported file predicts numbers, in the target's units
    data, _ = model_bytes(svc, job.job_id, None)
    (tmp_path / "model.keras").write_bytes(data)
    sidecar = read_sidecar(str(tmp_path / "model.keras"))
    assert sidecar["task"] == "regression" and sidecar["holdout_rmse"] == serial.report["rmse"]
    result = predict_file(str(tmp_path / "model.keras"), str(path), None)
    assert result["rmse"] == pytest.approx(serial.report["rmse"], rel=0.5)  # (all rows here)
    assert all(isinstance(v, float) for v in result["predictions"])


def test_a_learnable_target_is_learned_and_its_model_predicts_its_units(tmp_path):
    """R² above 0.8 on the holdout of y = 30a - 20b + 10ab + 1000; predictions near 1000."""
    path = write_target_csv(tmp_path / "target.csv", n=1000, seed=1)
    result = train_local(str(path), JobOptions(epochs=10, rows_per_shard=128),
                         svc=memory_services())
    assert result.report["r2"] > 0.8
    assert result.report["rmse"] < 0.45 * result.manifest.target_std
    model_path = tmp_path / "m.keras"
    model_path.write_bytes(export_keras(result.model, serial_sidecar(
        result.manifest, JobOptions(), result.accuracy, result.report)))
    predicted = predict_file(str(model_path), str(path), None)
    assert predicted["r2"] > 0.8 and predicted["scored_rows"] == 1000
    assert 900 < float(np.mean(predicted["predictions"])) < 1100


@pytest.fixture(scope="module")
def penguins_mass(tmp_path_factory):
    """train-local on data/penguins.csv as published, predicting body_mass_g (text columns, NA
    cells, two rows without a mass), exported as the raw-row model."""
    options = JobOptions(label_column="body_mass_g")
    result = train_local(str(PENGUINS), options, svc=memory_services())
    path = tmp_path_factory.mktemp("penguins") / "mass.keras"
    path.write_bytes(export_keras(result.model, serial_sidecar(result.manifest, options,
                                                               result.accuracy, result.report)))
    return result, path


def test_penguins_body_mass_is_a_numeric_target_learned_from_text_and_na_cells(penguins_mass):
    result, path = penguins_mass
    manifest = result.manifest
    assert manifest.task == "regression" and manifest.missing_targets == 2
    assert manifest.task_reason.startswith("auto: 94 distinct numeric labels")
    assert manifest.rows == 342 and 3500 < manifest.target_mean < 4500
    assert result.report["r2"] > 0.8 and result.report["rmse"] < 400  # grams


def test_predict_returns_grams_for_raw_rows_with_empty_cells_and_an_unseen_island(penguins_mass,
                                                                                  tmp_path):
    """data/penguins_new.csv's rows (an empty sex, an unseen island, NA cells) with a species:
    numbers in grams; RMSE/MAE/R² against the rows that have a mass."""
    _, path = penguins_mass
    lines = (REPO_DIR / "data" / "penguins_new.csv").read_text().splitlines()
    species = ["species", "Gentoo", "Chinstrap", "Adelie", "NA"]
    rows = tmp_path / "rows.csv"
    rows.write_text("\n".join(f"{s},{line}" for s, line in zip(species, lines, strict=True)))
    result = predict_file(str(path), str(rows), None)
    masses = result["predictions"]
    assert result["task"] == "regression" and result["rows"] == len(masses) == 4
    assert all(isinstance(m, float) and 2000 < m < 7000 for m in masses)
    assert result["scored_rows"] == 3 and result["rmse"] is not None  # the last has no mass
    out = predict_file(str(path), str(PENGUINS), str(tmp_path / "out.csv"))
    assert out["rows"] == 344 and out["scored_rows"] == 342 and out["r2"] > 0.8


def test_the_exported_regression_model_loads_with_plain_keras_in_safe_mode(penguins_mass):
    _, path = penguins_mass
    grams = outputs_without_bucketlearn(path, {
        "species": [["Gentoo"]], "island": [["Biscoe"]], "bill_length_mm": [[47.5]],
        "bill_depth_mm": [[14.2]], "flipper_length_mm": [[217.0]], "sex": [["female"]],
        "year": [[2009.0]]})
    assert grams.shape == (1, 1) and 4000 < grams[0, 0] < 6000  # a Gentoo female: ~4,700 g
