"""Permutation importance's pure parts (``domain.importance``): the columns' cells, the bound,
the ranking."""

from __future__ import annotations

from bucketlearn.domain import importance
from bucketlearn.domain.columns import CATEGORY, NUMERIC, Column


def test_each_column_spans_its_cells_in_matrix_order() -> None:
    # Prepare: a numeric column (1 cell) and a text column (its code: 1 cell; widths from Column)
    schema = [Column("age", NUMERIC), Column("island", CATEGORY, vocabulary=("a", "b")),
              Column("mass", NUMERIC)]
    # Execute
    found = importance.spans(schema)
    # Assert
    assert [s.name for s in found] == ["age", "island", "mass"]
    assert [s.start for s in found] == [0, schema[0].width, schema[0].width + schema[1].width]
    assert [s.width for s in found] == [c.width for c in schema]


def test_too_many_columns_are_not_ranked_and_say_why() -> None:
    assert importance.skipped(importance.MAX_COLUMNS) is None
    reason = importance.skipped(2352)
    assert reason is not None and "2,352 columns" in reason


def test_columns_are_ranked_by_their_mean_fall_ties_in_csv_order() -> None:
    # Execute
    found = importance.ranked(0.9, {"a": [0.9, 0.9], "b": [0.5, 0.7], "c": [0.92, 0.88],
                                    "d": [0.95, 0.95]}, "accuracy", 100)
    # Assert
    assert [c["column"] for c in found["columns"]] == ["b", "a", "c", "d"]
    assert found["columns"][0]["importance"] == 0.3
    assert found["columns"][-1]["importance"] == -0.05
    assert (found["metric"], found["baseline"], found["rows"], found["repeats"]) == (
        "accuracy", 0.9, 100, 2)
