"""ingest.split_upload: stratified shards, systematic holdout, streaming parts, statistics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bucketlearn import layout
from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.domain.deal import DealPlan, holdout_count, holdout_phases
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ingest.parts import PartWrites, ShardWriter, load_parts
from bucketlearn.ingest.split import split_upload
from bucketlearn.options import NONE, JobOptions
from bucketlearn.usecases.train_local import local_source
from tests.unit.helpers import csv_bytes, source_from_bytes

BUCKET = "work"
JOB = "sorted-000000000000"


def write_sorted_csv(path, class_sizes, n_features=5, seed=1):
    """Rows sorted by label; feature 'id' is a unique row id (exact in float32)."""
    rng = np.random.default_rng(seed)
    rows, row_id = [], 0
    for c, n in enumerate(class_sizes):
        for _ in range(n):
            noise = rng.normal(loc=c, size=n_features - 1)
            rows.append([row_id] + [f"{v:.6f}" for v in noise] + [c])
            row_id += 1
    header = ["id"] + [f"f{j}" for j in range(1, n_features)] + ["label"]
    path.write_bytes(csv_bytes(header, rows))
    return path


def split(path, options, buffer_bytes=None, limits=None):
    store = MemoryBlobStore()
    kwargs = {} if buffer_bytes is None else {"buffer_bytes": buffer_bytes}
    manifest = split_upload(local_source(str(path)), store, BUCKET, JOB, options,
                            limits or Limits(), **kwargs)
    return manifest, store


def shard_arrays(store, manifest):
    return [load_parts(store, BUCKET, shard.parts) for shard in manifest.shards]


CASES = {
    "4x300-sorted": ([300, 300, 300, 300], JobOptions(rows_per_shard=70, seed=0)),
    "uneven-sorted": ([301, 157, 430, 99], JobOptions(rows_per_shard=50, seed=11,
                                                      holdout_fraction=0.15)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def split_case(request, tmp_path_factory):
    class_sizes, options = CASES[request.param]
    path = write_sorted_csv(tmp_path_factory.mktemp("sorted") / "sorted.csv", class_sizes)
    manifest, store = split(path, options)
    return class_sizes, options, manifest, store, path


def test_every_shard_gets_its_quota_of_every_class(split_case):
    """Shard k holds n_train_c / shards rows of class c, within one row, for every class."""
    # Prepare
    class_sizes, options, manifest, store, _ = split_case
    phases = holdout_phases(options.seed, len(class_sizes))
    holdout = [holdout_count(n, options.holdout_fraction, p)
               for n, p in zip(class_sizes, phases, strict=True)]
    _, validation = load_parts(store, BUCKET, manifest.validation_parts)
    validated = np.bincount(validation, minlength=len(class_sizes))
    train_per_class = np.array(class_sizes) - np.array(holdout) - validated
    shards = len(manifest.shards)
    # Execute
    counts = np.array([np.bincount(y, minlength=len(class_sizes))
                       for _, y in shard_arrays(store, manifest)])
    # Assert
    assert shards > 1 and validated.min() >= 1  # validation rows of every class
    assert (counts.sum(axis=0) == train_per_class).all()
    assert list(train_per_class) == manifest.train_class_counts
    assert np.abs(counts - train_per_class / shards).max() < 1.0


def test_label_sorted_file_shards_have_the_files_class_proportions(tmp_path):
    """4x300 rows sorted by label: each shard's class counts are its size/4 within ±1 row."""
    # Prepare
    path = write_sorted_csv(tmp_path / "sorted.csv", [300, 300, 300, 300])
    options = JobOptions(rows_per_shard=70, seed=0, validation_fraction=NONE)
    # Execute
    manifest, store = split(path, options)
    counts = np.array([np.bincount(y, minlength=4) for _, y in shard_arrays(store, manifest)])
    # Assert
    sizes = counts.sum(axis=1, keepdims=True)
    assert len(manifest.shards) == round(960 / 70)
    assert np.abs(counts - sizes * 0.25).max() <= 1.0
    assert counts.min() >= 1


