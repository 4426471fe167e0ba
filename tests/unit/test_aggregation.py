"""aggregation.py: the pure maths of folding deltas, checked against hand-worked arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bucketlearn.aggregation import (
    BY_VERSIONS,
    DeltaUpdate,
    StalenessPolicy,
    delta_weights,
    fold,
    policy_for,
    project_shared_bases,
    staleness,
    staleness_discount,
    task_delays,
    weighted_mean_loss,
)


def _head():
    return [np.array([1.0, 2.0], dtype=np.float32), np.array([3.0], dtype=np.float32)]


def _update(task, delta, base=0, examples=10, loss=None, base_applied=None):
    return DeltaUpdate(task_index=task, base_version=base, examples=examples,
                       delta=[np.asarray(d, dtype=np.float32) for d in delta], train_loss=loss,
                       base_applied=base_applied)


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


@pytest.mark.parametrize("delay, exponent, expected", [
    (0, 1.0, 1.0),
    (1, 1.0, 0.5),
    (3, 1.0, 0.25),
    (-2, 1.0, 1.0),
    (1, 0.5, 1.0 / math.sqrt(2.0)),
    (3, 0.5, 0.5),
])
def test_staleness_discount_values(delay, exponent, expected):
    """(1 + max(0, delay)) ** -exponent for a few hand-computed points (default exponent 1)."""
    # Prepare / Execute
    value = staleness_discount(delay, exponent=exponent)
    # Assert
    assert value == pytest.approx(expected, rel=1e-12)


def test_staleness_discount_default_is_one_over_one_plus_delay():
    """Asynchronous SGD's rule: a delta 3 tasks late counts a quarter."""
    # Prepare / Execute
    value = staleness_discount(3)
    # Assert
    assert value == pytest.approx(0.25)


@pytest.mark.parametrize("head, base, expected", [(5, 5, 0), (5, 2, 3), (2, 5, 0)])
def test_staleness_counts_versions_since_base(head, base, expected):
    """Staleness is head - base, never negative."""
    # Prepare / Execute
    value = staleness(head, base)
    # Assert
    assert value == expected


def test_task_delays_count_deltas_since_base_and_ahead_in_the_fold():
    """Head has 10 deltas applied. Bases saw 10, 10, 7 and 9: behind 0, 0, 3, 1. Freshest first
    (ties in order): positions 0, 1, 3, 2, so delays 0, 1, 6, 3."""
    # Prepare
    updates = [
        _update(0, [[0, 0], [0]], base=4, base_applied=10),
        _update(1, [[0, 0], [0]], base=4, base_applied=10),
        _update(2, [[0, 0], [0]], base=2, base_applied=7),
        _update(3, [[0, 0], [0]], base=3, base_applied=9),
    ]
    # Execute
    delays = task_delays(updates, head_version=4, head_applied=10)
    # Assert
    assert delays == [0, 1, 6, 3]


def test_task_delays_estimate_from_versions_without_a_count():
    """A delta without base_applied (written by an older worker): versions behind times the
    fold's size, plus its place in the fold: 2 * 2 + 1 and 0 + 0."""
    # Prepare
    updates = [_update(0, [[0, 0], [0]], base=2), _update(1, [[0, 0], [0]], base=4)]
    # Execute
    delays = task_delays(updates, head_version=4, head_applied=99)
    # Assert
    assert delays == [5, 0]


def test_one_worker_one_delta_per_version_is_never_discounted():
    """K=1 with one worker: every delta was trained on the head, so it counts in full (the
    pipeline then takes exactly serial training's steps)."""
    # Prepare
    updates = [_update(0, [[0, 0], [0]], base=7, examples=100, base_applied=7)]
    # Execute
    weights = delta_weights(updates, head_version=7, nominal_examples=100, head_applied=7)
    # Assert
    assert weights == [1.0]


@pytest.mark.parametrize("exponent, discounts", [
    (1.0, [1.0, 0.5, 1.0 / 7.0, 0.25]),                    # 1/(1+delay), the CNN's
    (1.5, [1.0, 2.0 ** -1.5, 7.0 ** -1.5, 4.0 ** -1.5]),   # a stronger discount
])
def test_delta_weights_scale_by_example_share_and_delay(exponent, discounts):
    """weight = examples / nominal * (1 + delay) ** -exponent: delays 0, 1, 6, 3 (as above),
    shares 1, 0.5, 1, 2."""
    # Prepare
    updates = [
        _update(0, [[0, 0], [0]], base=4, examples=100, base_applied=10),  # fresh, full task
        _update(1, [[0, 0], [0]], base=4, examples=50, base_applied=10),   # second in the fold
        _update(2, [[0, 0], [0]], base=2, examples=100, base_applied=7),   # 3 behind, 4th
        _update(3, [[0, 0], [0]], base=3, examples=200, base_applied=9),   # 1 behind, 3rd
    ]
    # Execute
    weights = delta_weights(updates, head_version=4, nominal_examples=100, head_applied=10,
                            policy=StalenessPolicy("tasks", exponent))
    # Assert
    shares = [1.0, 0.5, 1.0, 2.0]
    assert weights == pytest.approx([a * b for a, b in zip(shares, discounts, strict=True)])


