"""Holdout figures beyond accuracy, from counts a streaming evaluation accumulates: pure maths.

Classification: a confusion matrix (true class × predicted class) gives accuracy, per-class
precision and recall, macro-F1, and the accuracy of always answering the majority class (the
baseline an imbalanced table has to beat); for two classes, ROC AUC from the positive class's
scores. Regression: RMSE, MAE and R² from sums of errors, so a holdout never has to be in memory
at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

AUC_BINS = 1000  # scores are histogrammed into this many bins per class for ROC AUC


@dataclass
class ClassificationTally:
    """What a holdout pass adds up for a classifier, part by part."""

    classes: int
    confusion: np.ndarray = field(init=False)
    loss_sum: float = 0.0
    rows: int = 0
    positive_scores: np.ndarray = field(init=False)  # binary: histogram of P(class 1) by truth

    def __post_init__(self) -> None:
        self.confusion = np.zeros((self.classes, self.classes), dtype=np.int64)
        self.positive_scores = np.zeros((2, AUC_BINS), dtype=np.int64)

    def add(self, probabilities: np.ndarray, labels: np.ndarray, losses: np.ndarray) -> None:
        """Add one batch: predicted probabilities (rows × classes), true labels, per-row loss."""
        predicted = np.argmax(probabilities, axis=1)
        np.add.at(self.confusion, (labels, predicted), 1)
        self.loss_sum += float(np.sum(losses))
        self.rows += len(labels)
        if self.classes == 2:
            bins = np.clip((probabilities[:, 1] * AUC_BINS).astype(np.int64), 0, AUC_BINS - 1)
            np.add.at(self.positive_scores, (labels, bins), 1)

    def report(self) -> dict[str, Any]:
        """The figures, ready for a version document (plain floats and lists)."""
        return classification_report(self.confusion, self.loss_sum / max(1, self.rows),
                                     self.positive_scores if self.classes == 2 else None)


def classification_report(confusion: np.ndarray, loss: float,
                          positive_scores: np.ndarray | None = None) -> dict[str, Any]:
    """Accuracy, loss, per-class precision/recall/F1, macro-F1, the majority-class baseline and
    (binary) ROC AUC from a confusion matrix (rows: true class, columns: predicted)."""
    confusion = np.asarray(confusion, dtype=np.int64)
    total = int(confusion.sum())
    correct = int(np.trace(confusion))
    true_counts = confusion.sum(axis=1)
    predicted_counts = confusion.sum(axis=0)
    precision = _ratio(np.diag(confusion), predicted_counts)
    recall = _ratio(np.diag(confusion), true_counts)
    f1 = [0.0 if p + r == 0 else 2 * p * r / (p + r) for p, r in zip(precision, recall,
                                                                   strict=True)]
    present = [i for i, n in enumerate(true_counts) if n > 0]
    majority = float(true_counts.max() / total) if total else 0.0
    accuracy = correct / total if total else 0.0
    report: dict[str, Any] = {
        "accuracy": accuracy, "loss": float(loss), "rows": total,
        "macro_f1": float(np.mean([f1[i] for i in present])) if present else 0.0,
        "precision": precision, "recall": recall, "f1": f1,
        "confusion": confusion.tolist(),
        "majority_accuracy": majority,
        "majority_class": int(np.argmax(true_counts)) if total else 0,
        "beats_majority": beats_majority(accuracy, majority),
    }
    if positive_scores is not None:
        report["roc_auc"] = roc_auc_from_histograms(positive_scores[0], positive_scores[1])
    return report


def beats_majority(accuracy: float | None, majority_accuracy: float | None) -> bool | None:
    """Whether an accuracy is above that of always answering the majority class (None when
    either is unknown, e.g. a version evaluated before the baseline was recorded)."""
    if accuracy is None or majority_accuracy is None:
        return None
    return float(accuracy) > float(majority_accuracy) + 1e-12


def majority_warning(accuracy: float | None, majority_accuracy: float | None,
                     majority_class: str | None) -> str | None:
    """The warning a user sees when the accuracy is no better than always answering the
    majority class; None when it is better, or when either figure is unknown."""
    if accuracy is None or majority_accuracy is None or beats_majority(accuracy,
                                                                       majority_accuracy):
        return None
    answer = ("the majority class" if majority_class is None else repr(str(majority_class)))
    return (f"accuracy {float(accuracy):.2%} is not above the {float(majority_accuracy):.2%} of "
            f"always answering {answer}: look at macro-F1 and per-class recall "
            f"(class_weight=balanced may help)")


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> list[float]:
    return [float(n / d) if d else 0.0 for n, d in zip(numerator, denominator, strict=True)]


def roc_auc_from_histograms(negative: Sequence[int], positive: Sequence[int]) -> float | None:
    """ROC AUC from histograms of the positive-class score over the same bins, for the true
    negatives and the true positives: the probability that a random positive scores above a
    random negative, ties counting one half. None when a class is missing."""
    neg = np.asarray(negative, dtype=np.float64)
    pos = np.asarray(positive, dtype=np.float64)
    n_neg, n_pos = neg.sum(), pos.sum()
    if n_neg == 0 or n_pos == 0:
        return None
    below = np.concatenate([[0.0], np.cumsum(neg)[:-1]])  # negatives in lower bins
    wins = float(np.sum(pos * (below + 0.5 * neg)))
    return wins / (n_neg * n_pos)


# --- the report as documents store it ------------------------------------------------------------

MAX_REPORT_CLASSES = 50  # per-class detail kept in a document for at most this many classes
HOLDOUT_FIGURES = ("holdout_macro_f1", "holdout_majority_accuracy", "holdout_roc_auc",
                   "holdout_report")


def holdout_fields(report: dict[str, Any], max_classes: int = MAX_REPORT_CLASSES
                   ) -> dict[str, Any]:
    """A classification report as the fields a version document (and the job's head) store:
    macro-F1, the majority baseline and ROC AUC (binary; else None) as scalars, and the
    per-class detail as a map (``report_document``). Keys: ``HOLDOUT_FIGURES``."""
    return {"holdout_macro_f1": float(report["macro_f1"]),
            "holdout_majority_accuracy": float(report["majority_accuracy"]),
            "holdout_roc_auc": report.get("roc_auc"),
            "holdout_report": report_document(report, max_classes)}


def report_document(report: dict[str, Any], max_classes: int = MAX_REPORT_CLASSES
                    ) -> dict[str, Any]:
    """The per-class part of a report in a shape Firestore stores (no array inside an array:
    the confusion matrix is a list of ``{"row": [...]}`` maps), kept small.

    A table of more than ``max_classes`` classes keeps the ``max_classes`` with the most holdout
    rows (ties: lower class id), in class-id order, and says so (``truncated``); the confusion
    matrix is then restricted to those classes. ``class_index`` names the classes kept.
    """
    confusion = np.asarray(report["confusion"], dtype=np.int64)
    support = confusion.sum(axis=1)
    n = len(support)
    kept = sorted(int(i) for i in np.argsort(-support, kind="stable")[:max_classes])
    return {
        "classes": n, "rows": int(report["rows"]), "truncated": n > max_classes,
        "class_index": kept,
        "precision": [float(report["precision"][i]) for i in kept],
        "recall": [float(report["recall"][i]) for i in kept],
        "f1": [float(report["f1"][i]) for i in kept],
        "support": [int(support[i]) for i in kept],
        "confusion": [{"row": [int(confusion[i, j]) for j in kept]} for i in kept],
        "majority_class": int(report.get("majority_class", int(np.argmax(support)) if n else 0)),
        "beats_majority": bool(report["beats_majority"]),
    }


def confusion_rows(document: dict[str, Any] | None) -> list[list[int]]:
    """The confusion matrix of a stored report (``report_document``) as a list of rows; also
    reads a plain list of lists. Empty when there is none."""
    rows = (document or {}).get("confusion") or []
    return [[int(v) for v in (row.get("row") or [] if isinstance(row, dict) else row)]
            for row in rows]


@dataclass
class RegressionTally:
    """Sums a holdout pass adds up for a regression, part by part (Welford-free: the target's
    mean comes from the sums too)."""

    rows: int = 0
    squared_error: float = 0.0
    absolute_error: float = 0.0
    target_sum: float = 0.0
    target_squares: float = 0.0

    def add(self, predicted: np.ndarray, target: np.ndarray) -> None:
        error = np.asarray(predicted, np.float64).reshape(-1) - np.asarray(target,
                                                                           np.float64).reshape(-1)
        target = np.asarray(target, np.float64).reshape(-1)
        self.rows += len(target)
        self.squared_error += float(np.sum(error ** 2))
        self.absolute_error += float(np.sum(np.abs(error)))
        self.target_sum += float(np.sum(target))
        self.target_squares += float(np.sum(target ** 2))

    def report(self) -> dict[str, Any]:
        """RMSE, MAE and R² (1 − SSE/SST; None when the target is constant)."""
        n = max(1, self.rows)
        mean = self.target_sum / n
        total = self.target_squares - n * mean * mean
        return {"rmse": math.sqrt(self.squared_error / n), "mae": self.absolute_error / n,
                "r2": (1.0 - self.squared_error / total) if total > 1e-12 else None,
                "rows": self.rows, "loss": self.squared_error / n}


# a regression version's figures, beside holdout_loss (the mean squared error)
REGRESSION_FIGURES = ("holdout_rmse", "holdout_mae", "holdout_r2")


def regression_fields(report: dict[str, Any]) -> dict[str, Any]:
    """A regression report (``RegressionTally.report``) as the fields a version document (and
    the job's head) store. Keys: ``REGRESSION_FIGURES``."""
    r2 = report.get("r2")
    return {"holdout_rmse": float(report["rmse"]), "holdout_mae": float(report["mae"]),
            "holdout_r2": None if r2 is None else float(r2)}


def regression_headline(rmse: float | None, mae: float | None, r2: float | None) -> str:
    """``RMSE 236.8, MAE 193.9, R² 0.913`` (dashes for figures not known)."""
    def number(value: float | None, digits: str) -> str:
        return "-" if value is None else format(float(value), digits)
    return f"RMSE {number(rmse, '.4g')}, MAE {number(mae, '.4g')}, R² {number(r2, '.3f')}"