def test_shard_sizes_are_close_to_rows_per_shard(split_case):
    """Shard count is round(train / rows_per_shard); shard sizes differ by at most one row."""
    # Prepare
    class_sizes, options, manifest, store, _ = split_case
    # Execute
    sizes = [len(y) for _, y in shard_arrays(store, manifest)]
    # Assert
    assert len(sizes) == max(1, round(manifest.train_rows / options.rows_per_shard))
    mean = manifest.train_rows / len(sizes)
    assert abs(mean - options.rows_per_shard) <= options.rows_per_shard / 2
    assert max(sizes) - min(sizes) <= 1
    assert [s.rows for s in manifest.shards] == sizes
    assert [s.index for s in manifest.shards] == list(range(len(sizes)))


def test_fewer_rows_per_class_than_shards_leaves_no_shard_empty(tmp_path):
    """100 classes x 18 rows, rows_per_shard=8, seed 33: every shard gets
    rows (the per-class deal left shard 67 empty, and its task failed the job)."""
    # Prepare
    path = write_sorted_csv(tmp_path / "many.csv", [18] * 100, n_features=3)
    options = JobOptions(rows_per_shard=8, seed=33, task="classification")  # 100 int labels
    # Execute
    manifest, store = split(path, options)
    # Assert
    sizes = [s.rows for s in manifest.shards]
    assert len(sizes) == round(manifest.train_rows / 8) > 100
    assert [s.index for s in manifest.shards if s.rows == 0] == []
    assert max(sizes) - min(sizes) <= 1
    counts = np.array([np.bincount(y, minlength=100) for _, y in shard_arrays(store, manifest)])
    assert counts.sum(axis=1).tolist() == sizes
    assert counts.max() <= 1  # each class has fewer rows than there are shards: 0 or 1 each


def test_shuffled_file_shards_complete_in_order_one_part_each():
    """In a shuffled file shard k takes its rows from about k/S of the way through each class,
    so shards complete (and are written) one after another: with a buffer of an eighth of the
    data and 16 KB read blocks, every shard is still written as a single part. Spreading a
    class's extra rows matters: dealt to consecutive shards, 200 classes x 200 rows gave 1153
    parts for 500 shards."""
    # Prepare
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.arange(200), 200))
    data = csv_bytes(["id", "f", "label"], [[i, i % 7, int(c)] for i, c in enumerate(labels)])
    options = JobOptions(rows_per_shard=64, seed=3, validation_fraction=NONE)
    # Execute
    manifest = split_upload(source_from_bytes(data), MemoryBlobStore(), BUCKET, JOB, options,
                            Limits(max_line_bytes=4096), buffer_bytes=len(labels) * 12 // 8,
                            read_block_bytes=16 * 1024)
    # Assert
    assert len(manifest.shards) == 500
    assert [len(s.parts) for s in manifest.shards] == [1] * 500


@pytest.mark.parametrize("shards", [1, 2, 3, 7, 100, 1441, 10_000])
def test_deal_plan_spreads_each_class_over_the_shards(shards):
    """Row j of a class goes to shard ~ j * S / n: a shard's range starts within 4 rows of
    k * n / S for every class (the extra rows are spread, not bunched)."""
    # Prepare
    counts = [1, 5, 366, 391, 999, 2 * shards + 17, 12_345]
    # Execute
    plan = DealPlan.make(counts, shards, seed=4)
    # Assert
    for c, n in enumerate(counts):
        per_shard = np.bincount(plan.shard_of(c, np.arange(n)), minlength=shards)
        starts = np.concatenate([[0], np.cumsum(per_shard)[:-1]])
        assert np.abs(starts - np.arange(shards) * n / shards).max() <= 4.0
        assert per_shard.max() - per_shard.min() <= 1


