"""Permutation importance of a model's original columns (``domain.importance``): the model
scored on a sample with each column's cells shuffled across its rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bucketlearn.domain import importance
from bucketlearn.domain.metrics import RegressionTally
from bucketlearn.domain.target import REGRESSION
from bucketlearn.ml.training import forget_state

BATCH_ROWS = 32_768  # rows of shuffled copies built at once, at most
BATCH_BYTES = 64 * 1024**2  # and at most this many bytes of them
PASS_ROWS = 4096  # rows a forward pass scores (the model's activations grow with them)


def _figure(predicted: np.ndarray, y: np.ndarray, task: str) -> float:
    """Accuracy of class probabilities, or R² of a numeric target's predictions."""
    if task != REGRESSION:
        return float(np.mean(np.argmax(predicted, axis=1) == y.reshape(-1)))
    tally = RegressionTally()  # the holdout report's arithmetic
    tally.add(predicted.reshape(-1), y.reshape(-1).astype(np.float32))
    return float(tally.report()["r2"] or 0.0)


def _predict(model: Any, x: np.ndarray) -> np.ndarray:
    """The model's outputs for ``x``, ``PASS_ROWS`` rows a forward pass."""
    return np.concatenate([np.asarray(model.predict_on_batch(x[i:i + PASS_ROWS]))
                           for i in range(0, len(x), PASS_ROWS)])


def permutation_importance(model: Any, weights: Sequence[np.ndarray], x: np.ndarray,
                           y: np.ndarray, spans: Sequence[importance.Span], task: str,
                           seed: int, repeats: int = importance.REPEATS) -> dict[str, Any]:
    """``domain.importance.ranked`` for the columns ``spans`` of ``x``: each shuffled
    ``repeats`` times with permutations drawn from ``seed`` (the same sample, weights and seed
    give the same figures). Shuffled copies are scored many to a forward pass."""
    forget_state(model)
    model.set_weights(list(weights))
    rows = len(y)
    baseline = _figure(_predict(model, x), y, task)
    rng = np.random.default_rng(seed)
    trials = [(span, rng.permutation(rows)) for span in spans for _ in range(repeats)]
    per_pass = max(1, min(BATCH_ROWS // max(1, rows), BATCH_BYTES // max(1, x.nbytes)))
    permuted: dict[str, list[float]] = {span.name: [] for span in spans}
    for first in range(0, len(trials), per_pass):
        chunk = trials[first:first + per_pass]
        copies = np.repeat(x[np.newaxis], len(chunk), axis=0)
        for copy, (span, order) in zip(copies, chunk, strict=True):
            cells = slice(span.start, span.start + span.width)
            copy[:, cells] = x[order, cells]
        predicted = _predict(model, copies.reshape(-1, x.shape[1]))
        for i, (span, _) in enumerate(chunk):
            permuted[span.name].append(_figure(predicted[i * rows:(i + 1) * rows], y, task))
    metric = "r2" if task == REGRESSION else "accuracy"
    return importance.ranked(baseline, permuted, metric, rows)
