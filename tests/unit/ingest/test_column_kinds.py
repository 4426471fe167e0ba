"""Ingest of tables with text, dates and missing cells: kinds, codes, what is left
out, and the problems that still reject a file naming row and column."""

from __future__ import annotations

import numpy as np
import pytest

from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.domain.columns import CATEGORY, DATETIME, NUMERIC, ColumnProfile
from bucketlearn.errors import InvalidInputError
from bucketlearn.ingest import columns as ingest_columns
from bucketlearn.ingest.parts import load_parts
from bucketlearn.ingest.split import split_upload
from bucketlearn.options import JobOptions
from tests.unit.helpers import (
    MIXED_HEADER,
    csv_bytes,
    mixed_rows,
    random_date_strings,
    source_from_bytes,
)


def split(data: bytes, block: int | None = None, **options):
    store = MemoryBlobStore()
    kwargs = {"read_block_bytes": block} if block else {}
    manifest = split_upload(source_from_bytes(data), store, "work", "job-000000000000",
                            JobOptions(rows_per_shard=64, **options), Limits(), **kwargs)
    return manifest, store


def all_rows(manifest, store):
    parts = ([p for s in manifest.shards for p in s.parts] + manifest.holdout_parts
             + manifest.validation_parts)
    return load_parts(store, "work", parts)


def test_a_mixed_table_is_read_with_a_kind_per_column_and_notes_for_what_is_left_out():
    manifest, store = split(csv_bytes(MIXED_HEADER, mixed_rows(500)))
    kinds = {c.name: c.kind for c in manifest.schema}
    assert kinds == {"city": CATEGORY, "payment": CATEGORY, "distance": NUMERIC,
                     "fare": NUMERIC, "start": DATETIME}
    dropped = {d["name"]: d["reason"] for d in manifest.dropped}
    assert dropped["trip_id"].startswith("identifier-like")
    assert dropped["flag"] == "constant: every row is 'Y'"
    assert manifest.width == 1 + 1 + 1 + 1 + 8
    summary = manifest.summary()["columns"]
    assert summary["kinds"] == {"category": 2, "numeric": 2, "datetime": 1}
    x, _ = all_rows(manifest, store)
    assert x.shape == (500, 12)
    distance = x[:, 2]
    assert np.isnan(distance).sum() == next(c.missing for c in manifest.schema
                                            if c.name == "distance") > 0


def test_category_codes_say_unseen_missing_or_which_word():
    words = ["a"] * 30 + ["b"] * 20 + ["c"] * 10 + ["NA"] * 6
    rows = [[word, i % 2] for i, word in enumerate(words)]
    manifest, store = split(csv_bytes(["kind", "label"], rows), max_categories=2)
    assert manifest.schema[0].vocabulary == ("a", "b")  # the two most frequent
    x, _ = all_rows(manifest, store)
    codes = dict(zip(*np.unique(x[:, 0], return_counts=True), strict=True))
    assert codes == {0.0: 10, 1.0: 6, 2.0: 30, 3.0: 20}  # c (outside the cap), missing, a, b


def test_text_after_a_first_block_of_empty_cells_makes_the_column_text():
    """The column's first block is all missing (read as numeric); text later restarts pass 1
    with the column read as text instead of rejecting the file."""
    rows = [[f"{i}.5", "" if i < 300 else ["red", "blue"][i % 2], i % 2] for i in range(400)]
    manifest, _ = split(csv_bytes(["x", "colour", "label"], rows), block=1024)
    assert {c.name: c.kind for c in manifest.schema} == {"x": NUMERIC, "colour": CATEGORY}


def test_a_word_in_a_numeric_column_is_rejected_naming_row_and_column():
    rows = [[f"{i}.5", i % 2] for i in range(300)]
    rows[250][0] = "twelve"
    with pytest.raises(InvalidInputError) as excinfo:
        split(csv_bytes(["x", "label"], rows), block=1024)
    problem = excinfo.value.problem
    assert (problem.row, problem.column, problem.found) == (251, "x", "twelve")
    assert "missing_values" in problem.expected and "drop_columns" in problem.expected


