"""How a job trains by default: its budget (batch size, learning rate, epochs), the validation
rows it holds out of its training rows, and which version it exports (the best by validation,
stopping early once validation stops improving). Pure: numbers in, decisions out; the split,
``train-local`` and the aggregator all ask these, so a job that trains one task at a time
selects and stops exactly where ``train-local`` does.

Where the numbers come from (docs/TRAINING.md, "The default recipe"): RealMLP (Holzmüller et
al. 2024, "Better by default") trains a 3 x 256 MLP with batch 256, Adam with beta_2 = 0.95, a
flat-then-cosine schedule and label smoothing 0.1, and reverts to its best epoch by validation;
the budget here is that recipe's, cut to what one CPU learner affords (at least 2,000 steps;
20 passes over a table up to 120,000 rows, fewer beyond; larger batches for large tables, the
rate scaled with the square root of the batch: Krizhevsky 2014, Hoffer et al. 2017). The image
model takes a fixed number of steps at a batch of 128, measured on the 48,000 images. The
patience (a quarter of the epochs, at least 5) keeps the cosine's decay, where most of the
late gains come, within reach.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RECIPE = 2  # the model and training recipe new jobs get (1: the earlier, smaller recipe)

BASE_BATCH = 256
MAX_BATCH = 2048
BATCH_DOUBLES_EVERY = 50_000  # training rows: the batch doubles past 50,000, 100,000, ...
MLP_RATE = 2e-3  # at BASE_BATCH
CNN_BATCH = 128
CNN_RATE = 1.4e-3  # at CNN_BATCH: the rate 0.001 it had at 64, times sqrt(2)
CNN_STEPS = 1200  # the image model's steps: 5 passes over the 48,000 images' training rows
MIN_STEPS = 2000
PASSES = 20
MAX_ROWS_SEEN = 2_400_000  # rows trained on in all, beyond MIN_STEPS' worth
MAX_EPOCHS = 200
# a continued job starts from a trained model: its automatic budget is this share of a new
# job's (steps, passes and rows seen), its batch, rate and patience rules the same
CONTINUED_SHARE = 0.25
VALIDATION_FRACTION = 0.1
MIN_VALIDATED_ROWS = 100  # training rows below which no validation rows are held out
VALIDATION_MAX_ROWS = 10_000  # validation rows a version is scored on (a fixed sample)


@dataclass(frozen=True)
class Budget:
    """A job's resolved budget and why: what each ``auto`` became for its size."""

    epochs: int
    batch_size: int
    learning_rate: float
    patience: int
    reasons: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "batch_size": self.batch_size,
                "learning_rate": self.learning_rate, "patience": self.patience,
                "reasons": dict(self.reasons)}


def auto_batch(train_rows: int, image: bool) -> int:
    """``BASE_BATCH`` rows a step up to ``BATCH_DOUBLES_EVERY`` training rows, doubling with
    each doubling of the rows beyond, at most ``MAX_BATCH`` (the image model: ``CNN_BATCH``)."""
    if image:
        return CNN_BATCH
    doublings = max(0, math.floor(math.log2(max(1.0, train_rows / BATCH_DOUBLES_EVERY))))
    return min(MAX_BATCH, BASE_BATCH * 2 ** doublings)


def auto_learning_rate(batch_size: int, image: bool) -> float:
    """The peak rate for ``batch_size``: the recipe's at its base batch, scaled by the square
    root of the batch's ratio to it."""
    base, rate = (CNN_BATCH, CNN_RATE) if image else (BASE_BATCH, MLP_RATE)
    return round(rate * math.sqrt(batch_size / base), 8)


def auto_epochs(train_rows: int, batch_size: int, image: bool = False, share: float = 1.0
                ) -> int:
    """Passes over the training rows: at least ``MIN_STEPS`` steps, at least ``PASSES`` passes
    up to ``MAX_ROWS_SEEN`` rows in all (the image model: ``CNN_STEPS`` steps), each times
    ``share`` (a continued job's: ``CONTINUED_SHARE``); at most ``MAX_EPOCHS``."""
    rows = share * (CNN_STEPS * batch_size if image else
                    max(MIN_STEPS * batch_size, min(PASSES * train_rows, MAX_ROWS_SEEN)))
    return max(1, min(MAX_EPOCHS, math.ceil(rows / max(1, train_rows))))