def test_holdout_per_class_follows_the_systematic_rule(split_case):
    """The holdout has holdout_count(n_c, f, phase_c) rows of every class (≈ f * n_c)."""
    # Prepare
    class_sizes, options, manifest, store, _ = split_case
    phases = holdout_phases(options.seed, len(class_sizes))
    expected = [holdout_count(n, options.holdout_fraction, p)
                for n, p in zip(class_sizes, phases, strict=True)]
    # Execute
    _, y_hold = load_parts(store, BUCKET, manifest.holdout_parts)
    found = np.bincount(y_hold, minlength=len(class_sizes)).tolist()
    # Assert
    assert found == expected
    for n, h in zip(class_sizes, expected, strict=True):
        assert abs(h - n * options.holdout_fraction) < 1.0
    assert manifest.holdout_rows == sum(expected)


def test_no_row_lost_or_duplicated(split_case):
    """Training + validation + holdout ids are exactly the file's ids, each once, with their
    own labels."""
    # Prepare
    class_sizes, _, manifest, store, _ = split_case
    label_of_id = np.repeat(np.arange(len(class_sizes)), class_sizes)
    # Execute
    parts = shard_arrays(store, manifest) + [load_parts(store, BUCKET, manifest.holdout_parts),
                                             load_parts(store, BUCKET, manifest.validation_parts)]
    ids = np.concatenate([x[:, 0] for x, _ in parts]).astype(np.int64)
    labels = np.concatenate([y for _, y in parts])
    # Assert
    assert manifest.rows == sum(class_sizes)
    assert manifest.train_rows + manifest.holdout_rows + manifest.validation_rows == (
        manifest.rows)
    assert manifest.validation_rows > 0
    assert len(ids) == manifest.rows
    assert np.array_equal(np.sort(ids), np.arange(sum(class_sizes)))
    assert np.array_equal(labels, label_of_id[ids])


