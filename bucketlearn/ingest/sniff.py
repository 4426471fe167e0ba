"""The upload as a whole, before any row is read: files that are plainly not CSV text
(compressed, binary, JSON, HTML) refused by what they are, the size checked, the header line
read and checked (line ends, length, UTF-8, CSV, the column names: ``read_header``), and the
label column chosen among its columns (``choose_label_column``).
"""

from __future__ import annotations

import codecs
import csv
import re
from typing import IO

from bucketlearn.config import Limits
from bucketlearn.ingest.problems import abbrev, rejected
from bucketlearn.ingest.stream import SourceFile

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
# Column names and class labels end up in Firestore documents (a job lists every class name;
# a document holds at most 1 MiB): each is at most this many bytes of UTF-8.
MAX_NAME_BYTES = 256


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
            raise rejected(name, message, expected=expected, found=found)
    if b"\x00" in head[:_SNIFF_BYTES]:
        raise rejected(name, "the file is not text", expected="a UTF-8 CSV",
                       found="binary data (NUL bytes)")
    text = head[len(_BOM):] if head.startswith(_BOM) else head
    first_line = decode_utf8_safe(text.lstrip()[:200].split(b"\n", 1)[0]).strip()
    if _JSON_START.match(text):
        raise rejected(name, "the file is JSON, not CSV",
                       expected="a CSV with a header line naming the columns",
                       found=f"JSON starting with {abbrev(first_line, 40)!r}")
    if _MARKUP_START.match(text):
        raise rejected(name, "the file is HTML or XML, not CSV",
                       expected="a CSV with a header line naming the columns",
                       found=f"markup starting with {abbrev(first_line, 40)!r}")


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


def read_header(source: SourceFile, limits: Limits, min_columns: int = 2) -> list[str]:
    """Check the file as a whole (size, compression, binary) and return its column names (at
    least ``min_columns``: a feature and a label to train on; a file to predict may have one)."""
    name = source.display_name
    if source.size == 0:
        raise rejected(name, "the file is empty", expected="a header line and data rows",
                       found="0 bytes")
    if source.size > limits.max_file_bytes:
        raise rejected(name, "the file is larger than the limit",
                       expected=f"at most {limits.max_file_bytes} bytes",
                       found=f"{source.size} bytes")
    with source.opener() as stream:
        head = stream.read(_SNIFF_BYTES)
        _sniff(name, head)
        line, too_long = _first_line(stream, head, limits.max_line_bytes)
    if b"\r" in line:
        raise rejected(name, "the header line contains a carriage return", row=0,
                       expected="LF or CRLF line ends",
                       found="a CR inside the first line (CR-only line ends, as in old Mac files?)")
    if too_long:
        raise rejected(name, "the header line is longer than the limit", row=0,
                       expected=f"lines of at most {limits.max_line_bytes} bytes",
                       found="a longer line")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise rejected(name, "the header is not UTF-8", row=0,
                       column=_header_column_at(line, exc.start), expected="UTF-8 text",
                       found=f"byte 0x{line[exc.start]:02x} at position {exc.start}") from None
    if csv.field_size_limit() < limits.max_line_bytes:  # the csv module's default is 128 KiB
        csv.field_size_limit(limits.max_line_bytes)
    try:
        names = next(csv.reader([text]), [])
    except csv.Error as exc:
        raise rejected(name, "the header is not valid CSV", row=0,
                       expected="comma-separated column names", found=str(exc)) from None
    if not names or all(not n.strip() for n in names):
        raise rejected(name, "the header line is empty", row=0,
                       expected="a header line naming the columns", found=repr(abbrev(text)))
    if len(names) > limits.max_columns:
        raise rejected(name, "too many columns", row=0,
                       expected=f"at most {limits.max_columns} columns",
                       found=f"{len(names)} columns")
    _check_column_names(name, names)
    if len(names) < min_columns:
        raise rejected(name, "the file has a single column", row=0,
                       expected="at least one feature column and a label column",
                       found=f"only '{abbrev(names[0])}'{_separator_hint(names[0])}")
    return [n.strip() for n in names]


def _check_column_names(name: str, names: list[str]) -> None:
    """Every column named, within the length limit, and no name twice."""
    seen: dict[str, int] = {}
    for position, column in enumerate(names, start=1):
        stripped = column.strip()
        if not stripped:
            raise rejected(name, "a column has no name", row=0, column=f"#{position}",
                           expected="a name for every column", found="an empty name")
        if len(stripped.encode()) > MAX_NAME_BYTES:
            raise rejected(name, "a column name is longer than the limit", row=0,
                           column=f"#{position}",
                           expected=f"column names of at most {MAX_NAME_BYTES} bytes (UTF-8)",
                           found=f"a name of {len(stripped.encode())} bytes: "
                                 f"{abbrev(stripped, 40)!r}")
        if stripped in seen:
            raise rejected(name, "duplicate column name", row=0, column=stripped,
                           expected="unique column names",
                           found=f"'{stripped}' at columns {seen[stripped]} and {position}")
        seen[stripped] = position


def choose_label_column(columns: list[str], requested: str | None, file: str) -> str:
    """The label column: the one requested, else 'label' if present, else the last column."""
    if requested is not None:
        if requested not in columns:
            raise rejected(file, "the label column is missing", column=requested,
                           expected=f"a column named '{requested}'",
                           found="columns " + abbrev(", ".join(columns), 200))
        return requested
    return "label" if "label" in columns else columns[-1]


def decode_utf8_safe(data: bytes) -> str:
    """Decode bytes for a message, replacing what is not UTF-8."""
    return codecs.decode(data, "utf-8", errors="replace")
