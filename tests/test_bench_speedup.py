"""The speed-up benchmark's arithmetic: time to accuracy, the projection to more learners and the
round trip it reads off a run. Hand-worked figures, no training."""

from __future__ import annotations

import pytest

from benchmarks.suites import speedup


def _timeline(rounds: list[list[float]], split: float = 2.0, training: float = 10.0) -> dict:
    return {"split_seconds": split, "training_seconds": training, "round_compute": rounds}


def test_time_to_accuracy_is_the_first_evaluated_version_within_a_point():
    evaluated = [(3.0, 0.70), (5.0, 0.905), (7.0, 0.91), (9.0, 0.93)]
    assert speedup.time_to(evaluated, target=0.92) == 7.0  # 0.91 is within a point of 0.92
    assert speedup.time_to(evaluated, target=0.915) == 5.0
    assert speedup.time_to(evaluated, target=0.95) is None
    assert speedup.time_to([], target=0.5) is None


def test_a_numeric_targets_time_is_to_within_one_percent_of_train_locals_rmse():
    evaluated = [(3.0, 12.0), (5.0, 10.2), (7.0, 10.05)]
    assert speedup.time_to(evaluated, target=10.0, metric="rmse") == 7.0  # 10.05 <= 10.1
    assert speedup.time_to(evaluated, target=10.1, metric="rmse") == 5.0
    assert speedup.time_to(evaluated, target=9.0, metric="rmse") is None
    # the same figures read as accuracies: a lower figure is never "within" a higher target
    assert speedup.time_to(evaluated, target=12.5, metric="accuracy") is None


def test_a_projection_runs_a_rounds_tasks_in_waves_of_the_learners():
    """Two rounds of 4 tasks: with 4 learners each round costs its slowest task; with 2 the
    slowest two of each wave, sorted longest first; plus a round trip each and the split."""
    timeline = _timeline([[1.0, 3.0, 2.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
    assert speedup.project(timeline, 4, 0.5) == pytest.approx(2.0 + (4.0 + 0.5) + (1.0 + 0.5))
    assert speedup.project(timeline, 2, 0.5) == pytest.approx(
        2.0 + (4.0 + 2.0 + 0.5) + (1.0 + 1.0 + 0.5))
    assert speedup.project(timeline, 1, 0.0) == pytest.approx(2.0 + 10.0 + 4.0)


def test_the_local_round_trip_is_the_training_span_less_each_rounds_compute():
    """With 2 learners a round's two tasks overlap (its slowest counts); with 1 they follow
    each other (both count)."""
    timeline = _timeline([[1.0, 2.0], [0.5, 1.5]], training=5.5)
    assert speedup.local_round_seconds(timeline, 2) == pytest.approx((5.5 - 3.5) / 2)
    assert speedup.local_round_seconds(timeline, 1) == pytest.approx((5.5 - 5.0) / 2)
    assert speedup.local_round_seconds(_timeline([[4.0]], training=3.0), 1) == 0.0


def test_the_wide_projection_runs_every_task_in_rounds_as_wide_as_the_learners():
    """Nine tasks of 1 s (the 90th percentile) on 4 learners: 3 rounds of 1 s + 0.5 s."""
    timeline = _timeline([[1.0] * 3] * 3, split=2.0)
    assert speedup.project_wide(timeline, 4, 0.5) == pytest.approx(2.0 + 3 * 1.5)


def test_a_plan_of_one_task_at_a_time_is_projected_with_a_chained_versions_round_trip():
    """R = 1: three versions of 1 s tasks cost the chain's 0.05 s each in the cloud, not a
    parallel round's 0.4 s; the R = W projection still prices parallel rounds."""
    # Prepare
    def cell(parallel: int) -> dict:
        run = {**_timeline([[1.0]] * 3, split=2.0, training=3.3), "evaluated": [(5.0, 0.9)],
               "plan": {"parallel_tasks": parallel}}
        return {"train_local": {"seconds": 4.0, "accuracy": 0.9}, "pipeline-1": run}
    chained, rounds = cell(1), cell(2)
    # Execute
    speedup.summarize(chained, [2], cloud=0.4, chain=0.05)
    speedup.summarize(rounds, [2], cloud=0.4, chain=0.05)
    # Assert
    assert chained["projection"]["cloud_round_seconds"] == 0.05
    assert chained["projection"]["W=2"]["cloud"] == pytest.approx(2.0 + 3 * 1.05)
    assert chained["projection"]["W=2"]["R=W"] == pytest.approx(2.0 + 2 * 1.4)
    assert rounds["projection"]["W=2"]["cloud"] == pytest.approx(2.0 + 3 * 1.4)


def test_a_numeric_targets_goal_is_carried_to_the_evaluation_sample_by_the_final_model():
    """Versions are evaluated on a sample; train-local's RMSE is on the whole holdout."""
    found = {"evaluated": [(3.0, 5.2), (6.0, 4.80), (9.0, 4.77)], "rmse": 4.53}
    target = speedup.sampled_target(found, 4.53, "rmse")
    assert abs(target - 4.77) < 1e-9  # the final model is train-local's: its sample RMSE
    assert speedup.time_to(found["evaluated"], target, "rmse") == 6.0  # 4.80 <= 4.77 * 1.01
    assert speedup.sampled_target(found, 0.9, "accuracy") == 0.9  # accuracy: unchanged


def test_train_locals_figure_on_the_evaluation_sample_is_the_goal_when_it_has_one():
    """train-local measured on the versions' own sample: the goal is that figure, not the whole
    holdout's carried over."""
    run = {**_timeline([[1.0]] * 3, split=2.0, training=3.3),
           "evaluated": [(3.0, 0.80), (5.0, 0.86), (7.0, 0.94)], "plan": {"parallel_tasks": 1}}
    whole = {"train_local": {"seconds": 4.0, "accuracy": 0.95}, "pipeline-1": dict(run)}
    sampled = {"train_local": {"seconds": 4.0, "accuracy": 0.95, "sample": {"accuracy": 0.87}},
               "pipeline-1": dict(run)}
    speedup.summarize(whole, [2], cloud=0.4, chain=0.05)
    speedup.summarize(sampled, [2], cloud=0.4, chain=0.05)
    assert whole["pipeline-1"]["time_to_accuracy"] == 7.0  # within a point of 0.95: 0.94
    assert sampled["pipeline-1"]["time_to_accuracy"] == 5.0  # within a point of 0.87: 0.86
