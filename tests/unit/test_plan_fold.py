"""aggregator.plan_fold: which deltas the next version folds in (pure, no backend)."""

from __future__ import annotations

from bucketlearn.aggregator import MAX_DELTAS_PER_VERSION_FACTOR, DeltaRef, plan_fold


def ref(task, base=0, failed=False, nonce="0"):
    kind = "failed.json" if failed else "npz"
    return DeltaRef(name=f"job/e0001/t{task:05d}/{nonce}.{kind}", task_index=task,
                    failed=failed, base_version=base, examples=10)


def tasks(refs):
    return sorted(r.task_index for r in refs)


def test_waits_below_buffer_size():
    """One fresh delta with buffer 2 and more tasks to come: no version."""
    # Prepare
    deltas = [ref(3)]
    # Execute
    plan = plan_fold(head_version=0, planned=8, applied=[], failed=[], deltas=deltas,
                     buffer_size=2, max_staleness=16)
    # Assert
    assert plan.apply == []
    assert plan.failed == []
    assert plan.requeue == []
    assert plan.garbage == []
    assert plan.commits is False


def test_folds_at_buffer_size():
    """buffer_size fresh deltas are folded together."""
    # Prepare
    deltas = [ref(5), ref(1)]
    # Execute
    plan = plan_fold(head_version=0, planned=8, applied=[], failed=[], deltas=deltas,
                     buffer_size=2, max_staleness=16)
    # Assert
    assert tasks(plan.apply) == [1, 5]
    assert plan.commits is True


def test_folds_last_deltas_of_epoch_below_buffer_size():
    """The epoch's last delta is folded even though the buffer is not full."""
    # Prepare
    deltas = [ref(4, base=2)]
    # Execute
    plan = plan_fold(head_version=2, planned=5, applied=[0, 1, 2], failed=[3], deltas=deltas,
                     buffer_size=3, max_staleness=16)
    # Assert
    assert tasks(plan.apply) == [4]
    assert plan.commits is True


def test_does_not_finish_epoch_while_a_task_is_missing():
    """Below buffer size with one task still untrained: wait."""
    # Prepare
    deltas = [ref(3, base=2)]
    # Execute
    plan = plan_fold(head_version=2, planned=5, applied=[0, 1], failed=[], deltas=deltas,
                     buffer_size=3, max_staleness=16)
    # Assert
    assert plan.apply == []
    assert plan.commits is False


def test_ignores_tasks_already_applied_or_failed():
    """Deltas and markers of tasks already done are garbage, never applied again."""
    # Prepare
    deltas = [ref(0, base=1), ref(1, failed=True), ref(1, base=1), ref(2, base=1)]
    # Execute
    plan = plan_fold(head_version=1, planned=4, applied=[0], failed=[1], deltas=deltas,
                     buffer_size=1, max_staleness=16)
    # Assert
    assert tasks(plan.garbage) == [0, 1, 1]
    assert tasks(plan.apply) == [2]
    assert plan.failed == []


def test_nothing_left_when_everything_is_done():
    """Every task done: leftovers are garbage and nothing commits."""
    # Prepare
    deltas = [ref(0), ref(1)]
    # Execute
    plan = plan_fold(head_version=3, planned=2, applied=[0, 1], failed=[], deltas=deltas,
                     buffer_size=1, max_staleness=16)
    # Assert
    assert plan.apply == [] and plan.failed == [] and plan.commits is False
    assert tasks(plan.garbage) == [0, 1]


def test_picks_freshest_of_duplicate_deltas():
    """Duplicate deltas for one task: the newest base is applied, the rest are garbage."""
    # Prepare
    old = ref(2, base=1, nonce="a")
    newest = ref(2, base=3, nonce="b")
    middle = ref(2, base=2, nonce="c")
    other = ref(6, base=3)
    # Execute
    plan = plan_fold(head_version=3, planned=8, applied=[], failed=[],
                     deltas=[old, newest, middle, other], buffer_size=2, max_staleness=16)
    # Assert
    assert plan.apply == [newest, other]
    assert sorted(r.name for r in plan.garbage) == sorted([old.name, middle.name])


def test_duplicates_count_once_toward_buffer():
    """Two copies of one task's delta do not fill a buffer of two."""
    # Prepare
    deltas = [ref(2, base=0, nonce="a"), ref(2, base=0, nonce="b")]
    # Execute
    plan = plan_fold(head_version=0, planned=8, applied=[], failed=[], deltas=deltas,
                     buffer_size=2, max_staleness=16)
    # Assert
    assert plan.apply == []
    assert plan.commits is False


