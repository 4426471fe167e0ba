"""The parts a split writes and training reads, each an encoded ``{"x", "y"}`` array set
(``codec``): training rows buffered per shard and written when a shard is complete or the
buffers reach their budget (``ShardWriter``), holdout rows written in parts of a set size
(``HoldoutWriter``), both through ``PartWrites`` (a few writes at once, behind the split), and
parts read back and joined (``load_parts``).

A split packs its parts into objects of about ``Limits.pack_bytes`` (``PartWrites`` with a
``pack_prefix``): a part's address in the manifest is then ``<object>#<offset>:<length>``, read
with one ranged read (``read_part``); a plain object name (a part written on its own, or a
manifest from before packs) is read whole. One object per part cost a 120,000-row table 378
writes (0.95 s of its 1.4 s split on the local stack, where the storage emulator takes writes
one at a time), and in the cloud each write is a round trip (60 ms in the round-trip
benchmark's projection); training reads a part at a time either way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any

import numpy as np

from bucketlearn import codec, layout
from bucketlearn.ingest.manifest import Shard
from bucketlearn.ports import BlobStore

_RANGE = "#"  # a packed part's address: ``<object>#<offset>:<length>``

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


def part_address(name: str, offset: int, length: int) -> str:
    """The address of a part stored at ``offset`` in the object ``name``, ``length`` bytes."""
    return f"{name}{_RANGE}{offset}:{length}"


def split_address(address: str) -> tuple[str, int, int] | None:
    """A packed part's (object, offset, length) (``part_address``); None for a plain name."""
    name, packed, span = address.rpartition(_RANGE)
    if not packed:
        return None
    offset, _, length = span.partition(":")
    return name, int(offset), int(length)


def read_part(store: BlobStore, bucket: str, address: str) -> bytes:
    """A part's bytes: a ranged read of its pack (``part_address``), or a whole object.

    Raises:
        CorruptObjectError: the pack holds fewer bytes than the address names.
    """
    packed = split_address(address)
    if packed is None:
        return store.read_bytes(bucket, address)
    data = store.read_range(bucket, *packed)
    if len(data) != packed[2]:
        raise codec.CorruptObjectError(
            f"gs://{bucket}/{address}: expected {packed[2]} bytes of a packed part; found "
            f"{len(data)}")
    return data


def load_part(store: BlobStore, bucket: str, address: str) -> tuple[np.ndarray, np.ndarray]:
    """A part's (x as float32, y), read from its address (``read_part``)."""
    return decode_part(read_part(store, bucket, address), address)


