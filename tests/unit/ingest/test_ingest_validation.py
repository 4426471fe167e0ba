"""ingest.split_upload validation: bad files are rejected naming row, column, expected, found."""

from __future__ import annotations

import io
import re
from typing import Any

import numpy as np
import pytest

from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.errors import InvalidInputError, PermanentError
from bucketlearn.ingest import scan
from bucketlearn.ingest.parts import load_parts, read_part
from bucketlearn.ingest.split import split_upload
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.options import JobOptions
from bucketlearn.usecases.train_local import local_source
from tests.unit.helpers import DATA_DIR, csv_bytes, source_from_bytes

BAD = DATA_DIR / "bad"
GOOD = DATA_DIR / "good"
ANY = object()  # the case does not pin this field


def split_file(path, options=None, limits=None):
    store = MemoryBlobStore()
    manifest = split_upload(local_source(str(path)), store, "work", "job-000000000000",
                            options or JobOptions(rows_per_shard=8), limits or Limits())
    return manifest, store


def xfail_bug(reason):
    return pytest.mark.xfail(strict=True, reason=reason)


# (file, options, limits, row, column, message, expected, found)
BAD_CASES = [
    pytest.param(BAD / "empty.csv", {}, {}, None, None, "the file is empty",
                 "a header line and data rows", "0 bytes", id="empty"),
    pytest.param(BAD / "header_only.csv", {}, {}, None, None, "header but no data rows",
                 "at least one data row", "0 rows", id="header-only"),
    pytest.param(BAD / "ragged_row_short.csv", {}, {}, 4, None, "wrong number of fields",
                 "3 fields", "2 fields", id="ragged-short"),
    pytest.param(BAD / "ragged_row_long.csv", {}, {}, 9, None, "wrong number of fields",
                 "3 fields", "4 fields", id="ragged-long"),
    pytest.param(BAD / "non_numeric.csv", {}, {}, 3, "b", "not a number", "a number", "abc",
                 id="non-numeric"),
    pytest.param(BAD / "inf_feature.csv", {}, {}, 7, "b", "not finite", "a finite number",
                 "inf", id="inf"),
    pytest.param(BAD / "nan_feature.csv", {"missing_values": "NA"}, {}, 2, "a", "not finite",
                 "a finite number", "nan", id="nan-not-a-marker"),
    pytest.param(BAD / "empty_label.csv", {}, {}, 6, "label", "the label is empty",
                 "a class label", "an empty value", id="empty-label"),
    pytest.param(BAD / "blank_label.csv", {}, {}, 10, "label", "the label is empty",
                 "a class label", "an empty value", id="blank-label"),
    pytest.param(BAD / "single_class.csv", {}, {}, None, "label", "every row has the same label",
                 "at least two classes", "only '1'", id="single-class"),
    pytest.param(BAD / "duplicate_columns.csv", {}, {}, 0, "a", "duplicate column name",
                 "unique column names", "'a' at columns 1 and 3", id="duplicate-columns"),
    pytest.param(BAD / "unnamed_column.csv", {}, {}, 0, "#2", "a column has no name",
                 "a name for every column", "an empty name", id="unnamed-column"),
    pytest.param(BAD / "single_column.csv", {}, {}, 0, None, "single column",
                 "at least one feature column and a label column", "only 'label'",
                 id="single-column"),
    pytest.param(BAD / "gzip.csv", {}, {}, None, None, "gzip-compressed", "a plain-text CSV",
                 "gzip data", id="gzip"),
    pytest.param(BAD / "binary.csv", {}, {}, None, None, "not text", "a UTF-8 CSV",
                 "binary data (NUL bytes)", id="binary-nul"),
    pytest.param(BAD / "non_utf8_label.csv", {}, {}, 8, "label", "not UTF-8", "UTF-8 text",
                 "byte 0xe9", id="non-utf8-label"),
    pytest.param(GOOD / "plain.csv", {"label_column": "target"}, {}, None, "target",
                 "the label column is missing", "a column named 'target'",
                 "columns a, b, label", id="label-column-missing"),
    pytest.param(BAD / "four_columns.csv", {}, {"max_columns": 3}, 0, None, "too many columns",
                 "at most 3 columns", "4 columns", id="too-many-columns"),
    pytest.param(GOOD / "plain.csv", {}, {"max_file_bytes": 64}, None, None,
                 "larger than the limit", "at most 64 bytes",
                 f"{(GOOD / 'plain.csv').stat().st_size} bytes", id="over-size-limit"),
    pytest.param(BAD / "three_classes.csv", {}, {"max_classes": 2}, None, "label",
                 "too many distinct labels", "at most 2 classes", "more than 2",
                 id="too-many-classes"),
    pytest.param(BAD / "underscore_number.csv", {}, {}, 5, "b", "not a number", "a number",
                 "1_0", id="underscore-number"),
    pytest.param(BAD / "blank_line_then_bad_value.csv", {}, {}, ANY, "b", "not a number",
                 "a number", "abc", id="blank-line-then-bad-value"),
]


