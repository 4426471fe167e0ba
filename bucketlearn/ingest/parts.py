"""The parts a split writes and training reads, each an encoded ``{"x", "y"}`` object (``codec``):
training rows buffered per shard and written when a shard is complete or the buffers reach
their budget (``ShardWriter``), holdout rows written in parts of a set size
(``HoldoutWriter``), both through ``PartWrites`` (a few writes at once, behind the split), and
parts read back and joined (``load_parts``).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

import numpy as np

from bucketlearn import codec, layout
from bucketlearn.ingest.manifest import Shard
from bucketlearn.ports import BlobStore

# Integer dtypes a part's features are stored in when every value fits exactly (pixels, counts,
# codes: a quarter or half of float32's bytes to write, store and read); read back as float32
_COMPACT = tuple(np.dtype(code) for code in ("u1", "i1", "u2", "i2"))


def compact(x: np.ndarray) -> np.ndarray:
    """``x`` in the narrowest integer dtype that holds each value exactly (every value a whole
    number within its range), else as it is: lossless, since ``decode_part`` returns float32,
    and float32 holds every integer of these dtypes exactly."""
    if x.size == 0 or x.dtype.kind != "f":
        return x
    low, high = float(np.min(x)), float(np.max(x))  # NaN in x makes both NaN: kept as float
    fits = [d for d in _COMPACT if np.iinfo(d).min <= low and high <= np.iinfo(d).max]
    if not fits or not np.array_equal(x, np.trunc(x)):
        return x
    return x.astype(fits[0])


def encode_part(x: np.ndarray, y: np.ndarray) -> bytes:
    """A part object: features (``compact``) and labels."""
    return codec.encode_arrays({"x": compact(x), "y": y})


def decode_part(data: bytes, path: str) -> tuple[np.ndarray, np.ndarray]:
    """A part's (x as float32, y) from its bytes (``CorruptObjectError`` if they are not one)."""
    arrays, _ = codec.decode_arrays(data, path)
    if "x" not in arrays or "y" not in arrays:
        raise codec.CorruptObjectError(
            f"{path}: expected a part with arrays x and y; found: {sorted(arrays) or 'none'}")
    x = arrays["x"]
    return (x if x.dtype == np.float32 else x.astype(np.float32)), arrays["y"]


def _write_part(store: BlobStore, bucket: str, path: str,
                chunks: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """Write buffered (x, y) chunks as one part object; return its rows."""
    x = np.concatenate([c[0] for c in chunks])
    y = np.concatenate([c[1] for c in chunks])
    store.write_bytes(bucket, path, encode_part(x, y), "application/octet-stream")
    return len(y)


class PartWrites:
    """Part objects encoded and written on ``threads`` threads while the split reads on (the
    store's ``write_threads``: Cloud Storage's adapter says 8, the in-memory store 0). One at a
    time, a table's split waited on every write: a 120,000-row table's 378 parts took 0.8-1.2 s
    of its 1.8-2.1 s split on the local stack, and would take 23 s in the cloud at the
    round-trip benchmark's 60 ms a write (docs/BENCHMARKS.md, section 3).

    At most ``max_bytes`` of buffered rows (and ``2 * threads`` parts) wait or are being
    written, or one part when it alone is larger; past that, ``write`` waits for the oldest.
    With each running write's copies (joined, compacted, encoded: about three of its bytes), the
    split holds at most its shard buffers plus about four times ``max_bytes`` (invariant 5). A
    failed write raises from a later ``write`` or from ``wait``; the split then fails as a whole,
    as it did when the write was its own. ``threads=0`` writes in the caller's thread. Used as a
    context manager: leaving it normally waits for every write (and raises a failure); leaving
    it on an error cancels writes not started and waits for the rest (no thread outlives the
    split).
    """

    def __init__(self, store: BlobStore, bucket: str, max_bytes: int, threads: int) -> None:
        self.store, self.bucket = store, bucket
        self.max_bytes = max_bytes
        self.threads = threads
        self._pool = (ThreadPoolExecutor(threads, thread_name_prefix="part-write")
                      if threads > 0 else None)
        self._pending: deque[tuple[Future[int], int]] = deque()
        self._bytes = 0

    @classmethod
    def for_store(cls, store: BlobStore, bucket: str, max_bytes: int) -> PartWrites:
        """On as many threads as ``store`` says writes at once pay off (``write_threads``;
        none said: 0)."""
        return cls(store, bucket, max_bytes, int(getattr(store, "write_threads", 0)))

    def write(self, path: str, chunks: list[tuple[np.ndarray, np.ndarray]]) -> int:
        """Write ``chunks`` as the part ``path`` (now or on a thread); return its rows."""
        rows = sum(len(y) for _, y in chunks)
        if self._pool is None:
            _write_part(self.store, self.bucket, path, chunks)
            return rows
        size = sum(x.nbytes + y.nbytes for x, y in chunks)
        while self._pending and (self._bytes + size > self.max_bytes
                                 or len(self._pending) >= 2 * self.threads):
            self._finish_oldest()
        self._pending.append((self._pool.submit(_write_part, self.store, self.bucket, path,
                                                chunks), size))
        self._bytes += size
        return rows

    def wait(self) -> None:
        """Wait for every part written so far; raise the first failure."""
        while self._pending:
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        future, size = self._pending.popleft()
        self._bytes -= size
        future.result()

    def __enter__(self) -> PartWrites:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            if kind is None:
                self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)


class ShardWriter:
    """Buffers rows per shard; writes a part (through ``writes``) when a shard is complete or
    memory is at budget."""

    def __init__(self, writes: PartWrites, job_id: str, expected: np.ndarray,
                 buffer_bytes: int) -> None:
        self.writes, self.job_id = writes, job_id
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
        record.rows += self.writes.write(path, chunks)
        record.parts.append(path)

    def close(self) -> list[Shard]:
        for shard in list(self.buffers):
            self.flush(shard)
        return self.shards


class HoldoutWriter:
    """Holdout rows in parts of about ``part_bytes`` (through ``writes``, as ``ShardWriter``)."""

    def __init__(self, writes: PartWrites, job_id: str, part_bytes: int) -> None:
        self.writes, self.job_id = writes, job_id
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
        rows = self.writes.write(path, self.chunks)
        self.rows += rows
        self.parts.append(path)
        self.part_rows.append(rows)
        self.chunks, self.bytes = [], 0


def load_parts(store: BlobStore, bucket: str, paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read shard or holdout parts and concatenate them into (x, y)."""
    xs, ys = [], []
    for path in paths:
        x, y = decode_part(store.read_bytes(bucket, path), path)
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)
