"""Ingestion: stream an uploaded CSV, validate it, deal its rows into stratified shards + holdout.

Two streaming passes over the file, each holding a few pyarrow blocks at a time (4 MiB blocks,
at most ``READ_AHEAD_BLOCKS`` read ahead of the batch being processed: ``readahead``):

1. *Scan*: parse every row (structure, UTF-8), read only the label column; count rows per class.
2. *Deal*: convert features to float32, check they are finite, and send each row either to the
   holdout (a systematic, per-class sample: exactly ``round(f * n_c)`` rows of every class) or to
   a training shard, following a ``DealPlan`` made from the class counts alone. With ``S`` shards
   and ``n_c = q_c * S + r_c`` training rows of class ``c``, every shard gets ``q_c`` rows of
   class ``c`` and ``r_c`` shards get one more; those extra rows are dealt round-robin over all
   classes (so every shard gets ``floor(N / S)`` or ``ceil(N / S)`` rows in all, and none is
   empty when there are at least as many rows as shards), through a golden-ratio stride that
   spreads each class's extra rows evenly over the shards. A shard's rows of a class are
   contiguous in file order and shard ``k`` takes them from about ``k / S`` of the way through
   the class, whatever the file's order (a CSV sorted by label included); in a shuffled file the
   shards are therefore complete, and written, one after the other.

A row longer than a block makes pyarrow fail ("straddles two block boundaries"); pass 1 then
starts again with blocks of ``2 x max_line_bytes`` (enough for any row within the limit), and
pass 2 uses the block size pass 1 succeeded with.

Shard rows are buffered per shard and written as ``part-NNNN.safetensors`` objects when a shard is
complete or when the buffers reach ``buffer_bytes``; memory therefore stays flat as the file grows
(invariant 5). A shard may end up as several parts; the manifest lists them.

Any problem ends in ``InvalidInputError`` whose ``InputProblem`` names the file, the data row
(1-based, header excluded) and the column, what was expected and what was found.
"""

from __future__ import annotations

import codecs
import csv
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from bucketlearn import codec, layout
from bucketlearn.config import JobOptions, Limits
from bucketlearn.domain.columns import (
    CATEGORY,
    NUMERIC,
    UNSIGNED_DECIMAL,
    Column,
    ColumnProfile,
    Dropped,
    decide_columns,
    is_matrix,
    matrix_width,
)
from bucketlearn.domain.plan import check_shard_bytes
from bucketlearn.domain.target import (
    CLASSIFICATION,
    FLOAT32_MAX,
    REGRESSION,
    bin_counts,
    bin_edges,
    bin_names,
    bin_of,
    decide_task,
    quantile_bins,
)
from bucketlearn.errors import InputProblem, InvalidInputError
from bucketlearn.ingest import readahead
from bucketlearn.ingest.columns import (
    COUNT_BOUND,
    Encoder,
    finish_profile,
    profile_batch,
    profile_complete_numbers,
    sniff_kind,
)
from bucketlearn.ingest.targets import LabelSniff, TargetReader, sniff_labels
from bucketlearn.ports import BlobStore

log = logging.getLogger(__name__)

Opener = Callable[[], IO[bytes]]
# Called once per record batch of either pass, before the batch is processed (the upload
# service renews its claim on the job there); it does its own I/O, ingest does none for it.
# Whatever it raises ends the split.
Progress = Callable[[], None]
DEFAULT_BUFFER_BYTES = 64 * 1024**2
READ_BLOCK_BYTES = 4 * 1024**2  # pyarrow's CSV block; larger only for rows that do not fit
READ_AHEAD_BLOCKS = 3  # blocks read from the source ahead of the batch being processed
HOLDOUT_PART_BYTES = 16 * 1024**2
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_NUMBER_RE = re.compile(rf"^[+-]?({UNSIGNED_DECIMAL}|nan|inf|infinity)$", re.IGNORECASE)
_KIND_SAYS = "as the column's kind (from its first rows, or column_kinds) says"
# Column names and class labels end up in Firestore documents (a job lists every class name;
# a document holds at most 1 MiB): each is at most this many bytes of UTF-8.
MAX_NAME_BYTES = 256


@dataclass(frozen=True)
class SourceFile:
    """An upload to read: a name for messages, its size and a way to open it (again).

    ``opener`` is called once per pass and must give the same bytes each time (the upload
    service pins the event's generation). Should a pass meet a label or a class count the first
    pass did not see, the split ends with "the file changed while it was being read".
    """

    display_name: str
    size: int
    opener: Opener


@dataclass
class Shard:
    index: int
    rows: int = 0
    parts: list[str] = field(default_factory=list)


@dataclass
class Manifest:
    """Everything the split produced; stored as ``jobs/<job>/manifest.json`` in the work bucket."""

    job_id: str
    source: str
    feature_names: list[str]
    label_column: str
    classes: list[str]
    label_kind: str
    class_counts: list[int]
    rows: int
    train_rows: int
    holdout_rows: int
    shards: list[Shard]
    holdout_parts: list[str]
    mean: list[float]
    variance: list[float]
    # rows of each holdout part (empty in manifests written before it was recorded)
    holdout_part_rows: list[int] = field(default_factory=list)
    # the kept feature columns (``Column.to_dict``) in matrix order; empty in manifests written
    # before column kinds: every feature numeric and complete
    columns: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)
    missing_values: list[str] = field(default_factory=list)
    # training rows of each class (empty in manifests written before it was recorded)
    train_class_counts: list[int] = field(default_factory=list)
    # numeric targets (issue #15): "classification" (manifests written before) or "regression";
    # a regression manifest has no classes: its rows are stratified by quantile bins of the
    # target (the boundaries between bins and their rows; ``domain.target``), y holds the
    # float32 targets, and the training rows' target mean and standard deviation scale the
    # model's output
    task: str = CLASSIFICATION
    task_reason: str = ""
    target_mean: float = 0.0
    target_std: float = 1.0
    bin_edges: list[float] = field(default_factory=list)
    bin_counts: list[int] = field(default_factory=list)
    train_bin_counts: list[int] = field(default_factory=list)
    missing_targets: int = 0  # rows left out: their label was empty or a missing value

    @property
    def schema(self) -> list[Column]:
        """The kept columns (legacy manifests: one numeric, complete column per feature)."""
        if not self.columns:
            return [Column(name, NUMERIC) for name in self.feature_names]
        return [Column.from_dict(c) for c in self.columns]

    @property
    def width(self) -> int:
        """Cells per row of the matrix the shards hold (the model's input width)."""
        return matrix_width(self.schema)

    @property
    def target(self) -> tuple[float, float] | None:
        """A regression's training target (mean, standard deviation); None for classes."""
        return (self.target_mean, self.target_std) if self.task == REGRESSION else None

    @property
    def train_counts(self) -> list[int]:
        """Training rows of each class; the file's class counts for a manifest written before
        they were recorded (the basis of ``class_weight=balanced``)."""
        if len(self.train_class_counts) == len(self.classes):
            return list(self.train_class_counts)
        return list(self.class_counts)

    def to_json(self) -> bytes:
        data = dict(self.__dict__)
        data["shards"] = [s.__dict__ for s in self.shards]
        return json.dumps(data).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        data = json.loads(raw)
        data["shards"] = [Shard(**s) for s in data["shards"]]
        return cls(**data)

    def summary(self) -> dict[str, Any]:
        """Dataset facts for the job document (no per-feature statistics)."""
        return {
            "rows": self.rows,
            "train_rows": self.train_rows,
            "holdout_rows": self.holdout_rows,
            "features": len(self.feature_names),
            "label_column": self.label_column,
            "classes": self.classes,
            "label_kind": self.label_kind,
            "class_counts": self.class_counts,
            "shards": len(self.shards),
            "columns": columns_summary(self.schema),
            "dropped_columns": list(self.dropped),
            "task": self.task,
            "task_reason": self.task_reason,
            **({"target_mean": self.target_mean, "target_std": self.target_std,
                "bin_edges": list(self.bin_edges),
                "bin_counts": list(self.bin_counts), "missing_targets": self.missing_targets}
               if self.task == REGRESSION else {}),
        }


