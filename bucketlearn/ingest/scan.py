"""Pass 1, the scan: each feature column's kind sniffed from the file's first block, then every
row parsed, its label checked and counted as a class (or, for a numeric target, read into fine
buckets) and its features profiled; started again with a larger block when a row does not fit,
or with a column read as text when one read as numeric turns out to hold text. ``count_pass``
returns what the deal is planned from (``Scan``); nothing is written.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bucketlearn.config import Limits
from bucketlearn.domain.columns import CATEGORY, NUMERIC, ColumnProfile
from bucketlearn.domain.target import (
    CLASSIFICATION,
    REGRESSION,
    bin_counts,
    bin_edges,
    bin_names,
    decide_task,
    quantile_bins,
)
from bucketlearn.errors import InvalidInputError
from bucketlearn.ingest import stream
from bucketlearn.ingest.columns import (
    COUNT_BOUND,
    finish_profile,
    profile_batch,
    profile_complete_numbers,
    sniff_kinds,
)
from bucketlearn.ingest.compact import Compactor
from bucketlearn.ingest.problems import KIND_SAYS, abbrev, rejected
from bucketlearn.ingest.sniff import MAX_NAME_BYTES
from bucketlearn.ingest.stream import PLAIN, Progress, Reading, SourceFile, diagnose, diagnosed
from bucketlearn.ingest.targets import LabelSniff, TargetReader, sniff_labels
from bucketlearn.options import JobOptions

log = logging.getLogger(__name__)


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


def _check_labels(source: SourceFile, columns: list[str], label: str, limits: Limits,
                  labels: pa.Array, rows: int, reading: Reading) -> None:
    """A batch's labels: none empty, too long or broken over lines."""
    empty = pc.equal(pc.utf8_trim_whitespace(labels), "")
    if pc.any(empty).as_py():
        row = rows + int(pc.index(empty, True).as_py()) + 1
        # the row may be worse than an empty label (e.g. only commas): say what it is
        raise diagnose(source, columns, label, limits, "", target_row=row,
                       reading=reading) or rejected(
            source.display_name, "the label is empty", row=row, column=label,
            expected="a class label", found="an empty value")
    too_long = pc.greater(pc.binary_length(pc.utf8_trim_whitespace(labels)), MAX_NAME_BYTES)
    if pc.any(too_long).as_py():
        r = int(pc.index(too_long, True).as_py())
        value = labels[r].as_py().strip()
        raise rejected(source.display_name, "a label is longer than the limit",
                       row=rows + r + 1, column=label,
                       expected=f"class labels of at most {MAX_NAME_BYTES} bytes (UTF-8)",
                       found=f"a label of {len(value.encode())} bytes: {abbrev(value, 40)!r}")
    broken = pc.match_substring_regex(labels, "[\r\n]")
    if pc.any(broken).as_py():
        r = int(pc.index(broken, True).as_py())
        raise rejected(source.display_name, "a label contains a line break",
                       row=rows + r + 1, column=label,
                       expected="a label on one line (no line breaks inside quotes)",
                       found=repr(abbrev(labels[r].as_py())))


