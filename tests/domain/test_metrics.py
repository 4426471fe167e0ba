"""domain.metrics against hand-worked values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bucketlearn.domain.metrics import (
    ClassificationTally,
    RegressionTally,
    classification_report,
    roc_auc_from_histograms,
)


def test_classification_report_from_a_confusion_matrix():
    """3 classes: rows are the truth, columns the prediction."""
    # Prepare: class 0: 8 right, 2 as class 1; class 1: 3 right, 1 as 2; class 2: 1 right
    confusion = np.array([[8, 2, 0], [0, 3, 1], [0, 0, 1]])
    # Execute
    report = classification_report(confusion, loss=0.5)
    # Assert
    assert report["accuracy"] == pytest.approx(12 / 15)
    assert report["precision"] == pytest.approx([1.0, 3 / 5, 1 / 2])
    assert report["recall"] == pytest.approx([8 / 10, 3 / 4, 1.0])
    f1 = [2 * p * r / (p + r) for p, r in zip(report["precision"], report["recall"], strict=True)]
    assert report["macro_f1"] == pytest.approx(sum(f1) / 3)
    assert report["majority_accuracy"] == pytest.approx(10 / 15)
    assert report["beats_majority"] is True
    assert report["confusion"] == confusion.tolist() and "roc_auc" not in report


def test_a_model_that_always_answers_the_majority_does_not_beat_it():
    """6 % positives, everything predicted negative: accuracy 0.94 equals the baseline."""
    report = classification_report(np.array([[94, 0], [6, 0]]), loss=0.2)
    assert report["accuracy"] == pytest.approx(0.94)
    assert report["beats_majority"] is False
    assert report["recall"] == [1.0, 0.0] and report["f1"][1] == 0.0


def test_roc_auc_from_histograms():
    """Perfect separation is 1, reversed 0, equal scores one half; a missing class is None."""
    assert roc_auc_from_histograms([5, 0, 0], [0, 0, 5]) == 1.0
    assert roc_auc_from_histograms([0, 0, 5], [5, 0, 0]) == 0.0
    assert roc_auc_from_histograms([0, 4, 0], [0, 4, 0]) == 0.5
    assert roc_auc_from_histograms([0, 0, 0], [1, 2, 3]) is None
    # 2 negatives in bin 0, 1 negative and 1 positive in bin 1, 1 positive in bin 2:
    # pairs won: pos@1 beats 2 negatives, ties 1 (0.5); pos@2 beats all 3 -> 5.5 of 6
    assert roc_auc_from_histograms([2, 1, 0], [0, 1, 1]) == pytest.approx(5.5 / 6)


def test_tallies_add_up_batches():
    """Adding a holdout in two batches gives the same report as in one."""
    # Prepare
    rng = np.random.default_rng(0)
    probs = rng.dirichlet([1, 1], size=200)
    labels = rng.integers(0, 2, 200)
    losses = -np.log(probs[np.arange(200), labels])
    whole, parts = ClassificationTally(2), ClassificationTally(2)
    # Execute
    whole.add(probs, labels, losses)
    parts.add(probs[:77], labels[:77], losses[:77])
    parts.add(probs[77:], labels[77:], losses[77:])
    # Assert
    one, two = whole.report(), parts.report()
    assert one["loss"] == pytest.approx(two["loss"]) == pytest.approx(float(np.mean(losses)))
    assert {k: v for k, v in one.items() if k != "loss"} == {k: v for k, v in two.items()
                                                            if k != "loss"}
    assert 0.0 <= whole.report()["roc_auc"] <= 1.0


def test_regression_tally():
    """RMSE, MAE and R² against a hand computation; a constant target has no R²."""
    # Prepare
    tally = RegressionTally()
    # Execute
    tally.add(np.array([1.0, 2.0]), np.array([1.5, 2.0]))
    tally.add(np.array([4.0]), np.array([3.0]))
    report = tally.report()
    # Assert: errors -0.5, 0, 1; target mean 6.5/3
    assert report["rmse"] == pytest.approx(math.sqrt((0.25 + 0 + 1) / 3))
    assert report["mae"] == pytest.approx(1.5 / 3)
    sst = sum((t - 6.5 / 3) ** 2 for t in (1.5, 2.0, 3.0))
    assert report["r2"] == pytest.approx(1 - 1.25 / sst)
    flat = RegressionTally()
    flat.add(np.array([1.0, 2.0]), np.array([2.0, 2.0]))
    assert flat.report()["r2"] is None
