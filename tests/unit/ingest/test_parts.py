"""Part objects: features stored in the narrowest integer dtype that holds them exactly, read
back as the float32 the split made; written a few at once behind the split, with the bytes in
flight bounded (``ingest.parts``)."""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest

from bucketlearn import codec, layout
from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.errors import TransientError
from bucketlearn.ingest.parts import (
    PartWrites,
    ShardWriter,
    compact,
    decode_part,
    encode_part,
    load_part,
    load_parts,
    part_address,
    read_part,
)
from bucketlearn.ingest.split import split_upload
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.options import JobOptions


@pytest.mark.parametrize(("values", "stored"), [
    ([0, 17, 255], np.uint8),            # pixels
    ([-128, 0, 127], np.int8),
    ([0, 256, 65535], np.uint16),        # counts
    ([-1, 300, -32768], np.int16),
    ([0, 65536], np.float32),            # beyond 16 bits: as it is
    ([0.5, 1, 2], np.float32),           # a fraction
    ([np.nan, 1, 2], np.float32),        # a missing cell
    ([np.inf, 1, 2], np.float32),
])
def test_a_part_stores_features_compactly_and_reads_them_back_exactly(values, stored):
    x = np.array([values, values[::-1]], dtype=np.float32)
    y = np.array([0, 1], dtype=np.int32)
    data = encode_part(x, y)
    assert codec.decode_arrays(data)[0]["x"].dtype == stored
    back_x, back_y = decode_part(data, "p")
    assert back_x.dtype == np.float32
    np.testing.assert_array_equal(back_x, x)  # NaN where NaN
    np.testing.assert_array_equal(back_y, y)


def test_compact_leaves_empty_and_non_float_arrays_alone():
    empty = np.empty((0, 3), np.float32)
    assert compact(empty) is empty
    codes = np.array([1, 2], np.int64)
    assert compact(codes) is codes


def test_pixel_parts_take_a_quarter_of_the_bytes_and_train_on_the_same_rows():
    """A shard of whole numbers 0..255 is written as bytes (a quarter of float32's) and loaded
    as the very float32 rows the split dealt."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(64, 100)).astype(np.float32)
    y = rng.integers(0, 4, size=64).astype(np.int32)
    store = MemoryBlobStore()
    writer = ShardWriter(PartWrites(store, "work", 1 << 30, threads=0), "job", np.array([64]),
                         1 << 30)
    writer.add(0, x, y)
    [shard] = writer.close()
    stored = store.read_bytes("work", shard.parts[0])
    assert len(stored) < x.nbytes / 3
    back_x, back_y = load_parts(store, "work", shard.parts)
    assert back_x.dtype == np.float32
    np.testing.assert_array_equal(back_x, x)
    np.testing.assert_array_equal(back_y, y)


def test_an_object_without_features_is_refused_by_name():
    data = codec.encode_arrays({"y": np.zeros(2, np.int32)})
    with pytest.raises(codec.CorruptObjectError, match="expected a part with arrays x and y"):
        decode_part(data, "jobs/j/shards/0.safetensors")


class GatedStore(MemoryBlobStore):
    """Holds every write until ``gate`` opens; counts the writes under way at once."""

    def __init__(self, fail: str = "") -> None:
        super().__init__()
        self.gate = threading.Event()
        self.fail = fail
        self.lock = threading.Lock()
        self.running = self.most = 0

    def write_bytes(self, bucket, name, data, content_type, metadata=None):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            assert self.gate.wait(10), "the test never opened the gate"
            if name == self.fail:
                raise TransientError(f"gs://{bucket}/{name}: upload failed")
            return super().write_bytes(bucket, name, data, content_type, metadata)
        finally:
            with self.lock:
                self.running -= 1


def rows(n: int, width: int = 4) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.full((n, width), 0.5, np.float32), np.zeros(n, np.int32))]


def test_parts_are_written_several_at_once_and_all_of_them_before_wait_returns():
    store = GatedStore()
    with PartWrites(store, "work", max_bytes=1 << 20, threads=4) as writes:
        counted = [writes.write(f"p{i}", rows(8)) for i in range(4)]  # none waits: all in flight
        deadline = time.monotonic() + 10
        while store.running < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.most == 4  # four writes under way at once, none finished
        store.gate.set()
        writes.wait()
        assert sorted(i.name for i in store.list("work")) == [f"p{i}" for i in range(4)]
    assert counted == [8, 8, 8, 8]
    np.testing.assert_array_equal(load_parts(store, "work", ["p2"])[0], rows(8)[0][0])


def test_a_write_waits_for_the_oldest_once_the_bytes_in_flight_would_pass_the_bound():
    """Invariant 5: what waits to be written is bounded, whatever the split reads."""
    store = GatedStore()
    part_bytes = sum(x.nbytes + y.nbytes for x, y in rows(8))
    writes = PartWrites(store, "work", max_bytes=2 * part_bytes, threads=4)
    with writes:
        writes.write("p0", rows(8))
        writes.write("p1", rows(8))
        third = threading.Thread(target=writes.write, args=("p2", rows(8)), daemon=True)
        third.start()
        third.join(0.3)
        assert third.is_alive()  # held: two parts' bytes are in flight
        assert store.most == 2
        store.gate.set()
        third.join(10)
        assert not third.is_alive()
        writes.wait()
    assert sorted(i.name for i in store.list("work")) == ["p0", "p1", "p2"]


def test_a_failed_write_fails_the_split_and_no_write_outlives_it():
    store = GatedStore(fail="p1")
    with pytest.raises(TransientError, match="p1: upload failed"):  # noqa: PT012
        with PartWrites(store, "work", max_bytes=1 << 20, threads=2) as writes:
            for i in range(4):  # 2 threads, 2 waiting: none of these waits
                writes.write(f"p{i}", rows(8))
            store.gate.set()
            writes.wait()
    assert store.running == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("part-write")]


def read_part_object(address: str) -> str:
    """The object a part's address names (its pack)."""
    return address.partition("#")[0]


