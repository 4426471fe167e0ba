"""Bounded read-ahead of the CSV stream (bucketlearn.ingest.readahead) and its use by ingest.

pyarrow's streaming CSV reader reads up to ~32 blocks ahead of the batches taken; ingest wraps
the source so it reads at most ``READ_AHEAD_BLOCKS`` ahead, in small blocks, and reads again with
large blocks when a row does not fit a small one.
"""

from __future__ import annotations

import dataclasses
import io
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.errors import InvalidInputError
from bucketlearn.ingest import readahead
from bucketlearn.ingest import stream as ingest
from bucketlearn.ingest.parts import load_parts
from bucketlearn.ingest.split import split_upload
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.options import JobOptions
from tests.unit.helpers import blobs_rows, csv_bytes, eventually

BLOCK = 16 * 1024
COLUMNS = ["a", "b", "c", "label"]
LIMITS = Limits(max_line_bytes=64 * 1024)  # the retry block: 1 MiB
OPTIONS = JobOptions(rows_per_shard=500, seed=3)


class CountingStream(io.BytesIO):
    """An in-memory file that counts the bytes read from it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.bytes_read += len(data)
        return data


def many_block_csv(blocks: int, block: int = BLOCK) -> bytes:
    """A CSV of at least ``blocks`` blocks of short rows (three classes)."""
    parts = [b"a,b,c,label\n"]
    size, i = len(parts[0]), 0
    while size < blocks * block:
        row = b"%d,%d,0.5,%d\n" % (i, 2 * i, i % 3)
        parts.append(row)
        size += len(row)
        i += 1
    return b"".join(parts)


def counting_source(data: bytes, streams: list[CountingStream]) -> SourceFile:
    def opener() -> CountingStream:
        streams.append(CountingStream(data))
        return streams[-1]

    return SourceFile("many.csv", len(data), opener)


def run_with_timeout(fn: Any, seconds: float) -> Any:
    """fn() in a thread; fails the test (instead of hanging it) if it does not end in time."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised in the test's thread
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"did not finish within {seconds} s (a read blocked?)"
    if "error" in out:
        raise out["error"]
    return out.get("value")



# --- (a) the read-ahead is bounded -----------------------------------------------------------------

def max_read_ahead(batches: Any, stream: list[CountingStream]) -> tuple[int, int]:
    """(most bytes read beyond the batches taken so far, batches) for a consumer that holds back."""
    ahead, count = 0, 0
    for i, _ in enumerate(batches):
        time.sleep(0.01)  # hold the batch: the reading thread gets as far as it is let
        ahead = max(ahead, stream[0].bytes_read - (i + 1) * BLOCK)
        count = i + 1
    return ahead, count


def test_read_ahead_is_bounded_while_the_consumer_holds_back():
    """Never more than N+1 blocks (plus one for slack) read beyond the batch being processed."""
    # Prepare: 64 blocks; the same file through pyarrow alone shows what is being bounded
    data = many_block_csv(64)
    n = ingest.READ_AHEAD_BLOCKS
    unbounded = [CountingStream(data)]
    reader = pacsv.open_csv(unbounded[0], read_options=pacsv.ReadOptions(
        block_size=BLOCK, column_names=COLUMNS, skip_rows=1))
    pyarrow_ahead, _ = max_read_ahead(reader, unbounded)
    streams: list[CountingStream] = []
    # Execute
    bounded_ahead, batches = max_read_ahead(
        ingest.batches(counting_source(data, streams), COLUMNS, "label", ["label"], BLOCK),
        streams)
    # Assert
    assert batches >= 64
    assert pyarrow_ahead > (n + 2) * BLOCK  # the bound below would catch pyarrow's read-ahead
    assert bounded_ahead <= (n + 1) * BLOCK + BLOCK
    assert streams[0].bytes_read == len(data)  # and the whole file was read
    assert streams[0].closed


@pytest.mark.parametrize("blank_blocks", [0, 3], ids=["rows", "blank-blocks"])
def test_counting_matches_pyarrow_without_the_stall_release(blank_blocks):
    """One batch per block, empty ones too: the gate never needs the stall fallback to proceed."""
    # Prepare: blocks of blank lines give empty batches; a 60 s stall would fail the timeout
    data = many_block_csv(20)
    data = data + b"\n" * (blank_blocks * BLOCK) + data.split(b"\n", 1)[1]
    stream = readahead.BoundedReader(io.BytesIO(data), ahead=2, stall_seconds=60)
    options = pacsv.ReadOptions(block_size=BLOCK, column_names=COLUMNS, skip_rows=1)
    batches = stream.batches(lambda s: pacsv.open_csv(s, read_options=options))
    # Execute
    rows = run_with_timeout(lambda: sum(b.num_rows for b in batches), 30)
    # Assert
    assert rows == sum(1 for line in data.split(b"\n")[1:] if line)
    assert stream.stalls == 0
    assert stream.closed and stream.waiting == 0


