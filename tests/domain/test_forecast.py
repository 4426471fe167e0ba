"""domain.forecast: how long a plan should train on how many learners, and what it measured."""

from __future__ import annotations

import pytest

from bucketlearn.domain.forecast import (
    CHAINED_VERSION_SECONDS,
    Forecast,
    ModelCost,
    actual,
    choose_layout,
    forecast_plan,
    forecast_sentence,
    plan_lines,
    plan_sentence,
    task_seconds,
)
from bucketlearn.domain.plan import plan_training

MODEL = ModelCost(flops_per_row=1e6, parameters=1000, layers=5)


def test_a_task_costs_its_fixed_part_its_steps_its_rows_and_the_version_it_reads():
    """64 rows in batches of 32 of a 1 MFLOP-a-row, 1,000-parameter, 5-layer model: 15 ms
    fixed + 2 steps x (0.1 + 5 x 0.03) ms + 64 MFLOP at 20 GFLOP/s + 12 kB read and written at
    100 MB/s = 18.94 ms; a chain's task holds the version (12 kB written only)."""
    assert task_seconds(64, 32, MODEL) == pytest.approx(0.01894)
    assert task_seconds(64, 32, MODEL, reads_version=False) == pytest.approx(0.01882)


def test_a_parallel_plan_is_forecast_by_rounds_and_waves_and_suggests_the_fewest_learners():
    """Ten 64-row shards, 2 epochs, R = 4: rounds of 4, 4 and 2 tasks of 18.94 ms, each round
    0.37 s of critical path. 1 learner: 2 x (3 x 0.37 + 10 tasks) = 2.5988 s; 2: 5 waves an
    epoch, 2.4094 s; 4: 3 waves, 2.33364 s. 2 learners are within 10 % of 4: suggested. One
    process: 2 x (640 MFLOP at 20 GFLOP/s + 20 steps of 0.25 ms) = 0.074 s, sooner."""
    # Prepare
    plan = plan_training([64] * 10, epochs=2, batch_size=32, requested=4)
    # Execute
    found = forecast_plan(plan, train_rows=640, batch_size=32, model=MODEL)
    # Assert
    assert found.workers == (1, 2, 4)
    assert found.seconds == pytest.approx((2.5988, 2.4094, 2.33364))
    assert found.rounds == 6 and found.steps_per_task == 2
    assert found.suggested_workers == 2
    assert found.one_process_seconds == pytest.approx(0.074)
    assert not found.pays
    assert "train-local would end sooner" in found.summary()
    assert found.at(3) == found.at(2) and found.at(64) == found.at(4)


def test_one_task_at_a_time_gains_nothing_from_more_learners():
    """R = 1: one learner chains the versions; each costs a task (no version read) and the
    rest of its path."""
    # Prepare
    plan = plan_training([64] * 8, epochs=3, batch_size=32)
    assert plan.parallel_tasks == 1
    # Execute
    found = forecast_plan(plan, train_rows=512, batch_size=32, model=MODEL)
    # Assert
    per_version = CHAINED_VERSION_SECONDS + task_seconds(256, 32, MODEL, reads_version=False)
    assert found.workers == (1,) and found.suggested_workers == 1
    assert found.seconds[0] == pytest.approx(plan.tasks_per_epoch * 3 * per_version, rel=1e-4)


def test_a_job_whose_tasks_dwarf_its_round_trip_pays_to_distribute():
    """A CNN-sized model (1 GFLOP a row, 256-row tasks, R = 8): 12.8 s tasks beside a 0.37 s
    round trip; 8 learners are about 8 times one, and sooner than one process."""
    # Prepare
    plan = plan_training([256] * 64, epochs=1, batch_size=32, requested=8)
    heavy = ModelCost(flops_per_row=1e9, parameters=100_000, layers=10)
    # Execute
    found = forecast_plan(plan, train_rows=256 * 64, batch_size=32, model=heavy)
    # Assert
    assert found.suggested_workers == 8
    assert found.at(1) / found.at(8) > 7
    assert found.pays and "sooner" not in found.summary()


def test_a_forecast_survives_its_document():
    plan = plan_training([64] * 10, epochs=2, batch_size=32, requested=4)
    found = forecast_plan(plan, 640, 32, MODEL)
    assert Forecast.from_dict(found.to_dict()) == found


def test_actual_says_the_training_time_the_time_left_at_this_pace_and_a_tasks_seconds():
    """60 s for 3 of 12 versions: 180 s left; 1.5 learner-seconds over 6 tasks: 0.25 s each.
    An ended job has nothing left; nothing counted yet is unknown, not zero."""
    doc = {"made_at": 100.0, "rounds": 12}
    assert actual(doc, 160.0, 3, 1.5, 6, ended=False) == {
        "training_seconds": 60.0, "seconds_left": 180.0, "versions": 3, "task_seconds": 0.25}
    assert actual(doc, 160.0, 12, 1.5, 6, ended=True)["seconds_left"] is None
    assert actual(doc, 160.0, 0, 0.0, 0, ended=False)["seconds_left"] is None
    assert actual(doc, 160.0, 3, 0.0, 6, ended=False)["task_seconds"] is None


