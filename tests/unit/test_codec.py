"""codec.py: pickle-free array archives."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from bucketlearn import codec
from bucketlearn.codec import CorruptObjectError
from bucketlearn.errors import PermanentError


def _zip_with_member(member: str, writer) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive, archive.open(member, "w") as handle:
        writer(handle)
    return buffer.getvalue()


def test_weights_round_trip_with_meta():
    """encode_weights -> decode_weights gives equal float32 arrays, in order, and the metadata."""
    # Prepare
    weights = [np.arange(6, dtype=np.float64).reshape(2, 3), np.array([-1.5, 2.25]),
               np.float32(7.0) * np.ones((1, 1, 2))]
    meta = {"job_id": "j-000000000000", "version": 3, "loss": 0.25, "names": ["a", "é"]}
    # Execute
    data = codec.encode_weights(weights, meta)
    decoded, decoded_meta = codec.decode_weights(data)
    # Assert
    assert len(decoded) == 3
    for original, back in zip(weights, decoded, strict=True):
        assert back.dtype == np.float32
        np.testing.assert_array_equal(back, original.astype(np.float32))
    assert decoded_meta == meta


def test_arrays_round_trip_keeps_dtypes():
    """encode_arrays keeps each array's dtype; no metadata gives {}."""
    # Prepare
    arrays = {"x": np.ones((3, 2), dtype=np.float32), "y": np.array([0, 2, 1], dtype=np.int32)}
    # Execute
    decoded, meta = codec.decode_arrays(codec.encode_arrays(arrays))
    # Assert
    assert meta == {}
    assert set(decoded) == {"x", "y"}
    assert decoded["y"].dtype == np.int32
    np.testing.assert_array_equal(decoded["y"], [0, 2, 1])


def test_encode_refuses_object_arrays():
    """Object arrays are refused on the way in."""
    # Prepare
    arrays = {"x": np.array([{"a": 1}, None], dtype=object)}
    # Execute
    with pytest.raises(TypeError) as excinfo:
        codec.encode_arrays(arrays)
    # Assert
    assert "object" in str(excinfo.value)


def test_planted_pickled_object_array_is_refused():
    """An .npz whose member is a pickled object array raises CorruptObjectError, never unpickles."""
    # Prepare
    class Boom:
        def __reduce__(self):
            return (pytest.fail, ("unpickled!",))

    planted = np.array([Boom(), 1], dtype=object)
    data = _zip_with_member("w0000.npy", lambda h: np.save(h, planted, allow_pickle=True))
    # Execute
    with pytest.raises(CorruptObjectError) as excinfo:
        codec.decode_weights(data, "deltas/x.npz")
    # Assert
    assert "deltas/x.npz" in str(excinfo.value)
    assert "pickle-free" in str(excinfo.value)
    assert isinstance(excinfo.value, PermanentError)


@pytest.mark.parametrize("data", [
    b"this is not an archive",
    b"",
    b"\x93NUMPY" + b"\x00" * 20,
    b"\x80\x04\x95" + b"\x00" * 30,  # a pickle protocol 4 header
], ids=["text", "empty", "bad-npy-header", "pickle-stream"])
def test_garbage_bytes_are_refused(data):
    """Bytes that are not an .npz raise CorruptObjectError."""
    # Prepare / Execute
    with pytest.raises(CorruptObjectError) as excinfo:
        codec.decode_arrays(data, "obj")
    # Assert
    assert str(excinfo.value).startswith("obj: expected")


@pytest.mark.parametrize("cut", ["truncated", "zip-magic-only"])
def test_truncated_archive_is_refused(cut):
    """A cut-off .npz (zip magic, broken body) raises CorruptObjectError."""
    # Prepare
    good = codec.encode_weights([np.ones((4, 4))], {"v": 1})
    data = good[: len(good) // 2] if cut == "truncated" else b"PK\x03\x04" + b"\x00" * 10
    # Execute
    with pytest.raises(Exception) as excinfo:
        codec.decode_weights(data, "w.npz")
    # Assert
    assert isinstance(excinfo.value, CorruptObjectError)
    assert str(excinfo.value).startswith("w.npz: expected")


def test_non_array_member_is_refused():
    """A zip member that is not an .npy array is not returned as a weight."""
    # Prepare
    data = _zip_with_member("w0000", lambda h: h.write(b"raw bytes, not an array"))
    # Execute
    with pytest.raises(Exception) as excinfo:
        codec.decode_weights(data, "w.npz")
    # Assert
    assert isinstance(excinfo.value, CorruptObjectError)
    assert str(excinfo.value).startswith("w.npz: expected")


def test_weights_need_dense_w_keys():
    """An archive without w0000… (or with gaps) is not a weights object."""
    # Prepare
    gap = codec.encode_arrays({"w0000": np.ones(1), "w0002": np.ones(1)})
    other = codec.encode_arrays({"x": np.ones(1)})
    # Execute / Assert
    with pytest.raises(CorruptObjectError):
        codec.decode_weights(gap)
    with pytest.raises(CorruptObjectError):
        codec.decode_weights(other)


def test_bad_metadata_is_refused():
    """A __meta__ array that is not UTF-8 JSON raises CorruptObjectError."""
    # Prepare
    data = codec.encode_arrays({"w0000": np.ones(1),
                                codec.META_KEY: np.frombuffer(b"\xff{not json", dtype=np.uint8)})
    # Execute
    with pytest.raises(CorruptObjectError) as excinfo:
        codec.decode_weights(data)
    # Assert
    assert "metadata" in str(excinfo.value)


def test_checksum_is_sha256_of_bytes():
    """checksum is 'sha256:' + hex digest; different bytes differ."""
    # Prepare / Execute
    a, b = codec.checksum(b"abc"), codec.checksum(b"abd")
    # Assert
    assert a == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert a != b
