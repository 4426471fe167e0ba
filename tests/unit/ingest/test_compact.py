"""Parsed batches held compact (bucketlearn.ingest.compact) and kept for pass 2
(bucketlearn.ingest.scan.ParsedBatches): what is given back is what was parsed, to the bit."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from bucketlearn.ingest import scan
from bucketlearn.ingest.compact import Compactor
from bucketlearn.ingest.scan import ParsedBatches


def _batch(columns: dict[str, list]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(v, type=pa.string() if name == "label" else pa.float32())
         for name, v in columns.items()], names=list(columns))


def _assert_same_bits(given: pa.RecordBatch, parsed: pa.RecordBatch) -> None:
    """Equal schemas, missing cells and values; float32 cells compared by their bits (so -0.0
    is not 0.0 and NaN is NaN)."""
    assert given.schema == parsed.schema
    assert given.num_rows == parsed.num_rows
    for got, want in zip(given.columns, parsed.columns, strict=True):
        assert got.is_null().to_pylist() == want.is_null().to_pylist()
        if want.type == pa.float32():
            present = ~np.asarray(want.is_null())
            bits = [np.asarray(c.fill_null(0.0)).view(np.uint32)[present] for c in (got, want)]
            assert np.array_equal(*bits)
        else:
            assert got.equals(want)


# Each batch is one file's consecutive rows; a column's narrowest type holds every batch so far
BATCHES = [
    _batch({"pixel": [0, 255, 17], "count": [3, 200, 9], "year": [2013, 1999, 2001],
            "delay": [-5, 12, 0], "ratio": [0.5, 1, 2], "gaps": [1, None, 4],
            "signed": [1, -0.0, 2], "label": ["a", "b", "a"]}),
    _batch({"pixel": [3, 4, 5], "count": [300, -2, 7], "year": [2014, 2015, None],
            "delay": [-0.0, 3, 1], "ratio": [1, 2, 3], "gaps": [None, None, 2],
            "signed": [1, 2, 3], "label": ["b", "b", "a"]}),
    _batch({"pixel": [255, 0, 1], "count": [1, 2, 40_000], "year": [2016, 2017, 2018],
            "delay": [1, 2, 3], "ratio": [float("nan"), 1, float("inf")], "gaps": [7, 8, 9],
            "signed": [4, 5, 6], "label": ["a", "a", "b"]}),
]


def test_whole_numbers_are_held_narrow_and_given_back_to_the_bit():
    """A column of whole numbers in 0..255 is held as uint8, one in -32,768..32,767 as int16
    (also with missing cells), and widens when a later batch needs it (300, then 40,000: the
    column goes back to float32); a fraction, NaN or an infinity keep their column as parsed,
    and so does a negative zero, for the rest of the file. Every batch comes back as parsed, bit for bit."""
    # Prepare
    compactor = Compactor(BATCHES[0].schema)
    # Execute
    held = [compactor.compact(batch) for batch in BATCHES]
    given = [compactor.restore(batch) for batch in held]
    # Assert
    types = [{f.name: str(f.type) for f in batch.schema} for batch in held]
    assert types[0] == {"pixel": "uint8", "count": "uint8", "year": "int16", "delay": "int16",
                        "ratio": "float", "gaps": "uint8", "signed": "float", "label": "string"}
    assert types[1]["count"] == "int16" and types[1]["delay"] == "float"  # 300; -0.0
    assert types[2]["count"] == "float" and types[2]["delay"] == "float"  # 40,000; -0.0 before
    assert types[2]["pixel"] == "uint8" and types[2]["gaps"] == "uint8"
    assert types[2]["signed"] == "float"  # once a -0.0 was seen, as parsed
    assert compactor.narrowed == {"pixel": 0, "count": 2, "year": 1, "delay": 2, "ratio": 2,
                                  "gaps": 0, "signed": 2}
    assert held[0].get_total_buffer_size() < BATCHES[0].get_total_buffer_size()
    for got, parsed in zip(given, BATCHES, strict=True):
        _assert_same_bits(got, parsed)


def _pixels(rows: int, seed: int) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    columns = {f"p{j}": rng.integers(0, 256, rows).astype(float).tolist() for j in range(8)}
    columns["label"] = [str(i % 3) for i in range(rows)]
    return _batch(columns)


def _kept(max_bytes: int, batches: list[pa.RecordBatch]) -> ParsedBatches:
    kept = ParsedBatches(max_bytes, group_bytes=40_000)  # two or three batches a group
    for batch in batches:
        kept.keep(batch)
    return kept


def test_kept_batches_stay_as_parsed_while_they_fit_and_are_compacted_once_they_would_not():
    """Within the bound as parsed, the batches are kept as they are; a bound they only fit
    compact holds them compact, in groups of consecutive batches (a quarter of the bound at
    most), and gives back the very batches in file order; a bound they do not fit even so
    keeps none."""
    # Prepare
    batches = [_pixels(rows, seed) for seed, rows in enumerate([400, 410, 390, 400, 420, 400, 380])]
    parsed_bytes = sum(scan._counted_bytes(b) for b in batches)
    # Execute
    roomy = _kept(parsed_bytes, batches)
    tight = _kept(parsed_bytes - 1, batches)
    too_tight = _kept(parsed_bytes // 8, batches)
    # Assert
    assert roomy.compactor is None and roomy.bytes == parsed_bytes
    assert tight.compactor is not None and not tight.overflowed
    assert tight.bytes < parsed_bytes // 2
    groups = [rows for _, rows in tight.held]
    assert all(rows is not None and 1 < len(rows) < len(batches) for rows in groups)
    for kept in (roomy, tight):
        given = list(kept.drain())
        assert [b.num_rows for b in given] == [b.num_rows for b in batches]
        for got, parsed in zip(given, batches, strict=True):
            _assert_same_bits(got, parsed)
        assert kept.held == [] and kept.pending == []  # let go of as handed out
    assert too_tight.overflowed and too_tight.held == [] and too_tight.pending == []


@pytest.mark.parametrize("bound, held", [(60_000, "none"), (150_000, "compact"),
                                         (400_000, "as parsed")])
def test_the_bound_counts_what_is_held(bound, held):
    """Whether as parsed or compact, the bytes counted for what is held never pass the bound
    and are those of what is held (the group not yet compacted counted as parsed); 12 batches
    of 400 rows take about 233 kB as parsed and about 90 kB compact."""
    # Prepare
    kept = ParsedBatches(bound, group_bytes=40_000)
    # Execute, Assert
    for seed in range(12):
        kept.keep(_pixels(400, seed))
        held_now = [b for b, _ in kept.held] + kept.pending
        assert kept.overflowed or kept.bytes == sum(scan._counted_bytes(b) for b in held_now)
        assert kept.overflowed or kept.bytes <= bound
    assert held == ("none" if kept.overflowed else
                    "as parsed" if kept.compactor is None else "compact")


def test_a_failure_to_compact_drops_the_kept_batches_instead_of_failing_the_split(caplog):
    """An Arrow error while compacting (here batches whose columns differ, which pass 1 never
    gives) is not the upload's fault: nothing is kept, pass 2 will read the upload again."""
    # Prepare
    kept = ParsedBatches(160_000, group_bytes=40_000)  # compacts at the 10th, 2-3 a group
    odd = _pixels(400, 1).append_column("extra", pa.array([1.0] * 400, pa.float32()))
    # Execute
    for batch in [_pixels(400, 0), odd] + [_pixels(400, seed) for seed in range(2, 12)]:
        kept.keep(batch)
        assert kept.compactor is not None or not kept.overflowed
    # Assert
    assert kept.overflowed and kept.held == [] and kept.pending == []
    assert "reading the upload again" in caplog.text