def test_plan_lines_say_the_plan_the_forecast_and_the_actual_beside_it():
    # Prepare
    plan = plan_training([64] * 10, epochs=2, batch_size=32, requested=4)
    found = {**forecast_plan(plan, 640, 32, MODEL).to_dict(), "made_at": 0.0}
    # Execute
    lines = dict(plan_lines(plan.to_dict(), found, actual(found, 30.0, 2, 0.5, 10, False)))
    # Assert
    assert lines["plan"] == ("trains 4 tasks at a time, each from the same version: as its "
                             "parallel_tasks option asks; 10 tasks an epoch of about 2 steps "
                             "each, 2 epochs")
    assert lines["forecast"].startswith("about ") and "on 2 learners" in lines["forecast"]
    assert lines["actual"] == ("30 s of training, about 60 s left at this pace; a task took "
                               "0.05 s of learner time (forecast 0.0189 s)")
    assert plan_lines(None, None, None) == []


def test_an_automatic_plan_keeps_rounds_only_where_they_end_sooner_than_one_task_at_a_time():
    """A table's model (1 MFLOP a row): 256 shards of 64 rows, 4 epochs (S = 2,048, H = 2:
    the bound allows R = 5) in rounds of 5 one-shard tasks cost 0.37 s a round for ~20 ms of
    compute; one chained task of 32 shards a version (8 tasks an epoch) ends sooner, so the plan trains one task at
    a time and says why. A CNN-sized model (1 GFLOP a row) keeps its rounds: its tasks dwarf
    the round trip."""
    # Prepare
    shards, rows = [64] * 256, 64 * 256
    parallel = plan_training(shards, epochs=4, batch_size=32)
    chained = plan_training(shards, epochs=4, batch_size=32, requested=1)
    assert parallel.parallel_tasks == 5
    heavy = ModelCost(flops_per_row=1e9, parameters=100_000, layers=10)
    # Execute
    table = choose_layout(parallel, chained, rows, 32, MODEL)
    images = choose_layout(parallel, chained, rows, 32, heavy)
    # Assert
    assert (table.parallel_tasks, table.shards_per_task) == (1, 32)
    assert table.tasks_per_epoch == 8 and table.serial_steps == parallel.serial_steps
    one = forecast_plan(chained, rows, 32, MODEL).best_seconds
    rounds = forecast_plan(parallel, rows, 32, MODEL).best_seconds
    assert one < rounds
    assert table.decided == (f"auto: one task at a time, forecast {one:,.1f} s; rounds of 5 "
                             f"tasks (the most the bound allows: R*H <= 0.25*sqrt(S) with "
                             f"S=2048 serial steps and H=2 steps per shard) were forecast "
                             f"{rounds:,.1f} s on 5 learners")
    assert images is parallel
    assert choose_layout(chained, chained, rows, 32, MODEL) is chained


def test_the_plan_and_its_forecast_are_said_in_words_the_rule_kept_in_the_plan():
    """Each way the plan can choose how many tasks train at once is said as a sentence a user
    reads (what was decided and why); the rule and its numbers stay in ``decided`` (for
    ``status --json`` and the docs), never in the words."""
    # Prepare: a job too small for rounds (the bound allows one task), one too small for
    # them to pay (the forecast), one a numeric target, one the option set
    small = plan_training([64] * 8, epochs=2, batch_size=32)
    large = plan_training([256] * 256, epochs=4, batch_size=32)
    chained = choose_layout(large, plan_training([256] * 256, 4, 32, requested=1),
                            256 * 256, 32, ModelCost(flops_per_row=1e4, parameters=1000, layers=5))
    numeric = plan_training([64] * 8, epochs=2, batch_size=32, regression=True)
    option = plan_training([64] * 8, epochs=2, batch_size=32, requested=2)
    # Execute
    said = {name: plan_sentence(plan.to_dict()) for name, plan in (
        ("small", small), ("large", large), ("chained", chained), ("numeric", numeric),
        ("option", option))}
    # Assert
    assert said["small"] == ("trains one task at a time: this job is too small to train tasks "
                             "side by side without losing accuracy")
    assert said["chained"] == ("trains one task at a time: this job is too small for parallel "
                               "rounds to finish sooner")
    assert said["large"].startswith(f"trains {large.parallel_tasks} tasks at a time")
    assert said["numeric"].startswith("trains one task at a time: a numeric target")
    assert said["option"].endswith(": as its parallel_tasks option asks")
    assert "R*H" in small.decided and "forecast" in chained.decided
    assert not any(mark in text for text in said.values() for mark in ("R*H", "sqrt", "S="))
    assert plan_sentence({"parallel_tasks": 1, "decided": "before"}) == "trains one task at a time"


def test_the_forecast_in_words_says_whether_distributing_pays():
    # Prepare
    plan = plan_training([64] * 8, epochs=2, batch_size=32, requested=1)
    found = forecast_plan(plan, 512, 32, MODEL).to_dict()
    # Execute
    said = forecast_sentence(found)
    # Assert
    assert said.startswith("about ") and " on 1 learner; about " in said
    assert said.endswith("in one process (train-local): too small to gain from distributing")
    assert "rounds of" not in said and "tasks of" not in said  # the parts: in ``summary``
    assert forecast_sentence({"summary": "as it was"}) == "as it was"