def test_manifest_statistics_match_numpy_on_training_rows(split_case):
    """mean/variance in the manifest are numpy's (population) mean/var of the training rows."""
    # Prepare
    _, _, manifest, store, _ = split_case
    x = np.concatenate([x for x, _ in shard_arrays(store, manifest)]).astype(np.float64)
    # Execute
    mean, variance = np.asarray(manifest.mean), np.asarray(manifest.variance)
    # Assert
    np.testing.assert_allclose(mean, x.mean(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(variance, x.var(axis=0), rtol=1e-9, atol=1e-9)


def test_manifest_is_stored_and_describes_the_file(split_case):
    """manifest.json in the work bucket equals the returned manifest."""
    # Prepare
    class_sizes, _, manifest, store, _ = split_case
    # Execute
    stored = Manifest.from_json(store.read_bytes(BUCKET, layout.manifest_path(JOB)))
    # Assert
    assert stored == manifest
    assert stored.feature_names == ["id", "f1", "f2", "f3", "f4"]
    assert stored.label_column == "label"
    assert stored.classes == [str(c) for c in range(len(class_sizes))]
    assert stored.class_counts == class_sizes
    assert stored.label_kind == "int"
    assert json.loads(manifest.to_json())["shards"][0]["index"] == 0


@pytest.mark.parametrize("buffer_bytes", [1, 200_000], ids=["1-byte", "200kB"])
def test_small_buffer_gives_many_parts_with_identical_contents(tmp_path, buffer_bytes):
    """A small buffer_bytes gives more parts whose concatenation equals the one-part shards."""
    # Prepare: ~1.8 MB sorted by label; max_line_bytes=4096 makes the reader use 1 MB blocks,
    # so every shard receives rows in several blocks
    path = write_sorted_csv(tmp_path / "big.csv", [10_000] * 4)
    options = JobOptions(rows_per_shard=4_000, seed=2)
    limits = Limits(max_line_bytes=4096)
    # Execute
    whole, whole_store = split(path, options, limits=limits)
    tiny, tiny_store = split(path, options, buffer_bytes=buffer_bytes, limits=limits)
    # Assert
    assert [len(s.parts) for s in whole.shards] == [1] * len(whole.shards)
    assert sum(len(s.parts) for s in tiny.shards) > len(tiny.shards)
    assert [s.rows for s in tiny.shards] == [s.rows for s in whole.shards]
    for big, small in zip(shard_arrays(whole_store, whole), shard_arrays(tiny_store, tiny),
                          strict=True):
        np.testing.assert_array_equal(big[0], small[0])
        np.testing.assert_array_equal(big[1], small[1])
    np.testing.assert_array_equal(load_parts(whole_store, BUCKET, whole.holdout_parts)[0],
                                  load_parts(tiny_store, BUCKET, tiny.holdout_parts)[0])
    np.testing.assert_allclose(tiny.mean, whole.mean, rtol=1e-12)
    np.testing.assert_allclose(tiny.variance, whole.variance, rtol=1e-12)


def test_split_is_deterministic_for_a_seed_and_changes_with_it(tmp_path):
    """The same seed gives the same shards; another seed deals differently."""
    # Prepare
    path = write_sorted_csv(tmp_path / "s.csv", [100, 100, 100])
    options = JobOptions(rows_per_shard=30, seed=5)
    # Execute
    first, store1 = split(path, options)
    second, store2 = split(path, options)
    other, store3 = split(path, JobOptions(rows_per_shard=30, seed=6))
    # Assert
    ids1 = [x[:, 0].tolist() for x, _ in shard_arrays(store1, first)]
    ids2 = [x[:, 0].tolist() for x, _ in shard_arrays(store2, second)]
    ids3 = [x[:, 0].tolist() for x, _ in shard_arrays(store3, other)]
    assert ids1 == ids2
    assert ids1 != ids3


def test_constant_feature_gets_unit_variance(tmp_path):
    """A feature constant over the training rows is left unscaled (variance 1)."""
    # Prepare
    rows = [[7, i, i % 2] for i in range(40)]
    path = tmp_path / "const.csv"
    path.write_bytes(csv_bytes(["const", "x", "label"], rows))
    # Execute
    manifest, _ = split(path, JobOptions(rows_per_shard=8))
    # Assert
    assert manifest.mean[0] == pytest.approx(7.0)
    assert manifest.variance[0] == 1.0
    assert manifest.variance[1] > 1.0


def _rows(n, start=0):
    x = np.arange(start, start + n, dtype=np.float32).reshape(n, 1)
    return x, np.zeros(n, dtype=np.int32)


def test_shard_writer_writes_a_shard_as_soon_as_it_is_complete():
    """A complete shard is written at once (memory stays flat), an incomplete one waits."""
    # Prepare
    store = MemoryBlobStore()
    writer = ShardWriter(PartWrites(store, BUCKET, 1 << 30, threads=0), JOB, np.array([3, 5]),
                         buffer_bytes=1 << 30)
    # Execute
    writer.add(1, *_rows(2))
    writer.add(0, *_rows(3, start=10))
    written_after_shard0 = [i.name for i in store.list(BUCKET)]
    writer.add(1, *_rows(3, start=2))
    shards = writer.close()
    # Assert
    assert written_after_shard0 == [layout.shard_part_path(JOB, 0, 0)]
    assert writer.total_bytes == 0
    assert [(s.rows, len(s.parts)) for s in shards] == [(3, 1), (5, 1)]
    x1, _ = load_parts(store, BUCKET, shards[1].parts)
    assert x1[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_shard_writer_evicts_the_largest_buffer_over_budget():
    """Over buffer_bytes, the shard with most bytes buffered is written as a part."""
    # Prepare
    store = MemoryBlobStore()
    row_bytes = 4 + 4  # one float32 feature + one int32 label
    writer = ShardWriter(PartWrites(store, BUCKET, 1 << 30, threads=0), JOB,
                         np.array([100, 100]), buffer_bytes=10 * row_bytes)
    # Execute
    writer.add(0, *_rows(2))
    writer.add(1, *_rows(6))
    written_before = [i.name for i in store.list(BUCKET)]
    writer.add(0, *_rows(3))  # 11 rows buffered > 10: shard 1 (6 rows) is the largest
    written_after = [i.name for i in store.list(BUCKET)]
    # Assert
    assert written_before == []
    assert written_after == [layout.shard_part_path(JOB, 1, 0)]
    assert writer.total_bytes == 5 * row_bytes

