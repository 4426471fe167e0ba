"""Parsed batches held compact: a float32 column whose present cells are all whole numbers in a
small range is held as uint8 (0..255) or int16 (-32,768..32,767), and given back as float32
whose present cells equal the parsed ones to the bit (missing cells stay missing; the slot
under one, which nothing reads, is not kept).

Pass 1 parses numeric features as float32 (``stream.NUMBER_TYPE``), 4 bytes a cell, though
many tables' numbers are counts, codes, years or pixel values: a 28 x 28 x 3 image CSV of 373 MB
parses to 452 MB of float32 and holds in 113 MB as uint8. ``scan.ParsedBatches`` compacts its
batches only once they would outgrow its bound, so an upload that fits as parsed pays nothing.

A column's type only ever widens (uint8, then int16, then float32 as parsed), so each column of
a batch (``scan.ParsedBatches`` passes groups of consecutive batches) is cast at most twice. A
cell that is not a whole number (a fraction, NaN, an infinity) or one out of range moves the
column to the next type; a negative zero (its sign would not come back) keeps it as parsed. A
column with a missing cell is compacted too: Arrow's cast keeps the validity bitmap.

(The parts a split writes are narrowed likewise, a whole matrix at a time: ``parts.compact``.)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bucketlearn.ingest.stream import NUMBER_TYPE

NARROW = (pa.uint8(), pa.int16())  # tried in order; a column moves on when its cells do not fit
_NEGATIVE_ZERO = np.uint32(0x8000_0000)  # float32 -0.0's bits


class Compactor:
    """Compacts a file's batches (all of ``schema``, as parsed) column by column, remembering
    each column's narrowest type so far (``narrowed``: name -> its index in ``NARROW``,
    ``len(NARROW)`` for float32 as parsed)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.narrowed: dict[str, int] = {}

    def compact(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch with each float32 column as narrow as its cells, and as earlier batches'
        cells of that column, allow (other columns as they are)."""
        columns = [self._narrow(name, column) if column.type == NUMBER_TYPE else column
                   for name, column in zip(batch.schema.names, batch.columns, strict=True)]
        return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)

    def _narrow(self, name: str, column: pa.Array) -> pa.Array:
        at = self.narrowed.get(name, 0)
        if at < len(NARROW) and _has_negative_zero(column):
            at = len(NARROW)
        narrow = column
        while at < len(NARROW):
            try:
                narrow = pc.cast(column, NARROW[at], safe=True)  # raises for what does not fit
                break
            except pa.ArrowInvalid:
                at += 1
        self.narrowed[name] = at
        return narrow

    def restore(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A compacted batch as parsed."""
        columns = [column.cast(field.type) if column.type != field.type else column
                   for column, field in zip(batch.columns, self.schema, strict=True)]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def _has_negative_zero(column: pa.Array) -> bool:
    """Whether a float32 column holds -0.0 (a missing cell's slot may say so too: that column
    is then left as parsed, which is only a missed saving)."""
    if len(column) == 0:
        return False
    bits = np.frombuffer(column.buffers()[1], dtype=np.uint32, count=len(column),
                         offset=column.offset * 4)
    return bool((bits == _NEGATIVE_ZERO).any())
