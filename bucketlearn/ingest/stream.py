"""How the passes read an upload's rows: the upload (``SourceFile``), each feature column's type
and the markers of a missing cell (``Reading``), the record batches streamed in blocks with
bounded read-ahead (``batches``) and, when pyarrow refuses a block or a number is not finite,
the line-by-line re-read that names the first bad row and column exactly (``diagnose``; a
batch's first non-finite number: ``first_non_finite``).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from bucketlearn.config import Limits
from bucketlearn.domain.columns import NUMERIC, UNSIGNED_DECIMAL, Column, is_matrix
from bucketlearn.domain.target import FLOAT32_MAX
from bucketlearn.errors import InvalidInputError
from bucketlearn.ingest import readahead
from bucketlearn.ingest.problems import KIND_SAYS, abbrev, changed_while_read, rejected

Opener = Callable[[], IO[bytes]]
# Called once per record batch of either pass, before the batch is processed (the upload
# service renews its claim on the job there); it does its own I/O, ingest does none for it.
# Whatever it raises ends the split.
Progress = Callable[[], None]
READ_BLOCK_BYTES = 4 * 1024**2  # pyarrow's CSV block; larger only for rows that do not fit
READ_AHEAD_BLOCKS = 3  # blocks read from the source ahead of the batch being processed
_NUMBER_RE = re.compile(rf"^[+-]?({UNSIGNED_DECIMAL}|nan|inf|infinity)$", re.IGNORECASE)


@dataclass(frozen=True)
class SourceFile:
    """An upload to read: a name for messages, its size and a way to open it (again).

    ``opener`` is called once per pass (pass 2 does not call it when it takes pass 1's batches:
    ``scan.ParsedBatches``) and must give the same bytes each time (the upload service pins the
    event's generation). Should a pass meet a label or a class count the first pass did not see,
    the split ends with "the file changed while it was being read".
    """

    display_name: str
    size: int
    opener: Opener


NUMBER_TYPE = pa.float32()  # how a numeric feature is parsed (the label is read as text)


@dataclass
class Reading:
    """How the passes read the file's columns: each feature column's kind and the markers that
    make a numeric cell missing (null). String columns keep their text (markers included)."""

    kinds: dict[str, str]
    markers: list[str]
    # numeric only because every cell seen so far was missing: text later makes them category
    unknown: set[str] = field(default_factory=set)

    def types(self, columns: list[str], label: str) -> dict[str, pa.DataType]:
        return {c: (NUMBER_TYPE if c != label and self.kinds.get(c, NUMERIC) == NUMERIC
                    else pa.string()) for c in columns}


PLAIN = Reading({}, [])  # every feature numeric, only an empty cell missing


def batches(source: SourceFile, columns: list[str], label: str, include: list[str] | None,
            block_bytes: int, reading: Reading = PLAIN) -> Any:
    read_options = pacsv.ReadOptions(block_size=block_bytes, column_names=columns, skip_rows=1)
    parse_options = pacsv.ParseOptions(newlines_in_values=False)
    convert_options = pacsv.ConvertOptions(
        column_types=reading.types(columns, label), include_columns=include,
        strings_can_be_null=False, quoted_strings_can_be_null=False,
        null_values=["", *reading.markers])
    stream = readahead.BoundedReader(source.opener(), ahead=READ_AHEAD_BLOCKS)
    try:
        yield from stream.batches(lambda s: pacsv.open_csv(
            s, read_options=read_options, parse_options=parse_options,
            convert_options=convert_options))
    finally:
        stream.close()  # releases pyarrow's reading thread if it waits for room


def _lines(stream: IO[bytes], limit: int) -> Any:
    """Yield the stream's lines without line breaks, reading in blocks (any stream is fast).

    A line longer than ``limit`` is yielded cut to ``limit + 1`` bytes, and nothing after it.
    """
    pending = b""
    while True:
        chunk = stream.read(1 << 20)
        if not chunk:
            if pending:
                yield pending[: limit + 2].rstrip(b"\r")
            return
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            yield pending[start:end].rstrip(b"\r")
            start = end + 1
        pending = pending[start:]
        if len(pending) > limit + 1:
            yield pending[: limit + 1]
            return


def _split_fields(text: str, limit: int) -> list[str]:
    """A line's fields, as pyarrow reads them (plain split when nothing is quoted)."""
    if '"' not in text:
        return text.split(",")
    if csv.field_size_limit() < limit:  # the csv module's default (128 KiB) is below ours
        csv.field_size_limit(limit)
    return next(csv.reader([text]), [])


def diagnose(source: SourceFile, columns: list[str], label: str, limits: Limits,
             arrow_message: str, target_row: int | None = None,
             reading: Reading = PLAIN) -> InvalidInputError | None:
    """Re-read the file line by line to name the first bad row and column exactly.

    Rows are numbered like the fast path numbers them: data rows from 1, empty lines skipped.
    A ``label`` not among ``columns`` (a file to predict, without one) checks no label.
    With ``target_row``, only that row is checked (the fast path already knows where the problem
    is and wants its exact text); None when that row shows no problem. Without it, a problem the
    line-by-line check cannot see is reported with pyarrow's message.
    """
    file = source.display_name
    label_index = columns.index(label) if label in columns else -1
    limit = limits.max_line_bytes
    with source.opener() as raw:
        lines = _lines(raw, limit)
        next(lines, None)  # the header, already checked
        row_number = 0
        for line in lines:
            if len(line) > limit:
                return rejected(file, "the row is longer than the limit", row=row_number + 1,
                                expected=f"lines of at most {limit} bytes",
                                found=f"a line of more than {limit} bytes")
            if not line:
                continue
            row_number += 1
            if target_row is not None and row_number < target_row:
                continue
            problem = _check_line(file, line, row_number, columns, label_index, limit, reading)
            if problem is not None or target_row is not None:
                return problem
    if target_row is not None:
        return None
    return rejected(file, "the CSV could not be parsed", expected="well-formed CSV",
                    found=abbrev(arrow_message, 300))


def diagnosed(source: SourceFile, columns: list[str], label: str, limits: Limits,
              arrow_message: str, reading: Reading = PLAIN) -> InvalidInputError:
    problem = diagnose(source, columns, label, limits, arrow_message, reading=reading)
    assert problem is not None  # without target_row, diagnose always names a problem
    return problem


def _check_line(file: str, line: bytes, row_number: int, columns: list[str], label_index: int,
                limit: int, reading: Reading = PLAIN) -> InvalidInputError | None:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return rejected(file, "the row is not UTF-8 text", row=row_number,
                        column=_column_of_bad_byte(line, columns, limit),
                        expected="UTF-8 text", found=f"byte 0x{line[exc.start]:02x}")
    if text.count('"') % 2:
        return rejected(file, "a quoted field is not closed on its line", row=row_number,
                        expected="quoted fields closed on the same line (no line breaks inside)",
                        found=abbrev(text))
    if '"' not in text and text.count(",") != len(columns) - 1 and text.strip(", \t"):
        return rejected(file, "the row has the wrong number of fields", row=row_number,
                        expected=f"{len(columns)} fields", found=f"{text.count(',') + 1} fields")
    try:
        row = _split_fields(text, limit)
    except csv.Error as exc:
        return rejected(file, "the row is not valid CSV", row=row_number,
                        expected="well-formed CSV", found=str(exc))
    return _check_row(file, row, row_number, columns, label_index, reading)


def _column_of_bad_byte(line: bytes, columns: list[str], limit: int) -> str | None:
    """The column whose field holds the first byte that is not UTF-8 (None if unclear)."""
    try:
        fields = _split_fields(line.decode("utf-8", errors="surrogateescape"), limit)
    except csv.Error:
        return None
    if len(fields) != len(columns):
        return None
    return next((columns[i] for i, value in enumerate(fields)
                 if any("\udc80" <= ch <= "\udcff" for ch in value)), None)


def _check_row(file: str, row: list[str], row_number: int, columns: list[str],
               label_index: int, reading: Reading = PLAIN) -> InvalidInputError | None:
    if all(not value.strip() for value in row):
        return rejected(file, "the row has no values", row=row_number,
                        expected=f"{len(columns)} values (the features and a label)",
                        found="only commas" if len(row) > 1 else "only whitespace")
    if len(row) != len(columns):
        return rejected(file, "the row has the wrong number of fields", row=row_number,
                        expected=f"{len(columns)} fields", found=f"{len(row)} fields")
    for index, value in enumerate(row):
        if index == label_index:
            if not value.strip():
                return rejected(file, "the label is empty", row=row_number,
                                column=columns[index], expected="a class label",
                                found="an empty value")
            continue
        if reading.kinds.get(columns[index], NUMERIC) != NUMERIC:
            continue
        problem = _check_number(file, value, row_number, columns[index], reading.markers)
        if problem is not None:
            return problem
    return None


def _check_number(file: str, value: str, row_number: int, column: str,
                  markers: list[str]) -> InvalidInputError | None:
    text = value.strip()
    if not text or value in markers:
        return None  # a missing cell
    if not _NUMBER_RE.match(text):
        shown = ", ".join(markers[:6]) + (", …" if len(markers) > 6 else "")
        return rejected(file, "a feature value is not a number", row=row_number, column=column,
                        expected="a number or a missing value (an empty cell"
                                 + (f" or one of missing_values: {shown}" if markers else "")
                                 + f") {KIND_SAYS}; add the value to missing_values, or "
                                   "leave the column out with drop_columns",
                        found=abbrev(value))
    number = float(text)
    if math.isnan(number) or (math.isinf(number) and "inf" in text.lower()):
        return rejected(file, "a feature value is not finite", row=row_number, column=column,
                        expected="a finite number", found=abbrev(value))
    if not abs(number) <= FLOAT32_MAX:
        return rejected(file, "a feature value is out of range", row=row_number, column=column,
                        expected=f"a number from -{FLOAT32_MAX:.4g} to {FLOAT32_MAX:.4g} "
                                 "(32-bit float)", found=abbrev(value))
    return None


def first_non_finite(x: np.ndarray, batch: pa.RecordBatch, schema: list[Column],
                     row_offset: int, file: str) -> tuple[InvalidInputError, bool] | None:
    """The first numeric cell that is present but not finite (inf, or out of float32's range):
    (the problem, whether the cell had a value whose text is worth quoting).

    A missing cell is NaN, which the model imputes, except in a file pass 1 found complete and
    numeric (taken as a matrix, no imputation): there it means the file changed.
    """
    if np.isfinite(x).all():  # the common case, in one pass over the block
        return None
    matrix = is_matrix(schema)
    first: tuple[int, int, str, bool] | None = None
    at = 0
    for column in schema:
        if column.kind == NUMERIC:
            values = x[:, at]
            cells = batch.column(column.name)
            present = ~np.asarray(cells.is_null().to_numpy(zero_copy_only=False), dtype=bool) \
                if cells.null_count else np.ones(len(values), dtype=bool)
            bad = ~np.isfinite(values) & (present | matrix)
            if bad.any():
                r = int(np.argmax(bad))
                if first is None or r < first[0]:
                    first = (r, at, column.name, bool(present[r]))
        at += column.width
    if first is None:
        return None
    r, at, name, present = first
    if not present:
        return changed_while_read(file, "a missing value in a column the first pass found "
                                        "complete", row=row_offset + r + 1, column=name), False
    return rejected(file, "a feature value is not finite", row=row_offset + r + 1, column=name,
                    expected="a finite number", found=str(x[r, at])), True
