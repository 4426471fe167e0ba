"""The local training step (one task on its rows) and holdout evaluation. Needs TensorFlow.

A task starts from a version's *whole* training state: its weights and the optimizer state that
goes with them (Adam's step count and moment estimates), both stored in the version's object.
So a task's first step continues the optimizer's trajectory exactly as serial training's next
step would, and with one task per round the pipeline takes serial training's steps. The learning
rate of a task comes with its message (``domain.plan.learning_rate``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bucketlearn.domain.metrics import ClassificationTally, RegressionTally
from bucketlearn.domain.target import CLASSIFICATION, REGRESSION
from bucketlearn.ml.recipe import one_hot_classes

EVAL_BATCH = 1024
EPSILON = 1e-7  # Keras's clip for the cross-entropy of probabilities


@dataclass(frozen=True)
class LocalResult:
    weights: list[np.ndarray]
    optimizer: list[np.ndarray]
    train_loss: float
    examples: int
    seconds: float


def shuffle_rows(x: np.ndarray, y: np.ndarray, seed: int, epoch: int, task_index: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Reshuffle a task's rows, differently every epoch, reproducibly."""
    order = np.random.default_rng([seed, epoch, task_index]).permutation(len(y))
    return x[order], y[order]


def _state_variables(model: Any) -> list[Any]:
    """The optimizer's variables that make up its state (all but the learning rate)."""
    optimizer = model.optimizer
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    return [v for v in optimizer.variables if not v.path.endswith("learning_rate")]


def optimizer_state(model: Any) -> list[np.ndarray]:
    """The optimizer state (step count, moment estimates) as arrays, in a fixed order."""
    return [np.asarray(v.numpy()) for v in _state_variables(model)]


def set_optimizer_state(model: Any, state: Sequence[np.ndarray]) -> None:
    """Load an optimizer state taken with ``optimizer_state`` (from the same model)."""
    variables = _state_variables(model)
    if len(variables) != len(state):
        raise ValueError(f"optimizer state: expected {len(variables)} arrays; found {len(state)}")
    for variable, value in zip(variables, state, strict=True):
        variable.assign(np.asarray(value, dtype=variable.dtype))


STEPS_ATTRIBUTE = "_bucketlearn_steps"  # a model's compiled task loops, by signature


def _compiled_task(model: Any, x: np.ndarray, y: np.ndarray, weighted: bool) -> Any:
    """The model's training loop over one task's batches, compiled once per model.

    Each step is Keras's own ``train_step`` (the forward pass, loss, gradients and optimizer
    update ``fit`` takes), at the step's learning rate, over the task's rows in order, in
    batches of ``batch_size`` (the last may be shorter). The whole task is one call into the
    graph: a call costs 0.5-0.7 ms of Python here, more than a small model's step, and
    ``train_on_batch`` also traced a new graph for each batch shape it met (three traces of
    0.35-0.4 s per model, more than the whole training of a small job). This loop is traced
    once, with the row count left open.
    """
    import tensorflow as tf  # noqa: PLC0415 - deliberately lazy, as keras_module

    loops = model.__dict__.setdefault(STEPS_ATTRIBUTE, {})
    key = (weighted, x.dtype.str, x.shape[1:], y.dtype.str, y.shape[1:])
    if key not in loops:
        # build the compiled loss and metrics first (as train_on_batch does): a variable
        # created inside the first trace would make tf.function trace it a second time.
        # Keras's own (private) builder; without it the loop still works, traced twice.
        build = getattr(model, "_symbolic_build", None)
        if build is not None:
            build(data_batch=(x[:1], y[:1], None))
        specs = [tf.TensorSpec((None, *x.shape[1:]), tf.as_dtype(x.dtype)),
                 tf.TensorSpec((None, *y.shape[1:]), tf.as_dtype(y.dtype)),
                 tf.TensorSpec((None,), tf.float32), tf.TensorSpec((), tf.int32),
                 tf.TensorSpec((None,), tf.float32)]

        def loop(xs: Any, ys: Any, rates: Any, batch: Any, ws: Any) -> Any:
            def body(i: Any, _: Any) -> Any:
                rows = slice(i * batch, (i + 1) * batch)
                model.optimizer.learning_rate.assign(rates[i])
                data = (xs[rows], ys[rows], ws[rows] if weighted else None)
                return i + 1, model.train_step(data)["loss"]

            return tf.while_loop(lambda i, _: i < tf.shape(rates)[0], body,
                                 (tf.constant(0), tf.constant(0.0)))[1]

        loops[key] = tf.function(loop, input_signature=specs)
    return loops[key]