def test_a_bad_date_is_rejected_naming_row_and_column():
    rows = [[f"2024-01-{1 + i % 28:02d}", i % 2] for i in range(100)]
    rows[70][0] = "31/01/2024"
    with pytest.raises(InvalidInputError) as excinfo:
        split(csv_bytes(["day", "label"], rows))
    problem = excinfo.value.problem
    assert (problem.row, problem.column, problem.found) == (71, "day", "'31/01/2024'")
    assert "ISO date" in problem.expected


def test_missing_values_and_drop_columns_options():
    rows = [[f"{i}", "-" if i % 7 == 0 else f"{i % 5}", "junk", i % 2] for i in range(80)]
    manifest, store = split(csv_bytes(["a", "b", "note", "label"], rows),
                            missing_values="-", drop_columns="note")
    assert [c.name for c in manifest.schema] == ["a", "b"]
    assert {"name": "note", "reason": "drop_columns"} in manifest.dropped
    x, _ = all_rows(manifest, store)
    assert np.isnan(x[:, 1]).sum() == 12


def test_drop_columns_naming_no_column_is_rejected():
    with pytest.raises(InvalidInputError) as excinfo:
        split(csv_bytes(["a", "label"], [[i, i % 2] for i in range(20)]), drop_columns="b")
    assert excinfo.value.problem.column == "b"
    assert "feature columns of the file: a" in excinfo.value.problem.expected


def test_training_statistics_skip_missing_cells():
    rows = [["" if i % 4 == 0 else str(i % 8), i % 2] for i in range(400)]
    manifest, store = split(csv_bytes(["a", "label"], rows))
    x, _ = all_rows(manifest, store)
    train = np.concatenate([load_parts(store, "work", s.parts)[0] for s in manifest.shards])
    present = train[~np.isnan(train[:, 0]), 0]
    assert manifest.mean[0] == pytest.approx(float(present.mean()))
    assert manifest.variance[0] == pytest.approx(float(present.var()))
    assert np.isnan(x).any()


def test_a_complete_numeric_file_is_split_as_before():
    """No missing cell, no text: the matrix and its statistics are those of the plain path."""
    rows = [[f"{i * 0.37:.2f}", "0", i % 3] for i in range(90)]
    manifest, store = split(csv_bytes(["a", "zero", "label"], rows))
    assert [c.name for c in manifest.schema] == ["a", "zero"] and not manifest.dropped
    x, _ = all_rows(manifest, store)
    assert not np.isnan(x).any() and manifest.variance[1] == 1.0


def test_counting_a_text_column_stays_bounded():
    """A column with a new value in every row: the counts never hold more than the bound."""
    import pyarrow as pa

    profile = ColumnProfile("id", CATEGORY)
    largest = 0
    for start in range(0, 5000, 250):
        values = pa.array([f"v{i}" for i in range(start, start + 250)])
        ingest_columns.profile_batch(profile, values, ["NA"], bound=100)
        largest = max(largest, profile.tally.num_rows)
    ingest_columns.finish_profile(profile)
    assert largest <= 100 and profile.overflowed and len(profile.counts) == 50
    assert profile.batch_distinct == 5000 and profile.present == 5000