def columns_summary(columns: list[Column], detail_limit: int = 100) -> dict[str, Any]:
    """The job document's view of the columns: counts by kind, and the columns worth naming
    (not numeric, or with missing cells), at most ``detail_limit`` of them."""
    kinds: dict[str, int] = {}
    for column in columns:
        kinds[column.kind] = kinds.get(column.kind, 0) + 1
    named = [c for c in columns if c.kind != NUMERIC or c.missing]
    detail = [{"name": c.name, "kind": c.kind, "missing": c.missing,
               **({"categories": len(c.vocabulary), "distinct": c.distinct}
                  if c.kind == CATEGORY else {})} for c in named[:detail_limit]]
    return {"kinds": kinds, "detail": detail, "detail_truncated": len(named) > detail_limit}


def _problem(file: str, message: str, **kw: Any) -> InvalidInputError:
    return InvalidInputError(InputProblem(file=file, message=message, **kw))


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


# --- header ------------------------------------------------------------------------------------

# (magic bytes, what the file is, message, expected, found): formats people upload by mistake.
_SIGNATURES: tuple[tuple[bytes, str, str, str], ...] = (
    (_GZIP_MAGIC, "the file is gzip-compressed", "a plain-text CSV (decompress it before uploading)",
     "gzip data"),
    (b"BZh", "the file is bzip2-compressed", "a plain-text CSV (decompress it before uploading)",
     "bzip2 data"),
    (b"\xfd7zXZ\x00", "the file is xz-compressed",
     "a plain-text CSV (decompress it before uploading)", "xz data"),
    (b"\x28\xb5\x2f\xfd", "the file is zstd-compressed",
     "a plain-text CSV (decompress it before uploading)", "zstd data"),
    (b"PK\x03\x04", "the file is a ZIP archive",
     "a plain-text CSV (save a spreadsheet as CSV, UTF-8)", "ZIP data (e.g. an .xlsx workbook)"),
    (b"\x89PNG\r\n\x1a\n", "the file is an image", "a UTF-8 CSV", "PNG image data"),
    (b"\xff\xd8\xff", "the file is an image", "a UTF-8 CSV", "JPEG image data"),
    (b"GIF8", "the file is an image", "a UTF-8 CSV", "GIF image data"),
    (b"%PDF-", "the file is a PDF document", "a UTF-8 CSV", "PDF data"),
    (b"PAR1", "the file is a Parquet file", "a UTF-8 CSV", "Parquet data"),
    (b"\xff\xfe", "the file is UTF-16 (or UTF-32) text", "UTF-8 text (save the CSV as UTF-8)",
     "a UTF-16 little-endian byte-order mark"),
    (b"\xfe\xff", "the file is UTF-16 (or UTF-32) text", "UTF-8 text (save the CSV as UTF-8)",
     "a UTF-16 big-endian byte-order mark"),
)
_JSON_START = re.compile(rb'\A\s*(\{\s*["}]|\[\s*[\[{"\]])')
_MARKUP_START = re.compile(rb"\A\s*<(!doctype|html|\?xml|head|body|!--|svg|table|div)\b",
                           re.IGNORECASE)
_SNIFF_BYTES = 65536


def _sniff(name: str, head: bytes) -> None:
    """Refuse files that are plainly not CSV text (compressed, binary, JSON, HTML), by name."""
    for magic, message, expected, found in _SIGNATURES:
        if head.startswith(magic):
            raise _problem(name, message, expected=expected, found=found)
    if b"\x00" in head[:_SNIFF_BYTES]:
        raise _problem(name, "the file is not text", expected="a UTF-8 CSV",
                       found="binary data (NUL bytes)")
    text = head[len(_BOM):] if head.startswith(_BOM) else head
    first_line = decode_utf8_safe(text.lstrip()[:200].split(b"\n", 1)[0]).strip()
    if _JSON_START.match(text):
        raise _problem(name, "the file is JSON, not CSV",
                       expected="a CSV with a header line naming the columns",
                       found=f"JSON starting with {_short(first_line, 40)!r}")
    if _MARKUP_START.match(text):
        raise _problem(name, "the file is HTML or XML, not CSV",
                       expected="a CSV with a header line naming the columns",
                       found=f"markup starting with {_short(first_line, 40)!r}")


def _first_line(stream: IO[bytes], head: bytes, limit: int) -> tuple[bytes, bool]:
    """(the first line without its line break, whether it is longer than ``limit``)."""
    buffer = bytearray(head)
    while b"\n" not in buffer and len(buffer) <= limit:
        more = stream.read(1 << 20)
        if not more:
            break
        buffer += more
    end = buffer.find(b"\n")
    if end < 0:
        end = len(buffer)
    line = bytes(buffer[:end])
    if line.startswith(_BOM):
        line = line[len(_BOM):]
    line = line[:-1] if line.endswith(b"\r") else line
    return line[: limit + 1], len(line) > limit


def _separator_hint(text: str) -> str:
    for separator, spelled in ((";", "';'"), ("\t", "tabs"), ("|", "'|'")):
        if separator in text:
            return f" (the separator must be a comma; this line seems to use {spelled})"
    return ""


def _header_column_at(line: bytes, position: int) -> str | None:
    """'#N' for the header field that holds byte ``position`` (None if the quoting is unclear)."""
    prefix = line[:position]
    return None if b'"' in prefix else f"#{prefix.count(b',') + 1}"


def read_header(source: SourceFile, limits: Limits) -> list[str]:
    """Check the file as a whole (size, compression, binary) and return its column names."""
    name = source.display_name
    if source.size == 0:
        raise _problem(name, "the file is empty", expected="a header line and data rows",
                       found="0 bytes")
    if source.size > limits.max_file_bytes:
        raise _problem(name, "the file is larger than the limit",
                       expected=f"at most {limits.max_file_bytes} bytes",
                       found=f"{source.size} bytes")
    with source.opener() as stream:
        head = stream.read(_SNIFF_BYTES)
        _sniff(name, head)
        line, too_long = _first_line(stream, head, limits.max_line_bytes)
    if b"\r" in line:
        raise _problem(name, "the header line contains a carriage return", row=0,
                       expected="LF or CRLF line ends",
                       found="a CR inside the first line (CR-only line ends, as in old Mac files?)")
    if too_long:
        raise _problem(name, "the header line is longer than the limit", row=0,
                       expected=f"lines of at most {limits.max_line_bytes} bytes",
                       found="a longer line")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _problem(name, "the header is not UTF-8", row=0,
                       column=_header_column_at(line, exc.start), expected="UTF-8 text",
                       found=f"byte 0x{line[exc.start]:02x} at position {exc.start}") from None
    if csv.field_size_limit() < limits.max_line_bytes:  # the csv module's default is 128 KiB
        csv.field_size_limit(limits.max_line_bytes)
    try:
        names = next(csv.reader([text]), [])
    except csv.Error as exc:
        raise _problem(name, "the header is not valid CSV", row=0,
                       expected="comma-separated column names", found=str(exc)) from None
    if not names or all(not n.strip() for n in names):
        raise _problem(name, "the header line is empty", row=0,
                       expected="a header line naming the columns", found=repr(_short(text)))
    if len(names) > limits.max_columns:
        raise _problem(name, "too many columns", row=0,
                       expected=f"at most {limits.max_columns} columns",
                       found=f"{len(names)} columns")
    _check_column_names(name, names)
    if len(names) < 2:
        raise _problem(name, "the file has a single column", row=0,
                       expected="at least one feature column and a label column",
                       found=f"only '{_short(names[0])}'{_separator_hint(names[0])}")
    return [n.strip() for n in names]


