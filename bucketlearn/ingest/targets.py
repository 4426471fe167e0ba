"""A numeric label column: is it one, and its values, checked, batch by batch.

The rules (which task, the bins) are in ``bucketlearn.domain.target``; this module reads the
label column of pyarrow batches for them. A label cell that is empty or one of
``missing_values`` is a *missing target*: its row is left out of training and evaluation (the
job counts such rows). Any other cell must be a finite decimal number within float32's range,
else the file is rejected naming the row and the column.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bucketlearn.domain.columns import UNSIGNED_DECIMAL
from bucketlearn.domain.target import FINE_BUCKETS, FLOAT32_MAX, fine_buckets
from bucketlearn.errors import InputProblem, InvalidInputError
from bucketlearn.ingest.columns import missing_mask

# a finite decimal number (what pyarrow's float parser reads, without inf and nan)
NUMBER_PATTERN = rf"^[+-]?{UNSIGNED_DECIMAL}$"
_DISTINCT_CAP = 100_000  # the first block's distinct numbers are counted up to this many


@dataclass(frozen=True)
class LabelSniff:
    """What the first block's labels look like (``decide_task``'s inputs)."""

    all_numbers: bool
    distinct: int
    rows: int
    capped: bool = False
    center: float = 0.0  # the median of those numbers: fine buckets are taken around it


def sniff_labels(labels: pa.Array | None, markers: list[str]) -> LabelSniff:
    """Whether every present label of the first block is a finite number, and how many distinct
    numbers there are (None: no block could be read; the passes name the problem)."""
    if labels is None:
        return LabelSniff(False, 0, 0)
    trimmed = pc.utf8_trim_whitespace(labels)
    present = pc.invert(_missing(labels, trimmed, markers))
    numbers = pc.match_substring_regex(trimmed, NUMBER_PATTERN)
    if not pc.all(pc.or_(pc.invert(present), numbers)).as_py():
        return LabelSniff(False, 0, len(labels))
    values = pc.cast(pc.filter(trimmed, present), pa.float64())
    distinct = len(pc.unique(values))
    numbers = values.to_numpy(zero_copy_only=False)
    numbers = numbers[np.abs(numbers) <= FLOAT32_MAX]
    center = float(np.float32(np.median(numbers))) if len(numbers) else 0.0
    return LabelSniff(True, min(distinct, _DISTINCT_CAP), len(labels), distinct > _DISTINCT_CAP,
                      center)


def _missing(labels: pa.Array, trimmed: pa.Array, markers: list[str]) -> pa.Array:
    """A missing target: blank (a label is read trimmed) or one of the markers."""
    return pc.or_(pc.equal(trimmed, ""), missing_mask(labels, markers))


@dataclass
class TargetReader:
    """Reads a regression file's label column: float32 targets and which rows have one; in
    pass 1 it also counts the rows of every fine bucket (``domain.target``)."""

    file: str
    label: str
    markers: list[str]
    reason: str  # how the task was decided, for the message of a label that is not a number
    # fine buckets are those of (target - center): finest around the first block's median
    center: float = 0.0
    fine_counts: np.ndarray = field(default_factory=lambda: np.zeros(FINE_BUCKETS, np.int64))
    missing: int = 0

    def read(self, labels: pa.Array, row_offset: int) -> tuple[np.ndarray, np.ndarray]:
        """(targets as float32, 0 where missing; present mask) of a batch's labels.

        Raises:
            InvalidInputError: a label that is neither missing nor a finite float32 number,
                naming its row (``row_offset`` + its place, 1-based) and the label column.
        """
        trimmed = pc.utf8_trim_whitespace(labels)
        present = pc.invert(_missing(labels, trimmed, self.markers))
        bad = pc.and_(present, pc.invert(pc.match_substring_regex(trimmed, NUMBER_PATTERN)))
        if pc.any(bad).as_py():
            r = int(pc.index(bad, True).as_py())
            raise self._problem("a label is not a number", row_offset + r + 1,
                                self._expected(), labels[r].as_py())
        mask = np.asarray(present.to_numpy(zero_copy_only=False), dtype=bool)
        values = pc.cast(pc.if_else(present, trimmed, "0"), pa.float64()).to_numpy(
            zero_copy_only=False)
        too_large = ~(np.abs(values) <= FLOAT32_MAX)
        if too_large.any():
            r = int(np.argmax(too_large))
            raise self._problem("a label is out of range", row_offset + r + 1,
                                f"a number from -{FLOAT32_MAX:.4g} to {FLOAT32_MAX:.4g} "
                                "(32-bit float)", labels[r].as_py())
        return values.astype(np.float32), mask

    def count(self, labels: pa.Array, row_offset: int) -> None:
        """Pass 1: check a batch's labels and add them to the fine buckets' counts."""
        targets, present = self.read(labels, row_offset)
        self.missing += int(len(present) - present.sum())
        self.fine_counts += np.bincount(self.buckets(targets[present]), minlength=FINE_BUCKETS)

    def buckets(self, targets: np.ndarray) -> np.ndarray:
        """The fine bucket of each target: that of its distance from ``center`` (float32, so
        the buckets are about 1 % of that distance wide: fine where most targets are)."""
        return fine_buckets((targets.astype(np.float64) - self.center).astype(np.float32))

    def _expected(self) -> str:
        return (f"a number: the label column is a numeric target ({self.reason}); an empty "
                "cell or one of missing_values leaves the row out; set task=classification "
                "to train its values as classes")

    def _problem(self, message: str, row: int, expected: str, found: object) -> InvalidInputError:
        text = str(found)
        return InvalidInputError(InputProblem(
            file=self.file, message=message, row=row, column=self.label, expected=expected,
            found=text if len(text) <= 60 else text[:60] + "…"))