def test_status_and_dashboard_name_the_kinds_and_what_was_left_out():
    from bucketlearn.domain.job import Job
    from bucketlearn.entrypoints.cli.printing import columns_lines
    from bucketlearn.usecases.status import status_object
    from bucketlearn.views import options_data

    manifest, _ = split(csv_bytes(MIXED_HEADER, mixed_rows(200)))
    job = Job("j", status="RUNNING", phase="training", dataset=manifest.summary())
    status = status_object(job)
    assert status["columns"]["kinds"]["category"] == 2
    lines = columns_lines(status)
    assert lines[0] == "columns:   2 category, 1 datetime, 2 numeric"
    assert any(line.startswith("left out:  trip_id: identifier-like") for line in lines)
    rows = {r["column"]: r for r in options_data.column_rows(job)}
    assert rows["city"]["kind"] == "category" and rows["city"]["note"].startswith("5 categories")
    assert rows["flag"]["kind"] == "left out" and rows["flag"]["note"].startswith("constant")
    assert options_data.dataset_facts(job)["feature kinds"] == "2 category, 1 datetime, 2 numeric"


@pytest.mark.parametrize("with_time", [False, True])
def test_the_vectorized_date_encoder_reads_as_the_reference_does(with_time):
    """Ingest's pyarrow/numpy date reader against ``parse_date``, on valid dates and near misses
    (bad days, hours, separators, truncations, non-ASCII digits, line breaks)."""
    import pyarrow as pa

    from bucketlearn.domain.columns import parse_date

    texts = random_date_strings(20000, seed=1)
    found = ingest_columns.encode_dates(pa.array(texts), with_time)
    expected = np.array([parse_date(t, with_time) for t in texts], dtype=np.float32)
    assert np.isfinite(expected[:, 0]).sum() > 2000
    np.testing.assert_array_equal(found, expected)


def test_a_date_column_constant_within_each_batch_but_not_across_them_is_kept():
    """Each read batch holds one timestamp, but not the same one: the column varies."""
    rows = [["2024-01-01T10:00" if i < 300 else "2024-01-01T11:00", i % 2] for i in range(600)]
    manifest, _ = split(csv_bytes(["when", "label"], rows), block=1024)
    assert [c.name for c in manifest.schema] == ["when"] and not manifest.dropped


def test_column_kinds_reads_a_code_of_digits_as_text():
    # Prepare: zip codes look like numbers; as numbers 60614 > 10001 would mean something
    zips = ["60614", "10001", "94103", "02139"]
    rows = [[zips[i % 4], i % 7 / 7, i % 2] for i in range(200)]
    data = csv_bytes(["zip", "amount", "label"], rows)
    # Execute
    detected, _ = split(data)
    forced, store = split(data, column_kinds="zip = Category")
    # Assert
    assert {c.name: c.kind for c in detected.schema} == {"zip": NUMERIC, "amount": NUMERIC}
    zip_column = forced.schema[0]
    assert (zip_column.name, zip_column.kind) == ("zip", CATEGORY)
    assert sorted(zip_column.vocabulary) == sorted(zips)  # "02139" kept as written
    x, _ = all_rows(forced, store)
    assert set(np.unique(x[:, 0])) <= set(range(2, 6))  # word codes, not the numbers


def test_column_kinds_numeric_on_text_rejects_the_file_naming_row_and_column():
    rows = [["2024-01-02" if i else "2024-01-01", i % 2] for i in range(40)]
    with pytest.raises(InvalidInputError) as caught:
        split(csv_bytes(["when", "label"], rows), column_kinds="when=numeric")
    assert "row 1, column 'when'" in str(caught.value)


@pytest.mark.parametrize("named", ["nope", "label", "gone"])
def test_column_kinds_naming_no_feature_column_is_rejected(named):
    rows = [[i % 3, i % 5, i % 2] for i in range(40)]
    with pytest.raises(InvalidInputError) as caught:
        split(csv_bytes(["gone", "kept", "label"], rows), drop_columns="gone",
              column_kinds=f"{named}=category")
    text = str(caught.value)
    assert f"column '{named}'" in text and "column_kinds" in text
    assert "expected feature columns of the file: kept" in text


