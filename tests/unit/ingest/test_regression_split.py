"""Numeric targets at ingest: the task decided from the first block, rows stratified
by quantile bins of the target, float32 targets in shards and holdout, and the problems that
reject a regression file naming row and column."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.domain.target import bin_of, fine_buckets
from bucketlearn.errors import InvalidInputError
from bucketlearn.ingest.parts import load_parts
from bucketlearn.ingest.split import split_upload
from bucketlearn.options import NONE, JobOptions
from tests.unit.helpers import csv_bytes, source_from_bytes


def regression_rows(n: int, seed: int = 0, sort: bool = False) -> list[list[object]]:
    """y = 3 a - 2 b + 100 + noise, with an id column; sorted by y when asked."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(size=n)
    y = 3 * a - 2 * b + 100 + rng.normal(scale=0.1, size=n)
    rows = [[i, f"{a[i]:.5f}", f"{b[i]:.5f}", f"{y[i]:.4f}"] for i in range(n)]
    return sorted(rows, key=lambda r: float(r[3])) if sort else rows


def split(data: bytes, **options):
    store = MemoryBlobStore()
    block = options.pop("read_block_bytes", 4 * 1024**2)
    options.setdefault("validation_fraction", NONE)  # the bins' shares of shards and holdout
    manifest = split_upload(source_from_bytes(data), store, "work", "job-000000000000",
                            JobOptions(**options), Limits(), read_block_bytes=block)
    return manifest, store


def problem_of(data: bytes, **options):
    with pytest.raises(InvalidInputError) as caught:
        split(data, **options)
    return caught.value.problem


def test_a_file_sorted_by_its_target_gives_every_shard_and_the_holdout_every_bin():
    """Auto: 1,200 distinct numbers make a target; the rows are stratified by 10 quantile bins,
    so every shard and the holdout hold rows from the whole range of y, whatever the order."""
    # Prepare
    rows = regression_rows(1200, sort=True)
    # Execute
    manifest, store = split(csv_bytes(["id", "a", "b", "y"], rows), rows_per_shard=100)
    # Assert
    assert manifest.task == "regression" and manifest.classes == []
    assert re.match(r"auto: 1,1\d\d distinct numeric labels in the first 1,200 rows",
                    manifest.task_reason)  # (a few targets repeat at 4 decimals)
    assert len(manifest.bin_counts) == 10 and sum(manifest.bin_counts) == 1200
    assert len(manifest.bin_edges) == 9
    starts = np.searchsorted(np.array([float(r[3]) for r in rows], np.float32),
                             manifest.bin_edges)  # rows below each edge: the bins are quantiles
    assert np.all(np.abs(np.diff(np.r_[0, starts, 1200]) - 120) <= 15)
    truth = {int(r[0]): np.float32(float(r[3])) for r in rows}
    edges = np.r_[-np.inf, manifest.bin_edges]
    per_shard = []
    for shard in manifest.shards:
        x, y = load_parts(store, "work", shard.parts)
        assert y.dtype == np.float32
        assert [truth[int(i)] for i in x[:, 0]] == list(y)  # the targets themselves
        per_shard.append(np.bincount(np.searchsorted(edges, y, side="right") - 1, minlength=10))
    per_shard = np.array(per_shard)
    share = np.array(manifest.train_bin_counts) / len(manifest.shards)
    assert np.all(np.abs(per_shard - share) <= 1.0 + 1e-9)
    _, y_hold = load_parts(store, "work", manifest.holdout_parts)
    assert y_hold.dtype == np.float32 and len(y_hold) == manifest.holdout_rows
    held = np.bincount(np.searchsorted(edges, y_hold, side="right") - 1, minlength=10)
    assert held.tolist() == [n - t for n, t in zip(manifest.bin_counts, manifest.train_bin_counts,
                                                    strict=True)]
    assert held.min() >= 20
    y_train = np.concatenate([load_parts(store, "work", s.parts)[1] for s in manifest.shards])
    assert manifest.target_mean == pytest.approx(float(np.mean(y_train.astype(np.float64))))
    assert manifest.target_std == pytest.approx(float(np.std(y_train.astype(np.float64))))


