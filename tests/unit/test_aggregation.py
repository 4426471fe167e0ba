"""aggregation.py: the pure maths of folding deltas, checked against hand-worked arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bucketlearn.aggregation import (
    DeltaUpdate,
    delta_weights,
    fold,
    staleness,
    staleness_discount,
    weighted_mean_loss,
)


def _head():
    return [np.array([1.0, 2.0], dtype=np.float32), np.array([3.0], dtype=np.float32)]


def _update(task, delta, base=0, examples=10, loss=None):
    return DeltaUpdate(task_index=task, base_version=base, examples=examples,
                       delta=[np.asarray(d, dtype=np.float32) for d in delta], train_loss=loss)


def test_fold_adds_weighted_sum_of_deltas():
    """head + 1.0*d1 + 0.5*d2, worked out by hand."""
    # Prepare
    head = _head()
    d1 = _update(0, [[1.0, 1.0], [1.0]])
    d2 = _update(1, [[2.0, -2.0], [4.0]])
    # Execute
    new = fold(head, [d1, d2], [1.0, 0.5])
    # Assert
    # layer 0: [1+1+1, 2+1-1] = [3, 2]; layer 1: [3+1+2] = [6]
    assert new is not None and len(new) == 2
    np.testing.assert_array_equal(new[0], np.array([3.0, 2.0], dtype=np.float32))
    np.testing.assert_array_equal(new[1], np.array([6.0], dtype=np.float32))
    assert all(layer.dtype == np.float32 for layer in new)


def test_fold_applies_server_learning_rate():
    """server_lr scales the whole weighted sum."""
    # Prepare
    head = _head()
    d1 = _update(0, [[2.0, 4.0], [-2.0]])
    # Execute
    new = fold(head, [d1], [0.5], server_lr=0.5)
    # Assert
    np.testing.assert_allclose(new[0], [1.5, 3.0])
    np.testing.assert_allclose(new[1], [2.5])


def test_fold_does_not_modify_head_or_deltas():
    """fold returns new arrays and leaves its inputs untouched."""
    # Prepare
    head = _head()
    d1 = _update(0, [[1.0, 1.0], [1.0]])
    # Execute
    fold(head, [d1], [1.0])
    # Assert
    np.testing.assert_array_equal(head[0], [1.0, 2.0])
    np.testing.assert_array_equal(head[1], [3.0])
    np.testing.assert_array_equal(d1.delta[0], [1.0, 1.0])


def test_fold_skips_zero_weight_updates():
    """A zero-weight delta contributes nothing."""
    # Prepare
    head = _head()
    d1 = _update(0, [[1.0, 1.0], [1.0]])
    d2 = _update(1, [[100.0, 100.0], [100.0]])
    # Execute
    new = fold(head, [d1, d2], [1.0, 0.0])
    # Assert
    np.testing.assert_array_equal(new[0], [2.0, 3.0])
    np.testing.assert_array_equal(new[1], [4.0])


@pytest.mark.parametrize("updates, weights", [
    ([], []),
    ([_update(0, [[1.0, 1.0], [1.0]])], [0.0]),
    ([_update(0, [[1.0, 1.0], [1.0]]), _update(1, [[1.0, 1.0], [1.0]])], [0.0, 0.0]),
], ids=["empty", "one-zero-weight", "all-zero-weight"])
def test_fold_returns_none_when_nothing_valid(updates, weights):
    """No updates, or only zero weights: None (no new version)."""
    # Prepare
    head = _head()
    # Execute
    new = fold(head, updates, weights)
    # Assert
    assert new is None


@pytest.mark.parametrize("delta, fragment", [
    ([[1.0, 1.0, 1.0], [1.0]], "layer 0 expected shape (2,)"),
    ([[1.0, 1.0], [[1.0]]], "layer 1 expected shape (1,)"),
    ([[1.0, 1.0]], "expected 2 weight arrays"),
], ids=["wrong-shape-layer0", "wrong-rank-layer1", "missing-layer"])
def test_fold_rejects_shape_mismatch(delta, fragment):
    """A delta whose layers do not match the head raises ValueError naming the layer."""
    # Prepare
    head = _head()
    bad = _update(7, delta)
    # Execute
    with pytest.raises(ValueError) as excinfo:
        fold(head, [bad], [1.0])
    # Assert
    assert fragment in str(excinfo.value)
    assert "task 7" in str(excinfo.value)


def test_fold_rejects_weight_count_mismatch():
    """One weight per update is required."""
    # Prepare
    head = _head()
    d1 = _update(0, [[1.0, 1.0], [1.0]])
    # Execute
    with pytest.raises(ValueError) as excinfo:
        fold(head, [d1], [1.0, 1.0])
    # Assert
    assert "one weight per update" in str(excinfo.value)


@pytest.mark.parametrize("s, grace, expected", [
    (0, 0, 1.0),
    (1, 0, 1.0 / math.sqrt(2.0)),
    (3, 0, 0.5),
    (0, 1, 1.0),
    (1, 1, 1.0),
    (3, 1, 1.0 / math.sqrt(3.0)),
    (3, 5, 1.0),
])
def test_staleness_discount_values(s, grace, expected):
    """(1 + max(0, s - grace)) ** -0.5 for a few hand-computed points."""
    # Prepare / Execute
    value = staleness_discount(s, exponent=0.5, grace=grace)
    # Assert
    assert value == pytest.approx(expected, rel=1e-12)


def test_staleness_discount_other_exponent():
    """exponent 1 gives 1/(1+s)."""
    # Prepare / Execute
    value = staleness_discount(3, exponent=1.0)
    # Assert
    assert value == pytest.approx(0.25)


@pytest.mark.parametrize("head, base, expected", [(5, 5, 0), (5, 2, 3), (2, 5, 0)])
def test_staleness_counts_versions_since_base(head, base, expected):
    """Staleness is head - base, never negative."""
    # Prepare / Execute
    value = staleness(head, base)
    # Assert
    assert value == expected


def test_delta_weights_scale_by_example_share_and_staleness():
    """weight = examples / nominal * discount(staleness)."""
    # Prepare
    updates = [
        _update(0, [[0, 0], [0]], base=4, examples=100),   # fresh, full task
        _update(1, [[0, 0], [0]], base=4, examples=50),    # fresh, half a task
        _update(2, [[0, 0], [0]], base=1, examples=100),   # 3 versions stale
        _update(3, [[0, 0], [0]], base=3, examples=200),   # 1 stale, double task
    ]
    # Execute
    weights = delta_weights(updates, head_version=4, nominal_examples=100)
    # Assert
    assert weights == pytest.approx([1.0, 0.5, 0.5, 2.0 / math.sqrt(2.0)])


def test_delta_weights_grace_forgives_in_flight_versions():
    """With grace 1, one version of staleness costs nothing."""
    # Prepare
    updates = [_update(0, [[0, 0], [0]], base=3, examples=100)]
    # Execute
    weights = delta_weights(updates, head_version=4, nominal_examples=100, grace=1)
    # Assert
    assert weights == pytest.approx([1.0])


def test_delta_weights_zero_nominal_is_treated_as_one():
    """A nominal task size of 0 cannot divide by zero."""
    # Prepare
    updates = [_update(0, [[0, 0], [0]], base=0, examples=3)]
    # Execute
    weights = delta_weights(updates, head_version=0, nominal_examples=0)
    # Assert
    assert weights == pytest.approx([3.0])


def test_weighted_mean_loss_weights_by_examples():
    """(1.0*30 + 4.0*10) / 40, skipping updates without a loss."""
    # Prepare
    updates = [
        _update(0, [[0, 0], [0]], examples=30, loss=1.0),
        _update(1, [[0, 0], [0]], examples=10, loss=4.0),
        _update(2, [[0, 0], [0]], examples=1000, loss=None),
    ]
    # Execute
    loss = weighted_mean_loss(updates)
    # Assert
    assert loss == pytest.approx(70.0 / 40.0)


@pytest.mark.parametrize("updates", [
    [],
    [_update(0, [[0, 0], [0]], examples=10, loss=None)],
    [_update(0, [[0, 0], [0]], examples=0, loss=2.0)],
], ids=["empty", "no-loss-reported", "zero-examples"])
def test_weighted_mean_loss_none_without_data(updates):
    """No reported losses (or no examples): None."""
    # Prepare / Execute
    loss = weighted_mean_loss(updates)
    # Assert
    assert loss is None