@pytest.mark.parametrize("path, options, limits, row, column, message, expected, found",
                         BAD_CASES)
def test_bad_file_is_rejected_naming_row_column_expected_found(path, options, limits, row,
                                                               column, message, expected, found):
    """split_upload raises InvalidInputError whose problem pins the row, column and reason."""
    # Prepare
    job_options = JobOptions(rows_per_shard=8, **options)
    # Execute
    with pytest.raises(InvalidInputError) as excinfo:
        split_file(path, job_options, Limits(**limits))
    # Assert
    problem = excinfo.value.problem
    text = str(excinfo.value)
    if row is not ANY:
        assert problem.row == row
    if column is not ANY:
        assert problem.column == column
    assert message in problem.message
    assert expected in problem.expected
    assert found in problem.found
    assert text.startswith(path.name)
    assert f"expected {problem.expected}" in text
    assert f"found: {problem.found}" in text
    if problem.row is not None:
        assert f"row {problem.row}" in text
    if problem.column is not None:
        assert f"column '{problem.column}'" in text
    assert isinstance(excinfo.value, PermanentError)


def test_non_utf8_label_is_rejected_naming_the_byte():
    """A latin-1 byte in a label is rejected as not UTF-8, naming the byte."""
    # Prepare
    path = BAD / "non_utf8_label.csv"
    # Execute
    with pytest.raises(InvalidInputError) as excinfo:
        split_file(path)
    # Assert
    problem = excinfo.value.problem
    assert "not UTF-8" in problem.message
    assert problem.expected == "UTF-8 text"
    assert problem.found == "byte 0xe9"
    assert problem.row is not None and problem.row >= 1


def test_problem_row_is_exact_deep_in_a_multi_block_file():
    """A bad value far into a file read in several blocks is reported at its exact row."""
    # Prepare
    rows = [[i, i % 7, i % 3] for i in range(40_000)]
    rows[33_333][1] = "oops"
    data = csv_bytes(["id", "x", "label"], rows)
    source = source_from_bytes(data, "deep.csv")
    # Execute
    with pytest.raises(InvalidInputError) as excinfo:
        split_upload(source, MemoryBlobStore(), "work", "job-000000000000",
                     JobOptions(rows_per_shard=1000), Limits(max_line_bytes=1024))
    # Assert
    assert (excinfo.value.problem.row, excinfo.value.problem.column) == (33_334, "x")
    assert excinfo.value.problem.found == "oops"


def test_problem_row_is_exact_for_non_finite_in_a_later_block():
    """An 'inf' in a later block is found in pass 2 at its exact row."""
    # Prepare
    rows = [[i, i % 7, i % 3] for i in range(40_000)]
    rows[39_990][1] = "-inf"
    source = source_from_bytes(csv_bytes(["id", "x", "label"], rows), "deep.csv")
    # Execute
    with pytest.raises(InvalidInputError) as excinfo:
        split_upload(source, MemoryBlobStore(), "work", "job-000000000000",
                     JobOptions(rows_per_shard=1000), Limits(max_line_bytes=1024))
    # Assert
    assert (excinfo.value.problem.row, excinfo.value.problem.column) == (39_991, "x")
    assert excinfo.value.problem.found == "-inf"