def test_numeric_columns_profiled_at_once_read_as_one_by_one():
    """A wide block of complete numbers is profiled in one numpy pass; a block with a missing
    cell or a NaN goes column by column. Both give the profiles ``profile_batch`` gives."""
    import pyarrow as pa

    rng = np.random.default_rng(3)
    blocks = [rng.normal(size=(50, 4)).astype(np.float32) for _ in range(3)]
    blocks[1][7, 2] = np.nan
    batches = [pa.RecordBatch.from_arrays([pa.array(b[:, j]) for j in range(4)],
                                          names=list("abcd")) for b in blocks]
    batches.append(pa.RecordBatch.from_arrays(
        [pa.array([1.0, None], pa.float32()), *(pa.array([2.0, 3.0], pa.float32()),) * 3],
        names=list("abcd")))
    fast = [ColumnProfile(n, NUMERIC) for n in "abcd"]
    slow = [ColumnProfile(n, NUMERIC) for n in "abcd"]
    handled = 0
    for batch in batches:
        left = ingest_columns.profile_complete_numbers(fast, batch)
        handled += len(left) == 0
        for profile in left:
            ingest_columns.profile_batch(profile, batch.column(profile.name), [])
        for profile in slow:
            ingest_columns.profile_batch(profile, batch.column(profile.name), [])
    assert handled == 2  # the NaN block and the block with a missing cell went one by one
    assert [(p.rows, p.missing, p.minimum, p.maximum) for p in fast] == \
        [(p.rows, p.missing, p.minimum, p.maximum) for p in slow]


def test_numeric_block_is_the_columns_one_by_one_with_missing_cells_as_nan():
    """The block of numeric columns made in one Arrow call holds what converting each column
    gives (a missing cell NaN, an integer column as float32), in either memory order; a
    column Arrow will not convert falls back to one by one, and fails there as before."""
    import pyarrow as pa

    batch = pa.RecordBatch.from_arrays(
        [pa.array([1.5, None, 3.0], pa.float32()), pa.array([4, 5, 6], pa.int64()),
         pa.array([7.25, 8.0, None], pa.float32()), pa.array(["x", "y", "z"])],
        names=["a", "b", "c", "text"])
    expected = np.array([[1.5, 4, 7.25], [np.nan, 5, 8.0], [3.0, 6, np.nan]], np.float32)
    for row_major in (True, False):
        block = ingest_columns.numeric_block(batch, ["a", "b", "c"], row_major=row_major)
        assert block.dtype == np.float32 and block.shape == (3, 3)
        np.testing.assert_array_equal(block, expected)
        assert block.flags.c_contiguous == row_major
    np.testing.assert_array_equal(ingest_columns.numeric_block(batch, ["c", "a"]),
                                  expected[:, [2, 0]])
    with pytest.raises(pa.ArrowException):
        ingest_columns.numeric_block(batch, ["a", "text"])


def test_encoder_places_numbers_between_other_kinds_as_column_by_column():
    """A schema mixing numbers and categories: the numbers go to their own columns of the
    matrix (made in one call), the category codes to theirs."""
    import pyarrow as pa

    from bucketlearn.domain.columns import Column

    columns = [Column("n1", NUMERIC), Column("kind", CATEGORY, vocabulary=("a", "b")),
               Column("n2", NUMERIC)]
    encoder = ingest_columns.Encoder(columns, [])
    batch = pa.RecordBatch.from_arrays(
        [pa.array([1.0, None], pa.float32()), pa.array(["b", "zzz"]),
         pa.array([2.0, 3.0], pa.float32())], names=["n1", "kind", "n2"])
    out = encoder.encode(batch)
    codes = encoder._codes(batch.column("kind"), "kind")
    np.testing.assert_array_equal(out[:, 0], [1.0, np.nan])
    np.testing.assert_array_equal(out[:, 1], codes)
    np.testing.assert_array_equal(out[:, 2], [2.0, 3.0])
    only_numbers = ingest_columns.Encoder([columns[0], columns[2]], [])
    np.testing.assert_array_equal(only_numbers.encode(batch), out[:, [0, 2]])