def test_requeues_task_whose_deltas_are_all_too_stale():
    """Only deltas more than max_staleness behind: retrain the task, apply nothing."""
    # Prepare
    deltas = [ref(3, base=1, nonce="a"), ref(3, base=2, nonce="b"), ref(4, base=10)]
    # Execute
    plan = plan_fold(head_version=10, planned=8, applied=[], failed=[], deltas=deltas,
                     buffer_size=2, max_staleness=5)
    # Assert
    assert plan.requeue == [3]
    assert tasks(plan.apply) == []  # task 4 alone does not fill the buffer
    assert all(r.task_index != 3 for r in plan.garbage)


def test_staleness_equal_to_limit_is_still_usable():
    """A delta exactly max_staleness behind is applied; one more and it is requeued."""
    # Prepare
    at_limit = ref(1, base=5)
    too_old = ref(2, base=4)
    # Execute
    plan = plan_fold(head_version=10, planned=3, applied=[0], failed=[],
                     deltas=[at_limit, too_old], buffer_size=1, max_staleness=5)
    # Assert
    assert plan.apply == [at_limit]
    assert plan.requeue == [2]


def test_stale_copy_is_garbage_when_a_fresh_one_exists():
    """A stale delta next to a fresh one for the same task is garbage, not a requeue."""
    # Prepare
    stale = ref(1, base=0, nonce="a")
    fresh = ref(1, base=9, nonce="b")
    # Execute
    plan = plan_fold(head_version=10, planned=2, applied=[0], failed=[], deltas=[stale, fresh],
                     buffer_size=4, max_staleness=5)
    # Assert
    assert plan.apply == [fresh]
    assert plan.garbage == [stale]
    assert plan.requeue == []


def test_failure_marker_counts_only_without_a_delta():
    """Task 1 has a marker and a delta (the delta wins); task 2 only a marker (it fails)."""
    # Prepare
    marker1 = ref(1, failed=True, nonce="m1")
    delta1 = ref(1, base=0, nonce="d1")
    marker2 = ref(2, failed=True, nonce="m2")
    # Execute
    plan = plan_fold(head_version=0, planned=8, applied=[], failed=[],
                     deltas=[marker1, delta1, marker2], buffer_size=4, max_staleness=16)
    # Assert
    assert plan.apply == [delta1]
    assert plan.failed == [marker2]
    assert marker1 in plan.garbage
    assert plan.commits is True  # a failure is recorded without waiting for the buffer


def test_failure_marker_with_only_stale_delta_requeues():
    """A task with a stale delta and a marker is retrained, not failed."""
    # Prepare
    deltas = [ref(1, failed=True, nonce="m"), ref(1, base=0, nonce="d")]
    # Execute
    plan = plan_fold(head_version=20, planned=4, applied=[], failed=[], deltas=deltas,
                     buffer_size=2, max_staleness=16)
    # Assert
    assert plan.requeue == [1]
    assert plan.failed == []


def test_failures_finish_the_epoch():
    """Markers for the last tasks complete the epoch together with the waiting deltas."""
    # Prepare
    deltas = [ref(2, base=1), ref(3, failed=True)]
    # Execute
    plan = plan_fold(head_version=1, planned=4, applied=[0, 1], failed=[], deltas=deltas,
                     buffer_size=8, max_staleness=16)
    # Assert
    assert tasks(plan.apply) == [2]
    assert tasks(plan.failed) == [3]


def test_out_of_range_task_index_is_garbage():
    """Task indices outside 0..planned-1 are garbage."""
    # Prepare
    deltas = [ref(8), ref(-1), ref(100, failed=True), ref(7)]
    # Execute
    plan = plan_fold(head_version=0, planned=8, applied=[], failed=[], deltas=deltas,
                     buffer_size=1, max_staleness=16)
    # Assert
    assert tasks(plan.garbage) == [-1, 8, 100]
    assert tasks(plan.apply) == [7]
    assert plan.failed == []


def test_caps_deltas_per_version():
    """At most buffer_size * MAX_DELTAS_PER_VERSION_FACTOR deltas go into one version."""
    # Prepare
    deltas = [ref(i) for i in range(10)]
    # Execute
    plan = plan_fold(head_version=0, planned=10, applied=[], failed=[], deltas=deltas,
                     buffer_size=2, max_staleness=16)
    # Assert
    assert len(plan.apply) == 2 * MAX_DELTAS_PER_VERSION_FACTOR
    assert tasks(plan.apply) == list(range(2 * MAX_DELTAS_PER_VERSION_FACTOR))