def validation_share(train_rows: int, requested: float | None) -> tuple[float, str]:
    """The share of each class's training rows held out for validation, and why."""
    if requested is not None:
        return requested, (f"validation_fraction={requested:g} (option)" if requested else
                           "none (the last version is exported)")
    if train_rows < MIN_VALIDATED_ROWS:
        return 0.0, (f"none: {train_rows} training rows are too few to hold some out "
                     "(the last version is exported)")
    return VALIDATION_FRACTION, (f"{VALIDATION_FRACTION:g} of each class's training rows "
                                 "(the best version by validation is exported)")


def auto_patience(epochs: int) -> int:
    """Epochs without a better validation score before training stops."""
    return max(5, math.ceil(epochs / 4))


def resolve_budget(rows: int, image: bool, epochs: int | None, batch_size: int | None,
                   learning_rate: float | None, patience: int | None,
                   continued: bool = False) -> Budget:
    """What each ``auto`` (None) becomes for a job training on ``rows`` rows (its shards', the
    holdout and validation rows out); a value given is kept.

    Args:
        rows: the rows the job trains on.
        image: the image model (a CNN) trains; its batch and rate are its own.
        continued: the job continues another's model (``CONTINUED_SHARE`` of the epochs).
    """
    batch = batch_size or auto_batch(rows, image)
    rate = learning_rate or auto_learning_rate(batch, image)
    share = CONTINUED_SHARE if continued else 1.0
    passes = epochs or auto_epochs(rows, batch, image, share)
    waits = patience or auto_patience(passes)
    reasons = {}
    if batch_size is None:
        reasons["batch_size"] = (f"{batch}: the image model's" if image else
                                 f"{batch}: {BASE_BATCH}, doubled for each doubling of the "
                                 f"training rows past {BATCH_DOUBLES_EVERY:,}")
    if learning_rate is None:
        reasons["learning_rate"] = f"{rate:g}: the base rate x sqrt(batch / base batch)"
    if epochs is None:
        reasons["epochs"] = (f"{passes}: {share * CNN_STEPS:,.0f} steps of the image model"
                             if image else f"{passes}: at least {share * MIN_STEPS:,.0f} steps "
                             f"and {share * PASSES:g} passes, at most "
                             f"{share * MAX_ROWS_SEEN:,.0f} rows in all beyond that")
        if continued:
            reasons["epochs"] += (f" (a continued job's: {CONTINUED_SHARE:g} of a new job's "
                                  "budget, since it starts from a trained model)")
    if patience is None:
        reasons["patience"] = f"{waits}: a quarter of the epochs, at least 5"
    return Budget(passes, batch, rate, waits, reasons)


# -- selection: the best version by validation, and when to stop ---------------------------------

@dataclass(frozen=True)
class Score:
    """A checkpoint's validation figures: classes by accuracy (then loss), a numeric target by
    RMSE."""

    epoch: int
    version: int
    accuracy: float | None = None
    loss: float | None = None
    rmse: float | None = None

    def key(self) -> tuple[float, float]:
        """Larger is better."""
        if self.rmse is not None:
            return (-self.rmse, 0.0)
        return (self.accuracy if self.accuracy is not None else -math.inf,
                -(self.loss if self.loss is not None else math.inf))

    def is_finite(self) -> bool:
        """Whether its figures are numbers (a diverged checkpoint's are not)."""
        return all(math.isfinite(v) for v in self.key())

    def figure(self, decimals: int = 2) -> str:
        """The score as people read it: 'RMSE 12.3' for a numeric target, else '93.45 %'
        (accuracy to ``decimals``)."""
        if self.rmse is not None:
            return f"RMSE {self.rmse:.4g}"
        return f"{100 * self.accuracy:.{decimals}f} %" if self.accuracy is not None else "scored"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in {"epoch": self.epoch, "version": self.version,
                                  "accuracy": self.accuracy, "loss": self.loss,
                                  "rmse": self.rmse}.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Score:
        return cls(int(data["epoch"]), int(data["version"]), data.get("accuracy"),
                   data.get("loss"), data.get("rmse"))


