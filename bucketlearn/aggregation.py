"""Aggregation as a strategy over pure maths: no I/O here, unit-tested against hand-worked arrays.

A delta is ``trained_weights - base_weights`` from one task. Deltas are buffered (FedBuff) and
folded into the head together: ``new = head + server_lr * sum_i w_i * delta_i``.

*Sum semantics.* ``w_i`` is the delta's example share of a full task times a staleness discount,
not ``1/K``: a fresh delta moves the model as far as the task's own training did, so one epoch of
the pipeline takes as many optimizer steps as one epoch of serial training (an average would take
K times fewer).

*Staleness* discounts a delta trained from an older model by FedAsync's polynomial
``(1 + d) ** -exponent``. How ``d`` is counted depends on the model (``StalenessPolicy``):

* CNN — ``d`` counts *task deltas* that reached the model after the delta's base and before it:
  those applied in versions since its base, plus those ahead of it in the same fold (a fold is
  read as applying its deltas one after another, freshest first). Counting versions instead lets
  K deltas trained from one head all count as fresh; their sum overshoots like a step K times too
  long, and the CNN trained with Adam oscillated (holdout accuracy swinging between 0.6 and 1.0
  from version to version, −5 to −29 points against serial with 2–4 workers). Exponent 1.0,
  asynchronous SGD's 1/(1+d) step-size rule, with deltas from one base folded without their
  common part (``project_shared_bases``). Alone, 1/(1+d) left a tail of seeds 3–4 points below
  serial; (1+d)^-1.5 avoided the tail but left 4 simulated workers short of serial's progress
  (still climbing at the end). On 28×28×3 data with 4 simulated workers over seeds 0–4, mean
  gaps (sorted / shuffled) were −0.70 / −0.60 with ^-1.5 (worst seed −1.83), −0.90 / −0.43 with
  ^-1 (worst −3.82), −0.63 / −0.70 with ^-1.5 and the projection, and −0.53 / −0.20 with ^-1 and
  the projection (worst −1.33); with 1 and 2 workers that last rule was within −0.67 for every
  seed (0–2). A weaker discount with the projection (^-0.5) lost 3–19 points.
* MLP — ``d`` counts *versions* committed since the delta's base; exponent 0, FedAsync's
  *constant* staleness function: every delta within ``max_staleness`` counts in full. The MLP
  tolerates summed same-base deltas, and any discount costs it progress. On digits sorted by label
  with 4 simulated workers, over seeds 0–4, the mean gap to serial was −1.17 points with
  ``(1+s)^-0.5``, −0.83 with ``(1+s)^-0.25`` and −0.56 with no discount.

With one worker and ``buffer_size`` 1 every delay is 0 under both policies and the pipeline takes
exactly serial training's steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DeltaUpdate:
    """One task's contribution, as the maths sees it.

    ``base_applied`` is how many task deltas the job had applied when the worker read its base
    (the job's ``tasks_applied`` beside the head it trained from); None for a delta written
    before workers recorded it, whose delay is then estimated from versions.
    """

    task_index: int
    base_version: int
    examples: int
    delta: Sequence[np.ndarray]
    train_loss: float | None = None
    base_applied: int | None = None


@dataclass(frozen=True)
class StalenessPolicy:
    """How a delta's delay is counted (``"tasks"`` or ``"versions"``) and discounted, and
    whether deltas trained from one base are folded without their common part
    (``project_shared_bases``)."""

    unit: str
    exponent: float
    project_shared_bases: bool = False


BY_TASKS = StalenessPolicy("tasks", 1.0, project_shared_bases=True)
BY_VERSIONS = StalenessPolicy("versions", 0.0)
DEFAULT_EXPONENT = 1.0


def policy_for(model_kind: str) -> StalenessPolicy:
    """Task-counted delays for CNNs, version-counted for MLPs (see the module docstring)."""
    return BY_TASKS if model_kind == "cnn" else BY_VERSIONS


def staleness(head_version: int, base_version: int) -> int:
    """Versions committed since the delta's base (0 when trained on the head)."""
    return max(0, head_version - base_version)


def staleness_discount(delay: int, exponent: float = DEFAULT_EXPONENT) -> float:
    """FedAsync polynomial discount ``(1 + delay) ** -exponent``."""
    return float((1.0 + max(0, delay)) ** -exponent)


def task_delays(updates: Sequence[DeltaUpdate], head_version: int, head_applied: int) -> list[int]:
    """Each delta's delay in tasks: deltas applied since its base, plus those ahead of it in
    this fold. The fold goes freshest first (ties in the given order).

    Args:
        updates: the deltas of one fold.
        head_version: the version they are folded into.
        head_applied: task deltas the job has applied up to and including ``head_version``.
    """
    behind = []
    for update in updates:
        if update.base_applied is not None:
            behind.append(max(0, head_applied - update.base_applied))
        else:  # no count recorded: about len(updates) deltas went into each version since
            behind.append(staleness(head_version, update.base_version) * len(updates))
    order = sorted(range(len(updates)), key=lambda i: (behind[i], i))
    delays = [0] * len(updates)
    for position, i in enumerate(order):
        delays[i] = behind[i] + position
    return delays


def delays(updates: Sequence[DeltaUpdate], head_version: int, head_applied: int,
           policy: StalenessPolicy = BY_TASKS) -> list[int]:
    """Each delta's delay under ``policy``: ``task_delays``, or versions since its base."""
    if policy.unit == "tasks":
        return task_delays(updates, head_version, head_applied)
    if policy.unit == "versions":
        return [staleness(head_version, u.base_version) for u in updates]
    raise ValueError(f"staleness unit: expected 'tasks' or 'versions'; found {policy.unit!r}")


def delta_weights(
    updates: Sequence[DeltaUpdate],
    head_version: int,
    nominal_examples: int,
    head_applied: int = 0,
    policy: StalenessPolicy = BY_TASKS,
) -> list[float]:
    """Weight of each delta: example share of a nominal task times its delay discount."""
    return weigh(updates, head_version, nominal_examples, head_applied, policy)[1]


def weigh(
    updates: Sequence[DeltaUpdate],
    head_version: int,
    nominal_examples: int,
    head_applied: int = 0,
    policy: StalenessPolicy = BY_TASKS,
) -> tuple[list[int], list[float]]:
    """Each delta's delay under ``policy`` and its weight (``delta_weights``), together."""
    nominal = max(1, nominal_examples)
    found = delays(updates, head_version, head_applied, policy)
    return found, [(u.examples / nominal) * staleness_discount(d, policy.exponent)
                   for u, d in zip(updates, found, strict=True)]


def _base_key(update: DeltaUpdate) -> tuple[str, int]:
    if update.base_applied is not None:
        return ("applied", update.base_applied)
    return ("version", update.base_version)


def project_shared_bases(updates: Sequence[DeltaUpdate], weights: Sequence[float]
                         ) -> list[DeltaUpdate]:
    """Take out of each delta the part that a heavier delta from the same base already moves.

    Two tasks trained from one head both move the model down the same slope; summed, the shared
    direction is taken twice, like a step twice too long. Serial training would have taken the
    second task's steps from where the first ended, where that slope is mostly gone. So deltas
    are visited heaviest first (ties in the given order), and each loses its component along
    every earlier-visited delta of the same base (Gram-Schmidt), but only where the two point
    the same way: a part that undoes the other is kept. Deltas from different bases are left
    alone (the staleness discount handles those).
    """
    if len(updates) != len(weights):
        raise ValueError(f"expected one weight per update; found {len(weights)} for {len(updates)}")
    order = sorted(range(len(updates)), key=lambda i: (-weights[i], i))
    out = list(updates)
    visited: list[int] = []
    for i in order:
        delta = [np.asarray(layer, dtype=np.float64) for layer in updates[i].delta]
        for j in visited:
            if _base_key(updates[j]) != _base_key(updates[i]):
                continue
            other = out[j].delta
            norm = sum(float(np.vdot(o, o)) for o in other)
            dot = sum(float(np.vdot(d, o)) for d, o in zip(delta, other, strict=True))
            if norm > 0 and dot > 0:
                delta = [d - (dot / norm) * np.asarray(o) for d, o in zip(delta, other,
                                                                            strict=True)]
        out[i] = dataclasses.replace(updates[i], delta=delta)
        visited.append(i)
    return out


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