def test_the_bins_are_the_domain_rule_on_the_whole_file():
    rows = regression_rows(500, seed=3)
    manifest, store = split(csv_bytes(["id", "a", "b", "y"], rows), rows_per_shard=64)
    y = np.array([float(r[3]) for r in rows], np.float32)
    edges = np.r_[-np.inf, manifest.bin_edges]
    by_edges = np.searchsorted(edges, y, side="right") - 1
    found = np.bincount(by_edges, minlength=len(manifest.bin_counts))
    # (the edges are the fine buckets' floors as numbers: a value on an edge may round across)
    assert np.abs(found - manifest.bin_counts).sum() <= 2
    assert len(set(bin_of(fine_buckets(y), np.arange(1)))) == 1  # (one bin: everything in it)


def test_missing_targets_leave_their_rows_out_and_are_counted():
    rows = regression_rows(300)
    rows[10][3], rows[200][3] = "NA", ""
    manifest, store = split(csv_bytes(["id", "a", "b", "y"], rows), rows_per_shard=50)
    assert manifest.task == "regression" and manifest.missing_targets == 2
    assert manifest.rows == 298 == manifest.train_rows + manifest.holdout_rows
    ids = np.concatenate([load_parts(store, "work", [p])[0][:, 0]
                          for p in [*manifest.holdout_parts,
                                    *(q for s in manifest.shards for q in s.parts)]])
    assert sorted(ids.astype(int).tolist()) == [i for i in range(300) if i not in (10, 200)]
    assert manifest.summary()["missing_targets"] == 2


def test_a_word_in_a_regression_label_column_rejects_the_file_naming_row_and_column():
    rows = regression_rows(200)
    rows[56][3] = "heavy"
    problem = problem_of(csv_bytes(["id", "a", "b", "y"], rows), task="regression")
    assert (problem.row, problem.column, problem.found) == (57, "y", "heavy")
    assert problem.message == "a label is not a number"
    assert "task=regression" in problem.expected and "task=classification" in problem.expected


def test_auto_decides_from_the_first_block_and_a_later_word_names_its_row():
    """The first block (here 4 KiB) holds only numbers: a numeric target; a word far below it
    rejects the file, saying how the task was decided and what to set instead."""
    rows = regression_rows(2000)
    rows[1799][3] = "n.a."
    problem = problem_of(csv_bytes(["id", "a", "b", "y"], rows), read_block_bytes=4096)
    assert (problem.row, problem.column, problem.found) == (1800, "y", "n.a.")
    assert "auto: " in problem.expected and "set task=classification" in problem.expected


def test_labels_with_a_word_in_the_first_block_stay_classes_and_task_classification_wins():
    rows = [[i % 5, i % 30] for i in range(300)]
    manifest, _ = split(csv_bytes(["a", "label"], rows), rows_per_shard=50)
    assert manifest.task == "regression"  # 30 distinct numbers
    manifest, _ = split(csv_bytes(["a", "label"], rows), rows_per_shard=50,
                        task="classification")
    assert manifest.task == "classification" and len(manifest.classes) == 30
    rows[3][1] = rows[4][1] = "other"
    manifest, _ = split(csv_bytes(["a", "label"], rows), rows_per_shard=50)
    assert manifest.task == "classification" and manifest.task_reason.startswith("auto: labels that are not all numbers")


def test_out_of_range_target_and_class_weight_are_refused():
    rows = regression_rows(100)
    rows[7][3] = "1e39"
    problem = problem_of(csv_bytes(["id", "a", "b", "y"], rows), task="regression")
    assert (problem.row, problem.column, problem.message) == (8, "y", "a label is out of range")
    problem = problem_of(csv_bytes(["id", "a", "b", "y"], regression_rows(100)),
                         class_weight="balanced")
    assert problem.column == "y" and "class_weight" in problem.message
    assert "task=classification" in problem.expected