HOLDS_ATTRIBUTE = "_bucketlearn_holds"  # the (weights, optimizer) lists a task left in it


def _load(model: Any, weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray]) -> None:
    """Set the model's weights and optimizer state, unless it holds them already: when they
    are the very lists the model's last task returned (serial training and a chain go on from
    the last task's end state), loading them again (about 5 ms of Python per task on a small
    model, a quarter of its training) would change nothing. Whatever sets the model's weights
    otherwise forgets that mark (``forget_state``)."""
    held = model.__dict__.pop(HOLDS_ATTRIBUTE, None)  # until this task ends well: a task
    # that fails half-way leaves the model holding neither its start nor its end state
    if held is not None and held[0] is weights and held[1] is optimizer:
        return
    model.set_weights(list(weights))
    set_optimizer_state(model, optimizer)


def forget_state(model: Any) -> None:
    """Mark the model as holding no task's end state (its weights are about to change)."""
    model.__dict__.pop(HOLDS_ATTRIBUTE, None)


def train_task(model: Any, weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray],
               x: np.ndarray, y: np.ndarray, batch_size: int,
               learning_rates: float | Sequence[float], seed: int, epoch: int,
               task_index: int, class_weights: Sequence[float] | None = None) -> LocalResult:
    """Train one pass over a task's rows from a version's weights and optimizer state.

    The same steps as ``fit(epochs=1, shuffle=False)`` over the reshuffled rows, taken in one
    call of the model's compiled task loop (``_compiled_task``): a task is only a few batches,
    and ``fit()``'s per-call set-up (data adapter, callbacks, progress state) cost about three
    times the steps themselves.
    ``learning_rates`` is one rate for every step, or one per step (the last repeats).
    ``class_weights`` (one per class; ``domain.plan.class_weights``) weight each row's loss by
    its class; None trains unweighted, exactly as before the option existed.

    Returns:
        The weights and optimizer state after the task, its mean training loss and row count.
    """
    started = time.perf_counter()
    _load(model, weights, optimizer)
    steps = max(1, -(-len(y) // batch_size))
    given = ([float(learning_rates)] if isinstance(learning_rates, (int, float))
             else [float(r) for r in learning_rates])
    rates = np.asarray([given[min(i, len(given) - 1)] for i in range(steps)], np.float32)
    xs, ys = shuffle_rows(x, y, seed, epoch, task_index)
    row_weights = (np.zeros(0, np.float32) if class_weights is None else
                   np.asarray(class_weights, dtype=np.float32)[np.asarray(ys, dtype=np.int64)])
    classes = one_hot_classes(model)
    targets = (ys if classes is None else  # a recipe-2 classifier learns smoothed one-hots
               np.eye(classes, dtype=np.float32)[np.asarray(ys, dtype=np.int64)])
    model.reset_metrics()  # the loss tracker then averages this task's batches, row-weighted
    loss = _compiled_task(model, xs, targets, class_weights is not None)(
        xs, targets, rates, np.int32(batch_size), row_weights) if len(ys) else 0.0
    result = LocalResult(weights=[np.asarray(w) for w in model.get_weights()],
                         optimizer=optimizer_state(model), train_loss=float(loss),
                         examples=len(ys), seconds=time.perf_counter() - started)
    model.__dict__[HOLDS_ATTRIBUTE] = (result.weights, result.optimizer)
    return result


@dataclass(frozen=True)
class Evaluation:
    """A model's figures on held-out rows (a regression: no accuracy and no class counts; its
    loss is the mean squared error in the target's units, its report RMSE, MAE and R²)."""

    accuracy: float | None
    loss: float
    predicted_counts: list[int]  # how many rows the model put in each class
    true_counts: list[int] = field(default_factory=list)  # how many rows each class has
    rows: int = 0
    # ``domain.metrics.classification_report``: per-class precision/recall/F1, macro-F1, the
    # confusion matrix, the majority-class baseline, ROC AUC for two classes
    report: dict[str, Any] = field(default_factory=dict)


def evaluate_parts(model: Any, weights: Sequence[np.ndarray] | None,
                   parts: Iterable[tuple[np.ndarray, np.ndarray]],
                   task: str = CLASSIFICATION) -> Evaluation:
    """Holdout figures of ``weights`` over rows that come in parts, one part held at a time.

    A confusion matrix, the loss and (binary) score histograms are accumulated batch by batch
    (``domain.metrics.ClassificationTally``), so a holdout of any size is evaluated in the
    memory of one part (the export evaluates the whole holdout this way); the figures are those
    of all the rows taken together.

    Args:
        model: the compiled model.
        weights: the weights to evaluate (None: the model's current weights).
        parts: (x, y) pairs; each is released before the next is asked for.
        task: "regression": y are targets, and the figures those of ``evaluate_targets``.

    Returns:
        Accuracy, mean cross-entropy, predicted- and true-class counts, the row count and the
        classification report.

    Raises:
        ValueError: the parts hold no row.
    """
    if weights is not None:
        forget_state(model)
        model.set_weights(list(weights))
    if task == REGRESSION:
        return evaluate_targets(model, parts)
    tally: ClassificationTally | None = None
    for x, y in parts:
        labels = np.asarray(y, dtype=np.int64).reshape(-1)
        # predict_on_batch, not evaluate(): the same numbers, without evaluate()'s per-call
        # set-up (data adapter, callbacks, metric state), which cost 30x the forward pass of a
        # small holdout and sat on the aggregator's critical path once per version.
        for start in range(0, len(labels), EVAL_BATCH):
            probs = np.asarray(model.predict_on_batch(x[start:start + EVAL_BATCH]))
            batch = labels[start:start + EVAL_BATCH]
            tally = tally or ClassificationTally(probs.shape[1])
            picked = np.clip(probs[np.arange(len(batch)), batch], EPSILON, 1.0)
            with np.errstate(invalid="ignore"):
                losses = -np.log(picked.astype(np.float64))
            tally.add(probs, batch, losses)
        del x, y, labels
    if tally is None or tally.rows == 0:
        raise ValueError("holdout: expected at least one row; found none")
    rows = tally.rows
    return Evaluation(int(np.trace(tally.confusion)) / rows, tally.loss_sum / rows,
                      [int(c) for c in tally.confusion.sum(axis=0)],
                      [int(c) for c in tally.confusion.sum(axis=1)], rows, tally.report())


def evaluate_targets(model: Any, parts: Iterable[tuple[np.ndarray, np.ndarray]]) -> Evaluation:
    """A regression model's holdout figures (its current weights), streamed like
    ``evaluate_parts``: RMSE, MAE, R² and the mean squared error (the loss), in the target's
    units (``domain.metrics.RegressionTally``, float64 sums)."""
    tally = RegressionTally()
    for x, y in parts:
        targets = np.asarray(y, dtype=np.float32).reshape(-1)
        for start in range(0, len(targets), EVAL_BATCH):
            predicted = np.asarray(model.predict_on_batch(x[start:start + EVAL_BATCH]))
            tally.add(predicted.reshape(-1), targets[start:start + EVAL_BATCH])
        del x, y, targets
    if tally.rows == 0:
        raise ValueError("holdout: expected at least one row; found none")
    report = tally.report()
    return Evaluation(None, float(report["loss"]), [], [], tally.rows, report)


def evaluate_detail(model: Any, weights: Sequence[np.ndarray] | None, x: np.ndarray,
                    y: np.ndarray, task: str = CLASSIFICATION) -> Evaluation:
    """Holdout accuracy, loss and predicted-class counts of ``weights`` (or the model's current
    weights when None), on rows held in memory (``evaluate_parts`` of one part)."""
    return evaluate_parts(model, weights, [(x, y)], task)


def evaluate(model: Any, weights: Sequence[np.ndarray] | None, x: np.ndarray, y: np.ndarray
             ) -> tuple[float | None, float]:
    """Holdout (accuracy, loss) of ``weights`` (or the model's current weights when None)."""
    found = evaluate_detail(model, weights, x, y)
    return found.accuracy, found.loss