@dataclass(frozen=True)
class Selection:
    """Where selection stands after the checkpoints scored so far, in epoch order: the best
    (the first of equals), the epochs scored one after another from the first
    (``scored_through``), and the epoch after which training stops (``stop_epoch``, None while
    it goes on)."""

    best: Score | None = None
    stop_epoch: int | None = None
    scored_through: int = 0

    def to_dict(self, patience: int) -> dict[str, Any]:
        return {"best": self.best.to_dict() if self.best is not None else None,
                "stop_epoch": self.stop_epoch, "scored_through": self.scored_through,
                "patience": patience}

    @classmethod
    def from_dict(cls, data: Any) -> Selection:
        """A selection as a job document stores it (``to_dict``); the empty one for None."""
        if not data:
            return cls()
        best = data.get("best")
        return cls(Score.from_dict(best) if best else None,
                   int(data["stop_epoch"]) if data.get("stop_epoch") is not None else None,
                   int(data.get("scored_through") or 0))


def advance(state: Selection, scores: Mapping[int, Score], patience: int,
            epochs: int) -> Selection:
    """``state`` moved on by the scores of the epochs after the ones it has seen, in epoch
    order (``scores`` by epoch; a later epoch's score waits for the ones before it).

    Training stops after epoch ``e`` when ``patience`` epochs have passed since the best one
    (``e - best.epoch >= patience``), or after the last epoch. The decision depends only on the
    scores, so every learner count and timing, and ``train-local``, decide the same.
    """
    if state.stop_epoch is not None:
        return state
    best, epoch = state.best, state.scored_through
    while epoch + 1 in scores:
        epoch += 1
        score = scores[epoch]
        if best is None or score.key() > best.key():
            best = score
        if epoch >= epochs or epoch - best.epoch >= patience:
            return Selection(best, epoch, epoch)
    return Selection(best, None, epoch)


def select(scores: Sequence[Score], patience: int, epochs: int) -> Selection:
    """The selection the scores make from the first epoch (``advance`` from nothing)."""
    return advance(Selection(), {s.epoch: s for s in scores}, patience, epochs)


def selection_sentence(status: Mapping[str, Any]) -> str | None:
    """Which version a job's model is and why, for people (the CLI's ``status``, the dashboard):
    "version 96, the best by validation (epoch 12; stopped after epoch 38, 26 epochs without a
    better score)". ``status`` is a status object (``selection``, ``validation``,
    ``model_version``, ``status``); None before anything is scored and with no validation."""
    selection = Selection.from_dict(status.get("selection"))
    patience = (status.get("selection") or {}).get("patience")
    done = status.get("status") == "DONE"
    if selection.best is None:
        held_none = str(status.get("validation") or "").startswith("none")
        if done and held_none and status.get("model_version") is not None:
            return (f"version {status['model_version']}, the last one trained: no rows were "
                    "held out for validation")
        return None
    best = selection.best
    chosen = (f"epoch {best.epoch} (version {best.version}, {best.figure(1)} on the validation "
              "rows)")
    if selection.stop_epoch is None:
        return (f"the best by validation so far: {chosen}; training stops after {patience} "
                "epochs without a better one")
    stopped = (f"stopped after epoch {selection.stop_epoch}, {patience} epochs without a "
               "better score" if selection.stop_epoch - best.epoch >= (patience or 0)
               else f"all {selection.stop_epoch} epochs trained")
    lead = (f"version {status.get('model_version')}, the best by validation" if done else
            "the best by validation")
    return f"{lead}: {chosen}; {stopped}"