def _check_column_names(name: str, names: list[str]) -> None:
    """Every column named, within the length limit, and no name twice."""
    seen: dict[str, int] = {}
    for position, column in enumerate(names, start=1):
        stripped = column.strip()
        if not stripped:
            raise _problem(name, "a column has no name", row=0, column=f"#{position}",
                           expected="a name for every column", found="an empty name")
        if len(stripped.encode()) > MAX_NAME_BYTES:
            raise _problem(name, "a column name is longer than the limit", row=0,
                           column=f"#{position}",
                           expected=f"column names of at most {MAX_NAME_BYTES} bytes (UTF-8)",
                           found=f"a name of {len(stripped.encode())} bytes: "
                                 f"{_short(stripped, 40)!r}")
        if stripped in seen:
            raise _problem(name, "duplicate column name", row=0, column=stripped,
                           expected="unique column names",
                           found=f"'{stripped}' at columns {seen[stripped]} and {position}")
        seen[stripped] = position


def choose_label_column(columns: list[str], requested: str | None, file: str) -> str:
    """The label column: the one requested, else 'label' if present, else the last column."""
    if requested is not None:
        if requested not in columns:
            raise _problem(file, "the label column is missing", column=requested,
                           expected=f"a column named '{requested}'",
                           found="columns " + _short(", ".join(columns), 200))
        return requested
    return "label" if "label" in columns else columns[-1]


# --- streaming -----------------------------------------------------------------------------------

def _block_sizes(limits: Limits, block_bytes: int | None) -> tuple[int, int]:
    """(the block to try first, the block to retry with when a row does not fit it).

    The retry block holds any row within the line limit: twice the limit (1 to 64 MiB); the
    first is ``block_bytes`` (None: the retry block) but never larger.
    """
    largest = max(1 << 20, min(limits.max_line_bytes * 2, 64 << 20))
    return largest if block_bytes is None else min(block_bytes, largest), largest


# pyarrow's messages for a row, or the header, that does not fit in one block
_BLOCK_TOO_SMALL = ("straddling object straddles two block boundaries",
                    "header is larger than block size")


class _BlockTooSmall(Exception):
    """A row (or the header) is longer than the read block; read again with a larger one."""


@dataclass
class _Reading:
    """How the passes read the file's columns: each feature column's kind and the markers that
    make a numeric cell missing (null). String columns keep their text (markers included)."""

    kinds: dict[str, str]
    markers: list[str]
    # numeric only because every cell seen so far was missing: text later makes them category
    unknown: set[str] = field(default_factory=set)

    def types(self, columns: list[str], label: str) -> dict[str, pa.DataType]:
        return {c: (pa.float32() if c != label and self.kinds.get(c, NUMERIC) == NUMERIC
                    else pa.string()) for c in columns}


_PLAIN = _Reading({}, [])  # every feature numeric, only an empty cell missing


def _batches(source: SourceFile, columns: list[str], label: str, include: list[str] | None,
             block_bytes: int, reading: _Reading = _PLAIN) -> Any:
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


