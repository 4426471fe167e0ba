"""A CSV's rows predicted a batch at a time: what ``bucketlearn predict MODEL FILE`` and a batch
prediction request (``usecases.batch_predict``) share.

The file is read as ingest reads an upload (``ingest.stream.batches``: blocks of
``READ_BLOCK_BYTES``, at most a few read ahead), every column as its text, so a batch holds a
bounded number of rows whatever the file's size, and the input's cells can be written back as
they were. Each feature column is then typed as at training (numbers as float32, an empty cell
or one of the model's missing-value markers null; text and dates as their text) and the
model's outputs computed for the batch. A cell that is not a number in a numeric feature column,
or a row pyarrow cannot parse, ends the reading with ``InvalidInputError`` naming the row (data
rows from 1, as ingest numbers them), the column, what was expected and what was found.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bucketlearn.config import Limits
from bucketlearn.domain.columns import NUMERIC
from bucketlearn.domain.target import REGRESSION
from bucketlearn.errors import InvalidInputError
from bucketlearn.ingest import stream
from bucketlearn.ingest.problems import abbrev, rejected
from bucketlearn.ingest.sniff import read_header
from bucketlearn.ingest.stream import SourceFile

READ_BLOCK_BYTES = stream.READ_BLOCK_BYTES
PREDICT_BATCH_ROWS = 1024  # rows a matrix model's ``predict`` takes at once
# rows a raw-row model is called on at once: each call runs the model eagerly (op by op), so
# its cost is mostly per call; 8,192 rows a call predicted penguins' 65,536 rows at 197,000
# rows/s against 58,000 at 1,024, the same outputs to the bit
RAW_BATCH_ROWS = 8192
PROBABILITY_PREFIX = "probability_"


@dataclass(frozen=True)
class LoadedModel:
    """A ``.keras`` model as ``ml.model.load_model`` loads it, and what its sidecar says."""

    model: Any
    sidecar: dict[str, Any]

    @classmethod
    def load(cls, path: str) -> LoadedModel:
        from bucketlearn.ml.model import load_model  # noqa: PLC0415 - TensorFlow, on demand

        return cls(*load_model(path))

    @property
    def features(self) -> list[str]:
        return list(self.sidecar["feature_names"])

    @property
    def label(self) -> str | None:
        return self.sidecar.get("label_column")

    @property
    def classes(self) -> list[str]:
        return [str(c) for c in self.sidecar.get("class_names") or []]

    @property
    def regression(self) -> bool:
        return self.sidecar.get("task") == REGRESSION

    @property
    def markers(self) -> list[str]:
        return list(self.sidecar.get("missing_values") or [])

    def numeric(self, column: str) -> bool:
        """Whether the model reads ``column`` as a number (a matrix model reads every one)."""
        kinds = {c["name"]: c["kind"] for c in self.sidecar.get("columns", [])}
        return kinds.get(column, NUMERIC) == NUMERIC


@dataclass(frozen=True)
class RowBatch:
    """Consecutive rows of the file: every column as its text (``cells``), the feature columns
    as the model reads them (``typed``), the model's outputs (class probabilities, or a
    regression's targets), and the number of the batch's first row."""

    cells: pa.RecordBatch
    typed: dict[str, pa.Array]
    outputs: np.ndarray
    first_row: int

    @property
    def rows(self) -> int:
        return self.cells.num_rows


def predicted_rows(source: SourceFile, loaded: LoadedModel, limits: Limits
                   ) -> tuple[list[str], Iterator[RowBatch]]:
    """The file's column names (checked at once: every feature column must be there) and its
    rows a batch at a time with the model's outputs, read lazily as the batches are asked for.

    Raises:
        InvalidInputError: the file cannot be read as a CSV (``read_header``'s checks, with
            ``limits.max_file_bytes``), or lacks feature columns (named); while the batches
            are read, a row that cannot be read (its row and column named).
    """
    header = read_header(source, limits, min_columns=1)
    missing = [f for f in loaded.features if f not in header]
    if missing:
        raise rejected(source.display_name, "the file lacks feature columns of the model",
                       expected=f"the model's feature columns ({len(loaded.features)})",
                       found="no column " + ", ".join(repr(m) for m in missing[:10])
                             + (" …" if len(missing) > 10 else ""))
    return header, _batches(source, loaded, limits, header)


def _batches(source: SourceFile, loaded: LoadedModel, limits: Limits, header: list[str]
             ) -> Iterator[RowBatch]:
    as_text = stream.Reading({c: "text" for c in header}, [])
    first = 1
    try:
        for cells in stream.batches(source, header, "", None, READ_BLOCK_BYTES, as_text):
            typed = {f: _typed(cells, f, loaded, first, source.display_name)
                     for f in loaded.features}
            yield RowBatch(cells, typed, model_outputs(loaded, typed, cells.num_rows, first,
                                                       source.display_name), first)
            first += cells.num_rows
    except pa.ArrowInvalid as exc:  # a row pyarrow cannot read: re-read to name it
        reading = stream.Reading({c: NUMERIC if c in loaded.features and loaded.numeric(c)
                                  else "text" for c in header}, loaded.markers)
        raise stream.diagnosed(source, header, loaded.label or "", limits, str(exc),
                               reading) from None


def _typed(cells: pa.RecordBatch, column: str, loaded: LoadedModel, first_row: int,
           file: str) -> pa.Array:
    """A feature column as the model reads it: a number column's cells as float32 (an empty
    cell or a missing-value marker null, as at ingest), a text or date column's as they are."""
    values = cells.column(column)
    if not loaded.numeric(column):
        return values
    trimmed = pc.utf8_trim_whitespace(values)
    missing = pc.or_(pc.equal(trimmed, ""), pc.is_in(values, value_set=pa.array(
        loaded.markers, pa.string())))
    present = pc.if_else(missing, pa.scalar(None, pa.string()), trimmed)
    try:
        return pc.cast(present, pa.float32())
    except pa.ArrowInvalid:
        raise _not_a_number(present, values, column, loaded.markers, first_row, file) from None


