"""Is a job's training healthy? Pure decisions over holdout figures (invariant 9).

A job must not end DONE with a model that is broken: one whose holdout loss went to NaN, or
that diverged (its loss climbed far above the best it reached and stayed there), or that answers
the same class for every row while doing no better than the class frequencies. Each case ends the job
FAILED with a reason that says what was seen and what to try.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DIVERGE_FACTOR = 2.0  # a loss this many times the best so far counts as a worse version...
DIVERGE_PATIENCE = 5  # ...and this many evaluated versions in a row of them is divergence


@dataclass(frozen=True)
class Health:
    """What the job has seen of its holdout loss."""

    best_loss: float | None = None
    best_version: int | None = None
    worse_streak: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"best_loss": self.best_loss, "best_version": self.best_version,
                "worse_streak": self.worse_streak}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Health:
        data = data or {}
        best = data.get("best_loss")
        version = data.get("best_version")
        return cls(best_loss=None if best is None else float(best),
                   best_version=None if version is None else int(version),
                   worse_streak=int(data.get("worse_streak") or 0))


def chance_loss(classes: int) -> float:
    """Cross-entropy of guessing every class with the same probability: ln(classes)."""
    return math.log(max(2, classes))


def observe(health: Health, version: int, loss: float, classes: int, learning_rate: float,
            chance: float | None = None) -> tuple[Health, str | None]:
    """Add one version's holdout loss; return the new health and, if training has diverged,
    the reason to fail the job with.

    Diverged: the loss is not finite; or for ``DIVERGE_PATIENCE`` evaluated versions in a row it
    was above both ``DIVERGE_FACTOR`` times the best loss and the loss of a uniform guess
    (``chance``, when given, stands for that guess: for a regression, the mean squared error of
    always answering the training mean, ``target_std**2``).
    """
    advice = (f"try a lower learning_rate (this job used {learning_rate:g}; "
              f"for example {learning_rate / 10:g})")
    if not math.isfinite(loss):
        return health, (f"training diverged: the holdout loss of v{version} is {loss}; "
                        f"{advice}")
    if health.best_loss is None or loss < health.best_loss:
        return Health(loss, version, 0), None
    baseline = chance_loss(classes) if chance is None else chance
    worse = loss > DIVERGE_FACTOR * health.best_loss and loss > baseline
    streak = health.worse_streak + 1 if worse else 0
    updated = Health(health.best_loss, health.best_version, streak)
    if streak >= DIVERGE_PATIENCE:
        return updated, (f"training diverged: the holdout loss rose from {health.best_loss:.4g} "
                         f"(v{health.best_version}) to {loss:.4g} (v{version}) and stayed above "
                         f"{DIVERGE_FACTOR:g}x the best for {streak} versions; {advice}")
    return updated, None


def prior_loss(true_counts: Sequence[int]) -> float:
    """Cross-entropy of always answering the class frequencies: the entropy of the classes."""
    total = sum(true_counts)
    return -sum((n / total) * math.log(n / total) for n in true_counts if n > 0) if total else 0.0


def degenerate_regression(loss: float, learning_rate: float) -> str | None:
    """Why a final regression model must not be exported (None when it may be): its holdout
    error is not a number (what a diverged job ends with)."""
    if math.isfinite(loss):
        return None
    return (f"the final model's holdout mean squared error is {loss}: training diverged; try a "
            f"lower learning_rate (this job used {learning_rate:g}; for example "
            f"{learning_rate / 10:g})")


def degenerate_model(predicted_counts: Sequence[int], true_counts: Sequence[int],
                     class_names: Sequence[str], loss: float, learning_rate: float) -> str | None:
    """Why a final model must not be exported (None when it may be): it answers one class for
    every holdout row and its loss is no better than answering the class frequencies, so it
    learned nothing from the features (what a diverged job ends with)."""
    total = sum(predicted_counts)
    if sum(1 for n in true_counts if n > 0) < 2 or total == 0:
        return None
    top = max(range(len(predicted_counts)), key=lambda c: predicted_counts[c])
    baseline = prior_loss(true_counts)
    if predicted_counts[top] < total or (math.isfinite(loss) and loss < baseline):
        return None
    return (f"the final model answers {class_names[top]!r} for all {total} holdout rows and its "
            f"holdout loss {loss:.4g} is no better than answering the class frequencies "
            f"({baseline:.4g}): training diverged; try a lower learning_rate (this job used "
            f"{learning_rate:g}; for example {learning_rate / 10:g})")
