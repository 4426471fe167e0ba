"""domain.target: which task a label column is, and the quantile bins a regression file is
stratified by."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bucketlearn.domain.target import (
    CLASSIFICATION,
    FINE_BUCKETS,
    REGRESSION,
    bin_counts,
    bin_edges,
    bin_names,
    bin_of,
    bucket_floor,
    decide_task,
    fine_buckets,
    quantile_bins,
)


@pytest.mark.parametrize(("requested", "all_numbers", "distinct", "task"), [
    ("auto", True, 21, REGRESSION),
    ("auto", True, 20, CLASSIFICATION),       # 20 distinct numbers: still classes
    ("auto", False, 5000, CLASSIFICATION),    # a word among the labels: classes
    ("classification", True, 5000, CLASSIFICATION),
    ("regression", True, 3, REGRESSION),      # as the option says
])
def test_the_task_rule(requested, all_numbers, distinct, task):
    found, reason = decide_task(requested, all_numbers, distinct, rows=1234)
    assert found == task
    assert reason.startswith(requested if requested == "auto" else f"task={requested}")


def test_the_auto_reason_says_how_many_distinct_numbers_decided():
    _, reason = decide_task("auto", True, 1234, rows=12345)
    assert reason.startswith("auto: 1,234 distinct numeric labels in the first 12,345 rows")
    with pytest.raises(ValueError, match="task"):
        decide_task("maybe", True, 1, 1)


def test_fine_buckets_are_monotonic_and_their_floor_is_below_every_member():
    rng = np.random.default_rng(0)
    values = np.sort(np.concatenate([
        rng.normal(0, 1, 500), rng.normal(0, 1e6, 500), [0.0, 1e-30, -1e-30, 3e38, -3e38],
    ])).astype(np.float32)
    buckets = fine_buckets(values)
    assert np.all(np.diff(buckets) >= 0)
    assert buckets.min() >= 0 and buckets.max() < FINE_BUCKETS
    assert all(bucket_floor(b) <= v for b, v in zip(buckets, values, strict=True))
    # a bucket is narrow: under 1 % of the value
    assert all(abs(v - bucket_floor(b)) <= 0.0079 * abs(v) + 1e-37
               for b, v in zip(buckets, values, strict=True) if abs(v) > 1e-30)


def test_quantile_bins_hold_about_equal_rows_and_bins_are_exact():
    rng = np.random.default_rng(1)
    target = rng.normal(4200, 800, size=3333).astype(np.float32)
    counts = np.bincount(fine_buckets(target), minlength=FINE_BUCKETS)
    starts = quantile_bins(counts, bins=10)
    per_bin = np.bincount(bin_of(fine_buckets(target), starts), minlength=len(starts))
    assert len(starts) == 10 and starts[0] == 0
    assert per_bin.tolist() == bin_counts(counts, starts)
    assert per_bin.min() >= 270 and per_bin.max() <= 400  # buckets of ~50 rows here
    edges = bin_edges(starts)
    assert edges[0] == -math.inf and all(a < b for a, b in zip(edges, edges[1:], strict=False))
    assert bin_names(edges)[0].startswith("[-inf, ")


def test_a_spike_makes_fewer_bins_and_every_bin_has_two_rows():
    target = np.concatenate([np.zeros(900), np.arange(1, 101)]).astype(np.float32)
    counts = np.bincount(fine_buckets(target), minlength=FINE_BUCKETS)
    starts = quantile_bins(counts, bins=10)
    per_bin = bin_counts(counts, starts)
    assert 1 < len(starts) < 10 and per_bin[0] >= 900 and min(per_bin) >= 2
    assert sum(per_bin) == 1000
    tiny = np.bincount(fine_buckets(np.array([1.0, 2.0, 3.0], np.float32)), minlength=FINE_BUCKETS)
    assert bin_counts(tiny, quantile_bins(tiny)) == [3]  # no bin of one row