def test_stall_release_lets_a_stuck_consumer_proceed():
    """A reader that needs more look-ahead than counted gets one block per stall, not a deadlock."""
    # Prepare: each 'batch' needs three reads; only one block may be ahead
    class GreedyReader:
        def __init__(self, stream: readahead.BoundedReader) -> None:
            self.stream = stream

        def read_next_batch(self) -> bytes:
            chunks = [self.stream.read(4) for _ in range(3)]
            if not any(chunks):
                raise StopIteration
            return b"".join(chunks)

    stream = readahead.BoundedReader(io.BytesIO(b"x" * 48), ahead=1, stall_seconds=0.05)
    # Execute
    out = run_with_timeout(lambda: b"".join(stream.batches(GreedyReader)), 20)
    # Assert
    assert out == b"x" * 48
    assert stream.stalls >= 4


@pytest.mark.parametrize("where", ["header", "first-row"])
def test_a_failed_open_does_not_deadlock(where):
    """pyarrow waits for its reading thread when opening fails; the stall release frees it."""
    # Prepare: a line longer than the block in the first block fails inside open_csv
    data = blob_csv(long_header=where == "header", long_row=0 if where == "first-row" else None)
    options = pacsv.ReadOptions(block_size=BLOCK, column_names=["f0", "f1", "f2", "f3", "label"],
                                skip_rows=1)

    def open_and_fail() -> None:
        for _ in range(40):  # the wait happens in a fraction of the opens only
            stream = readahead.BoundedReader(io.BytesIO(data), stall_seconds=0.05)
            with pytest.raises(pa.ArrowInvalid):
                next(stream.batches(lambda s: pacsv.open_csv(s, read_options=options)))
            assert stream.closed
            assert eventually(lambda s=stream: s.waiting == 0)

    # Execute / Assert
    run_with_timeout(open_and_fail, 60)


# --- (b) rows longer than the block ----------------------------------------------------------------