GOOD_VARIANTS = ["bom.csv", "crlf.csv", "quoted.csv", "bom_crlf_quoted.csv",
                 "no_final_newline.csv"]


@pytest.fixture(scope="module")
def plain_split():
    return split_file(GOOD / "plain.csv")


@pytest.mark.parametrize("name", GOOD_VARIANTS)
def test_good_spellings_split_exactly_like_plain(name, plain_split):
    """BOM, CRLF, quoting and a missing final newline change nothing about the split."""
    # Prepare
    plain, plain_store = plain_split
    # Execute
    manifest, store = split_file(GOOD / name)
    # Assert
    assert manifest.feature_names == ["a", "b"]  # no '\ufeff' glued to the first name
    assert manifest.label_column == "label"
    assert manifest.classes == ["0", "1"] and manifest.class_counts == [6, 6]
    assert (manifest.rows, manifest.train_rows, manifest.holdout_rows) == (
        plain.rows, plain.train_rows, plain.holdout_rows)
    assert manifest.mean == plain.mean and manifest.variance == plain.variance
    for mine, theirs in zip(manifest.shards, plain.shards, strict=True):
        x1, y1 = load_parts(store, "work", mine.parts)
        x2, y2 = load_parts(plain_store, "work", theirs.parts)
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def test_plain_file_values_are_parsed(plain_split):
    """The plain file's 12 rows arrive as floats with their labels."""
    # Prepare
    manifest, store = plain_split
    # Execute
    parts = [p for s in manifest.shards for p in s.parts] + manifest.holdout_parts
    x, y = load_parts(store, "work", parts)
    # Assert
    order = np.argsort(x[:, 0])
    np.testing.assert_array_equal(x[order, 0], np.arange(1, 13) + 0.5)
    np.testing.assert_array_equal(x[order, 1], np.arange(1, 13) * 2.0)
    np.testing.assert_array_equal(y[order], np.arange(1, 13) % 2)


def _labels_split(labels):
    rows = [[i, i * 0.5, label] for i, label in enumerate(labels)]
    data = csv_bytes(["x1", "x2", "label"], rows)
    store = MemoryBlobStore()
    manifest = split_upload(source_from_bytes(data), store, "work", "job-000000000000",
                            JobOptions(rows_per_shard=8), Limits())
    parts = [p for s in manifest.shards for p in s.parts] + manifest.holdout_parts
    x, y = load_parts(store, "work", parts)
    return manifest, x, y


def test_string_labels_become_sorted_class_names():
    """String labels: classes are the sorted distinct values; y indexes into them."""
    # Prepare
    labels = ["cat", "bird", "dog", "Ant"] * 5
    # Execute
    manifest, x, y = _labels_split(labels)
    # Assert
    assert manifest.classes == ["Ant", "bird", "cat", "dog"]
    assert manifest.label_kind == "str"
    assert manifest.class_counts == [5, 5, 5, 5]
    for row_id, cls in zip(x[:, 0].astype(int), y, strict=True):
        assert manifest.classes[cls] == labels[row_id]


def test_integer_labels_sort_numerically():
    """Integer labels sort as numbers: '10' comes after '9'."""
    # Prepare
    labels = ["10", "9", "2", "100"] * 5
    # Execute
    manifest, x, y = _labels_split(labels)
    # Assert
    assert manifest.classes == ["2", "9", "10", "100"]
    assert manifest.label_kind == "int"
    for row_id, cls in zip(x[:, 0].astype(int), y, strict=True):
        assert manifest.classes[cls] == labels[row_id]


