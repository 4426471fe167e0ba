"""The local training step (one task on one shard) and holdout evaluation.

Workers keep one compiled model per job and reset its *weights* to the head version before each
task; the Adam moments are kept between tasks of the same job, so a task's first steps continue
the optimizer's trajectory instead of restarting it cold (a cold restart makes early Adam steps
large and noisy, one of the ways distributed training loses to serial).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

EVAL_BATCH = 1024
EPSILON = 1e-7  # Keras's clip for the cross-entropy of probabilities

@dataclass(frozen=True)
class LocalResult:
    weights: list[np.ndarray]
    train_loss: float
    examples: int
    seconds: float


def shuffle_rows(x: np.ndarray, y: np.ndarray, seed: int, epoch: int, task_index: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Reshuffle a shard's rows, differently every epoch, reproducibly."""
    order = np.random.default_rng([seed, epoch, task_index]).permutation(len(y))
    return x[order], y[order]


def train_on_shard(model: Any, base_weights: Sequence[np.ndarray], x: np.ndarray, y: np.ndarray,
                   batch_size: int, seed: int, epoch: int, task_index: int) -> LocalResult:
    """Train one pass over the shard starting from ``base_weights``; return the new weights.

    The same steps as ``fit(epochs=1, shuffle=False)`` over the reshuffled rows, taken with
    ``train_on_batch``: a task is only a few batches, and ``fit()``'s per-call set-up (data
    adapter, callbacks, progress state) cost about three times the steps themselves.
    """
    started = time.perf_counter()
    model.set_weights(list(base_weights))
    xs, ys = shuffle_rows(x, y, seed, epoch, task_index)
    loss_sum, seen = 0.0, 0
    for start in range(0, len(ys), batch_size):
        xb, yb = xs[start:start + batch_size], ys[start:start + batch_size]
        logs = model.train_on_batch(xb, yb, return_dict=True)
        loss_sum += float(logs["loss"]) * len(yb)
        seen += len(yb)
    return LocalResult(weights=[np.asarray(w) for w in model.get_weights()],
                       train_loss=loss_sum / max(1, seen), examples=len(ys),
                       seconds=time.perf_counter() - started)


def evaluate(model: Any, weights: Sequence[np.ndarray] | None, x: np.ndarray, y: np.ndarray
             ) -> tuple[float, float]:
    """Holdout (accuracy, loss) of ``weights`` (or the model's current weights when None)."""
    if weights is not None:
        model.set_weights(list(weights))
    if len(y) == 0:
        raise ValueError("holdout: expected at least one row; found none")
    # predict_on_batch, not evaluate(): the same numbers, without evaluate()'s per-call set-up
    # (data adapter, callbacks, metric state), which cost 30x the forward pass of a small
    # holdout and sat on the aggregator's critical path once per version.
    probs = np.concatenate([np.asarray(model.predict_on_batch(x[i:i + EVAL_BATCH]))
                            for i in range(0, len(y), EVAL_BATCH)])
    labels = np.asarray(y, dtype=np.int64).reshape(-1)
    accuracy = float(np.mean(np.argmax(probs, axis=1) == labels))
    picked = np.clip(probs[np.arange(len(labels)), labels], EPSILON, 1.0)
    return accuracy, float(np.mean(-np.log(picked)))


def subtract(new: Sequence[np.ndarray], base: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(n, dtype=np.float32) - np.asarray(b, dtype=np.float32)
            for n, b in zip(new, base, strict=True)]
