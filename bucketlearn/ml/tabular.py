"""Models for tables with text, dates and missing cells; the exported model that takes raw rows.

Two models, both of built-in Keras layers and ``keras.ops`` only (they load in safe mode):

- the **core** trains on the float32 matrix ingest writes (see ``bucketlearn.domain.columns``):
  per column it imputes missing cells with the training mean and adds a missing indicator
  (numbers and dates), scales with the training statistics, and turns category codes into a
  one-hot vector (small vocabularies) or an embedding; then the same MLP as for plain tables;
- the **raw-row model**, built at export, takes one input per kept CSV column (float32 for
  numeric columns, NaN for missing; strings for text and date columns), turns the strings into
  the matrix's cells in the graph (a ``StringLookup`` for categories, a character-level parser
  for ISO dates) and calls the core, whose weights it reuses unchanged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bucketlearn.domain.columns import CATEGORY, DATE_CHARS, NUMERIC, Column, matrix_width

ONE_HOT_MAX_TOKENS = 16  # a vocabulary of up to this many codes is one-hot, larger is embedded
DATE_VOCABULARY = [*"0123456789", "-", "T", " ", ":", ".", "Z", "+"]


def embedding_size(tokens: int) -> int:
    """The width of a category's embedding (the fastai rule of thumb, at most 16)."""
    return min(16, math.ceil(1.6 * tokens ** 0.56))


def layer_name(column: str, taken: set[str]) -> str:
    """A Keras layer/input name for a column (``^[A-Za-z0-9_.-]+$``), unique among ``taken``."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", column) or "column"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def input_names(columns: Sequence[Column]) -> dict[str, str]:
    """Each kept column's input name in the exported model."""
    taken: set[str] = set()
    return {c.name: layer_name(c.name, taken) for c in columns}


def output_head(keras: Any, x: Any, n_classes: int, init: Callable[[], Any],
                target: tuple[float, float] | None = None) -> Any:
    """The model's output: class probabilities (softmax); or, for a regression (``target``:
    the training rows' target mean and standard deviation), one linear unit that predicts the
    standardized target and a ``Normalization(invert=True)`` that turns it into the target's
    units (built-in layers: the model loads in safe mode and predicts original values)."""
    if target is None:
        return keras.layers.Dense(n_classes, activation="softmax", name="probabilities",
                                  kernel_initializer=init())(x)
    z = keras.layers.Dense(1, name="standardized", kernel_initializer=init())(x)
    mean, std = float(target[0]), float(target[1])
    return keras.layers.Normalization(mean=np.array([mean], np.float32),
                                      variance=np.array([std * std], np.float32), invert=True,
                                      name="target")(z)


def build_core(keras: Any, columns: Sequence[Column], n_classes: int, mean: Sequence[float],
               variance: Sequence[float], next_seed: Callable[[], int],
               target: tuple[float, float] | None = None) -> tuple[Any, Any]:
    """(inputs, class probabilities, or a regression's target: ``output_head``) of the core
    on the matrix; ``next_seed`` gives each kernel's and embedding's initializer a seed of its
    own."""
    from keras import ops  # noqa: PLC0415 - TensorFlow is imported lazily

    def init() -> Any:
        return keras.initializers.GlorotUniform(seed=next_seed())

    inputs = keras.Input(shape=(matrix_width(columns),), name="features")
    names = input_names(columns)
    blocks, at = [], 0
    for column in columns:
        cells = inputs[:, at:at + column.width]
        name = names[column.name]
        if column.kind == CATEGORY:
            blocks.append(_category_block(keras, ops, cells, column, name, next_seed))
        else:
            blocks.extend(_number_block(keras, ops, cells, column, name, mean[at:at + column.width],
                                        variance[at:at + column.width]))
        at += column.width
    x = keras.layers.Concatenate(name="encoded")(blocks) if len(blocks) > 1 else blocks[0]
    x = keras.layers.Dense(128, activation="relu", kernel_initializer=init())(x)
    x = keras.layers.Dense(64, activation="relu", kernel_initializer=init())(x)
    return inputs, output_head(keras, x, n_classes, init, target)