def test_mixed_labels_are_strings():
    """One non-integer label makes every label a string, sorted as text."""
    # Prepare
    labels = ["10", "9", "x"] * 6
    # Execute
    manifest, _, _ = _labels_split(labels)
    # Assert
    assert manifest.label_kind == "str"
    assert manifest.classes == ["10", "9", "x"]


def test_label_column_defaults_to_label_then_last():
    """'label' is the label column wherever it is; without one, the last column is."""
    # Prepare
    with_label = csv_bytes(["label", "x", "y"], [[i % 2, i, i * 2] for i in range(20)])
    without = csv_bytes(["x", "y", "target"], [[i, i * 2, i % 2] for i in range(20)])
    # Execute
    first = split_upload(source_from_bytes(with_label), MemoryBlobStore(), "w", "j",
                         JobOptions(rows_per_shard=8), Limits())
    second = split_upload(source_from_bytes(without), MemoryBlobStore(), "w", "j",
                          JobOptions(rows_per_shard=8), Limits())
    # Assert
    assert (first.label_column, first.feature_names) == ("label", ["x", "y"])
    assert (second.label_column, second.feature_names) == ("target", ["x", "y"])


def _changing_source(first, second, from_open=4):
    """A SourceFile whose opens from ``from_open`` on (pass 2; the header, the kinds' first
    block and pass 1 come before) read ``second``, not ``first``: what an unpinned reader of a
    re-uploaded object sees."""
    from bucketlearn.ingest.stream import SourceFile

    opens = []

    def opener():
        opens.append(1)
        return io.BytesIO(second if len(opens) >= from_open else first)

    return SourceFile(display_name="changing.csv", size=len(first), opener=opener)


FIRST = csv_bytes(["x", "label"], [[i, ["a", "b"][i % 2]] for i in range(40)])


@pytest.mark.parametrize("second, row, found", [
    (csv_bytes(["x", "label"], [[i, ["a", "b", "c"][i % 3]] for i in range(40)]), 3,
     "label 'c', which the first pass did not see"),
    (csv_bytes(["x", "label"], [[i, "a" if i < 30 else "b"] for i in range(40)]), 21,
     "more than the 20 rows of class 'a' the first pass counted"),
    (csv_bytes(["x", "label"], [[i, ["a", "b"][i % 2]] for i in range(30)]), None,
     "15 rows of class 'a' where the first pass counted 20"),
], ids=["new-label", "more-rows-of-a-class", "fewer-rows-of-a-class"])
def test_a_pass_that_reads_another_file_is_a_clear_problem(second, row, found):
    """Pass 2 meeting a label, or class counts, pass 1 did not: an
    InvalidInputError naming row and column, never a KeyError or silently skewed shards."""
    # Prepare
    source = _changing_source(FIRST, second)
    # Execute (pass 2 reads the file again: an upload too large to keep pass 1's batches)
    with pytest.raises(InvalidInputError) as excinfo:
        split_upload(source, MemoryBlobStore(), "work", "job-000000000000",
                     JobOptions(rows_per_shard=8), Limits(keep_parsed_bytes=0))
    # Assert
    problem = excinfo.value.problem
    assert problem.message == "the file changed while it was being read"
    assert (problem.row, problem.column) == (row, "label")
    assert problem.found == found
    assert "the same rows in both passes" in problem.expected


def test_an_empty_feature_cell_is_missing_not_a_rejection():
    """The empty cell at row 5 of column 'a' (a REJECTED file before) is a missing
    value: the job trains, the cell is NaN in its part and the model imputes it."""
    manifest, store = split_file(GOOD / "missing_cell.csv")
    assert [c.missing for c in manifest.schema] == [1, 0]
    parts = [p for s in manifest.shards for p in s.parts] + manifest.holdout_parts
    x, _ = load_parts(store, "work", parts)
    assert np.isnan(x).sum() == 1 and np.isnan(x[:, 0]).sum() == 1


# --- the deployment's limits on one upload's cost ----------------------------------------------