@pytest.mark.parametrize("exponent, discounts", [
    (0.5, [1.0, 1.0, 0.5, 1.0 / math.sqrt(2.0)]),  # (1+0, 1+0, 1+3, 1+1) ** -0.5
    (0.0, [1.0, 1.0, 1.0, 1.0]),                    # BY_VERSIONS, the MLP's: constant
])
def test_delta_weights_by_versions(exponent, discounts):
    """Version-counted delays, no place-in-fold count: shares 1, 0.5, 1, 2 times each delta's
    discount for 0, 0, 3 and 1 versions behind the head."""
    # Prepare
    updates = [
        _update(0, [[0, 0], [0]], base=4, examples=100, base_applied=10),
        _update(1, [[0, 0], [0]], base=4, examples=50, base_applied=10),
        _update(2, [[0, 0], [0]], base=1, examples=100, base_applied=7),
        _update(3, [[0, 0], [0]], base=3, examples=200, base_applied=9),
    ]
    # Execute
    weights = delta_weights(updates, head_version=4, nominal_examples=100, head_applied=10,
                            policy=StalenessPolicy("versions", exponent))
    # Assert
    shares = [1.0, 0.5, 1.0, 2.0]
    assert weights == pytest.approx([a * b for a, b in zip(shares, discounts, strict=True)])


def test_mlp_policy_is_constant_within_max_staleness():
    assert BY_VERSIONS == StalenessPolicy("versions", 0.0)


@pytest.mark.parametrize("kind, unit, exponent, projects", [("cnn", "tasks", 1.0, True),
                                                            ("mlp", "versions", 0.0, False)])
def test_policy_follows_the_model_kind(kind, unit, exponent, projects):
    """CNNs count delays in tasks with 1/(1+d) and fold same-base deltas without their common
    part; MLPs count versions, undiscounted, and sum deltas as they are."""
    # Prepare / Execute
    policy = policy_for(kind)
    # Assert
    assert (policy.unit, policy.exponent, policy.project_shared_bases) == (unit, exponent,
                                                                          projects)


def test_delta_weights_zero_nominal_is_treated_as_one():
    """A nominal task size of 0 cannot divide by zero."""
    # Prepare
    updates = [_update(0, [[0, 0], [0]], base=0, examples=3, base_applied=0)]
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


def _flat(update):
    return np.concatenate([np.ravel(layer) for layer in update.delta])


def test_projection_drops_the_part_a_heavier_same_base_delta_already_moves():
    """Hand-worked: a = ([2, 0], [0]), b = ([1, 1], [2]) from one base, a heavier. b·a = 2,
    a·a = 4, so b loses 0.5·a: ([0, 1], [2]). a itself is unchanged."""
    # Prepare
    a = _update(0, [[2.0, 0.0], [0.0]], base_applied=4)
    b = _update(1, [[1.0, 1.0], [2.0]], base_applied=4)
    # Execute
    out = project_shared_bases([b, a], [0.5, 1.0])
    # Assert
    np.testing.assert_allclose(_flat(out[1]), [2.0, 0.0, 0.0])
    np.testing.assert_allclose(_flat(out[0]), [0.0, 1.0, 2.0])
    assert float(np.dot(_flat(out[0]), _flat(out[1]))) == pytest.approx(0.0)
    assert out[0].task_index == 1 and out[0].base_applied == 4


def test_projection_of_two_equal_same_base_deltas_keeps_one():
    # Prepare
    a = _update(0, [[1.0, -1.0], [0.5]], base_applied=2)
    b = _update(1, [[1.0, -1.0], [0.5]], base_applied=2)
    # Execute
    out = project_shared_bases([a, b], [1.0, 1.0])  # a tie: the given order decides
    # Assert
    np.testing.assert_allclose(_flat(out[0]), [1.0, -1.0, 0.5])
    np.testing.assert_allclose(_flat(out[1]), [0.0, 0.0, 0.0], atol=1e-12)


@pytest.mark.parametrize("b_delta, b_base", [
    ([[-1.0, 0.0], [0.0]], 4),   # points the other way: kept whole
    ([[0.0, 3.0], [0.0]], 4),    # orthogonal: nothing shared
    ([[2.0, 0.0], [0.0]], 5),    # same direction, another base: the discount's business
])
def test_projection_leaves_opposed_orthogonal_and_other_base_deltas_alone(b_delta, b_base):
    # Prepare
    a = _update(0, [[2.0, 0.0], [0.0]], base_applied=4)
    b = _update(1, b_delta, base_applied=b_base)
    # Execute
    out = project_shared_bases([a, b], [1.0, 0.5])
    # Assert
    np.testing.assert_allclose(_flat(out[1]), np.concatenate([np.ravel(d) for d in b_delta]))
    np.testing.assert_allclose(_flat(out[0]), [2.0, 0.0, 0.0])


def test_projection_without_a_task_count_groups_by_base_version():
    # Prepare: deltas written before workers recorded base_applied
    a = _update(0, [[1.0, 0.0], [0.0]], base=3)
    b = _update(1, [[1.0, 1.0], [0.0]], base=3)
    c = _update(2, [[1.0, 1.0], [0.0]], base=2)
    # Execute
    out = project_shared_bases([a, b, c], [1.0, 0.5, 0.25])
    # Assert
    np.testing.assert_allclose(_flat(out[1]), [0.0, 1.0, 0.0])
    np.testing.assert_allclose(_flat(out[2]), [1.0, 1.0, 0.0])


def test_projection_needs_one_weight_per_update():
    with pytest.raises(ValueError, match="one weight per update"):
        project_shared_bases([_update(0, [[1.0, 0.0], [0.0]])], [1.0, 0.5])
