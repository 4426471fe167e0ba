"""The MLP of recipe 2 (``domain.recipe``): the float32 matrix ingest writes in, class
probabilities (or a numeric target) out; built-in Keras layers and ``keras.ops`` only, so the
model (and the raw-row model around it, ``ml.tabular.raw_row_model``) loads in safe mode.

* numeric cells (numeric columns and the parts of dates): a missing cell takes the median; each
  cell is robust-scaled and smoothly clipped (``domain.scaling``); where the split fitted an
  encoding, each cell's piecewise-linear encoding over its quantile bins goes through a linear
  map of its own (``EMBEDDING``-wide, ReLU) beside the scaled value; a column with missing cells
  adds a missing indicator;
* category codes: one-hot up to ``tabular.ONE_HOT_MAX_TOKENS`` codes, else an embedding
  (as recipe 1);
* then ``LAYERS`` of ReLU units, and the output head (``tabular.output_head``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bucketlearn.domain.columns import CATEGORY, Column
from bucketlearn.domain.scaling import CLIP, Preprocessing
from bucketlearn.ml.tabular import ONE_HOT_MAX_TOKENS, embedding_size, output_head

LAYERS = (256, 256, 256)
EMBEDDING = 8  # the width of a numeric cell's learned encoding
LABEL_SMOOTHING = 0.1
BETA_2 = 0.95


def build(keras: Any, columns: Sequence[Column], width: int, n_classes: int,
          preprocessing: Preprocessing, next_seed: Callable[[], int],
          target: tuple[float, float] | None = None, layers: Sequence[int] = LAYERS,
          encoding: bool = True) -> tuple[Any, Any]:
    """(inputs, outputs) of the recipe-2 MLP on a ``width``-cell matrix whose columns are
    ``columns`` (empty: every cell a complete number): ``layers`` of ReLU units; ``encoding``
    False leaves out the numeric cells' piecewise-linear encoding."""
    from keras import ops  # noqa: PLC0415 - TensorFlow is imported lazily

    def init() -> Any:
        return keras.initializers.GlorotUniform(seed=next_seed())

    inputs = keras.Input(shape=(width,), name="features")
    blocks = _numeric_blocks(keras, ops, inputs, columns, preprocessing, init, encoding)
    at = 0
    for column in columns:
        if column.kind == CATEGORY:
            blocks.append(_category_block(keras, ops, inputs[:, at], column, next_seed))
        at += column.width
    x = keras.layers.Concatenate(name="encoded")(blocks) if len(blocks) > 1 else blocks[0]
    for units in layers:
        x = keras.layers.Dense(units, activation="relu", kernel_initializer=init())(x)
    return inputs, output_head(keras, x, n_classes, init, target)


def _numeric_blocks(keras: Any, ops: Any, inputs: Any, columns: Sequence[Column],
                    prep: Preprocessing, init: Callable[[], Any],
                    encoding: bool = True) -> list[Any]:
    """The scaled numeric cells, their encodings and the missing indicators."""
    if not prep.cells:
        return []
    cells = np.asarray(prep.cells, dtype=np.int32)
    center = np.asarray(prep.center, dtype=np.float32)
    raw = ops.take(inputs, cells, axis=1)
    missing = ops.isnan(raw)
    z = (ops.where(missing, center, raw) - center) / np.asarray(prep.scale, dtype=np.float32)
    z = z / ops.sqrt(1.0 + ops.square(z / CLIP))
    blocks = [z]
    if prep.edges and encoding:
        blocks.insert(0, _encoded(keras, ops, z, np.asarray(prep.edges, np.float32), init))
    flagged = _flagged_cells(columns, prep.cells)
    if flagged:
        blocks.append(ops.cast(ops.take(missing, np.asarray(flagged, np.int32), axis=1),
                               "float32"))
    return blocks


def _encoded(keras: Any, ops: Any, z: Any, edges: np.ndarray, init: Callable[[], Any]) -> Any:
    """Each cell's piecewise-linear encoding (Gorishniy et al. 2022: bin t's component is 0
    below the bin, 1 above it, linear within; a bin of no width a step) through a linear map of
    its own to ``EMBEDDING`` units, ReLU. Unlike the paper's, the outer bins are closed too: a
    value beyond the training rows' range (a year never seen) keeps the outer bin's encoding
    and is told apart by the scaled value beside it, which smooth clipping bounds; an open bin
    of no width would have turned it into a number of any size."""
    cells = edges.shape[0]
    left = edges[:, :-1]
    widths = np.maximum(edges[:, 1:] - left, 1e-6)
    t = ops.clip((ops.expand_dims(z, -1) - left[None]) / widths[None], 0.0, 1.0)
    e = keras.layers.EinsumDense("bfn,fnd->bfd", output_shape=(cells, EMBEDDING),
                                 bias_axes="fd", activation="relu", kernel_initializer=init(),
                                 name="numeric_encoding")(t)
    return keras.layers.Flatten(name="numeric_encoded")(e)


def _flagged_cells(columns: Sequence[Column], cells: Sequence[int]) -> list[int]:
    """Positions (among ``cells``) of the first cell of each column with missing cells."""
    position = {cell: i for i, cell in enumerate(cells)}
    flagged, at = [], 0
    for column in columns:
        if column.kind != CATEGORY and column.missing and at in position:
            flagged.append(position[at])
        at += column.width
    return flagged


def _category_block(keras: Any, ops: Any, codes: Any, column: Column,
                    next_seed: Callable[[], int]) -> Any:
    tokens = len(column.vocabulary) + 2  # out-of-vocabulary, missing, then the vocabulary
    codes = ops.cast(codes, "int32")
    if tokens <= ONE_HOT_MAX_TOKENS:
        return ops.one_hot(codes, tokens)
    seed = next_seed()
    embedded = keras.layers.Embedding(
        tokens, embedding_size(tokens),
        embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=seed))(codes)
    return embedded


def compile_recipe(keras: Any, model: Any, learning_rate: float, regression: bool,
                   n_classes: int, smoothing: float = LABEL_SMOOTHING) -> None:
    """Adam with beta_2 = ``BETA_2``; classes learn from one-hot targets smoothed by
    ``smoothing`` (``ml.training`` one-hots a task's labels: ``one_hot_classes``), a
    numeric target by its mean squared error. The optimizer's state is built now (a version
    carries it)."""
    loss = ("mse" if regression else
            keras.losses.CategoricalCrossentropy(label_smoothing=smoothing))
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=learning_rate, beta_2=BETA_2),
                  loss=loss)
    model.optimizer.build(model.trainable_variables)
    if not regression:
        model.__dict__[ONE_HOT_ATTRIBUTE] = n_classes


ONE_HOT_ATTRIBUTE = "_bucketlearn_one_hot"  # a model that learns from one-hot targets


def one_hot_classes(model: Any) -> int | None:
    """The class count when ``model`` learns from one-hot targets (None: from class ids)."""
    return model.__dict__.get(ONE_HOT_ATTRIBUTE)