def _counting_source(data, name):
    """A source from memory that counts how often it is opened (once per pass, and the header)."""
    opened = []

    def opener():
        opened.append(1)
        return io.BytesIO(data)

    return SourceFile(display_name=name, size=len(data), opener=opener), opened


def _wide_table(rows=600, columns=64):
    header = [f"f{j}" for j in range(columns)] + ["label"]
    return csv_bytes(header, [[(i * (j + 3)) % 101 for j in range(columns)] + [i % 3]
                              for i in range(rows)])


def test_a_shard_over_the_memory_budget_is_refused_before_any_shard_is_written():
    """Item 5: rows_per_shard=1,000,000 on a 64-column table puts all its training rows in one
    shard. With max_shard_bytes one byte under that shard's arrays the split stops before pass
    2 (one read fewer, nothing written), naming rows × (cells + label) × 4 bytes, the limit and
    what fits; exactly at the limit it splits as with the default limits."""
    # Prepare
    data = _wide_table()
    options = JobOptions(rows_per_shard=1_000_000)
    full, full_opens = _counting_source(data, "wide.csv")
    manifest = split_upload(full, MemoryBlobStore(), "work", "job-000000000000", options,
                            Limits(keep_parsed_bytes=0))  # pass 2 reads the file again
    rows = max(s.rows for s in manifest.shards)
    size = rows * (64 + 1) * 4
    source, opens = _counting_source(data, "wide.csv")
    store = MemoryBlobStore()
    # Execute
    with pytest.raises(InvalidInputError) as excinfo:
        split_upload(source, store, "work", "job-000000000000", options,
                     Limits(max_shard_bytes=size - 1))
    at_limit = split_upload(source_from_bytes(data, "wide.csv"), MemoryBlobStore(), "work",
                            "job-000000000000", options, Limits(max_shard_bytes=size))
    # Assert
    problem = excinfo.value.problem
    assert len(manifest.shards) == 1 and rows == manifest.train_rows
    assert problem.message == "a shard would not fit in a learner's memory"
    assert problem.found == (f"rows_per_shard=1,000,000 gives shards of up to {rows} rows × "
                             f"(64 matrix cells + 1 label) × 4 bytes = {size:,} bytes")
    assert problem.expected.startswith(f"shards of at most {size - 1:,} bytes (the "
                                       "deployment's max_shard_bytes): a smaller rows_per_shard "
                                       f"(shards of at most {rows - 1} rows fit)")
    assert len(opens) == len(full_opens) - 1  # pass 2 never read the file
    assert list(store.list("work")) == []
    assert at_limit.to_json() == manifest.to_json()


def _text_table(rows=20_000, columns=8):
    """A numeric feature and ``columns`` text columns with a new value in every row."""
    header = ["x"] + [f"t{j}" for j in range(columns)] + ["label"]
    return csv_bytes(header, [[i % 13] + [f"t{j}-{i}" for j in range(columns)] + [i % 2]
                              for i in range(rows)])


def test_text_values_counted_across_columns_are_bounded_during_the_first_pass():
    """Item 6: 8 text columns with a new value in every row hold 160,000 values by the end of
    20,000 rows, each column under its own bound of 20,000 (no rejection without the overall
    one: they are left out as identifier-like). With max_counted_values=20,000 pass 1 stops at
    the batch that passes the bound, long before the end of the file, holding at most one
    batch more than the bound, and says which bound, which columns and what to do."""
    # Prepare
    data = _text_table()
    batches = []
    # Execute
    with pytest.raises(InvalidInputError) as excinfo:
        split_upload(source_from_bytes(data, "texts.csv"), MemoryBlobStore(), "work",
                     "job-000000000000", JobOptions(rows_per_shard=256),
                     Limits(max_line_bytes=1024, max_counted_values=20_000),
                     read_block_bytes=64 * 1024, progress=lambda: batches.append(1))
    # Assert
    problem = excinfo.value.problem
    assert "the bound on all text columns together was reached" in problem.message
    assert "(not the one per column)" in problem.message
    assert problem.expected.startswith("at most 20,000 distinct values counted across all text "
                                       "columns at once (the deployment's max_counted_values")
    assert "drop_columns" in problem.expected and "column_kinds" in problem.expected
    found = re.fullmatch(r"([\d,]+) distinct values by row ([\d,]+), held for (\d) of the "
                         r"file's 8 text columns: 't0' \([\d,]+\), .* and \d more",
                         problem.found)
    assert found, problem.found
    held, row = int(found[1].replace(",", "")), int(found[2].replace(",", ""))
    assert 20_000 < held <= 20_000 + row // len(batches)  # the bound and one batch's values
    assert row < 5_000 and len(batches) <= 6  # of 20,000 rows in about 30 batches


