"""Numeric targets: classes or a number to predict, and the bins a regression file
is stratified by. Pure rules (numpy only).

**The task.** ``task=classification`` and ``task=regression`` are taken as said. ``task=auto``
looks at the labels of the file's first read block (4 MiB, where the feature kinds are sniffed
too): the label column is a regression target when every label there that is present is a
number and there are more than ``REGRESSION_MIN_DISTINCT`` distinct numbers among them; else
classes, as before the option existed. A later label that is not a number then rejects the file
naming its row (set ``task=classification`` to train classes).

**The bins.** Ingest stratifies by class. A regression file is stratified by *bins* of its
target instead: pass 1 counts the rows of each of 65,536 monotonic *fine buckets* (the top 16
bits of the float32 distance of the target from the first block's median, ordered: under 1 % of
that distance wide, so finest where most targets are; a fixed array, whatever the file size),
and ``quantile_bins`` groups consecutive fine buckets into at most ``TARGET_BINS`` bins of
about equal row counts. The counts per bin are then exact, so the holdout and the deal plan work
on bins as they work on classes: every shard and the holdout get rows from every part of the
target's range, whatever the file's order (a file sorted by the target included).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

AUTO, CLASSIFICATION, REGRESSION = "auto", "classification", "regression"
TASKS = (AUTO, CLASSIFICATION, REGRESSION)
REGRESSION_MIN_DISTINCT = 20  # auto: more distinct numbers than this make a regression target
TARGET_BINS = 10  # a regression file is stratified by this many quantile bins (at most)
FINE_BUCKETS = 1 << 16
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the largest target (and feature) a shard holds


def decide_task(requested: str, all_numbers: bool, distinct: int, rows: int,
                distinct_capped: bool = False) -> tuple[str, str]:
    """(task, the reason the job records) from what the first block's labels are.

    Args:
        requested: the ``task`` option (auto, classification, regression).
        all_numbers: every present label of the first block is a finite number.
        distinct: distinct numbers among them (counted up to a cap).
        rows: the first block's rows.
        distinct_capped: ``distinct`` stopped at its cap (there are at least that many).
    """
    if requested == CLASSIFICATION:
        return CLASSIFICATION, "task=classification"
    if requested == REGRESSION:
        return REGRESSION, "task=regression"
    if requested != AUTO:
        raise ValueError(f"task: expected one of {', '.join(TASKS)}; found {requested!r}")
    counted = f"{distinct:,}{'+' if distinct_capped else ''}"
    if all_numbers and distinct > REGRESSION_MIN_DISTINCT:
        return REGRESSION, (f"auto: {counted} distinct numeric labels in the first {rows:,} rows "
                            f"(more than {REGRESSION_MIN_DISTINCT}: a numeric target)")
    # (one text whatever the block held: a classification manifest does not depend on the block)
    return CLASSIFICATION, (f"auto: labels that are not all numbers, or at most "
                            f"{REGRESSION_MIN_DISTINCT} distinct numbers in the first rows: "
                            "classes")


def fine_buckets(values: np.ndarray) -> np.ndarray:
    """Each value's fine bucket (int64, 0..65535), monotonic in the value: the top 16 bits of
    its float32 pattern, flipped so that the order of the buckets is the order of the numbers."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    ordered = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(0x80000000))
    return (ordered >> 16).astype(np.int64)


def bucket_floor(bucket: int) -> float:
    """The smallest number of a fine bucket (its lower edge; -inf for a bucket whose lowest
    pattern is not a finite number)."""
    ordered = (int(bucket) << 16) & 0xFFFFFFFF
    bits = ordered & 0x7FFFFFFF if ordered >> 31 else ~ordered & 0xFFFFFFFF
    value = float(np.array([bits], dtype=np.uint32).view(np.float32)[0])
    return value if math.isfinite(value) else -math.inf


def quantile_bins(counts: Sequence[int] | np.ndarray, bins: int = TARGET_BINS,
                  min_rows: int = 2) -> np.ndarray:
    """The first fine bucket of each bin (ascending, the first 0): consecutive fine buckets
    grouped into at most ``bins`` bins of about ``n / bins`` rows, every bin at least
    ``min_rows`` rows (a bin that would have fewer joins its lower neighbour).

    A fine bucket is never split, so a value that fills many rows (a spike, e.g. zeros) makes
    fewer, uneven bins. Deterministic: the counts alone decide.
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(1, dtype=np.int64)
    cumulative = np.cumsum(counts)
    targets = total * np.arange(1, bins) / bins
    # a bin ends with the bucket where the cumulative count first reaches its quantile
    ends = np.unique(np.searchsorted(cumulative, targets, side="left"))
    starts = [0]
    for end in ends:
        start = int(end) + 1
        if start >= len(counts):
            continue
        before = int(cumulative[start - 1]) - (int(cumulative[starts[-1] - 1]) if starts[-1] else 0)
        after = total - int(cumulative[start - 1])
        if before >= min_rows and after >= min_rows:
            starts.append(start)
    return np.asarray(starts, dtype=np.int64)


def bin_of(buckets: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The bin (int32) of each fine bucket, for the bins starting at ``starts``."""
    return (np.searchsorted(starts, buckets, side="right") - 1).astype(np.int32)


def bin_edges(starts: np.ndarray, center: float = 0.0) -> list[float]:
    """Each bin's lower edge as a number (-inf for the first), for fine buckets taken around
    ``center`` (of ``target - center``)."""
    return [center + bucket_floor(int(s)) if i else -math.inf for i, s in enumerate(starts)]


def bin_counts(counts: Sequence[int] | np.ndarray, starts: np.ndarray) -> list[int]:
    """Rows of each bin, from the fine buckets' counts."""
    counts = np.asarray(counts, dtype=np.int64)
    return [int(v) for v in np.add.reduceat(counts, np.asarray(starts, dtype=np.int64))]


def bin_names(edges: Sequence[float]) -> list[str]:
    """Readable names of the bins (``[a, b)``), for messages and the job document."""
    upper = [*edges[1:], math.inf]
    return [f"[{low:.4g}, {high:.4g})" for low, high in zip(edges, upper, strict=True)]

