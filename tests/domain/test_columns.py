"""Column kinds: what is kept, what is left out and why; the reference date reader."""

from __future__ import annotations

import math

import pytest

from bucketlearn.domain.columns import (
    CATEGORY,
    DATE,
    DATETIME,
    NUMERIC,
    Column,
    ColumnProfile,
    decide_columns,
    is_matrix,
    parse_date,
    vocabulary,
)


def category(name, counts, missing=0, overflowed=False, batch_distinct=0):
    rows = sum(counts.values()) + missing
    return ColumnProfile(name, CATEGORY, rows=rows, missing=missing, counts=dict(counts),
                         overflowed=overflowed, batch_distinct=batch_distinct)


def numeric(name, rows, low, high, missing=0):
    return ColumnProfile(name, NUMERIC, rows=rows, missing=missing, minimum=low, maximum=high)


def test_identifier_constant_and_empty_columns_are_left_out_with_a_reason():
    profiles = [
        category("id", {f"r{i}": 1 for i in range(100)}),
        category("city", {"a": 60, "b": 40}),
        category("flag", {"Y": 100}),
        numeric("const", 100, 7.0, 7.0),
        numeric("x", 100, 0.0, 3.0),
        ColumnProfile("blank", NUMERIC, rows=100, missing=100),
    ]
    kept, dropped = decide_columns(profiles, max_categories=10, dropped_by_user=["note"])
    assert [c.name for c in kept] == ["city", "x"]
    reasons = {d.name: d.reason for d in dropped}
    assert reasons["note"] == "drop_columns"
    assert reasons["id"].startswith("identifier-like: 100 distinct values in 100 rows")
    assert reasons["flag"] == "constant: every row is 'Y'"
    assert reasons["const"] == "constant: every row is 7"
    assert reasons["blank"] == "empty: all 100 values are missing"


def test_a_complete_numeric_file_is_a_matrix_and_keeps_its_constant_columns():
    """An image's border pixel is constant: in an all-numeric, complete file it keeps its place."""
    profiles = [numeric("p0", 50, 0.0, 0.0), numeric("p1", 50, 0.0, 255.0)]
    kept, dropped = decide_columns(profiles, 10, [])
    assert [c.name for c in kept] == ["p0", "p1"] and not dropped
    assert is_matrix(kept)


def test_a_constant_text_column_with_missing_cells_is_kept():
    """Missing or not is then what the column says."""
    kept, _ = decide_columns([category("flag", {"Y": 50}, missing=50)], 10, [])
    assert kept == [Column("flag", CATEGORY, missing=50, vocabulary=("Y",), distinct=1)]


def test_an_overflowed_count_judges_identifiers_by_batch_distinct_values():
    common = {f"v{i}": 3 for i in range(50)}
    many = category("code", common, overflowed=True, batch_distinct=100)
    unique = category("uid", common, overflowed=True, batch_distinct=150)
    kept, dropped = decide_columns([many, unique], 10, [])
    assert [c.name for c in kept] == ["code"]
    assert dropped[0].reason.startswith("identifier-like: more than 50 distinct values")


def test_the_vocabulary_is_the_most_frequent_values_ties_by_value():
    assert vocabulary({"b": 5, "a": 5, "c": 9, "d": 1}, 3) == ("c", "a", "b")


def test_dates_with_a_time_become_datetime_columns():
    profile = ColumnProfile("when", DATE, rows=10, minimum=1.0, maximum=2.0, has_time=True)
    kept, _ = decide_columns([profile], 10, [])
    assert kept[0].kind == DATETIME and kept[0].width == 8
    assert kept[0].cell_names()[-1] == "when.second"


@pytest.mark.parametrize("text, with_time, cells", [
    ("2024-02-29", False, [2024, 2, 29, 3, 19782]),
    ("1970-01-01T00:00", True, [1970, 1, 1, 3, 0, 0, 0, 0]),
    ("1969-12-31 23:59:59.123+02:00", True, [1969, 12, 31, 2, -1, 23, 59, 59]),
    ("2023-02-29", False, None),
    ("2024-13-01", False, None),
    ("2024-01-01T24:00", True, None),
    ("01/02/2024", False, None),
    ("", False, None),
])
def test_the_reference_date_reader(text, with_time, cells):
    found = parse_date(text, with_time)
    if cells is None:
        assert all(math.isnan(v) for v in found) and len(found) == (8 if with_time else 5)
    else:
        assert found == [float(c) for c in cells]


def test_column_documents_round_trip():
    column = Column("city", CATEGORY, missing=3, vocabulary=("a", "b"), distinct=7)
    assert Column.from_dict(column.to_dict()) == column