def test_leaving_text_columns_out_brings_the_count_within_the_bound():
    """Item 6's advice works: the same file with 7 of its text columns in drop_columns splits
    under max_counted_values=20,000 (the one left is identifier-like and left out)."""
    # Prepare
    options = JobOptions(rows_per_shard=256, drop_columns="t1,t2,t3,t4,t5,t6,t7")
    # Execute
    manifest = split_upload(source_from_bytes(_text_table(), "texts.csv"), MemoryBlobStore(),
                            "work", "job-000000000000", options,
                            Limits(max_line_bytes=1024, max_counted_values=20_000),
                            read_block_bytes=64 * 1024)
    # Assert
    assert manifest.feature_names == ["x"]
    assert [d["name"] for d in manifest.dropped][-1] == "t0"


def _mixed_table(rows: int = 2400, text_from: int = 0) -> bytes:
    """Numbers, a text column (empty until row ``text_from``), a date, an empty cell now and
    then, an id column, a label."""
    cities = ["oslo", "rome", "lima", "kyiv"]
    return csv_bytes(["n", "city", "day", "id", "label"], [
        [(i * 7) % 31 if i % 13 else "", cities[i % 4] if i >= text_from else "",
         f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}", f"r{i}", ["a", "b", "c"][i % 3]]
        for i in range(rows)])


def _long_row_table() -> bytes:
    """A row of 40 kB deep in the file: with 16 KiB blocks pass 1 starts again, larger."""
    rows = [[(i * 3) % 17, (i * 5) % 23, i % 2] for i in range(2000)]
    rows[1500][0] = "0" * 40_000 + "7"
    return csv_bytes(["a", "b", "label"], rows)


def _target_table() -> bytes:
    return csv_bytes(["a", "b", "y"], [[i % 17, (i * 5) % 23, round(0.5 * (i % 17) - (i % 23), 2)]
                                      for i in range(2000)])


WIDE = _wide_table()


@pytest.fixture
def kept_batches(monkeypatch) -> list[scan.ParsedBatches]:
    """Every ``ParsedBatches`` the splits of the test make, in order."""
    made: list[scan.ParsedBatches] = []

    class Spied(scan.ParsedBatches):
        def __init__(self, max_bytes):
            super().__init__(max_bytes)
            made.append(self)

    monkeypatch.setattr(scan, "ParsedBatches", Spied)
    return made