def part_rows(index: int, rows: int = 100, width: int = 30) -> list[tuple[np.ndarray, np.ndarray]]:
    """A part's chunks: ``rows`` rows whose features hold the part's number and a fraction
    (stored as float32, 12 kB a part at the defaults)."""
    x = np.full((rows, width), index + 0.5, np.float32)
    return [(x[: rows // 2], np.full(rows // 2, index, np.int32)),
            (x[rows // 2:], np.full(rows - rows // 2, index, np.int32))]


@pytest.mark.parametrize("threads", [0, 3])
def test_parts_are_packed_into_few_objects_and_read_back_by_address(threads):
    """With a pack prefix, parts go into objects of about ``pack_bytes``, in the order written;
    each part's address reads back exactly its rows, with one ranged read."""
    store = MemoryBlobStore()
    names = [f"part-{i}" for i in range(40)]
    with PartWrites(store, "work", max_bytes=1 << 20, threads=threads, pack_prefix="j/pack-",
                    pack_bytes=100_000) as writes:
        rows = [writes.write(name, part_rows(i)) for i, name in enumerate(names)]
    addresses = [writes.address(name) for name in names]
    objects = sorted(i.name for i in store.list("work"))
    assert rows == [100] * 40
    assert objects == [f"j/pack-{n:05d}.bin" for n in range(len(objects))]
    assert 4 <= len(objects) <= 6  # 40 parts of 12 kB in packs of about 100 kB
    assert sorted({read_part_object(a) for a in addresses}) == objects
    for i, address in enumerate(addresses):
        x, y = load_part(store, "work", address)
        np.testing.assert_array_equal(x, np.full((100, 30), i + 0.5, np.float32))
        np.testing.assert_array_equal(y, np.full(100, i, np.int32))
    assert sum(i.size for i in store.list("work")) == sum(
        len(read_part(store, "work", a)) for a in addresses)  # nothing but the parts


def test_a_part_named_as_an_object_of_its_own_is_read_whole():
    """A manifest from before packs (or a part written alone) names whole objects."""
    store = MemoryBlobStore()
    x, y = np.ones((3, 2), np.float32), np.array([0, 1, 0], np.int32)
    store.write_bytes("work", "jobs/j/shards/t00000/part-0000.safetensors", encode_part(x, y),
                      "application/octet-stream")
    back_x, back_y = load_part(store, "work", "jobs/j/shards/t00000/part-0000.safetensors")
    np.testing.assert_array_equal(back_x, x)
    np.testing.assert_array_equal(back_y, y)


def test_a_pack_shorter_than_its_address_says_is_a_corrupt_object():
    store = MemoryBlobStore()
    data = encode_part(np.ones((3, 2), np.float32), np.zeros(3, np.int32))
    store.write_bytes("work", "j/pack-00000.bin", data, "application/octet-stream")
    address = part_address("j/pack-00000.bin", 0, len(data) + 10)
    with pytest.raises(codec.CorruptObjectError, match=r"expected \d+ bytes of a packed part"):
        read_part(store, "work", address)


def test_the_split_writes_every_part_before_its_manifest():
    """The manifest lists parts that exist: ``split_upload`` waits for its writes."""
    written: list[str] = []

    class Recording(MemoryBlobStore):
        write_threads = 4  # as a remote store's: the split writes on threads

        def write_bytes(self, bucket, name, data, content_type, metadata=None):
            time.sleep(0.002)  # parts finish after the deal has moved on
            written.append(name)
            return super().write_bytes(bucket, name, data, content_type, metadata)

    data = ("a,b,label\n" + "".join(f"{i},{i % 7},{i % 3}\n" for i in range(3000))).encode()
    store = Recording()
    manifest = split_upload(SourceFile("t.csv", len(data), lambda: io.BytesIO(data)), store,
                            "work", "job", JobOptions(rows_per_shard=64), Limits(pack_bytes=4096))
    parts = [p for s in manifest.shards for p in s.parts] + manifest.holdout_parts
    assert len(parts) > 30
    assert len({read_part_object(p) for p in parts}) > 5  # several packs, written on threads
    assert written[-1] == layout.manifest_path("job")
    assert {read_part_object(p) for p in parts} <= set(written[:-1])


def test_a_split_whose_part_write_fails_fails_and_leaves_no_thread_and_no_manifest():
    """A write failing on one of the split's threads fails the split (the function then retries
    it): no manifest lists parts that may not exist, and no writer thread is left behind."""

    class Failing(MemoryBlobStore):
        write_threads = 4

        def __init__(self) -> None:
            super().__init__()
            self.parts = 0
            self.lock = threading.Lock()

        def write_bytes(self, bucket, name, data, content_type, metadata=None):
            with self.lock:
                self.parts += "/shards/" in name
                failing = self.parts == 3  # a pack while others are under way
            if failing:
                raise TransientError(f"gs://{bucket}/{name}: upload failed")
            return super().write_bytes(bucket, name, data, content_type, metadata)

    data = ("a,b,label\n" + "".join(f"{i},{i % 7},{i % 3}\n" for i in range(3000))).encode()
    store = Failing()
    with pytest.raises(TransientError, match="upload failed"):
        split_upload(SourceFile("t.csv", len(data), lambda: io.BytesIO(data)), store, "work",
                     "job", JobOptions(rows_per_shard=64), Limits(pack_bytes=4096))
    assert store.stat("work", layout.manifest_path("job")) is None
    assert not [t for t in threading.enumerate() if t.name.startswith("part-write")]
