"""Feature columns of any common kind: what each column is, and what is left out and why.

Pure rules, no I/O. Ingest profiles every feature column in its first pass (``ColumnProfile``,
filled by ``bucketlearn.ingest.columns``) and ``decide_columns`` turns the profiles into the job's
schema: a list of ``Column`` kept in CSV order and a list of ``Dropped`` with a reason each.

Each kept column becomes a block of cells in the float32 matrix that shards hold:

==========  =====  ==================================================================
kind        cells  content
==========  =====  ==================================================================
numeric     1      the value; NaN where the cell is empty or a missing marker
category    1      a code: 0 a value outside the vocabulary, 1 missing, 2.. vocabulary
date        5      year, month, day, day of week (Monday 0), days since 1970-01-01
datetime    8      the date's 5, then hour, minute, second (wall clock as written)
==========  =====  ==================================================================

Dates are ISO 8601 (``YYYY-MM-DD``, optionally ``T`` or a space and ``HH:MM[:SS]``, then
fractions or a time-zone offset, which are ignored); an invalid date reads as missing (NaN).
The model imputes, scales and encodes these blocks (``bucketlearn.ml.tabular``); the exported
model parses the raw strings into the same blocks (``parse_date`` is the reference both
implement).
"""

from __future__ import annotations

import calendar
import datetime as dt
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

NUMERIC, CATEGORY, DATE, DATETIME = "numeric", "category", "date", "datetime"
# the kinds the ``column_kinds`` option can give a column (date or datetime follows its values)
FORCEABLE_KINDS = (NUMERIC, CATEGORY, DATE)
WIDTH = {NUMERIC: 1, CATEGORY: 1, DATE: 5, DATETIME: 8}
DATE_PARTS = ("year", "month", "day", "weekday", "days")
TIME_PARTS = ("hour", "minute", "second")

# The markers an upload reads as a missing cell unless the missing_values option says otherwise;
# an empty cell is always missing.
DEFAULT_MISSING_VALUES = ("NA", "N/A", "NaN", "nan", "null", "NULL", "None", "?")

OOV_CODE, MISSING_CODE, FIRST_WORD_CODE = 0, 1, 2

# A decimal number without its sign, as pyarrow's float parser reads one: the patterns of a
# numeric cell (ingest), of a column's kind (sniffing) and of a numeric target are built on it.
UNSIGNED_DECIMAL = r"(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?"

# A category column whose values are distinct in more than this share of its non-missing rows
# (and in more than IDENTIFIER_MIN_ROWS rows) is identifier-like: it names rows, it does not
# describe them, so nothing learned from it carries over to a new row.
IDENTIFIER_SHARE = 0.9
IDENTIFIER_MIN_ROWS = 20

