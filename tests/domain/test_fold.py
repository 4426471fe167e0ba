"""domain.fold and domain.health against hand-worked values (no storage, no TensorFlow)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bucketlearn.domain import health
from bucketlearn.domain.fold import (
    MAX_REFUSALS,
    OUTLIER_FACTOR,
    WEIGHTS,
    TaskResult,
    check_delta,
    count_refusals,
    delta_norm,
    fold_round,
    running_norm,
    server_learning_rate,
    task_delta,
    weighted_mean_loss,
)


def result(task, delta, optimizer=None, examples=10, loss=None):
    return TaskResult(task, [np.asarray(d, np.float32) for d in delta],
                      [np.asarray(o) for o in (optimizer or [np.zeros(2)])], examples, loss)


BASE = [np.array([1.0, 2.0], np.float32), np.array([[0.5]], np.float32)]
OPT = [np.array(3, np.int64), np.array([0.0, 0.0], np.float32)]


def test_fold_sums_or_averages_by_the_server_learning_rate():
    """Two deltas: η = 2 (an MLP's round of 2) adds both; η = 1 (a CNN) adds their mean. The
    optimizer state is the mean of the tasks' states either way."""
    # Prepare
    a = result(0, [[1.0, 0.0], [[2.0]]], [np.array(11), np.array([1.0, 3.0])])
    b = result(1, [[0.0, 4.0], [[-1.0]]], [np.array(11), np.array([3.0, 5.0])])
    # Execute
    summed = fold_round(BASE, OPT, [b, a], server_lr=2.0)
    averaged = fold_round(BASE, OPT, [a, b], server_lr=1.0)
    # Assert
    assert summed is not None and averaged is not None
    np.testing.assert_allclose(summed[0][0], [2.0, 6.0])
    np.testing.assert_allclose(summed[0][1], [[1.5]])
    np.testing.assert_allclose(averaged[0][0], [1.5, 4.0])
    np.testing.assert_allclose(averaged[0][1], [[1.0]])
    assert int(summed[1][0]) == 11 and summed[1][0].dtype == np.int64
    np.testing.assert_allclose(summed[1][1], [2.0, 4.0])
    assert fold_round(BASE, OPT, []) is None


def test_fold_rejects_a_result_of_another_model():
    bad = result(0, [[1.0, 0.0]], [np.array(1), np.zeros(2)])
    with pytest.raises(ValueError, match="expected 2 weight arrays; found 1"):
        fold_round(BASE, OPT, [bad])


def test_server_learning_rate_is_the_mean_for_scaled_rates_and_by_family_before():
    """Rounds whose tasks trained at k times the job's rate fold by their mean whatever the
    model; a job planned before that (rates "family") keeps the sum for an MLP."""
    assert server_learning_rate("mlp", 3) == server_learning_rate("cnn", 3) == 1.0
    assert server_learning_rate("mlp", 3, "scaled") == 1.0
    assert server_learning_rate("mlp", 3, "family") == 3.0
    assert server_learning_rate("cnn", 3, "family") == 1.0
    assert server_learning_rate("cnn", 1, "family") == server_learning_rate("mlp", 1,
                                                                           "family") == 1.0


def test_check_delta_accepts_a_sound_result():
    ok = result(0, [[0.1, 0.1], [[0.1]]], [np.array(1), np.zeros(2)])
    assert check_delta(ok, [(2,), (1, 1)], [(), (2,)], recent_norm=0.2) is None
    assert check_delta(ok, [(2,), (1, 1)], [(), (2,)], recent_norm=None) is None


@pytest.mark.parametrize("delta, optimizer, expected", [
    ([[np.nan, 0.0], [[0.0]]], [np.array(1), np.zeros(2)], "weights array 0 is not finite"),
    ([[0.0, 0.0], [[np.inf]]], [np.array(1), np.zeros(2)], "weights array 1 is not finite"),
    ([[0.0, 0.0], [[0.0]]], [np.array(1), np.array([0.0, np.nan])],
     "optimizer state array 1 is not finite"),
    ([[0.0, 0.0]], [np.array(1), np.zeros(2)], "expected weight arrays of shapes"),
    ([[0.0, 0.0], [[0.0]]], [np.array(1)], "expected optimizer arrays of shapes"),
])
def test_check_delta_refuses_what_must_not_be_folded(delta, optimizer, expected):
    """A NaN or infinity anywhere, or arrays of the wrong shapes, are refused with a reason."""
    bad = result(0, delta, optimizer)
    reason = check_delta(bad, [(2,), (1, 1)], [(), (2,)], recent_norm=1.0)
    assert reason is not None and expected in reason


def test_check_delta_refuses_an_outlying_norm():
    """A delta more than OUTLIER_FACTOR times the job's recent deltas is refused; one just under
    it is folded."""
    # Prepare
    recent = 0.5
    just_under = result(0, [[OUTLIER_FACTOR * recent * 0.99, 0.0], [[0.0]]],
                        [np.array(1), np.zeros(2)])
    over = result(1, [[OUTLIER_FACTOR * recent * 1.5, 0.0], [[0.0]]], [np.array(1), np.zeros(2)])
    # Execute
    under_reason = check_delta(just_under, [(2,), (1, 1)], [(), (2,)], recent)
    over_reason = check_delta(over, [(2,), (1, 1)], [(), (2,)], recent)
    # Assert
    assert under_reason is None
    assert over_reason is not None and "30x the job's recent deltas" in over_reason


def test_running_norm_follows_the_median_delta():
    """The first fold sets the running norm to the round's median; later folds move it by
    1 - NORM_MEMORY of the way."""
    a, b, c = (result(i, [[3.0 * i, 4.0 * i], [[0.0]]]) for i in (1, 2, 3))
    assert delta_norm(a.delta) == pytest.approx(5.0)
    first = running_norm(None, [a, b, c])
    assert first == pytest.approx(10.0)
    assert running_norm(first, [a]) == pytest.approx(0.8 * 10.0 + 0.2 * 5.0)
    assert running_norm(7.0, []) == 7.0


def test_weighted_mean_loss():
    assert weighted_mean_loss([result(0, [[0, 0]], examples=10, loss=1.0),
                               result(1, [[0, 0]], examples=30, loss=2.0)]) == pytest.approx(1.75)
    assert weighted_mean_loss([result(0, [[0, 0]])]) is None


# --- health ------------------------------------------------------------------------------------

def test_health_tracks_the_best_loss_and_fails_a_nan():
    """A better loss becomes the best; a NaN loss is divergence at once, with advice."""
    # Execute
    first, reason1 = health.observe(health.Health(), 1, 1.2, classes=3, learning_rate=0.5)
    better, reason2 = health.observe(first, 2, 0.7, classes=3, learning_rate=0.5)
    _, nan_reason = health.observe(better, 3, math.nan, classes=3, learning_rate=0.5)
    # Assert
    assert (reason1, reason2) == (None, None)
    assert (better.best_loss, better.best_version, better.worse_streak) == (0.7, 2, 0)
    assert nan_reason is not None and "diverged" in nan_reason and "0.05" in nan_reason


def test_health_fails_a_loss_that_stays_far_above_its_best():
    """DIVERGE_PATIENCE versions in a row above both twice the best and a uniform guess's loss
    is divergence; a single bad version, or a loss under ln(classes), is not."""
    # Prepare
    state, _ = health.observe(health.Health(), 1, 0.4, classes=3, learning_rate=1.0)
    high = 5.0  # > 2 * 0.4 and > ln 3
    reasons = []
    # Execute
    for version in range(2, 2 + health.DIVERGE_PATIENCE):
        state, reason = health.observe(state, version, high, classes=3, learning_rate=1.0)
        reasons.append(reason)
    calm, calm_reason = health.observe(health.Health(0.4, 1, 3), 9, 1.0, 3, 1.0)
    # Assert
    assert reasons[:-1] == [None] * (health.DIVERGE_PATIENCE - 1)
    assert reasons[-1] is not None and "rose from 0.4 (v1) to 5" in reasons[-1]
    assert calm_reason is None and calm.worse_streak == 0  # 1.0 < ln 3: not a worse version
    assert health.Health.from_dict(state.to_dict()) == state


def test_degenerate_model_is_one_answer_no_better_than_the_class_frequencies():
    """One class for every row with a loss at or above the entropy of the classes is degenerate;
    the same answer with a lower loss (a model that learned an imbalanced holdout's prior and
    a little more), several answers, or a holdout of one class are not."""
    names = ["a", "b", "c"]
    balanced = [30, 30, 30]
    reason = health.degenerate_model([0, 90, 0], balanced, names, loss=1.104, learning_rate=1.0)
    assert reason is not None and "'b' for all 90 holdout rows" in reason
    assert "(1.099)" in reason and "for example 0.1" in reason
    assert health.degenerate_model([0, 90, 0], [5, 80, 5], names, 0.3, 1.0) is None
    assert health.degenerate_model([10, 80, 0], balanced, names, 9.0, 1.0) is None
    assert health.degenerate_model([0, 90, 0], [0, 90, 0], names, 9.0, 1.0) is None
    assert health.prior_loss([30, 30, 30]) == pytest.approx(math.log(3))


def test_one_task_folded_from_its_end_weights_is_those_weights_to_the_bit():
    """R = 1 is serial training only if x + Δ gives back the task's weights. A float32 delta
    cannot where a weight moves across zero or far from its base (1.0 -> 1e-8: the float32
    spacing near 1 is 6e-8); the delta taken in float64 from the end weights can."""
    # Prepare
    base = [np.array([1.0, -3.0e-3, 0.75], np.float32)]
    trained = [np.array([1.0e-8, 2.5e-3, 0.7500001], np.float32)]
    rounded = [np.asarray(trained[0] - base[0], np.float32)]  # what a float32 delta holds
    # Execute
    exact, _ = fold_round(base, OPT, [TaskResult(0, task_delta(trained, base, WEIGHTS),
                                                 OPT, 1)], server_lr=1.0)
    lossy, _ = fold_round(base, OPT, [TaskResult(0, rounded, OPT, 1)], server_lr=1.0)
    # Assert
    assert exact[0].dtype == np.float32 and exact[0].tobytes() == trained[0].tobytes()
    assert lossy[0].tobytes() != trained[0].tobytes()


def test_a_result_written_as_a_delta_is_taken_as_it_is_and_end_weights_must_fit_the_base():
    """Results written before the learner sent its end weights (no ``content``) are deltas; end
    weights of other shapes than the base are refused with both shapes named."""
    # Prepare
    delta = [np.array([0.5, 0.25], np.float32), np.array([[1.0]], np.float32)]
    # Execute
    taken = task_delta(delta, BASE, None)
    # Assert
    assert [t.tolist() for t in taken] == [[0.5, 0.25], [[1.0]]]
    with pytest.raises(ValueError, match=r"expected weight arrays of shapes \[\(2,\), \(1, 1\)\]"):
        task_delta([np.zeros(3, np.float32), np.zeros((1, 1), np.float32)], BASE, WEIGHTS)


def test_a_refused_task_trains_again_until_its_results_were_refused_max_refusals_times():
    """Each refusal of a task's result counts, per epoch (an earlier epoch's counts are dropped);
    the ``MAX_REFUSALS``-th one fails the task for good, the others send it to train again."""
    # Prepare
    before = {"2-0": MAX_REFUSALS - 1, "2-1": 0, "1-0": 5}
    # Execute
    tally = count_refusals(before, 2, [1, 0])
    # Assert
    assert tally.counts == {"2-0": MAX_REFUSALS, "2-1": 1}
    assert tally.failed == frozenset({0})
    assert tally.times(2, 0) == MAX_REFUSALS and tally.times(2, 3) == 0
    assert count_refusals(None, 1, [4]).counts == {"1-4": 1}
