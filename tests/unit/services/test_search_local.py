"""``train-local --search``: the same search in one process selects the same model every time,
its candidate 0 is ``train-local``'s model to the bit, and the selected model (one candidate or
the mean of the finalists) exports and loads in safe mode with raw rows in."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bucketlearn.bootstrap import memory_services
from bucketlearn.entrypoints import cli
from bucketlearn.errors import ConfigError
from bucketlearn.ml.model import export_keras
from bucketlearn.options import JobOptions
from bucketlearn.usecases.local_search import search_local
from bucketlearn.usecases.model_files import predict_file, serial_sidecar
from bucketlearn.usecases.train_local import train_local
from tests.unit.helpers import SEARCH_OPTIONS, csv_bytes, write_search_table

write_table, OPTIONS = write_search_table, SEARCH_OPTIONS


def test_candidate_zero_is_train_locals_model_and_the_search_repeats(tmp_path):
    # Prepare
    path = write_table(tmp_path / "t.csv")
    # Execute
    serial = train_local(str(path), OPTIONS, svc=memory_services())
    first = search_local(str(path), OPTIONS, 6, svc=memory_services())
    second = search_local(str(path), OPTIONS, 6, svc=memory_services())
    # Assert: the default configuration scored as train-local scored it, epoch by epoch
    zero = next(c for c in first.candidates if c["index"] == 0)
    scores = serial.selection["scores"]
    assert zero["best"] in scores[:zero["epochs"]]
    assert zero["best"]["accuracy"] == max(s["accuracy"] for s in scores[:zero["epochs"]])
    # the same candidates, promotions, selection and weights on a second run
    assert first.candidates == [
        {**c, "seconds": first.candidates[i]["seconds"],
         "rung_seconds": first.candidates[i]["rung_seconds"]}
        for i, c in enumerate(second.candidates)]
    assert first.selected == second.selected
    assert [w.tobytes() for w in first.weights] == [w.tobytes() for w in second.weights]
    assert first.accuracy == second.accuracy
    # 6 candidates: rung 0 trains 6 to 3 epochs, keeps 4 finalists to the budget
    assert [r["count"] for r in first.rungs] == [6, 4]
    states = sorted(c["state"] for c in first.candidates)
    assert states == ["finalist"] * 4 + ["pruned"] * 2
    assert all(c["reason"].startswith("rung 0: not among the best 4 of 6")
               for c in first.candidates if c["state"] == "pruned")
    finalists = [c["index"] for c in first.candidates if c["state"] == "finalist"]
    assert sorted(first.selected["candidates"]) == sorted(finalists)  # the mean of all four
    assert first.selected["reason"].startswith("the mean of the 4 finalists")


def test_the_selected_model_exports_and_takes_raw_rows(tmp_path):
    path = write_table(tmp_path / "t.csv", seed=1)
    result = search_local(str(path), OPTIONS, 5, svc=memory_services())
    # what the result says is the mean's and the job's, not one finalist's
    assert [r["count"] for r in result.rungs] == [5, 4]
    assert result.cost == {"candidate_epochs": 5 * 3 + 4 * 6, "epochs": 9}
    assert result.spec.seed == OPTIONS.seed and result.spec.to_dict().get("width") is None
    assert result.selection == {} and "epoch" not in result.selected["score"]
    assert result.tasks == sum(sum(c["rung_tasks"]) for c in result.candidates) > 0
    out = tmp_path / "m.keras"
    out.write_bytes(export_keras(result.model, serial_sidecar(
        result.manifest, result.options, result.accuracy, result.report)))
    predicted = predict_file(str(out), str(path), None)  # safe mode, raw rows, empty cells
    assert len(predicted["predictions"]) == 600
    assert set(predicted["predictions"]) <= {"yes", "no"}
    assert predicted["accuracy"] > 0.7


def test_a_search_without_validation_rows_is_refused(tmp_path):
    path = write_table(tmp_path / "t.csv", n=200)
    with pytest.raises(ConfigError, match="validation rows to select on"):
        search_local(str(path), OPTIONS.with_overrides(validation_fraction="none"), 4,
                     svc=memory_services())


def test_the_mean_of_two_models_exports_and_takes_raw_rows(tmp_path):
    from bucketlearn.ingest.parts import load_parts
    from bucketlearn.ml.model import ensemble_model

    path = write_table(tmp_path / "t.csv", seed=2)
    svc = memory_services()
    one = train_local(str(path), OPTIONS, svc=svc)
    two = train_local(str(path), OPTIONS.with_overrides(seed=3, epochs=4), svc=memory_services())
    x, _ = load_parts(svc.store, svc.settings.work_bucket, one.manifest.holdout_parts)
    expected = (np.asarray(one.model.predict_on_batch(x))
                + np.asarray(two.model.predict_on_batch(x))) / 2
    mean = ensemble_model([one.model, two.model])
    assert np.allclose(mean.predict_on_batch(x), expected, atol=1e-6)
    out = tmp_path / "mean.keras"
    out.write_bytes(export_keras(mean, serial_sidecar(one.manifest, one.options, None, {})))
    predicted = predict_file(str(out), str(path), None)  # safe mode, raw rows, empty cells
    assert len(predicted["predictions"]) == 600 and predicted["accuracy"] > 0.7


def test_an_image_search_varies_the_rate_batch_and_seed_of_the_cnn(tmp_path):
    """16 x 16 images (the CNN): the candidates keep the model's shape; the search runs and its
    mean predicts."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(400):
        label = i % 2
        pixels = rng.random(256) * 0.5 + (np.arange(256) < 128) * label * 0.5
        rows.append([f"{p:.3f}" for p in pixels] + [str(label)])
    path = tmp_path / "images.csv"
    path.write_bytes(csv_bytes([f"p{i}" for i in range(256)] + ["label"], rows))
    result = search_local(str(path), JobOptions(epochs=2, rows_per_shard=64), 3,
                          svc=memory_services())
    assert result.spec.kind == "cnn"
    assert {(c["width"], c["depth"]) for c in result.candidates} == {(None, None)}
    assert "smoothing" not in result.candidates[1]["configuration"]  # said as the CNN's
    assert result.accuracy > 0.7 and len(result.selected["candidates"]) == 3


def test_train_local_search_auto_trains_the_default_model_on_a_small_table(tmp_path, capsys):
    # Prepare
    table = write_table(tmp_path / "t.csv")
    plain = train_local(str(table), OPTIONS, svc=memory_services())
    # Execute
    code = cli.main(["train-local", str(table), "--search", "auto", "--epochs", "9",
                     "--rows-per-shard", "64", "--patience", "9", "--json"])
    # Assert: auto is off below 20,000 training rows, so the model is train-local's default
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["options"]["search"] == 0 and "search" not in report
    assert report["accuracy"] == plain.accuracy
