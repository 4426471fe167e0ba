"""Part objects: features stored in the narrowest integer dtype that holds them exactly, read
back as the float32 the split made (``ingest.parts``)."""

from __future__ import annotations

import numpy as np
import pytest

from bucketlearn import codec
from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.ingest.parts import ShardWriter, compact, decode_part, encode_part, load_parts


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
    writer = ShardWriter(store, "work", "job", np.array([64]), 1 << 30)
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