def _not_a_number(present: pa.Array, values: pa.Array, column: str, markers: list[str],
                  first_row: int, file: str) -> InvalidInputError:
    """The first cell of ``present`` that is not a number (found by halving the batch)."""
    low, high = 0, len(present)
    while high - low > 1:
        middle = (low + high) // 2
        try:
            pc.cast(present.slice(low, middle - low), pa.float32())
            low = middle
        except pa.ArrowInvalid:
            high = middle
    shown = ", ".join(markers[:6]) + (", …" if len(markers) > 6 else "")
    return rejected(file, "a feature value is not a number", row=first_row + low, column=column,
                    expected="a number or a missing value (an empty cell"
                             + (f" or one of the model's missing values: {shown}" if markers
                                else "") + "), as the model was trained on",
                    found=abbrev(values[low].as_py()))


def model_outputs(loaded: LoadedModel, typed: dict[str, pa.Array], rows: int,
                  first_row: int = 1, file: str = "") -> np.ndarray:
    """The model's outputs for rows whose feature columns are ``typed``: class probabilities
    (rows x classes), or a regression's targets."""
    inputs = loaded.sidecar.get("inputs")
    if inputs:
        return predict_raw_rows(loaded.model, typed, inputs, rows)
    x = np.column_stack([typed[f].fill_null(np.nan).to_numpy(zero_copy_only=False)
                         for f in loaded.features]) if rows else np.zeros(
        (0, len(loaded.features)), np.float32)
    if not np.isfinite(x).all():
        row = int(np.nonzero(~np.isfinite(x).all(axis=1))[0][0])
        column = loaded.features[int(np.nonzero(~np.isfinite(x[row]))[0][0])]
        value = float(x[row, loaded.features.index(column)])
        raise rejected(file, "a feature value is missing or not finite", row=first_row + row,
                       column=column, expected="a finite number (this model was trained on "
                       "complete numeric rows)", found="an empty cell or a missing-value marker"
                       if np.isnan(value) else str(value))
    if not rows:
        return np.zeros((0, max(1, len(loaded.classes))), np.float32)
    return np.asarray(loaded.model.predict(x.astype(np.float32),
                                           batch_size=PREDICT_BATCH_ROWS, verbose=0))


def predict_raw_rows(model: Any, columns: dict[str, Any], inputs: dict[str, str], rows: int,
                     batch: int = RAW_BATCH_ROWS) -> np.ndarray:
    """The raw-row model's outputs, ``batch`` rows at a time (Keras's ``predict`` does not take
    string arrays in a dict: the model is called on tensors)."""
    import tensorflow as tf  # noqa: PLC0415

    out = []
    for start in range(0, max(rows, 1), batch):
        feed = {}
        for name, input_name in inputs.items():
            values = columns[name].slice(start, batch)
            if values.type == pa.string():
                cells = np.array(values.to_pylist(), dtype=object).reshape(-1, 1)
                feed[input_name] = tf.constant(cells, dtype=tf.string)
            else:
                cells = values.fill_null(np.nan).to_numpy(zero_copy_only=False)
                feed[input_name] = tf.constant(cells.reshape(-1, 1), dtype=tf.float32)
        out.append(np.asarray(model(feed, training=False)))
    return np.concatenate(out)[:rows]


def predicted_labels(loaded: LoadedModel, outputs: np.ndarray) -> list[Any]:
    """Original label values (a class's name), or a regression's numbers (floats)."""
    if loaded.regression:
        return [float(v) for v in np.asarray(outputs, dtype=np.float64).reshape(-1)]
    classes = loaded.classes
    return [classes[i] for i in np.argmax(outputs, axis=1)]


def output_columns(loaded: LoadedModel) -> list[str]:
    """The columns a batch prediction adds to the input's: ``prediction`` and, for a
    classification, ``probability_<class>`` per class in the model's order."""
    if loaded.regression:
        return ["prediction"]
    return ["prediction", *(PROBABILITY_PREFIX + c for c in loaded.classes)]


def output_batch(loaded: LoadedModel, batch: RowBatch) -> pa.RecordBatch:
    """The input's cells as they were, then the ``output_columns``."""
    arrays = list(batch.cells.columns)
    names = list(batch.cells.schema.names)
    if loaded.regression:
        arrays.append(pa.array(predicted_labels(loaded, batch.outputs), pa.float64()))
    else:
        arrays.append(pa.array(predicted_labels(loaded, batch.outputs), pa.string()))
        probabilities = np.asarray(batch.outputs, dtype=np.float32)
        arrays.extend(pa.array(probabilities[:, i]) for i in range(len(loaded.classes)))
    names.extend(output_columns(loaded))
    return pa.RecordBatch.from_arrays(arrays, names=names)


def unbounded(limits: Limits) -> Limits:
    """``limits`` without a bound on the file's size (a local file, predicted in place)."""
    return dataclasses.replace(limits, max_file_bytes=2**62)