def _diagnose(source: SourceFile, columns: list[str], label: str, limits: Limits,
              arrow_message: str, target_row: int | None = None,
              reading: _Reading = _PLAIN) -> InvalidInputError | None:
    """Re-read the file line by line to name the first bad row and column exactly.

    Rows are numbered like the fast path numbers them: data rows from 1, empty lines skipped.
    With ``target_row``, only that row is checked (the fast path already knows where the problem
    is and wants its exact text); None when that row shows no problem. Without it, a problem the
    line-by-line check cannot see is reported with pyarrow's message.
    """
    file = source.display_name
    label_index = columns.index(label)
    limit = limits.max_line_bytes
    with source.opener() as raw:
        lines = _lines(raw, limit)
        next(lines, None)  # the header, already checked
        row_number = 0
        for line in lines:
            if len(line) > limit:
                return _problem(file, "the row is longer than the limit", row=row_number + 1,
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
    return _problem(file, "the CSV could not be parsed", expected="well-formed CSV",
                    found=_short(arrow_message, 300))


def _diagnosed(source: SourceFile, columns: list[str], label: str, limits: Limits,
               arrow_message: str, reading: _Reading = _PLAIN) -> InvalidInputError:
    problem = _diagnose(source, columns, label, limits, arrow_message, reading=reading)
    assert problem is not None  # without target_row, _diagnose always names a problem
    return problem


def _check_line(file: str, line: bytes, row_number: int, columns: list[str], label_index: int,
                limit: int, reading: _Reading = _PLAIN) -> InvalidInputError | None:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _problem(file, "the row is not UTF-8 text", row=row_number,
                        column=_column_of_bad_byte(line, columns, limit),
                        expected="UTF-8 text", found=f"byte 0x{line[exc.start]:02x}")
    if text.count('"') % 2:
        return _problem(file, "a quoted field is not closed on its line", row=row_number,
                        expected="quoted fields closed on the same line (no line breaks inside)",
                        found=_short(text))
    if '"' not in text and text.count(",") != len(columns) - 1 and text.strip(", \t"):
        return _problem(file, "the row has the wrong number of fields", row=row_number,
                        expected=f"{len(columns)} fields", found=f"{text.count(',') + 1} fields")
    try:
        row = _split_fields(text, limit)
    except csv.Error as exc:
        return _problem(file, "the row is not valid CSV", row=row_number,
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
               label_index: int, reading: _Reading = _PLAIN) -> InvalidInputError | None:
    if all(not value.strip() for value in row):
        return _problem(file, "the row has no values", row=row_number,
                        expected=f"{len(columns)} values (the features and a label)",
                        found="only commas" if len(row) > 1 else "only whitespace")
    if len(row) != len(columns):
        return _problem(file, "the row has the wrong number of fields", row=row_number,
                        expected=f"{len(columns)} fields", found=f"{len(row)} fields")
    for index, value in enumerate(row):
        if index == label_index:
            if not value.strip():
                return _problem(file, "the label is empty", row=row_number,
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
        return _problem(file, "a feature value is not a number", row=row_number, column=column,
                        expected="a number or a missing value (an empty cell"
                                 + (f" or one of missing_values: {shown}" if markers else "")
                                 + f") {_KIND_SAYS}; add the value to missing_values, or "
                                   "leave the column out with drop_columns",
                        found=_short(value))
    number = float(text)
    if math.isnan(number) or (math.isinf(number) and "inf" in text.lower()):
        return _problem(file, "a feature value is not finite", row=row_number, column=column,
                        expected="a finite number", found=_short(value))
    if not abs(number) <= FLOAT32_MAX:
        return _problem(file, "a feature value is out of range", row=row_number, column=column,
                        expected=f"a number from -{FLOAT32_MAX:.4g} to {FLOAT32_MAX:.4g} "
                                 "(32-bit float)", found=_short(value))
    return None


def _first_non_finite(x: np.ndarray, batch: pa.RecordBatch, schema: list[Column],
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
        return _changed_while_read(file, "a missing value in a column the first pass found "
                                         "complete", row=row_offset + r + 1, column=name), False
    return _problem(file, "a feature value is not finite", row=row_offset + r + 1, column=name,
                    expected="a finite number", found=str(x[r, at])), True


# --- pass 1: scan --------------------------------------------------------------------------------

def _check_labels(source: SourceFile, columns: list[str], label: str, limits: Limits,
                  labels: pa.Array, rows: int, reading: _Reading) -> None:
    """A batch's labels: none empty, too long or broken over lines."""
    empty = pc.equal(pc.utf8_trim_whitespace(labels), "")
    if pc.any(empty).as_py():
        row = rows + int(pc.index(empty, True).as_py()) + 1
        # the row may be worse than an empty label (e.g. only commas): say what it is
        raise _diagnose(source, columns, label, limits, "", target_row=row,
                        reading=reading) or _problem(
            source.display_name, "the label is empty", row=row, column=label,
            expected="a class label", found="an empty value")
    too_long = pc.greater(pc.binary_length(pc.utf8_trim_whitespace(labels)), MAX_NAME_BYTES)
    if pc.any(too_long).as_py():
        r = int(pc.index(too_long, True).as_py())
        value = labels[r].as_py().strip()
        raise _problem(source.display_name, "a label is longer than the limit",
                       row=rows + r + 1, column=label,
                       expected=f"class labels of at most {MAX_NAME_BYTES} bytes (UTF-8)",
                       found=f"a label of {len(value.encode())} bytes: {_short(value, 40)!r}")
    broken = pc.match_substring_regex(labels, "[\r\n]")
    if pc.any(broken).as_py():
        r = int(pc.index(broken, True).as_py())
        raise _problem(source.display_name, "a label contains a line break",
                       row=rows + r + 1, column=label,
                       expected="a label on one line (no line breaks inside quotes)",
                       found=repr(_short(labels[r].as_py())))


def _count_classes(source: SourceFile, columns: list[str], label: str, limits: Limits,
                   labels: pa.Array, rows: int, reading: _Reading, counts: dict[str, int]
                   ) -> None:
    """Check a batch's labels and add them to the class counts (within ``max_classes``)."""
    _check_labels(source, columns, label, limits, labels, rows, reading)
    for item in pc.value_counts(labels).to_pylist():
        value = item["values"].strip()
        counts[value] = counts.get(value, 0) + item["counts"]
    if len(counts) > limits.max_classes:
        raise _problem(source.display_name, "too many distinct labels", column=label,
                       expected=f"at most {limits.max_classes} classes",
                       found=f"more than {limits.max_classes} (by row {rows + len(labels)})")


class _KindChanged(Exception):
    """A column read as numeric because its first cells were all missing holds text."""

    def __init__(self, column: str) -> None:
        super().__init__(column)
        self.column = column


_ARROW_COLUMN = re.compile(r"In CSV column #(\d+)")


class _CountedValues:
    """The distinct values pass 1 holds while it counts the text columns, all of them together:
    checked after each column's count, so what is held stays within ``limit`` plus one column's
    count (a column alone holds at most ``COUNT_BOUND``)."""

    def __init__(self, file: str, limit: int, columns: int) -> None:
        self.file, self.limit, self.columns = file, limit, columns
        self.total = 0
        self.held: dict[str, int] = {}

    def update(self, profile: ColumnProfile, rows: int) -> None:
        """Take in a column's count after a batch (``rows``: the rows read so far).

        Raises:
            InvalidInputError: the columns together hold more than ``limit`` values.
        """
        held = profile.tally.num_rows if profile.tally is not None else 0
        self.total += held - self.held.get(profile.name, 0)
        self.held[profile.name] = held
        if self.total > self.limit:
            raise self.problem(rows)

    def problem(self, rows: int) -> InvalidInputError:
        counted = sorted(self.held.items(), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{_short(name, 40)!r} ({n:,})" for name, n in counted[:5])
        more = f" and {len(counted) - 5:,} more" if len(counted) > 5 else ""
        return _problem(
            self.file, "the text columns have too many distinct values to count: the bound on "
                       "all text columns together was reached (not the one per column)",
            expected=f"at most {self.limit:,} distinct values counted across all text columns "
                     f"at once (the deployment's max_counted_values; each column alone keeps "
                     f"its {COUNT_BOUND:,} most frequent): leave columns out with drop_columns, "
                     "or give columns of numbers or dates their kind with column_kinds "
                     "(e.g. zip=numeric)",
            found=f"{self.total:,} distinct values by row {rows:,}, held for {len(counted):,} "
                  f"of the file's {self.columns:,} text columns: {shown}{more}")


def _profile_features(source: SourceFile, batch: pa.RecordBatch,
                      profiles: dict[str, ColumnProfile], rows: int, reading: _Reading,
                      counted: _CountedValues) -> None:
    for profile in profile_complete_numbers(list(profiles.values()), batch):
        name = profile.name
        values = batch.column(name)
        bad = profile_batch(profile, values, reading.markers)
        if profile.kind == CATEGORY:
            counted.update(profile, rows + batch.num_rows)
        if bad is not None:
            raise _problem(source.display_name, "a value of a date column is not an ISO date",
                           row=rows + bad + 1, column=name,
                           expected="an ISO date (YYYY-MM-DD, optionally with a time), or a "
                                    f"missing value, {_KIND_SAYS}",
                           found=repr(_short(values[bad].as_py())))


def scan_labels(source: SourceFile, columns: list[str], label: str, limits: Limits,
                block_bytes: int | None = None, progress: Progress | None = None,
                reading: _Reading = _PLAIN, features: list[str] | None = None,
                targets: TargetReader | None = None
                ) -> tuple[list[str], list[int], dict[str, ColumnProfile]]:
    """Pass 1: parse every row, count the labels and profile the ``features`` (their kinds in
    ``reading``); return (label values in first-seen order, their counts, the profiles).

    ``block_bytes``: the read block, by default one that holds any row within the line limit.
    With a smaller one, a row (or the header) that does not fit raises ``_BlockTooSmall``.
    ``progress`` is called before each batch. A column of ``reading.unknown`` that turns out
    to hold text raises ``_KindChanged``. With ``targets`` (a regression file) the labels are
    read as numbers into it instead of being counted as classes (no class is returned).
    """
    block, largest = _block_sizes(limits, block_bytes)
    features = features or []
    profiles = {name: ColumnProfile(name, reading.kinds.get(name, NUMERIC)) for name in features}
    counts: dict[str, int] = {}
    counted = _CountedValues(source.display_name, limits.max_counted_values,
                             sum(p.kind == CATEGORY for p in profiles.values()))
    rows = 0
    try:
        for batch in _batches(source, columns, label, [label, *features], block, reading):
            if progress is not None:
                progress()
            labels = batch.column(label)
            if targets is not None:
                targets.count(labels, rows)
            else:
                _count_classes(source, columns, label, limits, labels, rows, reading, counts)
            _profile_features(source, batch, profiles, rows, reading, counted)
            rows += batch.num_rows
    except pa.ArrowInvalid as exc:
        if block < largest and any(m in str(exc) for m in _BLOCK_TOO_SMALL):
            raise _BlockTooSmall(str(exc)) from None
        found = _ARROW_COLUMN.search(str(exc))
        column = columns[int(found[1])] if found and int(found[1]) < len(columns) else None
        if column in reading.unknown and profiles[column].present == 0:
            raise _KindChanged(column) from None
        raise _diagnosed(source, columns, label, limits, str(exc), reading) from None
    if rows == 0:
        raise _problem(source.display_name, "the file has a header but no data rows",
                       expected="at least one data row", found="0 rows")
    for profile in profiles.values():
        finish_profile(profile)
    return list(counts), list(counts.values()), profiles


def order_classes(values: list[str], counts: list[int], file: str,
                  label: str) -> tuple[list[str], list[int], str]:
    """Sort class names (numerically when every label is an integer); return (names, counts, kind)."""
    if len(values) < 2:
        raise _problem(file, "every row has the same label", column=label,
                       expected="at least two classes", found=f"only '{_short(values[0])}'")
    kind = "int"
    try:
        keys = [int(v) for v in values]
    except ValueError:
        kind = "str"
    if kind == "int":
        normalized = [str(k) for k in keys]
        merged: dict[str, int] = {}
        for name, count in zip(normalized, counts, strict=False):
            merged[name] = merged.get(name, 0) + count
        names = sorted(merged, key=int)
        return names, [merged[n] for n in names], kind
    order = sorted(range(len(values)), key=lambda i: values[i])
    return [values[i] for i in order], [counts[i] for i in order], kind


# --- dealing -------------------------------------------------------------------------------------

def holdout_phase(n: int, fraction: float, phase: float) -> float:
    """The phase the systematic rule uses for an n-row class.

    The random phase is kept unless it would leave a class of two or more rows without any
    holdout row (n * fraction < 1); then a phase is used that selects exactly one row.
    """
    if n >= 2 and math.floor(n * fraction + phase) - math.floor(phase) < 1:
        return 1.0 - n * fraction / 2
    return phase


def holdout_count(n: int, fraction: float, phase: float) -> int:
    """Rows of an n-row class the systematic holdout rule selects (at least one when n >= 2)."""
    phase = holdout_phase(n, fraction, phase)
    return int(math.floor(n * fraction + phase)) - int(math.floor(phase))


def _holdout_mask(j: np.ndarray, fraction: float, phase: float) -> np.ndarray:
    return np.floor((j + 1) * fraction + phase) > np.floor(j * fraction + phase)


_GOLDEN_STRIDE = (3 - math.sqrt(5)) / 2  # 1/phi^2: consecutive multiples spread evenly mod 1


def _largest_partial_quotient(numerator: int, denominator: int) -> int:
    """The largest term of the continued fraction of numerator/denominator (after the first)."""
    largest = 0
    numerator, denominator = denominator, numerator % denominator
    while denominator:
        largest = max(largest, numerator // denominator)
        numerator, denominator = denominator, numerator % denominator
    return largest


def spread_stride(shards: int) -> int:
    """A stride coprime to ``shards`` near ``shards / phi^2`` (so it permutes 0..shards-1).

    Of the coprime strides within 64 of ``shards / phi^2``, the one whose ratio to ``shards``
    has the smallest continued-fraction terms: its multiples are the most evenly spread
    (three-distance theorem), as the golden ratio's (all terms 1) are.
    """
    if shards <= 2:
        return 1
    base = round(shards * _GOLDEN_STRIDE)
    candidates = [s for s in range(max(1, base - 64), min(shards, base + 65))
                  if math.gcd(s, shards) == 1]
    if not candidates:
        return 1
    return min(candidates, key=lambda s: (_largest_partial_quotient(s, shards), abs(s - base)))


@dataclass(frozen=True)
class DealPlan:
    """Which shard each training row goes to, from the class counts alone (made before pass 2).

    Class ``c`` has ``n_c = base[c] * shards + len(extras[c])`` training rows: every shard gets
    ``base[c]`` of them and the shards in ``extras[c]`` (sorted, distinct) one more. The extra
    rows of all classes are numbered one after the other (classes in a seeded order) and extra
    ``t`` goes to shard ``(t * stride + offset) mod shards``: each shard gets ``floor(R / S)``
    or ``ceil(R / S)`` of the ``R`` extra rows, and, the stride being near ``S / phi^2``, one
    class's extras are spread over the shards rather than bunched. Row ``j`` of a class goes to
    the shard whose range holds it, ranges in shard order.

    Memory: the extras, ``sum(n_c mod S)`` shard numbers (below classes x shards, both limited;
    not growing with the file).
    """

    shards: int
    base: np.ndarray
    extras: tuple[np.ndarray, ...]
    stride: int
    offset: int

    @classmethod
    def make(cls, train_per_class: list[int], shards: int, seed: int) -> DealPlan:
        """Plan the deal of ``train_per_class[c]`` rows of each class over ``shards`` shards.

        Args:
            train_per_class: training rows of each class (after the holdout).
            shards: how many shards (at least 1).
            seed: the job's seed; the same seed and counts give the same plan.

        Returns:
            The plan.
        """
        counts = np.asarray(train_per_class, dtype=np.int64)
        rng = np.random.default_rng([seed, 7919, 2])
        order = rng.permutation(len(counts))
        offset = int(rng.integers(shards))
        stride = spread_stride(shards)
        remainders = counts % shards
        first = np.zeros(len(counts), dtype=np.int64)
        first[order] = np.cumsum(remainders[order]) - remainders[order]
        dtype = np.uint16 if shards <= 1 << 16 else np.int64
        extras = tuple(
            np.sort(((first[c] + np.arange(remainders[c])) % shards * stride + offset)
                    % shards).astype(dtype)
            for c in range(len(counts)))
        return cls(shards=shards, base=counts // shards, extras=extras, stride=stride,
                   offset=offset)

    def sizes(self) -> np.ndarray:
        """Training rows of each shard."""
        total_extras = sum(len(e) for e in self.extras)
        sizes = np.full(self.shards, int(self.base.sum()) + total_extras // self.shards,
                        dtype=np.int64)
        first_round = np.arange(total_extras % self.shards, dtype=np.int64)
        sizes[(first_round * self.stride + self.offset) % self.shards] += 1
        return sizes

    def shard_of(self, c: int, j: np.ndarray) -> np.ndarray:
        """Shards of rows ``j`` (0-based among class ``c``'s training rows, file order)."""
        extras, per_shard = self.extras[c], int(self.base[c])
        if per_shard == 0:
            return extras[j].astype(np.int64)
        j = np.asarray(j, dtype=np.int64)
        # shard k holds rows [start(k), start(k + 1)), start(k) = k * base + extras below k, so
        # k * base <= start(k) <= k * base + min(k, len(extras)): binary search within that
        low = np.maximum(j // (per_shard + 1), (j - len(extras)) // per_shard)
        high = np.minimum(j // per_shard + 1, self.shards)
        while True:
            open_ = high - low > 1
            if not open_.any():
                return low
            middle = (low + high) // 2
            # (the query in the extras' own dtype: otherwise numpy converts the extras each time)
            below = middle * per_shard + np.searchsorted(extras, middle.astype(extras.dtype)) <= j
            low = np.where(open_ & below, middle, low)
            high = np.where(open_ & ~below, middle, high)


def _write_part(store: BlobStore, bucket: str, path: str,
                chunks: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """Write buffered (x, y) chunks as one part object; return its rows."""
    x = np.concatenate([c[0] for c in chunks])
    y = np.concatenate([c[1] for c in chunks])
    store.write_bytes(bucket, path, codec.encode_arrays({"x": x, "y": y}),
                      "application/octet-stream")
    return len(y)


class _ShardWriter:
    """Buffers rows per shard; writes a part when a shard is complete or memory is at budget."""

    def __init__(self, store: BlobStore, bucket: str, job_id: str, expected: np.ndarray,
                 buffer_bytes: int) -> None:
        self.store, self.bucket, self.job_id = store, bucket, job_id
        self.expected = expected
        self.received = np.zeros_like(expected)
        self.buffers: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.buffered_bytes: dict[int, int] = {}
        self.total_bytes = 0
        self.peak_bytes = 0
        self.buffer_bytes = buffer_bytes
        self.shards = [Shard(i) for i in range(len(expected))]

    def add(self, shard: int, x: np.ndarray, y: np.ndarray) -> None:
        self.buffers.setdefault(shard, []).append((x, y))
        size = x.nbytes + y.nbytes
        self.buffered_bytes[shard] = self.buffered_bytes.get(shard, 0) + size
        self.total_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.total_bytes)
        self.received[shard] += len(y)
        if self.received[shard] >= self.expected[shard]:
            self.flush(shard)
        while self.total_bytes > self.buffer_bytes and self.buffered_bytes:
            self.flush(max(self.buffered_bytes, key=self.buffered_bytes.__getitem__))

    def flush(self, shard: int) -> None:
        chunks = self.buffers.pop(shard, None)
        if not chunks:
            return
        self.total_bytes -= self.buffered_bytes.pop(shard)
        record = self.shards[shard]
        path = layout.shard_part_path(self.job_id, shard, len(record.parts))
        record.rows += _write_part(self.store, self.bucket, path, chunks)
        record.parts.append(path)

    def close(self) -> list[Shard]:
        for shard in list(self.buffers):
            self.flush(shard)
        return self.shards


class _HoldoutWriter:
    def __init__(self, store: BlobStore, bucket: str, job_id: str, part_bytes: int) -> None:
        self.store, self.bucket, self.job_id = store, bucket, job_id
        self.part_bytes = part_bytes
        self.chunks: list[tuple[np.ndarray, np.ndarray]] = []
        self.bytes = 0
        self.parts: list[str] = []
        self.part_rows: list[int] = []
        self.rows = 0

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        if len(y) == 0:
            return
        self.chunks.append((x, y))
        self.bytes += x.nbytes + y.nbytes
        if self.bytes >= self.part_bytes:
            self.flush()

    def flush(self) -> None:
        if not self.chunks:
            return
        path = layout.holdout_part_path(self.job_id, len(self.parts))
        rows = _write_part(self.store, self.bucket, path, self.chunks)
        self.rows += rows
        self.parts.append(path)
        self.part_rows.append(rows)
        self.chunks, self.bytes = [], 0


class _RunningStats:
    """Chan et al. parallel mean/variance over row blocks, in float64, per column over the cells
    that are not NaN (a missing cell is imputed later, so it does not count)."""

    def __init__(self, width: int) -> None:
        self.n = np.zeros(width)
        self.mean = np.zeros(width)
        self.m2 = np.zeros(width)

    def add(self, x: np.ndarray) -> None:
        if len(x) == 0:
            return
        block = x.astype(np.float64)  # the one float64 copy: deviations are squared in place
        missing = np.isnan(block)
        if missing.any():
            n_b = (~missing).sum(axis=0).astype(np.float64)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean_b = np.where(n_b > 0, np.nansum(block, axis=0) / np.maximum(n_b, 1), 0.0)
            block -= mean_b
            block[missing] = 0.0
        else:
            n_b = np.full(block.shape[1], float(len(block)))
            mean_b = block.mean(axis=0)
            block -= mean_b
        np.square(block, out=block)
        m2_b = block.sum(axis=0)
        total = self.n + n_b
        delta = mean_b - self.mean
        share = np.divide(n_b, total, out=np.zeros_like(total), where=total > 0)
        cross = np.divide(self.n * n_b, total, out=np.zeros_like(total), where=total > 0)
        self.mean = self.mean + delta * share
        self.m2 = self.m2 + m2_b + delta**2 * cross
        self.n = total

    def variance(self) -> np.ndarray:
        var = self.m2 / np.maximum(self.n, 1)
        # A feature constant in training data would divide by ~0 at prediction time: leave it
        # unscaled instead (variance 1) so unseen values cannot explode.
        return np.where(var < 1e-12, 1.0, var)


def _changed_while_read(file: str, found: str, row: int | None = None,
                        column: str | None = None) -> InvalidInputError:
    """The problem for a second pass that does not read what the first one did."""
    return _problem(file, "the file changed while it was being read", row=row, column=column,
                    expected="the same rows in both passes over the upload (was it replaced "
                             "while it was being split?)", found=found)


def _class_key(value: str, label_kind: str) -> str | None:
    """The class name a label value counts as (None: not an integer in an integer-label file)."""
    if label_kind != "int":
        return value.strip()
    try:
        return str(int(value))
    except ValueError:
        return None


def _class_ids(labels: pa.Array, class_index: dict[str, int], label_kind: str, file: str,
               row_offset: int, label: str) -> np.ndarray:
    """Class numbers of a batch's labels (int32), looking up each distinct label once.

    A label the first pass did not count means the file is not the one that pass read.
    """
    encoded = labels.dictionary_encode()
    ids = np.zeros(len(encoded.dictionary), dtype=np.int32)
    for position, value in enumerate(encoded.dictionary.to_pylist()):
        key = _class_key(value, label_kind)
        if key not in class_index:
            indices = encoded.indices.to_numpy(zero_copy_only=False)
            row = row_offset + int(np.flatnonzero(indices == position)[0]) + 1
            raise _changed_while_read(file, f"label {_short(value)!r}, which the first pass did "
                                            "not see", row=row, column=label)
        ids[position] = class_index[key]
    return ids[encoded.indices.to_numpy(zero_copy_only=False)]


def holdout_phases(seed: int, classes: int) -> np.ndarray:
    """Per-class random phases for the systematic holdout rule."""
    return np.random.default_rng([seed, 7919]).random(classes)


@dataclass(frozen=True)
class SplitPlan:
    """How a file's rows are split, decided from its class counts alone (before pass 2).

    Attributes:
        classes: class names in class-id order.
        class_counts: rows of each class in the file.
        label_kind: how labels were read ("int", "float", "text").
        hold_phase: each class's holdout phase (which of its rows are held out).
        holdout_per_class: rows of each class kept for the holdout.
        train_per_class: rows of each class to train on.
        deal: which shard each training row goes to.
    """

    classes: list[str]
    class_counts: list[int]
    label_kind: str
    hold_phase: np.ndarray
    holdout_per_class: list[int]
    train_per_class: list[int]
    deal: DealPlan

    @property
    def train_rows(self) -> int:
        return int(sum(self.train_per_class))

    @property
    def shards(self) -> int:
        return self.deal.shards


def plan_split(classes: list[str], class_counts: list[int], label_kind: str, file: str,
               label: str, options: JobOptions, limits: Limits) -> SplitPlan:
    """Decide holdout and shards from the class counts (pure: no I/O).

    Raises:
        InvalidInputError: a class with one row, too few rows, or too many shards.
    """
    single = [name for name, n in zip(classes, class_counts, strict=True) if n < 2]
    if single:
        raise _problem(file, "a class has too few rows to train and evaluate", column=label,
                       expected="at least 2 rows of every class (one to train on, one to "
                                "evaluate on)",
                       found=f"{len(single)} of {len(classes)} classes with a single row: "
                             + _short(", ".join(repr(v) for v in single), 120))
    random_phase = holdout_phases(options.seed, len(classes))
    hold_phase = np.array([holdout_phase(n, options.holdout_fraction, random_phase[c])
                           for c, n in enumerate(class_counts)])
    holdout_per_class = [holdout_count(n, options.holdout_fraction, hold_phase[c])
                         for c, n in enumerate(class_counts)]
    train_per_class = [n - h for n, h in zip(class_counts, holdout_per_class, strict=False)]
    train_rows = sum(train_per_class)
    if train_rows < 1 or sum(holdout_per_class) < 1:
        raise _problem(file, "too few rows to train and evaluate", column=label,
                       expected="enough rows for a training split and a holdout "
                                f"(holdout_fraction={options.holdout_fraction})",
                       found=f"{sum(class_counts)} rows")
    # never more shards than training rows: then no shard is empty
    shards = min(max(1, round(train_rows / options.rows_per_shard)), train_rows)
    if shards > limits.max_tasks_per_epoch:
        raise _problem(file, "the file would need too many shards",
                       expected=f"at most {limits.max_tasks_per_epoch} shards per epoch "
                                "(raise rows_per_shard)",
                       found=f"{shards} shards of {options.rows_per_shard} rows")
    return SplitPlan(classes, list(class_counts), label_kind, hold_phase, holdout_per_class,
                     train_per_class, DealPlan.make(train_per_class, shards, options.seed))


def _shards_that_fit(plan: SplitPlan, schema: list[Column], file: str, options: JobOptions,
                     limits: Limits) -> SplitPlan:
    """``plan`` when its largest shard's arrays fit ``limits.max_shard_bytes`` (checked before
    any shard is written).

    Raises:
        InvalidInputError: they would not; the problem names the numbers and what to change.
    """
    over = check_shard_bytes(int(plan.deal.sizes().max()), matrix_width(schema),
                             limits.max_shard_bytes, options.rows_per_shard)
    if over is not None:
        raise _problem(file, over.message, expected=over.expected, found=over.found)
    return plan


class _Dealer:
    """Pass 2's bookkeeping: which rows of a batch are held out and which shard the others go to.

    Rows of class ``c`` are numbered in file order; the holdout mask and the deal plan decide
    from that number alone, so the result does not depend on how the file is cut into batches.
    """

    def __init__(self, plan: SplitPlan, fraction: float, file: str, label: str) -> None:
        self.plan, self.fraction, self.file, self.label = plan, fraction, file, label
        self.seen = np.zeros(len(plan.classes), dtype=np.int64)
        self.seen_train = np.zeros(len(plan.classes), dtype=np.int64)

    def deal(self, y: np.ndarray, row_offset: int) -> tuple[np.ndarray, np.ndarray]:
        """(is_holdout, shard_of_row) for a batch's class ids; -1 for held-out rows. A row of
        class -1 (a regression row without a target) is neither held out nor dealt."""
        counts = self.plan.class_counts
        is_holdout = np.zeros(len(y), dtype=bool)
        shard_of_row = np.full(len(y), -1, dtype=np.int64)
        for c in np.unique(y):
            if c < 0:
                continue
            rows_c = np.nonzero(y == c)[0]
            if self.seen[c] + len(rows_c) > counts[c]:
                raise _changed_while_read(
                    self.file, f"more than the {counts[c]} rows of class "
                               f"{_short(self.plan.classes[c])!r} the first pass counted",
                    row=row_offset + int(rows_c[counts[c] - self.seen[c]]) + 1, column=self.label)
            j = self.seen[c] + np.arange(len(rows_c))
            hold = _holdout_mask(j, self.fraction, self.plan.hold_phase[c])
            self.seen[c] += len(rows_c)
            is_holdout[rows_c[hold]] = True
            train_rows_c = rows_c[~hold]
            j_train = self.seen_train[c] + np.arange(len(train_rows_c))
            self.seen_train[c] += len(train_rows_c)
            shard_of_row[train_rows_c] = self.plan.deal.shard_of(int(c), j_train)
        return is_holdout, shard_of_row

    def check_complete(self) -> None:
        """Pass 2 met exactly the rows pass 1 counted."""
        counts = self.plan.class_counts
        if self.seen.tolist() != list(counts):
            short = next(c for c in range(len(counts)) if self.seen[c] != counts[c])
            raise _changed_while_read(
                self.file, f"{self.seen[short]} rows of class {_short(self.plan.classes[short])!r}"
                           f" where the first pass counted {counts[short]}", column=self.label)


def _sniff_kinds(source: SourceFile, columns: list[str], label: str, features: list[str],
                 markers: list[str], block: int) -> tuple[_Reading, LabelSniff]:
    """Each feature column's kind from the file's first block read as text (``sniff_kind``),
    and what its labels look like (``sniff_labels``, for ``task=auto``).

    A column whose cells there are all missing is read as numeric until text shows up. A
    first block pyarrow cannot read leaves every column numeric: pass 1 names the problem.
    """
    as_text = _Reading(dict.fromkeys(features, CATEGORY), markers)
    batches = _batches(source, columns, label, [label, *features], block, as_text)
    try:
        first = next(batches, None)
    except pa.ArrowInvalid:
        first = None
    finally:
        batches.close()
    reading = _Reading(dict.fromkeys(features, NUMERIC), markers)
    for name in features:
        kind = sniff_kind(first.column(name), markers) if first is not None else None
        if kind is None:
            reading.unknown.add(name)
        else:
            reading.kinds[name] = kind
    return reading, sniff_labels(first.column(label) if first is not None else None, markers)


def _force_kinds(reading: _Reading, forced: dict[str, str]) -> None:
    """``column_kinds``: the user's kind replaces the detected one (a date column's cells still
    decide date or datetime; its names were checked by ``_features_read``)."""
    for name, kind in forced.items():
        reading.kinds[name] = kind
        reading.unknown.discard(name)


@dataclass
class _Scan:
    """What pass 1 found: classes and counts, the columns' kinds and profiles, the read block."""

    classes: list[str]
    class_counts: list[int]
    label_kind: str
    block: int
    reading: _Reading
    profiles: list[ColumnProfile]
    task: str = CLASSIFICATION
    task_reason: str = ""
    # regression: the label reader (fine-bucket counts, missing targets) and each bin's first
    # fine bucket; the "classes" above are then the bins
    targets: TargetReader | None = None
    bin_starts: np.ndarray | None = None


def _count_pass(source: SourceFile, columns: list[str], label: str, features: list[str],
                limits: Limits, options: JobOptions, read_block_bytes: int,
                progress: Progress | None) -> _Scan:
    """Pass 1: the classes, their row counts, the label kind, the columns' profiles and the read
    block that fits. Starts again (nothing is written in pass 1) with a larger block when a row
    does not fit, or with a column read as text when one thought numeric turns out to be."""
    block, largest = _block_sizes(limits, read_block_bytes)
    reading, sniffed = _sniff_kinds(source, columns, label, features, options.missing_markers,
                                    block)
    _force_kinds(reading, options.forced_kinds)
    task, reason = decide_task(options.task, sniffed.all_numbers, sniffed.distinct,
                               sniffed.rows, sniffed.capped)
    targets = None
    while True:
        if task == REGRESSION:  # (again on a restart: its counts start from zero)
            targets = _target_reader(source.display_name, label, options, reason,
                                     sniffed.center)
        try:
            raw_values, raw_counts, profiles = scan_labels(source, columns, label, limits, block,
                                                           progress, reading, features, targets)
            break
        except _BlockTooSmall as exc:
            log.info("%s: %s with %d-byte blocks; reading with %d-byte blocks",
                     source.display_name, exc, block, largest)
            block = largest
        except _KindChanged as exc:
            log.info("%s: column %r holds text after missing cells; reading it as text",
                     source.display_name, exc.column)
            reading.unknown.discard(exc.column)
            reading.kinds[exc.column] = CATEGORY
    kept = [profiles[name] for name in features]
    if targets is not None:
        return _target_scan(source.display_name, label, targets, block, reading, kept, reason)
    classes, class_counts, label_kind = order_classes(raw_values, raw_counts,
                                                      source.display_name, label)
    return _Scan(classes, class_counts, label_kind, block, reading, kept, task, reason)


def _target_reader(file: str, label: str, options: JobOptions, reason: str,
                   center: float) -> TargetReader:
    """The label reader of a regression file (``class_weight`` has no classes to weigh)."""
    if options.class_weight != "none":
        raise _problem(file, "class_weight applies to classes, not to a numeric target",
                       column=label, expected="class_weight=none for a numeric target, or "
                                              "task=classification",
                       found=f"class_weight={options.class_weight} ({reason})")
    return TargetReader(file, label, options.missing_markers, reason, center=center)


def _target_scan(file: str, label: str, targets: TargetReader, block: int, reading: _Reading,
                 profiles: list[ColumnProfile], reason: str) -> _Scan:
    """Pass 1's findings for a regression file: its quantile bins stand for classes."""
    if int(targets.fine_counts.sum()) == 0:
        raise _problem(file, "no row has a target", column=label,
                       expected="numbers in the label column (a numeric target)",
                       found=f"{targets.missing} rows whose label is empty or a missing value")
    starts = quantile_bins(targets.fine_counts)
    return _Scan(bin_names(bin_edges(starts, targets.center)), bin_counts(targets.fine_counts, starts), "float",
                 block, reading, profiles, REGRESSION, reason, targets, starts)


def _checked_features(source: SourceFile, columns: list[str], label: str, limits: Limits,
                      batch: pa.RecordBatch, encoder: Encoder, reading: _Reading,
                      row_offset: int) -> np.ndarray:
    """A batch's feature matrix (float32), or the problem of its first non-finite number."""
    x = encoder.encode(batch)
    found = _first_non_finite(x, batch, encoder.columns, row_offset, source.display_name)
    if found is not None:
        problem, quote = found
        # pyarrow turned the text into float32: re-read the row to quote what it said
        # (an overflow such as 1e40 is out of range, not 'inf')
        exact = _diagnose(source, columns, label, limits, "", target_row=problem.problem.row,
                          reading=reading) if quote else None
        raise exact or problem
    return x


def _write_train_rows(writer: _ShardWriter, x: np.ndarray, y: np.ndarray,
                      shard_of_row: np.ndarray, train: np.ndarray) -> None:
    """Hand a batch's training rows to their shards, grouped by shard."""
    by_shard = train[np.argsort(shard_of_row[train], kind="stable")]
    tx, ty, ts = x[by_shard], y[by_shard], shard_of_row[by_shard]
    bounds = np.flatnonzero(np.diff(ts)) + 1
    for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(ts)], strict=False):
        if stop > start:
            writer.add(int(ts[start]), tx[start:stop].copy(), ty[start:stop].copy())


def _batch_labels(batch: pa.RecordBatch, label: str, scan: _Scan, class_index: dict[str, int],
                  file: str, row_offset: int) -> tuple[np.ndarray, np.ndarray]:
    """(the stratum of each row: class id, or a regression target's bin (-1 without a target);
    what a shard stores as y: the class id, or the float32 target)."""
    if scan.targets is None:
        y = _class_ids(batch.column(label), class_index, scan.label_kind, file, row_offset,
                       label)
        return y, y
    assert scan.bin_starts is not None
    targets, present = scan.targets.read(batch.column(label), row_offset)
    strata = bin_of(scan.targets.buckets(targets), scan.bin_starts)
    strata[~present] = -1
    return strata, targets


def _deal_pass(source: SourceFile, columns: list[str], label: str, limits: Limits, scan: _Scan,
               progress: Progress | None, plan: SplitPlan, dealer: _Dealer, encoder: Encoder,
               writer: _ShardWriter, holdout: _HoldoutWriter, stats: _RunningStats,
               target_stats: _RunningStats) -> list[Shard]:
    """Pass 2: check every row, write it to the holdout or to its shard; the shards written."""
    file = source.display_name
    class_index = {name: i for i, name in enumerate(plan.classes)}
    include = [label, *(c.name for c in encoder.columns)]
    row_offset = 0
    try:
        for batch in _batches(source, columns, label, include, scan.block, scan.reading):
            if progress is not None:
                progress()
            x = _checked_features(source, columns, label, limits, batch, encoder, scan.reading,
                                  row_offset)
            strata, y = _batch_labels(batch, label, scan, class_index, file, row_offset)
            is_holdout, shard_of_row = dealer.deal(strata, row_offset)
            holdout.add(x[is_holdout], y[is_holdout])
            train = np.flatnonzero(~is_holdout & (strata >= 0))
            stats.add(x[train])
            if scan.targets is not None:
                target_stats.add(y[train].reshape(-1, 1))
            _write_train_rows(writer, x, y, shard_of_row, train)
            row_offset += batch.num_rows
    except pa.ArrowInvalid as exc:
        raise _diagnosed(source, columns, label, limits, str(exc), scan.reading) from None
    dealer.check_complete()
    shard_list = writer.close()
    holdout.flush()
    return shard_list


def split_upload(source: SourceFile, store: BlobStore, work_bucket: str, job_id: str,
                 options: JobOptions, limits: Limits, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                 read_block_bytes: int = READ_BLOCK_BYTES, progress: Progress | None = None
                 ) -> Manifest:
    """Validate and split one uploaded CSV into shards and a holdout in the work bucket.

    Pass 1 counts the classes and profiles the columns (kinds sniffed from the first block);
    ``decide_columns`` keeps or leaves out each column, ``plan_split`` decides holdout and deal
    from the counts; pass 2 (``_deal_pass``) encodes the rows and writes each where planned.

    Args:
        source: the upload (name, size, opener for streaming reads).
        store, work_bucket: where shard and holdout parts and the manifest are written.
        job_id: the job the objects belong to (their prefix).
        options: the job's options (label column, shard size, holdout fraction, seed).
        limits: input limits, checked before expensive work.
        buffer_bytes: memory budget for shard buffers.
        read_block_bytes: the CSV read block to try first (then ``2 x max_line_bytes``).
        progress: called before each record batch of both passes; what it raises ends the split.

    Returns:
        The manifest (also written to ``jobs/<job>/manifest.json``).

    Raises:
        InvalidInputError: the file cannot be trained on; the problem names row and column.
    """
    file = source.display_name
    columns = read_header(source, limits)
    label = choose_label_column(columns, options.label_column, file)
    features = _features_read(columns, label, options, file)
    scan = _count_pass(source, columns, label, features, limits, options, read_block_bytes,
                       progress)
    schema, dropped = _decide_schema(scan, options, file)
    plan = _shards_that_fit(plan_split(scan.classes, scan.class_counts, scan.label_kind, file,
                                       label, options, limits), schema, file, options, limits)
    encoder = Encoder(schema, options.missing_markers)
    holdout = _HoldoutWriter(store, work_bucket, job_id,
                             max(64 * 1024, min(HOLDOUT_PART_BYTES, buffer_bytes // 4)))
    stats, target_stats = _RunningStats(encoder.width), _RunningStats(1)
    writer = _ShardWriter(store, work_bucket, job_id, plan.deal.sizes(), buffer_bytes)
    shard_list = _deal_pass(source, columns, label, limits, scan, progress, plan,
                            _Dealer(plan, options.holdout_fraction, file, label), encoder,
                            writer, holdout, stats, target_stats)
    manifest = Manifest(
        job_id=job_id, source=file, feature_names=[c.name for c in schema], label_column=label,
        classes=scan.classes, label_kind=scan.label_kind, class_counts=scan.class_counts,
        rows=int(sum(scan.class_counts)), train_rows=plan.train_rows,
        holdout_rows=holdout.rows, shards=shard_list, holdout_parts=holdout.parts,
        mean=[float(v) for v in stats.mean], variance=[float(v) for v in stats.variance()],
        holdout_part_rows=holdout.part_rows, columns=[c.to_dict() for c in schema],
        dropped=[{"name": d.name, "reason": d.reason} for d in dropped],
        missing_values=options.missing_markers, train_class_counts=list(plan.train_per_class),
        task=scan.task, task_reason=scan.task_reason)
    if scan.targets is not None:
        _as_regression(manifest, scan, plan, target_stats)
    store.write_bytes(work_bucket, layout.manifest_path(job_id), manifest.to_json(),
                      "application/json")
    log.info("split %s: %d rows, %d classes, %d shards, %d holdout rows, %d columns left out",
             file, manifest.rows, len(scan.classes), len(shard_list), holdout.rows, len(dropped))
    return manifest


def _as_regression(manifest: Manifest, scan: _Scan, plan: SplitPlan,
                   target_stats: _RunningStats) -> None:
    """A regression manifest: no classes; the bins, the target's statistics, the rows left out."""
    assert scan.targets is not None and scan.bin_starts is not None
    manifest.classes, manifest.class_counts, manifest.train_class_counts = [], [], []
    manifest.bin_edges = bin_edges(scan.bin_starts, scan.targets.center)[1:]
    manifest.bin_counts = list(scan.class_counts)
    manifest.train_bin_counts = [int(n) for n in plan.train_per_class]
    manifest.target_mean = float(target_stats.mean[0])
    manifest.target_std = float(math.sqrt(target_stats.variance()[0]))
    manifest.missing_targets = scan.targets.missing


def _features_read(columns: list[str], label: str, options: JobOptions, file: str) -> list[str]:
    """The feature columns the passes read: all but the label and those in drop_columns; every
    column ``column_kinds`` names must be one of them."""
    dropped = options.dropped_columns
    unknown = [name for name in dropped if name not in columns]
    if unknown or label in dropped:
        raise _problem(file, "drop_columns names a column the file does not have"
                       if unknown else "drop_columns names the label column",
                       column=(unknown or [label])[0],
                       expected="feature columns of the file: " + _short(
                           ", ".join(c for c in columns if c != label), 200),
                       found=", ".join(unknown or [label]))
    features = [c for c in columns if c != label and c not in dropped]
    not_features = [name for name in options.forced_kinds if name not in features]
    if not_features:
        raise _problem(file, "column_kinds names a column that is not a feature column (the "
                             "file lacks it, or it is the label or in drop_columns)",
                       column=not_features[0],
                       expected="feature columns of the file: " + _short(", ".join(features),
                                                                        200),
                       found=", ".join(not_features))
    if not features:
        raise _problem(file, "drop_columns leaves no feature column",
                       expected="at least one feature column", found=f"drop_columns={dropped}")
    return features


def _decide_schema(scan: _Scan, options: JobOptions, file: str
                   ) -> tuple[list[Column], list[Dropped]]:
    schema, dropped = decide_columns(scan.profiles, options.max_categories,
                                     options.dropped_columns)
    if not schema:
        raise _problem(file, "no feature column can be trained on",
                       expected="at least one feature column that is not empty, constant or "
                                "identifier-like",
                       found="; ".join(f"{d.name}: {d.reason}" for d in dropped)[:300])
    return schema, dropped


def load_parts(store: BlobStore, bucket: str, paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read shard or holdout parts and concatenate them into (x, y)."""
    xs, ys = [], []
    for path in paths:
        arrays, _ = codec.decode_arrays(store.read_bytes(bucket, path), path)
        xs.append(arrays["x"])
        ys.append(arrays["y"])
    return np.concatenate(xs), np.concatenate(ys)


def decode_utf8_safe(data: bytes) -> str:
    """Decode bytes for a message, replacing what is not UTF-8."""
    return codecs.decode(data, "utf-8", errors="replace")