def _category_block(keras: Any, ops: Any, cells: Any, column: Column, name: str,
                    next_seed: Callable[[], int]) -> Any:
    tokens = len(column.vocabulary) + 2  # out-of-vocabulary, missing, then the vocabulary
    codes = ops.cast(cells, "int32")
    if tokens <= ONE_HOT_MAX_TOKENS:
        return keras.layers.CategoryEncoding(tokens, output_mode="one_hot",
                                             name=f"onehot_{name}")(codes)
    seed = next_seed()  # the embedding draws from the job's seed like every kernel
    embedded = keras.layers.Embedding(
        tokens, embedding_size(tokens), name=f"embed_{name}",
        embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=seed))(codes)
    return keras.layers.Flatten(name=f"flat_{name}")(embedded)


def _number_block(keras: Any, ops: Any, cells: Any, column: Column, name: str,
                  mean: Sequence[float], variance: Sequence[float]) -> list[Any]:
    fill = np.asarray(mean, dtype=np.float32)
    missing = ops.isnan(cells)
    filled = ops.where(missing, fill, cells)
    scaled = keras.layers.Normalization(mean=fill, variance=np.asarray(variance, np.float32),
                                        name=f"scale_{name}")(filled)
    if column.kind == NUMERIC and not column.missing:
        return [scaled]
    return [scaled, ops.cast(ops.any(missing, axis=1, keepdims=True), "float32")]


def raw_row_model(keras: Any, core: Any, columns: Sequence[Column], markers: Sequence[str]) -> Any:
    """The exported model: one input per kept column (see the module doc), then the core."""
    from keras import ops  # noqa: PLC0415

    names = input_names(columns)
    inputs = {names[c.name]: keras.Input(shape=(1,), name=names[c.name],
                                         dtype="float32" if c.kind == NUMERIC else "string")
              for c in columns}
    dates = [c for c in columns if c.kind not in (NUMERIC, CATEGORY)]
    parsed: dict[str, Any] = {}
    if dates:
        chars = keras.layers.TextVectorization(
            standardize=None, split="character", output_mode="int",
            output_sequence_length=DATE_CHARS, vocabulary=DATE_VOCABULARY, name="date_chars")
        codes = ops.stack([chars(inputs[names[c.name]]) for c in dates], axis=1)
        parts = parse_dates_in_graph(ops, ops.cast(codes, "int32"))
        parsed = {c.name: parts[:, i, :c.width] for i, c in enumerate(dates)}
    blocks = []
    missing_words = ["", *markers]
    for column in columns:
        cell = inputs[names[column.name]]
        if column.kind == NUMERIC:
            blocks.append(cell)
        elif column.kind == CATEGORY:
            lookup = keras.layers.StringLookup(
                vocabulary=missing_words + list(column.vocabulary), num_oov_indices=1,
                mask_token=None, output_mode="int", name=f"lookup_{names[column.name]}")
            index = ops.cast(lookup(cell), "int32")  # 0 unseen, 1..m missing, m+1.. vocabulary
            m = len(missing_words)
            code = ops.where(ops.equal(index, 0), 0, ops.where(index <= m, 1, index - m + 1))
            blocks.append(ops.cast(code, "float32"))
        else:
            blocks.append(parsed[column.name])
    matrix = keras.layers.Concatenate(name="matrix")(blocks) if len(blocks) > 1 else blocks[0]
    return keras.Model(inputs, core(matrix), name="bucketlearn_raw_rows")


