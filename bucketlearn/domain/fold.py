"""Folding a round: pure arithmetic over arrays, unit-tested against hand-worked values.

A round's R tasks all train from the same version ``x`` with its optimizer state; each returns
``Δ_i = x_i - x`` and its optimizer state after training. The next version is FedAvg with a
server learning rate η (Reddi et al., "Adaptive Federated Optimization", ICLR 2021):

    x' = x + η · (1/R) Σ_i Δ_i

and the optimizer state that goes with ``x'`` is the element-wise mean of the tasks' states. With
R = 1 both reduce to the one task's result: serial training, whatever η.

η is 1, the round's mean, and each task of a round of k trains at k times the job's learning
rate (``domain.plan.TrainingPlan.task_rate_scale``; why, and what it was measured against:
docs/TRAINING.md, "The cure"). A job planned with ``rates = "family"`` keeps that rule: the
job's rate, η = R (the round's sum) for an MLP, η = 1 (the mean) for a CNN. How many tasks a
round may have (``domain.plan``) bounds how far either fold is from serial.

**Exact with R = 1.** A result written as weights (``content == "weights"``, as learners write) is turned into a
delta against the round's base in float64, where the difference of two float32 arrays is
exact, so ``x + (x_i - x)`` is ``x_i`` to the last bit. Results written as deltas still fold.

A delta is *refused* (never folded; its task is trained again) when it is not finite or when its
norm is far outside the job's recent deltas (``check_delta``). A task whose results are refused
``MAX_REFUSALS`` times in an epoch fails for good (``count_refusals``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bucketlearn.domain.plan import RATES_SCALED

OUTLIER_FACTOR = 20.0  # a delta this many times larger than the job's recent deltas is refused
NORM_MEMORY = 0.8  # weight of the past in the running delta norm
MAX_REFUSALS = 3  # a task whose result is refused this many times fails for good


@dataclass(frozen=True)
class TaskResult:
    """One task's contribution: its delta, its optimizer state after training, its figures."""

    task_index: int
    delta: Sequence[np.ndarray]
    optimizer: Sequence[np.ndarray]
    examples: int
    train_loss: float | None = None


WEIGHTS = "weights"  # a task result's ``content``: the weights it ended with (else a delta)


def task_delta(arrays: Sequence[np.ndarray], base: Sequence[np.ndarray], content: str | None
               ) -> list[np.ndarray]:
    """A task result's delta against the round's base (float64 when taken from end weights).

    Args:
        arrays: what the result object holds: end weights (``content == WEIGHTS``) or a delta.
        base: the version the round trained from.
        content: the result's ``content`` metadata (None for results written as deltas).
    """
    if content != WEIGHTS:
        return list(arrays)  # fold_round sums in float64
    if len(arrays) != len(base):
        raise ValueError(f"expected {len(base)} weight arrays; found {len(arrays)}")
    found = [tuple(np.shape(a)) for a in arrays]
    expected = [tuple(np.shape(b)) for b in base]
    if found != expected:
        raise ValueError(f"expected weight arrays of shapes {expected}; found {found}")
    return [np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
            for a, b in zip(arrays, base, strict=True)]


def delta_norm(delta: Sequence[np.ndarray]) -> float:
    """The Euclidean norm of a delta over all its arrays (float64), summed by numpy, not by
    BLAS: a BLAS call (``np.vdot``) wakes OpenBLAS's threads, whose spinning after each call
    takes about a core of the aggregator's on a chained job."""
    return math.sqrt(sum(float(np.square(d).sum()) for d in (np.asarray(a, np.float64)
                                                             for a in delta)))


def check_delta(result: TaskResult, shapes: Sequence[tuple[int, ...]],
                optimizer_shapes: Sequence[tuple[int, ...]],
                recent_norm: float | None) -> str | None:
    """Why a task's result must not be folded, or None when it may.

    Args:
        result: the task's delta and optimizer state.
        shapes: the model's array shapes, in order.
        optimizer_shapes: the optimizer state's array shapes, in order.
        recent_norm: the job's running delta norm (None before the first fold).
    """
    found = [tuple(np.shape(d)) for d in result.delta]
    if found != [tuple(s) for s in shapes]:
        return f"expected weight arrays of shapes {list(shapes)}; found {found}"
    found_opt = [tuple(np.shape(o)) for o in result.optimizer]
    if found_opt != [tuple(s) for s in optimizer_shapes]:
        return f"expected optimizer arrays of shapes {list(optimizer_shapes)}; found {found_opt}"
    for name, arrays in (("weights", result.delta), ("optimizer state", result.optimizer)):
        for i, array in enumerate(arrays):
            if not np.all(np.isfinite(array)):
                return (f"{name} array {i} is not finite (NaN or infinity): the task's training "
                        "diverged")
    norm = delta_norm(result.delta)
    if recent_norm is not None and recent_norm > 0 and norm > OUTLIER_FACTOR * recent_norm:
        return (f"its norm {norm:.4g} is {norm / recent_norm:.0f}x the job's recent deltas "
                f"({recent_norm:.4g}); expected at most {OUTLIER_FACTOR:g}x")
    return None


