"""Aggregation as a strategy over pure maths: no I/O here, unit-tested against hand-worked arrays.

A delta is ``trained_weights - base_weights`` from one task. Deltas are buffered (FedBuff) and
folded into the head together. Each delta's weight is its share of examples times a staleness
discount (FedAsync's polynomial ``(1 + s) ** -a``), where staleness ``s`` counts versions committed
since the delta's base *beyond those that were in flight with it*.

Folding uses *sum* semantics: ``new = head + server_lr * sum_i w_i * delta_i`` with ``w_i`` the
delta's example share relative to a full task. K fresh deltas from the same base therefore move the
model as far as K sequential tasks would, which is what keeps distributed training level with
serial training epoch for epoch (an average would take K times fewer steps per epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DeltaUpdate:
    """One task's contribution, as the maths sees it."""

    task_index: int
    base_version: int
    examples: int
    delta: Sequence[np.ndarray]
    train_loss: float | None = None


def staleness(head_version: int, base_version: int) -> int:
    """Versions committed since the delta's base (0 when trained on the head)."""
    return max(0, head_version - base_version)


def staleness_discount(stale_versions: int, exponent: float = 0.5, grace: int = 0) -> float:
    """FedAsync polynomial discount ``(1 + max(0, s - grace)) ** -exponent``.

    ``grace`` is how many versions may pass while a delta is in flight without penalty: with W
    workers and buffer K, about ``ceil(W / K) - 1`` versions commit during any one task anyway.
    """
    effective = max(0, stale_versions - grace)
    return float((1.0 + effective) ** -exponent)


def delta_weights(
    updates: Sequence[DeltaUpdate],
    head_version: int,
    nominal_examples: int,
    exponent: float = 0.5,
    grace: int = 0,
) -> list[float]:
    """Weight of each delta: example share of a nominal task times its staleness discount."""
    nominal = max(1, nominal_examples)
    return [
        (u.examples / nominal) * staleness_discount(staleness(head_version, u.base_version),
                                                    exponent, grace)
        for u in updates
    ]


def fold(
    head: Sequence[np.ndarray],
    updates: Sequence[DeltaUpdate],
    weights: Sequence[float],
    server_lr: float = 1.0,
) -> list[np.ndarray] | None:
    """Apply weighted deltas to the head; None when nothing valid arrived.

    Args:
        head: the current global weights, layer by layer.
        updates: the buffered deltas (each with the same shapes as ``head``).
        weights: one weight per update (``delta_weights``).
        server_lr: global step size; 1.0 applies the weighted sum as is.

    Returns:
        The new weights (float32), or None when ``updates`` is empty or every weight is zero.

    Raises:
        ValueError: a delta's layer shapes differ from the head's.
    """
    if len(updates) != len(weights):
        raise ValueError(f"expected one weight per update; found {len(weights)} for {len(updates)}")
    live = [(u, w) for u, w in zip(updates, weights, strict=True) if w > 0]
    if not live:
        return None
    new = [np.array(layer, dtype=np.float64) for layer in head]
    for update, weight in live:
        if len(update.delta) != len(new):
            raise ValueError(
                f"task {update.task_index}: expected {len(new)} weight arrays; "
                f"found {len(update.delta)}")
        for i, (layer, d) in enumerate(zip(new, update.delta, strict=True)):
            if layer.shape != np.shape(d):
                raise ValueError(
                    f"task {update.task_index}: layer {i} expected shape {layer.shape}; "
                    f"found {np.shape(d)}")
            layer += server_lr * weight * np.asarray(d, dtype=np.float64)
    return [layer.astype(np.float32) for layer in new]


def weighted_mean_loss(updates: Sequence[DeltaUpdate]) -> float | None:
    """Example-weighted mean of the reported train losses (None when none reported)."""
    pairs = [(u.train_loss, u.examples) for u in updates if u.train_loss is not None]
    total = sum(n for _, n in pairs)
    if not pairs or total == 0:
        return None
    return float(sum(loss * n for loss, n in pairs) / total)