def parse_dates_in_graph(ops: Any, codes: Any) -> Any:
    """ISO dates in the graph: ``codes`` (batch, k, DATE_CHARS) from the date character
    vectorizer -> float32 (batch, k, 8): year, month, day, weekday, days since 1970, hour,
    minute, second; NaN where the text is not a valid date. The same as
    ``bucketlearn.domain.columns.parse_date`` (a test compares them on random strings)."""
    dash, t, space, colon, dot, zulu, plus = 12, 13, 14, 15, 16, 17, 18
    is_digit = ops.logical_and(codes >= 2, codes <= 11)
    digit = codes - 2
    separators = np.zeros(DATE_CHARS, np.int32)
    separators[[4, 7]], separators[[13, 16]] = dash, colon

    def ok(digit_at: list[int], separator_at: list[int]) -> Any:
        good = ops.logical_or(ops.logical_not(_mask(digit_at)), is_digit)
        if separator_at:
            good = ops.logical_and(good, ops.logical_or(ops.logical_not(_mask(separator_at)),
                                                        ops.equal(codes, separators)))
        return ops.all(good, axis=-1)

    def any_of(*values: int) -> Any:
        found = ops.equal(codes, values[0])
        for value in values[1:]:
            found = ops.logical_or(found, ops.equal(codes, value))
        return found

    ends = any_of(0, dot, zulu, plus, dash)  # padding, or where fractions / an offset begin
    after_date = codes[..., 10]
    has_hm = ops.logical_and(ok([11, 12, 14, 15], [13]),
                             ops.logical_or(ops.equal(after_date, t), ops.equal(after_date, space)))
    date_only = ends[..., 10]
    with_hm = ops.logical_and(has_hm, ends[..., 16])
    with_hms = ops.logical_and(ops.logical_and(has_hm, ok([17, 18], [16])), ends[..., 19])
    places = np.zeros((DATE_CHARS, 6), np.float32)  # digits -> y, mo, d, hh, mi, ss
    for part, at in enumerate([[0, 1, 2, 3], [5, 6], [8, 9], [11, 12], [14, 15], [17, 18]]):
        places[at, part] = [10.0 ** (len(at) - 1 - i) for i in range(len(at))]
    number = ops.cast(ops.matmul(ops.cast(ops.where(is_digit, digit, 0), "float32"), places),
                      "int32")  # exact: every value < 2**24
    y, mo, d = number[..., 0], number[..., 1], number[..., 2]
    has_time = ops.logical_or(with_hm, with_hms)
    hh = ops.where(has_time, number[..., 3], 0)
    mi = ops.where(has_time, number[..., 4], 0)
    ss = ops.where(with_hms, number[..., 5], 0)
    leap = ops.logical_or(ops.logical_and(ops.equal(y % 4, 0), ops.not_equal(y % 100, 0)),
                          ops.equal(y % 400, 0))
    month_days = ops.take(np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], np.int32),
                          ops.clip(mo - 1, 0, 11))
    month_days = month_days + ops.cast(ops.logical_and(leap, ops.equal(mo, 2)), "int32")
    valid = ops.logical_and(ok([0, 1, 2, 3, 5, 6, 8, 9], [4, 7]),
                            ops.logical_or(date_only, has_time))
    for condition in (y >= 1, mo >= 1, mo <= 12, d >= 1, d <= month_days, hh <= 23, mi <= 59,
                      ss <= 59):
        valid = ops.logical_and(valid, condition)
    days = _days_from_civil(ops, y, mo, d)
    weekday = (days + 3) % 7
    cells = ops.cast(ops.stack([y, mo, d, weekday, days, hh, mi, ss], axis=-1), "float32")
    return ops.where(valid[..., None], cells, np.float32("nan"))


def _days_from_civil(ops: Any, y: Any, mo: Any, d: Any) -> Any:
    """Days since 1970-01-01 (H. Hinnant's algorithm, integer floor arithmetic)."""
    yy = y - ops.cast(mo <= 2, "int32")
    era = ops.floor_divide(yy, 400)
    year_of_era = yy - era * 400
    day_of_year = ops.floor_divide(153 * ((mo + 9) % 12) + 2, 5) + d - 1
    day_of_era = (year_of_era * 365 + ops.floor_divide(year_of_era, 4)
                  - ops.floor_divide(year_of_era, 100) + day_of_year)
    return era * 146097 + day_of_era - 719468


def _mask(positions: list[int]) -> np.ndarray:
    mask = np.zeros(DATE_CHARS, bool)
    mask[positions] = True
    return mask