@dataclass(frozen=True)
class Refusals:
    """An epoch's refusal counts after a round's results were refused (``count_refusals``)."""

    counts: dict[str, int]  # by "<epoch>-<task index>", this epoch's only
    failed: frozenset[int]  # tasks refused ``MAX_REFUSALS`` times: they fail for good

    def times(self, epoch: int, task_index: int) -> int:
        return self.counts.get(f"{epoch}-{task_index}", 0)


def count_refusals(before: Mapping[str, Any] | None, epoch: int,
                   refused: Iterable[int]) -> Refusals:
    """Count one more refusal for each task of ``refused`` in ``epoch`` (``before``: the job's
    ``refusals``; other epochs' counts are dropped). A refused result is never folded: its task
    trains again, or fails for good once its results were refused ``MAX_REFUSALS`` times in the
    epoch."""
    prefix = f"{epoch}-"
    counts = {k: int(v) for k, v in (before or {}).items() if k.startswith(prefix)}
    failed = set()
    for task_index in sorted(refused):
        key = f"{prefix}{task_index}"
        counts[key] = counts.get(key, 0) + 1
        if counts[key] >= MAX_REFUSALS:
            failed.add(task_index)
    return Refusals(counts, frozenset(failed))


def running_norm(previous: float | None, results: Sequence[TaskResult]) -> float | None:
    """The job's delta norm after folding ``results``: an exponential average of the median."""
    if not results:
        return previous
    current = float(np.median([delta_norm(r.delta) for r in results]))
    if previous is None:
        return current
    return NORM_MEMORY * previous + (1.0 - NORM_MEMORY) * current


def server_learning_rate(model_kind: str, parallel_tasks: int, rates: str = RATES_SCALED
                         ) -> float:
    """η for a plan's ``rates`` (``domain.plan.TrainingPlan.rates``): 1 (the mean) when every
    task of the round trained at k times the job's rate; for jobs planned before that, by model
    family (see the module docstring): R for an MLP, 1 for a CNN."""
    if rates == RATES_SCALED:
        return 1.0
    return float(parallel_tasks) if model_kind == "mlp" else 1.0


def fold_round(weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray],
               results: Sequence[TaskResult], server_lr: float | None = None
               ) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """The next version's weights and optimizer state; None when nothing was trained.

    Args:
        weights: the round's base version, array by array.
        optimizer: the base version's optimizer state (kept when no result came).
        results: the round's checked task results, in any order.
        server_lr: η in ``x + η · mean(Δ)``; None means the number of results (their sum).

    Returns:
        (weights + η · mean of the deltas, mean of the tasks' optimizer states), float32. The
        sum is taken in float64 in task order, so the same results give the same bytes whatever
        order they arrived in.
    """
    if not results:
        return None
    ordered = sorted(results, key=lambda r: r.task_index)
    scale = (len(ordered) if server_lr is None else server_lr) / len(ordered)
    total = [np.zeros(np.shape(w), dtype=np.float64) for w in weights]
    for result in ordered:
        if len(result.delta) != len(total):
            raise ValueError(f"task {result.task_index}: expected {len(total)} weight arrays; "
                             f"found {len(result.delta)}")
        for layer, d in zip(total, result.delta, strict=True):
            layer += np.asarray(d, dtype=np.float64)
    new = [np.asarray(w, dtype=np.float64) + scale * t for w, t in zip(weights, total,
                                                                     strict=True)]
    state = [np.mean(np.stack([np.asarray(r.optimizer[i], np.float64) for r in ordered]), axis=0)
             for i in range(len(optimizer))]
    return ([layer.astype(np.float32) for layer in new],
            [s.astype(np.asarray(o).dtype) for s, o in zip(state, optimizer, strict=True)])


def weighted_mean_loss(results: Sequence[TaskResult]) -> float | None:
    """Example-weighted mean of the tasks' training losses (None when none reported)."""
    pairs = [(r.train_loss, r.examples) for r in results if r.train_loss is not None]
    total = sum(n for _, n in pairs)
    if not pairs or total == 0:
        return None
    return float(sum(loss * n for loss, n in pairs) / total)