def _joined(chunks: list[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """Buffered (x, y) chunks encoded as one part."""
    return encode_part(np.concatenate([c[0] for c in chunks]),
                       np.concatenate([c[1] for c in chunks]))


def _write_part(store: BlobStore, bucket: str, path: str,
                chunks: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, str]:
    """Write buffered (x, y) chunks as one part object; return its address (its name)."""
    store.write_bytes(bucket, path, _joined(chunks), "application/octet-stream")
    return {path: path}


def _write_pack(store: BlobStore, bucket: str, name: str,
                parts: list[tuple[str, list[tuple[np.ndarray, np.ndarray]]]]) -> dict[str, str]:
    """Write parts, each encoded as on its own, one after another in the object ``name``;
    return each part's address by its name."""
    encoded, addresses, offset = [], {}, 0
    for path, chunks in parts:
        data = _joined(chunks)
        encoded.append(data)
        addresses[path] = part_address(name, offset, len(data))
        offset += len(data)
    store.write_bytes(bucket, name, b"".join(encoded), "application/octet-stream")
    return addresses


class PartWrites:
    """Part objects encoded and written on ``threads`` threads while the split reads on (the
    store's ``write_threads``: Cloud Storage's adapter says 8, the in-memory store 0), so that
    the split does not wait on each write in turn.

    With a ``pack_prefix``, parts are gathered in order into packs of about ``pack_bytes`` of
    rows, each written as one object ``<pack_prefix>NNNNN.bin`` (``_write_pack``); ``address``
    then gives where a part went, once ``wait`` has returned. Without one, each part is its own
    object, named as given.

    At most ``max_bytes`` of buffered rows (and ``2 * threads`` objects) wait or are being
    written, or one object when it alone is larger; past that, ``write`` waits for the oldest.
    The pack being gathered holds up to ``pack_bytes`` more (plus its last part), at most
    ``max_bytes`` for a split's (``for_job``). With each
    running write's copies (joined, compacted, encoded: about three of its bytes), the split
    holds at most its shard buffers plus about four times ``max_bytes`` (invariant 5). A failed
    write raises from a later ``write`` or from ``wait``; the split then fails as a whole, as
    it did when the write was its own. ``threads=0`` writes in the caller's thread. Used as a
    context manager: leaving it normally waits for every write (and raises a failure); leaving
    it on an error cancels writes not started and waits for the rest (no thread outlives the
    split).
    """

    def __init__(self, store: BlobStore, bucket: str, max_bytes: int, threads: int,
                 pack_prefix: str | None = None, pack_bytes: int = 0) -> None:
        self.store, self.bucket = store, bucket
        self.max_bytes = max_bytes
        self.threads = threads
        self.pack_prefix, self.pack_bytes = pack_prefix, pack_bytes
        self.packs = 0  # pack objects started
        self._pool = (ThreadPoolExecutor(threads, thread_name_prefix="part-write")
                      if threads > 0 else None)
        self._pending: deque[tuple[Future[dict[str, str]], int]] = deque()
        self._bytes = 0
        self._gathered: list[tuple[str, list[tuple[np.ndarray, np.ndarray]]]] = []
        self._gathered_bytes = 0
        self._addresses: dict[str, str] = {}

    @classmethod
    def for_job(cls, store: BlobStore, bucket: str, job_id: str, buffer_bytes: int,
                pack_bytes: int) -> PartWrites:
        """A split's writes: its parts packed under the job's prefix, a quarter of its
        ``buffer_bytes`` in flight and packs of at most as much (the split's memory stays what
        its budget says, whatever ``pack_bytes``), on as many threads as ``store`` says writes
        at once pay off (``write_threads``; none said: 0)."""
        in_flight = buffer_bytes // 4
        return cls(store, bucket, in_flight, int(getattr(store, "write_threads", 0)),
                   layout.pack_prefix(job_id), min(pack_bytes, in_flight))

    def write(self, path: str, chunks: list[tuple[np.ndarray, np.ndarray]]) -> int:
        """Write ``chunks`` as the part ``path`` (now, on a thread, or with its pack); return
        its rows."""
        rows = sum(len(y) for _, y in chunks)
        size = sum(x.nbytes + y.nbytes for x, y in chunks)
        if self.pack_prefix is None:
            self._submit(_write_part, path, chunks, size)
            return rows
        self._gathered.append((path, chunks))
        self._gathered_bytes += size
        if self._gathered_bytes >= self.pack_bytes:
            self._write_gathered()
        return rows

    def address(self, path: str) -> str:
        """Where the part written as ``path`` is stored (after ``wait``)."""
        return self._addresses[path]

    def wait(self) -> None:
        """Write the pack being gathered; wait for every part written so far; raise the first
        failure."""
        self._write_gathered()
        while self._pending:
            self._finish_oldest()

    def _write_gathered(self) -> None:
        if not self._gathered:
            return
        parts, size = self._gathered, self._gathered_bytes
        self._gathered, self._gathered_bytes = [], 0
        name = f"{self.pack_prefix}{self.packs:05d}.bin"
        self.packs += 1
        self._submit(_write_pack, name, parts, size)

    def _submit(self, write: Callable[[BlobStore, str, str, Any], dict[str, str]], name: str,
                what: Any, size: int) -> None:
        """``write(store, bucket, name, what)`` now (no threads) or on a thread, once the bytes
        in flight allow."""
        if self._pool is None:
            self._addresses.update(write(self.store, self.bucket, name, what))
            return
        while self._pending and (self._bytes + size > self.max_bytes
                                 or len(self._pending) >= 2 * self.threads):
            self._finish_oldest()
        self._pending.append((self._pool.submit(write, self.store, self.bucket, name, what),
                              size))
        self._bytes += size

    def _finish_oldest(self) -> None:
        future, size = self._pending.popleft()
        self._bytes -= size
        self._addresses.update(future.result())

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
    """Holdout (or validation: ``path_of``) rows in parts of about ``part_bytes`` (through
    ``writes``, as ``ShardWriter``)."""

    def __init__(self, writes: PartWrites, job_id: str, part_bytes: int,
                 path_of: Callable[[str, int], str] = layout.holdout_part_path) -> None:
        self.writes, self.job_id, self.path_of = writes, job_id, path_of
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
        path = self.path_of(self.job_id, len(self.parts))
        rows = self.writes.write(path, self.chunks)
        self.rows += rows
        self.parts.append(path)
        self.part_rows.append(rows)
        self.chunks, self.bytes = [], 0


def load_parts(store: BlobStore, bucket: str, paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read shard or holdout parts (by address: ``read_part``) and concatenate them into
    (x, y)."""
    xs, ys = [], []
    for path in paths:
        x, y = load_part(store, bucket, path)
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)