@pytest.mark.parametrize("data, options, block", [
    (WIDE, JobOptions(rows_per_shard=64), None),
    (_mixed_table(), JobOptions(rows_per_shard=64, drop_columns="id"), None),
    # 'city' is empty in the first 16 KiB block: read as numbers, then again as text
    (_mixed_table(text_from=1500), JobOptions(rows_per_shard=64), 16 * 1024),
    (_long_row_table(), JobOptions(rows_per_shard=64), 16 * 1024),
    (_target_table(), JobOptions(rows_per_shard=64, task="regression"), None),
], ids=["numbers", "text-date-dropped", "restart-kind", "restart-block", "numeric-target"])
def test_pass_2_takes_pass_1s_batches_when_they_fit_and_splits_the_same(data, options, block,
                                                                        kept_batches):
    """An upload whose parsed batches fit ``keep_parsed_bytes`` is read once (header, kinds,
    pass 1) and split exactly as when pass 2 reads it again: the same manifest, the same parts'
    bytes; also when pass 1 started again (a longer row than the block, a column that turned
    out to be text), for text, date and dropped columns and a numeric target, and when the
    batches only fit held compact (a bound one byte under them as parsed: each of these
    tables is then still read once). One whose batches overflow the bound even compact
    is read again, with the same result."""
    # Prepare
    read_block = {"read_block_bytes": block} if block else {}

    def split(keep: int) -> tuple[Any, MemoryBlobStore, int, Any]:
        source, opens = _counting_source(data, "table.csv")
        store = MemoryBlobStore()
        manifest = split_upload(source, store, "work", "job-000000000000", options,
                                Limits(max_line_bytes=64 * 1024, keep_parsed_bytes=keep),
                                **read_block)
        return manifest, store, len(opens), (kept_batches[-1] if keep else None)

    # Execute
    again, again_store, again_opens, _ = split(0)
    kept, kept_store, kept_opens, as_parsed = split(1 << 30)
    compact, compact_store, compact_opens, compacted = split(as_parsed.bytes - 1)
    overflowed, _, overflowed_opens, _ = split(len(data) // 8)
    # Assert
    assert kept_opens == again_opens - 1
    assert kept.to_json() == again.to_json() == compact.to_json() == overflowed.to_json()
    assert as_parsed.compactor is None and compacted.compactor is not None
    assert overflowed_opens == again_opens
    assert compact_opens == kept_opens and not compacted.overflowed
    parts = [p for s in again.shards for p in s.parts] + again.holdout_parts
    assert len(parts) > 5
    for store in (kept_store, compact_store):
        assert all(read_part(store, "work", p) == read_part(again_store, "work", p)
                   for p in parts)


def test_an_upload_over_four_times_the_bound_is_read_twice_without_keeping_anything(
        kept_batches):
    """Held compact a cell takes a byte at least, so an upload more than ``KEEP_FILE_RATIO``
    (4) times the bound is not kept at all: pass 1 holds nothing, pass 2 reads it again; at
    four times exactly it is tried (and overflows: 64 columns of two- and three-digit numbers
    hold in more than a quarter of their CSV)."""
    # Prepare
    opened = []
    # Execute
    for keep in (len(WIDE) // 4 - 1, -(-len(WIDE) // 4)):
        source, opens = _counting_source(WIDE, "wide.csv")
        split_upload(source, MemoryBlobStore(), "work", "job-000000000000",
                     JobOptions(rows_per_shard=64), Limits(keep_parsed_bytes=keep))
        opened.append(len(opens))
    # Assert
    assert [kept.max_bytes for kept in kept_batches] == [-(-len(WIDE) // 4)]
    assert opened[0] == opened[1]  # read twice either way


def test_the_deployments_bound_decides_whether_an_upload_is_parsed_once():
    """``Limits.keep_parsed_bytes`` (``BUCKETLEARN_KEEP_PARSED_BYTES``) is the bound a split
    keeps pass 1's batches within unless it is given one (0 reads the upload twice), read
    from the environment."""
    opened = []
    for limits in (Limits(), Limits(keep_parsed_bytes=0)):
        source, opens = _counting_source(WIDE, "wide.csv")
        split_upload(source, MemoryBlobStore(), "work", "job-000000000000",
                     JobOptions(rows_per_shard=64), limits)
        opened.append(len(opens))
    assert opened[1] == opened[0] + 1
    assert load_limits_keep({"BUCKETLEARN_KEEP_PARSED_BYTES": "805306368"}) == 768 * 1024**2


def load_limits_keep(environ: dict[str, str]) -> int:
    from bucketlearn.config import load_settings

    return load_settings(environ).limits.keep_parsed_bytes
