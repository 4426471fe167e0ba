"""domain.metrics against hand-worked values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bucketlearn.domain.metrics import (
    HOLDOUT_FIGURES,
    ClassificationTally,
    RegressionTally,
    beats_majority,
    classification_report,
    confusion_rows,
    holdout_fields,
    majority_warning,
    report_document,
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


def test_holdout_fields_store_the_report_without_arrays_in_arrays():
    """The figures a version document gets: scalars, and a report whose confusion matrix is a
    list of {"row": [...]} maps (Firestore refuses an array in an array) that reads back as the
    matrix; the majority class is the one with most true rows; no ROC AUC beyond two classes."""
    # Prepare
    confusion = np.array([[8, 2, 0], [0, 3, 1], [0, 0, 1]])
    report = classification_report(confusion, loss=0.5)
    # Execute
    fields = holdout_fields(report)
    # Assert
    doc = fields["holdout_report"]
    assert tuple(fields) == HOLDOUT_FIGURES
    assert fields["holdout_macro_f1"] == report["macro_f1"]
    assert fields["holdout_majority_accuracy"] == pytest.approx(10 / 15)
    assert fields["holdout_roc_auc"] is None
    assert doc["confusion"] == [{"row": [8, 2, 0]}, {"row": [0, 3, 1]}, {"row": [0, 0, 1]}]
    assert confusion_rows(doc) == confusion.tolist()
    assert doc["class_index"] == [0, 1, 2] and doc["support"] == [10, 4, 1]
    assert doc["majority_class"] == 0 and doc["truncated"] is False
    assert doc["precision"] == pytest.approx([1.0, 3 / 5, 1 / 2])
    assert doc["recall"] == pytest.approx([8 / 10, 3 / 4, 1.0])
    assert all(isinstance(x, int) for row in doc["confusion"] for x in row["row"])


def test_a_binary_report_keeps_its_roc_auc():
    """Two classes: the tally's ROC AUC becomes the scalar field."""
    # Prepare
    tally = ClassificationTally(2)
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    labels = np.array([0, 0, 1, 1])
    tally.add(probs, labels, np.zeros(4))
    # Execute
    fields = holdout_fields(tally.report())
    # Assert: positives score 0.7 and 0.4, negatives 0.1 and 0.2: every pair won
    assert fields["holdout_roc_auc"] == 1.0
    assert confusion_rows(fields["holdout_report"]) == [[2, 0], [1, 1]]


def test_a_report_of_many_classes_keeps_the_largest_and_says_so():
    """Beyond the cap, the classes with the most holdout rows are kept (ties: lower id), in
    class order, the confusion restricted to them, and the document says it is truncated."""
    # Prepare: 5 classes, supports 1, 5, 3, 5, 2 (all predicted right)
    confusion = np.diag([1, 5, 3, 5, 2])
    # Execute
    doc = report_document(classification_report(confusion, loss=0.1), max_classes=3)
    # Assert
    assert doc["truncated"] is True and doc["classes"] == 5
    assert doc["class_index"] == [1, 2, 3]
    assert doc["support"] == [5, 3, 5]
    assert confusion_rows(doc) == [[5, 0, 0], [0, 3, 0], [0, 0, 5]]
    assert doc["majority_class"] == 1


def test_the_majority_warning_names_the_class_and_both_figures():
    """No warning above the baseline or without figures; otherwise one naming both."""
    # Assert
    assert beats_majority(0.95, 0.94) is True
    assert beats_majority(0.94, 0.94) is False and beats_majority(None, 0.94) is None
    assert majority_warning(0.95, 0.94, "no") is None
    assert majority_warning(None, 0.94, "no") is None and majority_warning(0.9, None, "no") is None
    text = majority_warning(0.94, 0.94, "no")
    assert text is not None
    assert text.startswith("accuracy 94.00% is not above the 94.00% of always answering 'no'")


def test_confusion_rows_read_plain_lists_and_nothing():
    """Old or hand-written shapes: a plain list of lists reads as it is; no report, no rows."""
    assert confusion_rows({"confusion": [[1, 2], [3, 4]]}) == [[1, 2], [3, 4]]
    assert confusion_rows(None) == [] and confusion_rows({}) == []