def _count_classes(source: SourceFile, columns: list[str], label: str, limits: Limits,
                   labels: pa.Array, rows: int, reading: Reading, counts: dict[str, int]
                   ) -> None:
    """Check a batch's labels and add them to the class counts (within ``max_classes``)."""
    _check_labels(source, columns, label, limits, labels, rows, reading)
    for item in pc.value_counts(labels).to_pylist():
        value = item["values"].strip()
        counts[value] = counts.get(value, 0) + item["counts"]
    if len(counts) > limits.max_classes:
        raise rejected(source.display_name, "too many distinct labels", column=label,
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
        shown = ", ".join(f"{abbrev(name, 40)!r} ({n:,})" for name, n in counted[:5])
        more = f" and {len(counted) - 5:,} more" if len(counted) > 5 else ""
        return rejected(
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
                      profiles: dict[str, ColumnProfile], rows: int, reading: Reading,
                      counted: _CountedValues) -> None:
    for profile in profile_complete_numbers(list(profiles.values()), batch):
        name = profile.name
        values = batch.column(name)
        bad = profile_batch(profile, values, reading.markers)
        if profile.kind == CATEGORY:
            counted.update(profile, rows + batch.num_rows)
        if bad is not None:
            raise rejected(source.display_name, "a value of a date column is not an ISO date",
                           row=rows + bad + 1, column=name,
                           expected="an ISO date (YYYY-MM-DD, optionally with a time), or a "
                                    f"missing value, {KIND_SAYS}",
                           found=repr(abbrev(values[bad].as_py())))


def scan_labels(source: SourceFile, columns: list[str], label: str, limits: Limits,
                block_bytes: int | None = None, progress: Progress | None = None,
                reading: Reading = PLAIN, features: list[str] | None = None,
                targets: TargetReader | None = None, kept: ParsedBatches | None = None
                ) -> tuple[list[str], list[int], dict[str, ColumnProfile]]:
    """Pass 1: parse every row, count the labels and profile the ``features`` (their kinds in
    ``reading``); return (label values in first-seen order, their counts, the profiles).

    ``block_bytes``: the read block, by default one that holds any row within the line limit.
    With a smaller one, a row (or the header) that does not fit raises ``_BlockTooSmall``.
    ``progress`` is called before each batch. A column of ``reading.unknown`` that turns out
    to hold text raises ``_KindChanged``. With ``targets`` (a regression file) the labels are
    read as numbers into it instead of being counted as classes (no class is returned).
    ``kept`` keeps the batches read (``ParsedBatches``).
    """
    block, largest = _block_sizes(limits, block_bytes)
    features = features or []
    profiles = {name: ColumnProfile(name, reading.kinds.get(name, NUMERIC)) for name in features}
    counts: dict[str, int] = {}
    counted = _CountedValues(source.display_name, limits.max_counted_values,
                             sum(p.kind == CATEGORY for p in profiles.values()))
    rows = 0
    try:
        for batch in stream.batches(source, columns, label, [label, *features], block, reading):
            if progress is not None:
                progress()
            labels = batch.column(label)
            if targets is not None:
                targets.count(labels, rows)
            else:
                _count_classes(source, columns, label, limits, labels, rows, reading, counts)
            _profile_features(source, batch, profiles, rows, reading, counted)
            if kept is not None:
                kept.keep(batch)
            rows += batch.num_rows
    except pa.ArrowInvalid as exc:
        if block < largest and any(m in str(exc) for m in _BLOCK_TOO_SMALL):
            raise _BlockTooSmall(str(exc)) from None
        found = _ARROW_COLUMN.search(str(exc))
        column = columns[int(found[1])] if found and int(found[1]) < len(columns) else None
        if column in reading.unknown and profiles[column].present == 0:
            raise _KindChanged(column) from None
        raise diagnosed(source, columns, label, limits, str(exc), reading) from None
    if rows == 0:
        raise rejected(source.display_name, "the file has a header but no data rows",
                       expected="at least one data row", found="0 rows")
    for profile in profiles.values():
        finish_profile(profile)
    return list(counts), list(counts.values()), profiles


def order_classes(values: list[str], counts: list[int], file: str,
                  label: str) -> tuple[list[str], list[int], str]:
    """Sort class names (numerically when every label is an integer); return (names, counts, kind)."""
    if len(values) < 2:
        raise rejected(file, "every row has the same label", column=label,
                       expected="at least two classes", found=f"only '{abbrev(values[0])}'")
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


def _sniff_kinds(source: SourceFile, columns: list[str], label: str, features: list[str],
                 markers: list[str], block: int) -> tuple[Reading, LabelSniff]:
    """Each feature column's kind from the file's first block read as text (``sniff_kinds``),
    and what its labels look like (``sniff_labels``, for ``task=auto``).

    A column whose cells there are all missing is read as numeric until text shows up. A
    first block pyarrow cannot read leaves every column numeric: pass 1 names the problem.
    """
    as_text = Reading(dict.fromkeys(features, CATEGORY), markers)
    batches = stream.batches(source, columns, label, [label, *features], block, as_text)
    try:
        first = next(batches, None)
    except pa.ArrowInvalid:
        first = None
    finally:
        batches.close()
    reading = Reading(dict.fromkeys(features, NUMERIC), markers)
    found = sniff_kinds(first, features, markers) if first is not None else {}
    for name in features:
        kind = found.get(name)
        if kind is None:
            reading.unknown.add(name)
        else:
            reading.kinds[name] = kind
    return reading, sniff_labels(first.column(label) if first is not None else None, markers)


def _force_kinds(reading: Reading, forced: dict[str, str]) -> None:
    """``column_kinds``: the user's kind replaces the detected one (a date column's cells still
    decide date or datetime; its names were checked by ``split._features_read``)."""
    for name, kind in forced.items():
        reading.kinds[name] = kind
        reading.unknown.discard(name)


# Pass 1's parsed batches are kept for pass 2 while they stay within ``Limits.keep_parsed_bytes``:
# pass 2 then neither reads the upload again nor parses it. Batches that would outgrow the bound
# are held compact (``compact.Compactor``: whole numbers as uint8 or int16; a 373 MB image CSV,
# 452 MB as float32, is held in 113 MB); past the bound even so, the upload is read twice.
ARRAY_OVERHEAD_BYTES = 512  # beside an array's buffers: its C++ objects, buffer padding
# Consecutive parsed batches compacted together, and given back together (at most a quarter of
# the bound): a column is cast once a group rather than once a small batch. Compacting a group,
# or giving one back while pass 2 still deals the last one's rows, holds up to two groups beside
# the bound.
COMPACT_GROUP_BYTES = 64 * 1024**2
# An upload over this many times the bound is read twice without trying to keep it: held
# compact, a cell takes at least a byte, and a CSV cell rarely less than four ("123,")
KEEP_FILE_RATIO = 4


def _counted_bytes(batch: pa.RecordBatch) -> int:
    """A batch's bytes as the bound counts them: its buffers whole, and an allowance for each
    column's array object and padding."""
    return batch.get_total_buffer_size() + ARRAY_OVERHEAD_BYTES * batch.num_columns


@dataclass
class ParsedBatches:
    """Pass 1's record batches, kept for pass 2 while their bytes stay within ``max_bytes``:
    as parsed while they fit so; then held compact, in groups of consecutive batches of about
    ``group_bytes``; past the bound even so, none is kept (``overflowed``) and pass 2 reads the
    upload again. ``drain`` gives back the very batches kept, as parsed."""

    max_bytes: int
    # each a batch as parsed (rows None), or a compacted group of consecutive batches of these
    # row counts
    held: list[tuple[pa.RecordBatch, list[int] | None]] = field(default_factory=list)
    bytes: int = 0  # of ``held`` and ``pending`` together
    overflowed: bool = False
    compactor: Compactor | None = None  # set once the batches are held compact
    pending: list[pa.RecordBatch] = field(default_factory=list)  # the next group, as parsed
    pending_bytes: int = 0
    group_bytes: int = COMPACT_GROUP_BYTES

    def keep(self, batch: pa.RecordBatch) -> None:
        if self.overflowed:
            return
        size = _counted_bytes(batch)
        try:
            if self.compactor is None and self.bytes + size > self.max_bytes:
                self.compactor = Compactor(batch.schema)
                parsed, self.held, self.bytes = self.held, [], 0
                parsed.reverse()
                while parsed:  # one group at a time (memory only falls)
                    kept, _ = parsed.pop()
                    self._add_pending(kept, _counted_bytes(kept))
            if self.compactor is None:
                self.held.append((batch, None))
                self.bytes += size
            else:
                self._add_pending(batch, size)
        except pa.ArrowException:  # not the upload's fault: it is read again instead
            log.warning("keeping the parsed rows for the second pass failed; reading the upload "
                        "again", exc_info=True)
            self._overflow()
        if self.bytes > self.max_bytes:
            self._overflow()

    def _overflow(self) -> None:
        self.held.clear()
        self.pending.clear()
        self.overflowed = True

    def _add_pending(self, batch: pa.RecordBatch, size: int) -> None:
        assert self.compactor is not None
        self.pending.append(batch)
        self.pending_bytes += size
        self.bytes += size
        if self.pending_bytes >= min(self.group_bytes, self.max_bytes // 4):
            group = self.compactor.compact(pa.concat_batches(self.pending))
            self.held.append((group, [b.num_rows for b in self.pending]))
            self.bytes += _counted_bytes(group) - self.pending_bytes
            self.pending, self.pending_bytes = [], 0

    def drain(self) -> Iterator[pa.RecordBatch]:
        """The batches in file order as parsed, each let go of once handed out (memory falls
        as pass 2 goes)."""
        self.held.reverse()
        while self.held:
            batch, rows = self.held.pop()
            if rows is None:
                yield batch
                continue
            assert self.compactor is not None
            group, offset = self.compactor.restore(batch), 0
            del batch
            for count in rows:
                yield group.slice(offset, count)
                offset += count
            del group
        self.pending.reverse()
        while self.pending:
            yield self.pending.pop()


@dataclass
class Scan:
    """What pass 1 found: classes and counts, the columns' kinds and profiles, the read block,
    and its parsed batches where they were kept for pass 2 (``parsed``; None: read again)."""

    classes: list[str]
    class_counts: list[int]
    label_kind: str
    block: int
    reading: Reading
    profiles: list[ColumnProfile]
    task: str = CLASSIFICATION
    task_reason: str = ""
    # regression: the label reader (fine-bucket counts, missing targets) and each bin's first
    # fine bucket; the "classes" above are then the bins
    targets: TargetReader | None = None
    bin_starts: np.ndarray | None = None
    parsed: ParsedBatches | None = None


def count_pass(source: SourceFile, columns: list[str], label: str, features: list[str],
               limits: Limits, options: JobOptions, read_block_bytes: int,
               progress: Progress | None, kinds: dict[str, str] | None = None) -> Scan:
    """Pass 1: the classes, their row counts, the label kind, the columns' profiles and the read
    block that fits, and its batches for pass 2 where they are within
    ``limits.keep_parsed_bytes`` (``ParsedBatches``). Starts again (nothing is written in pass
    1) with a larger block when a row does not fit, or with a column read as text when one
    thought numeric turns out to be. ``kinds``: each feature column's kind, read as given rather
    than sniffed (a continued job's parent's); None: sniffed, then ``column_kinds``."""
    block, largest = _block_sizes(limits, read_block_bytes)
    reading, sniffed = _sniff_kinds(source, columns, label, features, options.missing_markers,
                                    block)
    _force_kinds(reading, options.forced_kinds if kinds is None else kinds)
    task, reason = decide_task(options.task, sniffed.all_numbers, sniffed.distinct,
                               sniffed.rows, sniffed.capped)
    targets = None
    while True:
        if task == REGRESSION:  # (again on a restart: its counts start from zero)
            targets = _target_reader(source.display_name, label, options, reason,
                                     sniffed.center)
        # (again on a restart: what the failed attempt kept is dropped)
        keep = limits.keep_parsed_bytes
        kept = ParsedBatches(keep) if keep and source.size <= KEEP_FILE_RATIO * keep else None
        try:
            raw_values, raw_counts, profiles = scan_labels(source, columns, label, limits, block,
                                                           progress, reading, features, targets,
                                                           kept)
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
    parsed = kept if kept is not None and not kept.overflowed else None
    profiled = [profiles[name] for name in features]
    if targets is not None:
        return dataclasses.replace(_target_scan(source.display_name, label, targets, block,
                                                reading, profiled, reason), parsed=parsed)
    classes, class_counts, label_kind = order_classes(raw_values, raw_counts,
                                                      source.display_name, label)
    return Scan(classes, class_counts, label_kind, block, reading, profiled, task, reason,
                parsed=parsed)


def _target_reader(file: str, label: str, options: JobOptions, reason: str,
                   center: float) -> TargetReader:
    """The label reader of a regression file (``class_weight`` has no classes to weigh)."""
    if options.class_weight != "none":
        raise rejected(file, "class_weight applies to classes, not to a numeric target",
                       column=label, expected="class_weight=none for a numeric target, or "
                                              "task=classification",
                       found=f"class_weight={options.class_weight} ({reason})")
    return TargetReader(file, label, options.missing_markers, reason, center=center)


def _target_scan(file: str, label: str, targets: TargetReader, block: int, reading: Reading,
                 profiles: list[ColumnProfile], reason: str) -> Scan:
    """Pass 1's findings for a regression file: its quantile bins stand for classes."""
    if int(targets.fine_counts.sum()) == 0:
        raise rejected(file, "no row has a target", column=label,
                       expected="numbers in the label column (a numeric target)",
                       found=f"{targets.missing} rows whose label is empty or a missing value")
    starts = quantile_bins(targets.fine_counts)
    return Scan(bin_names(bin_edges(starts, targets.center)), bin_counts(targets.fine_counts, starts), "float",
                block, reading, profiles, REGRESSION, reason, targets, starts)
