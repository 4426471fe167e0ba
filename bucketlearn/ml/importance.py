"""Permutation importance of a model's original columns (``domain.importance``): the model
scored on a sample with each column's cells shuffled across its rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bucketlearn.domain import importance
from bucketlearn.domain.target import REGRESSION
from bucketlearn.ml.training import evaluate_detail


def figure(model: Any, weights: Sequence[np.ndarray] | None, x: np.ndarray, y: np.ndarray,
           task: str) -> float:
    """Accuracy, or R² for a numeric target, of ``weights`` on (x, y)."""
    found = evaluate_detail(model, weights, x, y, task)
    if task == REGRESSION:
        return float(found.report.get("r2") or 0.0)
    return float(found.accuracy or 0.0)


def permutation_importance(model: Any, weights: Sequence[np.ndarray], x: np.ndarray,
                           y: np.ndarray, spans: Sequence[importance.Span], task: str,
                           seed: int, repeats: int = importance.REPEATS) -> dict[str, Any]:
    """``domain.importance.ranked`` for the columns ``spans`` of ``x``: each shuffled
    ``repeats`` times with permutations drawn from ``seed`` (the same sample, weights and seed
    give the same figures)."""
    model.set_weights(list(weights))
    baseline = figure(model, None, x, y, task)
    rng = np.random.default_rng(seed)
    permuted: dict[str, list[float]] = {}
    for span in spans:
        cells = slice(span.start, span.start + span.width)
        scores = []
        for _ in range(repeats):
            shuffled = x.copy()
            shuffled[:, cells] = x[rng.permutation(len(x)), cells]
            scores.append(figure(model, None, shuffled, y, task))
        permuted[span.name] = scores
    metric = "r2" if task == REGRESSION else "accuracy"
    return importance.ranked(baseline, permuted, metric, len(y))