# What ingest accepts as a date or timestamp when it decides a column's kind (stricter than
# what parse_date reads: a column is a date column only when every value is a clean ISO date).
DATE_VALUE_RE = re.compile(
    r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?$")
# What the date reader accepts (ASCII digits; anything after the seconds that starts with '.',
# 'Z', '+' or '-' is ignored). Ingest's vectorized reader uses the same pattern (RE2).
DATE_READ_PATTERN = (r"(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})"
                     r"(?:[T ](?P<hh>[0-9]{2}):(?P<mi>[0-9]{2})(?::(?P<ss>[0-9]{2}))?)?"
                     r"(?:[.Z+-].*)?")
_DATE_READ_RE = re.compile(DATE_READ_PATTERN, re.DOTALL)  # the tail may hold a line break
DATE_CHARS = 20  # the characters the exported model's date parser looks at


@dataclass(frozen=True)
class Column:
    """A kept feature column.

    Attributes:
        name: the CSV header's name.
        kind: numeric, category, date or datetime.
        missing: cells of this column that were missing in the file.
        vocabulary: category only: the values with a code of their own, most frequent first.
        distinct: category only: distinct non-missing values counted (a lower bound when more
            than the counting bound).
    """

    name: str
    kind: str
    missing: int = 0
    vocabulary: tuple[str, ...] = ()
    distinct: int = 0

    @property
    def width(self) -> int:
        return WIDTH[self.kind]

    def cell_names(self) -> list[str]:
        if self.kind in (NUMERIC, CATEGORY):
            return [self.name]
        parts = DATE_PARTS + (TIME_PARTS if self.kind == DATETIME else ())
        return [f"{self.name}.{part}" for part in parts]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["vocabulary"] = list(self.vocabulary)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Column:
        return cls(name=data["name"], kind=data["kind"], missing=int(data.get("missing", 0)),
                   vocabulary=tuple(data.get("vocabulary", ())),
                   distinct=int(data.get("distinct", 0)))


@dataclass(frozen=True)
class Dropped:
    """A feature column left out, and why (shown with the job)."""

    name: str
    reason: str


@dataclass
class ColumnProfile:
    """What the first pass learned about one feature column (bounded in memory).

    ``counts`` holds at most a bounded number of values (ingest prunes it); ``overflowed`` says
    it was pruned, and ``batch_distinct`` (distinct values summed over read batches) then stands
    in for the distinct count when judging whether the column is identifier-like. A date
    column's ``counts`` holds at most two of its values (one: the column is constant);
    ``minimum`` and ``maximum`` are a numeric column's.
    """

    name: str
    kind: str
    rows: int = 0
    missing: int = 0
    minimum: float | None = None
    maximum: float | None = None
    has_time: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    overflowed: bool = False
    batch_distinct: int = 0
    tally: Any = field(default=None, repr=False, compare=False)  # ingest's running count

    @property
    def present(self) -> int:
        return self.rows - self.missing


def _distinct_share(profile: ColumnProfile) -> float:
    if profile.present == 0:
        return 0.0
    distinct = profile.batch_distinct if profile.overflowed else len(profile.counts)
    return distinct / profile.present


def drop_reason(profile: ColumnProfile, whole_matrix: bool) -> str | None:
    """Why a profiled column is left out (None: it is kept).

    ``whole_matrix``: every feature column is numeric and complete, so the file is taken as a
    matrix (an image's constant border pixel keeps its place): constant columns are kept.
    """
    if profile.present == 0:
        return f"empty: all {profile.rows} values are missing"
    if profile.kind == CATEGORY:
        distinct = len(profile.counts)
        if not profile.overflowed and distinct == 1 and profile.missing == 0:
            return f"constant: every row is {next(iter(profile.counts))!r}"
        if profile.present > IDENTIFIER_MIN_ROWS and _distinct_share(profile) > IDENTIFIER_SHARE:
            many = f"more than {distinct}" if profile.overflowed else str(distinct)
            return (f"identifier-like: {many} distinct values in {profile.present} rows "
                    "(a value names a row; it does not carry over to new rows)")
        return None
    if whole_matrix or profile.missing:
        return None
    if profile.kind == NUMERIC and profile.minimum is not None \
            and profile.minimum == profile.maximum:
        return f"constant: every row is {profile.minimum:g}"
    if profile.kind == DATE and len(profile.counts) == 1:
        return "constant: every row has the same date"
    return None


def vocabulary(counts: dict[str, int], limit: int) -> tuple[str, ...]:
    """The ``limit`` most frequent values (ties by value, so the order is reproducible)."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return tuple(value for value, _ in ranked[:limit])


def decide_columns(profiles: list[ColumnProfile], max_categories: int,
                   dropped_by_user: list[str]) -> tuple[list[Column], list[Dropped]]:
    """The job's schema from the first pass's profiles: columns kept (CSV order) and dropped."""
    whole_matrix = all(p.kind == NUMERIC and p.missing == 0 for p in profiles)
    kept: list[Column] = []
    dropped = [Dropped(name, "drop_columns") for name in dropped_by_user]
    for profile in profiles:
        reason = drop_reason(profile, whole_matrix)
        if reason is not None:
            dropped.append(Dropped(profile.name, reason))
            continue
        kind = profile.kind
        if kind == DATE and profile.has_time:
            kind = DATETIME
        words = vocabulary(profile.counts, max_categories) if kind == CATEGORY else ()
        distinct = len(profile.counts) if kind == CATEGORY else 0
        kept.append(Column(profile.name, kind, profile.missing, words, distinct))
    return kept, dropped


def is_matrix(columns: list[Column]) -> bool:
    """Every column numeric and complete: the model takes the matrix as it is (no imputation,
    no encoding; a square matrix may be an image). Legacy jobs have no columns: a matrix."""
    return all(c.kind == NUMERIC and c.missing == 0 for c in columns)


def kinds_text(kinds: dict[str, int]) -> str:
    """Kept columns by kind, as a job shows them: '2 category, 1 datetime, 2 numeric'."""
    return ", ".join(f"{int(n)} {kind}" for kind, n in sorted(kinds.items()))


def matrix_width(columns: Sequence[Column]) -> int:
    """Cells per row of the matrix these columns make (the model's input width)."""
    return sum(c.width for c in columns)


def parse_date(text: str, with_time: bool) -> list[float]:
    """The reference date reader: the cells of a date (5) or datetime (8) block; NaN for a value
    that is not a valid ISO date. Only the first ``DATE_CHARS`` characters are looked at."""
    cells = WIDTH[DATETIME if with_time else DATE]
    match = _DATE_READ_RE.fullmatch(text[:DATE_CHARS])
    if not match:
        return [math.nan] * cells
    y, mo, d = int(match["y"]), int(match["mo"]), int(match["d"])
    hh, mi, ss = int(match["hh"] or 0), int(match["mi"] or 0), int(match["ss"] or 0)
    if not (1 <= y and 1 <= mo <= 12 and 1 <= d <= calendar.monthrange(y, mo)[1]
            and hh <= 23 and mi <= 59 and ss <= 59):
        return [math.nan] * cells
    day = dt.date(y, mo, d)
    parts = [y, mo, d, day.weekday(), (day - dt.date(1970, 1, 1)).days]
    return [float(p) for p in parts + ([hh, mi, ss] if with_time else [])]


def parse_pairs(items: Sequence[str]) -> list[tuple[str, str]]:
    """``name=value`` items as (name, value), both trimmed (the last ``=`` splits; an item
    without one has an empty name)."""
    return [(name.strip(), value.strip()) for name, _, value in
            (item.rpartition("=") for item in items)]


def parse_list(text: str) -> list[str]:
    """A comma-separated option value as a list (blank items dropped)."""
    return [item.strip() for item in text.split(",") if item.strip()]
