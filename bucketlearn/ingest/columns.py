"""Column kinds with pyarrow: sniff them, profile them in the first pass, encode them in the second.

The rules (what a kind is, what is dropped) are in ``bucketlearn.domain.columns``; this module
only reads record batches. Memory stays bounded whatever the file: a category column's value
counts are pruned to ``COUNT_BOUND`` values (the most frequent kept) whenever they grow past it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bucketlearn.domain.columns import (
    CATEGORY,
    DATE,
    DATE_CHARS,
    DATE_READ_PATTERN,
    DATE_VALUE_RE,
    FIRST_WORD_CODE,
    MISSING_CODE,
    NUMERIC,
    OOV_CODE,
    UNSIGNED_DECIMAL,
    Column,
    ColumnProfile,
    matrix_width,
)

COUNT_BOUND = 20_000  # distinct values a category profile keeps (pruned to half beyond it)
_NUMBER_PATTERN = rf"^\s*[+-]?({UNSIGNED_DECIMAL}|nan|inf|infinity)\s*$"
_DATE_PATTERN = DATE_VALUE_RE.pattern


def missing_mask(values: pa.Array, markers: Sequence[str]) -> pa.Array:
    """True where a string cell is empty or exactly one of the missing markers (the exported
    model's lookup matches the same way: no trimming)."""
    return pc.is_in(values, value_set=pa.array(["", *markers], pa.string()))


def sniff_kinds(batch: pa.RecordBatch, names: Sequence[str], markers: Sequence[str]
                ) -> dict[str, str | None]:
    """Each named column's kind from a first block of its cells as strings (None: every cell
    missing), all columns in one pass of each compute call (a wide file has thousands).

    Numeric when most present cells are numbers, date when most are ISO dates, else category.
    In a numeric or date column, a later value of another kind rejects the file (naming its row
    and column): it is a typo or a missing marker far more often than a category.
    """
    rows = batch.num_rows
    if not names or rows == 0:
        return dict.fromkeys(names)
    cells = pa.concat_arrays([batch.column(name) for name in names])
    shape = (len(names), rows)

    def cells_where(mask: pa.Array) -> np.ndarray:  # a mask over every cell, a row per column
        return pc.fill_null(mask, False).to_numpy(zero_copy_only=False).reshape(shape)

    present = cells_where(pc.invert(missing_mask(cells, markers)))

    def matching(pattern: str, ignore_case: bool = False) -> np.ndarray:  # present, per column
        found = pc.match_substring_regex(cells, pattern, ignore_case=ignore_case)
        return (cells_where(found) & present).sum(axis=1)

    counts = present.sum(axis=1)
    numbers = matching(_NUMBER_PATTERN, ignore_case=True)
    dates = matching(_DATE_PATTERN)
    kinds: dict[str, str | None] = {}
    for name, count, number, date in zip(names, counts, numbers, dates, strict=True):
        kinds[name] = (None if count == 0 else NUMERIC if number > count / 2
                       else DATE if date > count / 2 else CATEGORY)
    return kinds


def profile_batch(profile: ColumnProfile, values: pa.Array, markers: Sequence[str],
                  bound: int = COUNT_BOUND) -> int | None:
    """Add a batch's cells to a profile (a text column's counts kept to ``bound`` values); the
    batch row of a value a date column cannot hold (None when every value fits)."""
    profile.rows += len(values)
    if profile.kind == NUMERIC:
        profile.missing += values.null_count
        bounds = pc.min_max(values).as_py()
        if bounds["min"] is not None:
            low, high = float(bounds["min"]), float(bounds["max"])
            profile.minimum = low if profile.minimum is None else min(profile.minimum, low)
            profile.maximum = high if profile.maximum is None else max(profile.maximum, high)
        return None
    missing = missing_mask(values, markers)
    present = pc.filter(values, pc.invert(missing))
    profile.missing += len(values) - len(present)
    if profile.kind == DATE:
        return _profile_dates(profile, values, missing, present)
    _count(profile, present, bound)
    return None


def profile_complete_numbers(profiles: Sequence[ColumnProfile], batch: pa.RecordBatch
                             ) -> list[ColumnProfile]:
    """``profile_batch`` for the numeric columns of a batch at once, when none of them has a
    missing or NaN cell (a wide numeric file: one numpy pass instead of a compute call per
    column); returns the profiles left to ``profile_batch`` (all of them otherwise)."""
    numeric = [p for p in profiles if p.kind == NUMERIC]
    if len(numeric) < 2 or batch.num_rows == 0:
        return list(profiles)
    block = numeric_block(batch, [p.name for p in numeric], row_major=False)  # NaN if missing
    if np.isnan(block).any():
        return list(profiles)
    lows, highs = block.min(axis=0).tolist(), block.max(axis=0).tolist()
    for profile, low, high in zip(numeric, lows, highs, strict=True):
        profile.rows += block.shape[0]
        profile.minimum = low if profile.minimum is None else min(profile.minimum, low)
        profile.maximum = high if profile.maximum is None else max(profile.maximum, high)
    return [p for p in profiles if p.kind != NUMERIC]


def numeric_block(batch: pa.RecordBatch, names: Sequence[str], row_major: bool = True
                  ) -> np.ndarray:
    """The named numeric columns of a batch as one float32 matrix (C order, or Fortran order
    with ``row_major=False``, cheaper to make and as good for per-column reductions), a missing
    cell as NaN: one conversion in Arrow (a wide numeric file has thousands of columns, and a
    call per column cost more than parsing them), column by column if Arrow cannot."""
    selected = batch.select(list(names))
    try:
        tensor = selected.to_tensor(null_to_nan=True, row_major=row_major)
    except (pa.ArrowException, TypeError):  # a column Arrow will not put in a tensor
        return np.column_stack([column.fill_null(np.nan).to_numpy(zero_copy_only=False)
                                for column in selected.columns]).astype(np.float32, copy=False)
    return np.asarray(tensor).astype(np.float32, copy=False)


def _profile_dates(profile: ColumnProfile, values: pa.Array, missing: pa.Array,
                   present: pa.Array) -> int | None:
    good = pc.or_(missing, pc.match_substring_regex(values, _DATE_PATTERN))
    if not pc.all(good).as_py():
        return int(pc.index(good, False).as_py())
    if len(present):
        profile.has_time = profile.has_time or bool(
            pc.max(pc.utf8_length(present)).as_py() > 10)
        if len(profile.counts) < 2:  # constant means one value: two distinct ones settle it
            for value in pc.unique(present).slice(0, 2).to_pylist():
                profile.counts.setdefault(value, 1)
    return None


def _count(profile: ColumnProfile, present: pa.Array, bound: int) -> None:
    """Add a batch's values to the column's running count (a pyarrow table, merged and pruned
    without Python per value: the merge sums by dictionary code, the prune keeps the top
    ``bound // 2`` by count, ties by value, so which values stay does not depend on order)."""
    if len(present) == 0:
        return
    counted = pc.value_counts(present)
    profile.batch_distinct += len(counted)
    values, counts = counted.field("values"), counted.field("counts").to_numpy()
    if profile.tally is not None:
        coded = pc.dictionary_encode(pa.concat_arrays([profile.tally["value"].combine_chunks(),
                                                       values]))
        weights = np.concatenate([profile.tally["count"].to_numpy(), counts])
        counts = np.bincount(coded.indices.to_numpy(), weights=weights,
                             minlength=len(coded.dictionary)).astype(np.int64)
        values = coded.dictionary
    batch = pa.table({"value": values, "count": pa.array(counts, pa.int64())})
    if batch.num_rows > bound:
        batch = batch.take(pc.select_k_unstable(
            batch, bound // 2, [("count", "descending"), ("value", "ascending")]))
        profile.overflowed = True
    profile.tally = batch


def finish_profile(profile: ColumnProfile) -> None:
    """Turn a profile's running count into ``counts`` (at the end of the first pass)."""
    if profile.tally is not None:
        profile.counts = dict(zip(profile.tally["value"].to_pylist(),
                                  profile.tally["count"].to_pylist(), strict=True))
        profile.tally = None


class Encoder:
    """A record batch's feature cells as the float32 matrix of the schema (see the domain)."""

    def __init__(self, columns: list[Column], markers: Sequence[str]) -> None:
        self.columns = columns
        self.markers = list(markers)
        self.vocabularies = {c.name: pa.array(list(c.vocabulary), pa.string())
                             for c in columns if c.kind == CATEGORY}
        self.width = matrix_width(columns)
        starts = np.cumsum([0, *(c.width for c in columns)])[:-1]
        self.numeric = [c.name for c in columns if c.kind == NUMERIC]
        self.numeric_at = np.array([at for c, at in zip(columns, starts, strict=True)
                                    if c.kind == NUMERIC], dtype=np.intp)
        self.others = [(c, int(at)) for c, at in zip(columns, starts, strict=True)
                       if c.kind != NUMERIC]

    def encode(self, batch: pa.RecordBatch) -> np.ndarray:
        if self.numeric and len(self.numeric) == self.width:  # every feature a number
            return numeric_block(batch, self.numeric)
        out = np.empty((batch.num_rows, self.width), dtype=np.float32)
        if self.numeric:
            out[:, self.numeric_at] = numeric_block(batch, self.numeric, row_major=False)
        for column, at in self.others:
            values = batch.column(column.name)
            if column.kind == CATEGORY:
                out[:, at] = self._codes(values, column.name)
            else:
                out[:, at:at + column.width] = encode_dates(values, column.kind != DATE)
        return out

    def _codes(self, values: pa.Array, name: str) -> np.ndarray:
        index = pc.index_in(values, value_set=self.vocabularies[name])
        codes = pc.fill_null(pc.add(index, FIRST_WORD_CODE), OOV_CODE)
        codes = pc.if_else(missing_mask(values, self.markers), MISSING_CODE, codes)
        return codes.to_numpy(zero_copy_only=False).astype(np.float32)


def encode_dates(values: pa.Array, with_time: bool) -> np.ndarray:
    """Date cells (rows × 5 or 8), NaN for missing or invalid dates: ``parse_date`` vectorized
    (``_date_fields`` reads the parts, numpy checks them and does the calendar)."""
    width = 8 if with_time else 5
    out = np.full((len(values), width), np.nan, dtype=np.float32)
    (y, mo, d, hh, mi, ss), matched = _date_fields(values)
    if not matched.any():
        return out
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    month_days = _MONTH_DAYS[np.clip(mo - 1, 0, 11)] + (leap & (mo == 2))
    valid = (matched & (y >= 1) & (mo >= 1) & (mo <= 12) & (d >= 1) & (d <= month_days)
             & (hh <= 23) & (mi <= 59) & (ss <= 59))
    days = _days_from_civil(y, mo, d)
    cells = [y, mo, d, (days + 3) % 7, days] + ([hh, mi, ss] if with_time else [])
    out[valid] = np.stack(cells, axis=1)[valid].astype(np.float32)
    return out


def _date_fields(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(year, month, day, hour, minute, second as int64 rows of a 6 × n array; where the cell
    has the reader's form). Cells written exactly ``YYYY-MM-DD``, ``YYYY-MM-DD[T ]HH:MM`` or
    ``YYYY-MM-DD[T ]HH:MM:SS`` are read from the string buffer by position; the others (a
    fraction, a zone, non-ASCII text) by ``DATE_READ_PATTERN``, so both read alike."""
    fields = np.zeros((6, len(values)), dtype=np.int64)
    matched = np.zeros(len(values), dtype=bool)
    rest = _fixed_width_dates(values, fields, matched)
    if len(rest):
        fields[:, rest], matched[rest] = _pattern_dates(values.take(pa.array(rest)))
    return fields, matched


_FIXED_WIDTH = 19  # YYYY-MM-DDTHH:MM:SS
_DIGIT_AT = {10: [0, 1, 2, 3, 5, 6, 8, 9], 16: [11, 12, 14, 15], 19: [17, 18]}
_CHAR_AT = {10: {4: b"-", 7: b"-"}, 16: {10: b"T ", 13: b":"}, 19: {16: b":"}}


def _fixed_width_dates(values: pa.Array, fields: np.ndarray, matched: np.ndarray) -> np.ndarray:
    """Fill ``fields`` and ``matched`` for the cells of a fixed-width form; return the indices
    of the cells left for the pattern (those of 10 bytes or more in another form: a shorter
    cell cannot be a date)."""
    if values.type != pa.string() or values.null_count:
        return np.arange(len(values))
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32, count=len(values) + 1,
                            offset=values.offset * 4)
    data = values.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    padded = np.concatenate([raw[offsets[0]:offsets[-1]], np.zeros(_FIXED_WIDTH, np.uint8)])
    starts, lengths = offsets[:-1] - offsets[0], np.diff(offsets)
    grid = padded[starts[:, None] + np.arange(_FIXED_WIDTH)]
    digits = grid - np.uint8(ord("0"))  # wraps below '0': one comparison finds the digits
    is_digit = digits <= 9
    form_ok = {}
    for width in (10, 16, 19):
        ok = is_digit[:, _DIGIT_AT[width]].all(axis=1)
        for at, allowed in _CHAR_AT[width].items():
            ok &= np.logical_or.reduce([grid[:, at] == char for char in allowed])
        form_ok[width] = ok
    fast = form_ok[10] & ((lengths == 10) | (form_ok[16] & ((lengths == 16)
                                                           | ((lengths == 19) & form_ok[19]))))

    def number(at: list[int]) -> np.ndarray:
        value = np.zeros(len(values), dtype=np.int64)
        for i in at:
            value = value * 10 + digits[:, i].astype(np.int64)
        return np.where(fast, value, 0)

    fields[:] = [number([0, 1, 2, 3]), number([5, 6]), number([8, 9]),
                 np.where(lengths >= 16, number([11, 12]), 0),
                 np.where(lengths >= 16, number([14, 15]), 0),
                 np.where(lengths == 19, number([17, 18]), 0)]
    matched[:] = fast
    return np.flatnonzero(~fast & (lengths >= 10))


def _pattern_dates(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``_date_fields`` by ``DATE_READ_PATTERN`` (pyarrow's RE2) on the first ``DATE_CHARS``
    characters, as the exported model's parser reads them."""
    head = pc.utf8_slice_codeunits(values, 0, DATE_CHARS)
    parts = pc.extract_regex(head, f"(?s)^{DATE_READ_PATTERN}$")
    matched = ~np.asarray(parts.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if not matched.any():
        return np.zeros((6, len(values)), dtype=np.int64), matched

    def field(name: str) -> np.ndarray:
        text = parts.field(name)
        number = pc.cast(pc.if_else(pc.equal(text, ""), "0", text).fill_null("0"), pa.int64())
        return number.to_numpy(zero_copy_only=False)

    return np.stack([field(n) for n in ("y", "mo", "d", "hh", "mi", "ss")]), matched


_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


def _days_from_civil(y: np.ndarray, mo: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 (H. Hinnant's algorithm; floor division throughout)."""
    yy = y - (mo <= 2)
    era = yy // 400
    year_of_era = yy - era * 400
    day_of_year = (153 * ((mo + 9) % 12) + 2) // 5 + d - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468
