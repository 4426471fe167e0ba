"""The exported model of a mixed table takes raw CSV rows: strings, empty cells and
dates go in, the core's probabilities come out, with plain Keras in safe mode."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.domain.columns import DATE_CHARS, parse_date
from bucketlearn.ingest.columns import Encoder
from bucketlearn.ingest.split import split_upload
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.ml.model import (
    ModelSpec,
    build_model,
    export_keras,
    keras_module,
    model_inputs,
)
from bucketlearn.ml.tabular import DATE_VOCABULARY, parse_dates_in_graph
from bucketlearn.options import JobOptions
from bucketlearn.usecases.model_files import predict_file
from bucketlearn.usecases.prediction_rows import LoadedModel, predict_raw_rows, predicted_rows
from tests.unit.helpers import (
    MIXED_HEADER,
    csv_bytes,
    mixed_rows,
    outputs_without_bucketlearn,
    random_date_strings,
    source_from_bytes,
)


def test_the_graph_date_parser_reads_as_the_reference_does():
    keras = keras_module()
    from keras import ops

    texts = random_date_strings(4000)
    chars = keras.layers.TextVectorization(standardize=None, split="character",
                                           output_mode="int", output_sequence_length=DATE_CHARS,
                                           vocabulary=DATE_VOCABULARY)
    codes = ops.cast(chars(np.array(texts, dtype=object).reshape(-1, 1)), "int32")
    found = np.asarray(parse_dates_in_graph(ops, codes[:, None, :]))[:, 0, :]
    expected = np.array([parse_date(t, True) for t in texts], dtype=np.float32)
    assert np.isfinite(expected[:, 0]).sum() > 500  # many valid dates among them
    np.testing.assert_array_equal(found, expected)  # NaN where NaN, the same cells elsewhere


PREDICT_ROWS = [
    ["T9", "Chicago", "card", "3.5", "8.8", "2024-03-04T08:15:00", "Y", "tip"],
    ["T9", "Atlantis", "", "?", "", "", "N", "no_tip"],       # unseen city, missing cells
    ["T9", "Skokie", "NA", "", "12.0", "2024-02-30T08:00:00", "Y", "no_tip"],  # bad date
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A mixed table's core (untrained: its outputs still depend on every input) exported."""
    store = MemoryBlobStore()
    manifest = split_upload(source_from_bytes(csv_bytes(MIXED_HEADER, mixed_rows(300))), store,
                            "work", "job-000000000000", JobOptions(), Limits())
    spec = ModelSpec("mlp", manifest.width, 2, None, 3, 0.001)
    core = build_model(spec, manifest.mean, manifest.variance, manifest.schema)
    sidecar = {"feature_names": manifest.feature_names, "label_column": "label",
               "class_names": manifest.classes, "label_kind": "str",
               **model_inputs(manifest.columns, manifest.missing_values)}
    path = tmp_path_factory.mktemp("model") / "mixed.keras"
    path.write_bytes(export_keras(core, sidecar))
    csv_path = tmp_path_factory.mktemp("rows") / "rows.csv"
    csv_path.write_bytes(csv_bytes(MIXED_HEADER, PREDICT_ROWS + mixed_rows(40, seed=9)))
    return manifest, core, path, csv_path


def test_the_raw_row_model_gives_the_cores_probabilities(exported):
    """The rows read a batch at a time as ``predict`` reads them, typed as at ingest: the
    raw-row model's outputs are its core's on the encoded rows."""
    manifest, core, path, csv_path = exported
    loaded = LoadedModel.load(str(path))
    source = SourceFile(str(csv_path), csv_path.stat().st_size, lambda: open(csv_path, "rb"))
    _, batches = predicted_rows(source, loaded, Limits())
    (batch,) = list(batches)
    x = Encoder(manifest.schema, manifest.missing_values).encode(
        pa.RecordBatch.from_arrays([batch.typed[n] for n in manifest.feature_names],
                                   manifest.feature_names))
    assert np.isnan(x[1:3]).any() and x[1, 0] == 0.0  # missing cells; an unseen city (code 0)
    raw = predict_raw_rows(loaded.model, batch.typed, loaded.sidecar["inputs"], batch.rows)
    np.testing.assert_allclose(raw, np.asarray(core.predict_on_batch(x)), atol=1e-6)
    np.testing.assert_allclose(batch.outputs, raw, atol=1e-6)


def test_the_exported_model_loads_with_plain_keras_in_safe_mode(exported):
    """In a process where bucketlearn cannot be imported: only built-in layers and ops."""
    _, core, path, _ = exported
    probabilities = outputs_without_bucketlearn(path, {
        "city": [["Chicago"], ["Atlantis"]], "payment": [["card"], [""]],
        "distance": [[3.5], [float("nan")]], "fare": [[8.8], [float("nan")]],
        "start": [["2024-03-04T08:15:00"], [""]]})
    assert probabilities.shape == (2, 2)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)


def test_predict_takes_a_csv_with_missing_cells_and_unseen_categories(exported, tmp_path):
    _, _, path, csv_path = exported
    result = predict_file(str(path), str(csv_path), str(tmp_path / "out.csv"))
    assert result["rows"] == 43 and result["accuracy"] is not None
    lines = (tmp_path / "out.csv").read_text().splitlines()
    assert len(lines) == 44 and all(line.split(",")[1] in ("tip", "no_tip") for line in lines[1:])
