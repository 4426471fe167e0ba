"""The parts a split writes and training reads, each an encoded ``{"x", "y"}`` object (``codec``):
training rows buffered per shard and written when a shard is complete or the buffers reach
their budget (``ShardWriter``), holdout rows written in parts of a set size
(``HoldoutWriter``), and parts read back and joined (``load_parts``).
"""

from __future__ import annotations

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


class ShardWriter:
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


class HoldoutWriter:
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


def load_parts(store: BlobStore, bucket: str, paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read shard or holdout parts and concatenate them into (x, y)."""
    xs, ys = [], []
    for path in paths:
        x, y = decode_part(store.read_bytes(bucket, path), path)
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)
