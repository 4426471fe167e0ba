"""The validation rows a split holds out of training (per class, by the holdout's rule with
phases of their own) and the sample the numeric scaling is fitted on."""

from __future__ import annotations

import numpy as np

from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.ingest.parts import load_parts
from bucketlearn.ingest.split import split_upload
from bucketlearn.ingest.statistics import RowSample
from bucketlearn.options import JobOptions
from tests.unit.helpers import csv_bytes, source_from_bytes


def split(data: bytes, **options):
    store = MemoryBlobStore()
    manifest = split_upload(source_from_bytes(data), store, "work", "val-000000000000",
                            JobOptions(**options), Limits(), read_block_bytes=16 * 1024)
    return manifest, store


def test_each_class_gives_a_tenth_of_its_training_rows_to_validation() -> None:
    # Prepare: 3 classes of 900, 300 and 30 rows, sorted by label
    labels = [0] * 900 + [1] * 300 + [2] * 30
    data = csv_bytes(["id", "f", "label"], [[i, i % 13, c] for i, c in enumerate(labels)])
    # Execute
    manifest, store = split(data, rows_per_shard=64, seed=4)
    # Assert
    x_val, y_val = load_parts(store, "work", manifest.validation_parts)
    per_class = np.bincount(y_val, minlength=3)
    kept = np.array([900, 300, 30]) - np.bincount(
        load_parts(store, "work", manifest.holdout_parts)[1], minlength=3)
    assert np.all(np.abs(per_class - kept * 0.1) <= 1)
    assert manifest.validation_rows == len(y_val) == sum(manifest.validation_part_rows)
    assert manifest.validation_fraction == 0.1 and "0.1 of each class" in manifest.validation_reason
    # spread through the file, not its first rows of each class
    assert np.ptp(x_val[y_val == 0, 0]) > 600


def test_a_small_table_holds_no_validation_rows_and_says_why() -> None:
    data = csv_bytes(["f", "label"], [[i, i % 2] for i in range(110)])
    manifest, _ = split(data, rows_per_shard=16)
    assert manifest.validation_rows == 0 and manifest.validation_parts == []
    assert "too few to hold some out" in manifest.validation_reason


def test_the_sample_is_the_same_however_the_rows_come_in_batches() -> None:
    # Prepare
    rows = np.arange(3000 * 2, dtype=np.float32).reshape(3000, 2)
    whole, pieces = RowSample(100, 2, seed=5), RowSample(100, 2, seed=5)
    # Execute
    whole.add(rows)
    for start in range(0, 3000, 7):
        pieces.add(rows[start:start + 7])
    # Assert
    assert np.array_equal(whole.sample(), pieces.sample())
    assert len(whole.sample()) == 100 and len(np.unique(whole.sample()[:, 0])) == 100
    # roughly uniform over the rows, not the first ones
    assert whole.sample()[:, 0].mean() > 2000
