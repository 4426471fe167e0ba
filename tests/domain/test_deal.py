"""domain.deal: a file's holdout and deal planned from its class counts alone."""

from __future__ import annotations

from bucketlearn.domain.deal import SplitPlan, Unsplittable, plan_split


def test_plan_split_decides_holdout_and_shards_from_counts_alone():
    """The plan needs no file: 3 classes of 500, 300 and 7 rows with 20 % held out and 64-row
    shards give each class its holdout share and every shard ⌊n_c/S⌋ or ⌈n_c/S⌉ of a class."""
    # Execute
    plan = plan_split(["a", "b", "c"], [500, 300, 7], "text", holdout_fraction=0.2,
                      rows_per_shard=64, seed=3, max_tasks_per_epoch=10_000)
    # Assert
    assert isinstance(plan, SplitPlan)
    assert plan.holdout_per_class[:2] == [100, 60] and 1 <= plan.holdout_per_class[2] <= 2
    assert plan.train_rows == sum(plan.train_per_class) == 807 - sum(plan.holdout_per_class)
    assert plan.shards == round(plan.train_rows / 64)
    sizes = plan.deal.sizes()
    assert sizes.sum() == plan.train_rows and sizes.max() - sizes.min() <= 1


def test_plan_split_refuses_a_class_of_one_row_naming_it():
    """A class with a single row can be neither trained on nor evaluated: the refusal says so,
    as a problem of the label column."""
    # Execute
    refused = plan_split(["a", "lonely"], [40, 1], "text", holdout_fraction=0.2,
                         rows_per_shard=256, seed=0, max_tasks_per_epoch=10_000)
    # Assert
    assert isinstance(refused, Unsplittable)
    assert refused.of_label and "'lonely'" in refused.found


def test_plan_split_refuses_more_shards_than_an_epoch_may_have():
    """1,000 training rows in shards of 10 are 100 shards, over a limit of 50: the refusal
    names the shards and is not the label column's."""
    # Execute
    refused = plan_split(["a", "b"], [625, 625], "text", holdout_fraction=0.2,
                         rows_per_shard=10, seed=0, max_tasks_per_epoch=50)
    # Assert
    assert isinstance(refused, Unsplittable)
    assert not refused.of_label and refused.found == "100 shards of 10 rows"