def spied_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the block size of every streaming pass ingest starts."""
    blocks: list[int] = []
    real = ingest.batches

    def spy(source: SourceFile, columns: list[str], label: str, include: Any,
            block_bytes: int, reading: Any = ingest.PLAIN) -> Any:
        blocks.append(block_bytes)
        return real(source, columns, label, include, block_bytes, reading)

    monkeypatch.setattr(ingest, "batches", spy)
    return blocks


def split_bytes(data: bytes, read_block_bytes: int) -> tuple[Any, MemoryBlobStore]:
    store = MemoryBlobStore()
    source = SourceFile("upload.csv", len(data), lambda: io.BytesIO(data))
    # pass 2 reads the file again (as an upload too large to keep pass 1's batches): its blocks
    # are what these tests watch
    manifest = split_upload(source, store, "work", "job-000000000000", OPTIONS,
                            dataclasses.replace(LIMITS, keep_parsed_bytes=0),
                            read_block_bytes=read_block_bytes)
    return manifest, store


def assert_same_split(a: Any, a_store: MemoryBlobStore, b: Any, b_store: MemoryBlobStore) -> None:
    """Same manifest and parts (the statistics, summed per block, to rounding)."""
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12)
    np.testing.assert_allclose(a.variance, b.variance, rtol=1e-12)
    assert dataclasses.replace(a, mean=b.mean, variance=b.variance) == b
    assert sorted(i.name for i in a_store.list("work")) == sorted(i.name for i in b_store.list("work"))
    for shard_a, shard_b in zip(a.shards, b.shards, strict=True):
        for x, y in zip(load_parts(a_store, "work", shard_a.parts),
                        load_parts(b_store, "work", shard_b.parts), strict=True):
            np.testing.assert_array_equal(x, y)
    for x, y in zip(load_parts(a_store, "work", a.holdout_parts),
                    load_parts(b_store, "work", b.holdout_parts), strict=True):
        np.testing.assert_array_equal(x, y)


def blob_csv(n_rows: int = 3000, long_row: int | None = None, long_header: bool = False) -> bytes:
    header = ["f0", "f1", "f2", "f3", "label"]
    rows = blobs_rows(n_rows, 3, 4, seed=5)
    if long_row is not None:
        rows[long_row][1] = "0" * 40_000 + str(rows[long_row][1]).lstrip("-")  # 40 kB, a number
    if long_header:  # a 40 kB header line (names are at most 256 bytes: padding, stripped)
        header[0] = "f0" + " " * 40_000
    return csv_bytes(header, rows)


@pytest.mark.parametrize("where", ["row", "header"])
def test_a_line_longer_than_the_block_is_read_again_with_the_large_block(monkeypatch, where):
    """Pass 1 restarts with the large block, pass 2 uses it; the split equals a large-block one."""
    # Prepare: one 40 kB line (a data row deep in the file, or the header); 16 KiB blocks
    data = blob_csv(long_row=1700 if where == "row" else None, long_header=where == "header")
    assert len(data) > 6 * BLOCK
    blocks = spied_blocks(monkeypatch)
    # Execute
    small, small_store = split_bytes(data, BLOCK)
    small_blocks = list(blocks)
    blocks.clear()
    large, large_store = split_bytes(data, 1 << 20)
    # Assert: the kinds' first block and pass 1 at 16 KiB (pass 1 failed), pass 1 again and
    # pass 2 at 1 MiB; no row counted twice
    assert small_blocks == [BLOCK, BLOCK, 1 << 20, 1 << 20]
    assert blocks == [1 << 20, 1 << 20, 1 << 20]
    assert small.rows == 3000 and sum(small.class_counts) == 3000
    assert small.train_rows + small.holdout_rows + small.validation_rows == 3000
    assert_same_split(small, small_store, large, large_store)


def test_small_blocks_split_exactly_like_large_ones(monkeypatch):
    """Without long lines a file read in many small blocks gives the same parts as one block."""
    data = blob_csv()
    blocks = spied_blocks(monkeypatch)
    small, small_store = split_bytes(data, BLOCK)
    assert blocks == [BLOCK, BLOCK, BLOCK]  # the kinds' first block, pass 1, pass 2
    large, large_store = split_bytes(data, 1 << 20)
    assert_same_split(small, small_store, large, large_store)


def bad_after_long_row() -> bytes:
    lines = blob_csv(long_row=10).split(b"\n")
    fields = lines[2500].split(b",")
    fields[2] = b"abc"  # data row 2500, column f2
    lines[2500] = b",".join(fields)
    return b"\n".join(lines)


def over_the_limit() -> bytes:
    data = blob_csv()
    lines = data.split(b"\n")
    lines[1200] = b"0" * (2200 * 1024) + lines[1200]  # spans more than two 1 MiB blocks
    return b"\n".join(lines)


@pytest.mark.parametrize("make", [bad_after_long_row, over_the_limit],
                         ids=["bad-value-after-long-row", "row-over-the-limit"])
def test_problems_are_reported_as_with_large_blocks(make):
    """The block size changes nothing in what a rejection says."""
    data = make()
    with pytest.raises(InvalidInputError) as small:
        split_bytes(data, BLOCK)
    with pytest.raises(InvalidInputError) as large:
        split_bytes(data, 1 << 20)
    assert small.value.problem == large.value.problem
    assert small.value.problem.row in (2500, 1200)


# --- (c) no reading thread is left blocked ---------------------------------------------------------

def os_threads() -> int:
    status = Path("/proc/self/status")
    if not status.exists():
        return threading.active_count()
    line = next(x for x in status.read_text().splitlines() if x.startswith("Threads:"))
    return int(line.split()[1])


@pytest.fixture
def one_io_thread():
    """pyarrow with a single I/O thread: a read left blocked would stall every later read."""
    before = pa.io_thread_count()
    pa.set_io_thread_count(1)
    try:
        yield
    finally:
        pa.set_io_thread_count(before)


def test_leaving_early_releases_the_reading_thread(monkeypatch, one_io_thread):
    """close(), an error in the consumer, or a rejection mid-file: no read stays blocked."""
    # Prepare: record every gate; no stall release (60 s), so only close() can free a read
    gates: list[readahead.BoundedReader] = []

    class Recorded(readahead.BoundedReader):
        def __init__(self, raw: Any, ahead: int = 3, stall_seconds: float = 2.0) -> None:
            super().__init__(raw, ahead=ahead, stall_seconds=60)
            gates.append(self)

    monkeypatch.setattr(readahead, "BoundedReader", Recorded)
    data = many_block_csv(40)
    source = counting_source(data, [])

    def full_read() -> int:
        return sum(b.num_rows for b in ingest.batches(source, COLUMNS, "label", None, BLOCK))

    rows = run_with_timeout(full_read, 30)  # warm up pyarrow's pool
    baseline = os_threads()

    def close_after_first_batch() -> None:
        batches = ingest.batches(source, COLUMNS, "label", None, BLOCK)
        next(batches)
        assert eventually(lambda: gates[-1].waiting == 1)  # the reader is held at the gate
        batches.close()

    def fail_in_consumer() -> None:
        with pytest.raises(RuntimeError):
            for _ in ingest.batches(source, COLUMNS, "label", None, BLOCK):
                assert eventually(lambda: gates[-1].waiting == 1)
                raise RuntimeError("the consumer failed")

    def rejected_mid_file() -> None:
        bad = data.replace(b"\n100,200,0.5,1\n", b"\n100,200,0.5,\n")  # empty label, block 1
        with pytest.raises(InvalidInputError, match="label is empty"):
            split_upload(SourceFile("bad.csv", len(bad), lambda: io.BytesIO(bad)),
                         MemoryBlobStore(), "work", "job", OPTIONS, LIMITS,
                         read_block_bytes=BLOCK)

    # Execute: more early exits than pyarrow has I/O threads, then a full read
    for leave in [close_after_first_batch, fail_in_consumer, rejected_mid_file] * 2:
        run_with_timeout(leave, 20)
    after = run_with_timeout(full_read, 30)
    # Assert
    assert after == rows
    assert eventually(lambda: all(g.waiting == 0 and g.closed for g in gates))
    assert eventually(lambda: os_threads() <= baseline)
    assert all(g.stalls == 0 for g in gates)
