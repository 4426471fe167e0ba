"""Which columns a job's model relies on: permutation importance (Breiman 2001; scikit-learn's
``permutation_importance``) of each original CSV column on a sample of the holdout. Pure: the
columns' spans, the bounds and the ranking; the model's scoring is ``ml.importance``'s.

A column's importance is how much the model's holdout figure (accuracy, or R² for a numeric
target) falls when that column's cells are shuffled across the sample's rows, breaking its link
with the label while keeping its values: the mean fall over ``REPEATS`` seeded shuffles. A text
or date column is shuffled as one (all its cells together), so the figure is of the column the
user uploaded, not of its encoding. Near zero (or below: noise) means the model does not use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bucketlearn.domain.columns import Column

MAX_COLUMNS = 200  # beyond this many columns (an image's pixels) nothing is computed
SAMPLE_ROWS = 2000  # holdout rows scored, at most
REPEATS = 3  # shuffles a column, averaged


@dataclass(frozen=True)
class Span:
    """An original column and the cells of the model's input matrix that encode it."""

    name: str
    start: int
    width: int


def spans(schema: Sequence[Column]) -> list[Span]:
    """Each column of ``schema`` (the manifest's, in matrix order) and its cells."""
    found, at = [], 0
    for column in schema:
        found.append(Span(column.name, at, column.width))
        at += column.width
    return found


def skipped(columns: int) -> str | None:
    """Why no importance is computed for a model of ``columns`` columns (None: it is)."""
    if columns > MAX_COLUMNS:
        return (f"not computed: {columns:,} columns (at most {MAX_COLUMNS} are ranked; "
                "an image's pixels are not columns a user reads)")
    return None


def ranked(baseline: float, permuted: Mapping[str, Sequence[float]], metric: str,
           rows: int) -> dict[str, Any]:
    """The job document's ``feature_importance``: the columns, most important first (the
    mean fall of ``metric`` from ``baseline`` over each column's shuffles; columns of equal
    importance in their CSV order), with what was measured on how many rows."""
    order = {name: i for i, name in enumerate(permuted)}
    columns = [{"column": name, "importance": round(baseline - sum(s) / len(s), 6)}
               for name, s in permuted.items() if s]
    columns.sort(key=lambda c: (-c["importance"], order[c["column"]]))
    return {"columns": columns, "metric": metric, "baseline": round(baseline, 6),
            "rows": rows, "repeats": max((len(s) for s in permuted.values()), default=0)}
