"""codec.py: pickle-free array archives."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketlearn import codec
from bucketlearn.codec import CorruptObjectError
from bucketlearn.errors import PermanentError
from tests.unit.helpers import deflated_with_bad_stream, npy_member, zip_archive


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


# --- malformed archives: only CorruptObjectError escapes (issue #14, item 4) ----------------------

def _with_declared_size(data, size):
    """``data`` (one member) with its central directory entry declaring ``size`` bytes
    uncompressed (the field at offset 24 of the entry; zipfile reads sizes from there)."""
    central = data.rindex(b"PK\x01\x02")
    return data[:central + 24] + size.to_bytes(4, "little") + data[central + 28:]


MALFORMED = {
    # a header declaring 4 TiB over 64 bytes of data (MemoryError before the fix)
    "terabyte-header": zip_archive(("w0000.npy", npy_member((1 << 20, 1 << 20), body=b"\0" * 64))),
    "terabyte-header-v2": zip_archive(("w0000.npy", npy_member((1 << 40,), body=b"", version=(2, 0)))),
    # damaged deflate data (zlib.error before the fix)
    "bad-zlib": deflated_with_bad_stream(),
    # a member declaring far more bytes than deflate could expand its data to
    "deflate-bomb-size": _with_declared_size(
        zip_archive(("w0000.npy", npy_member((64,))), compression=zipfile.ZIP_DEFLATED), 2**32 - 1),
    "stored-size-beyond-archive": _with_declared_size(zip_archive(("w0000.npy", npy_member((4,)))), 10**9),
    "truncated-data": zip_archive(("w0000.npy", npy_member((64,), body=b"\0" * 10))),
    "trailing-data": zip_archive(("w0000.npy", npy_member((2,), body=b"\0" * 12))),
    "string-dtype": zip_archive(("w0000.npy", npy_member((2,), descr="<U3"))),
    "bytes-dtype": zip_archive(("w0000.npy", npy_member((2,), descr="|S4"))),
    "structured-dtype": zip_archive(("w0000.npy", npy_member((2,), descr=[("a", "<f4"), ("b", "<i4")]))),
    "datetime-dtype": zip_archive(("w0000.npy", npy_member((2,), descr="<M8[s]"))),
    "complex-dtype": zip_archive(("w0000.npy", npy_member((2,), descr="<c8"))),
    "object-dtype": zip_archive(("w0000.npy", npy_member((2,), descr="|O", body=b"\x80\x04N."))),
    "negative-shape": zip_archive(("w0000.npy", npy_member((-4,), body=b""))),
    "header-not-a-dict": zip_archive(("w0000.npy", b"\x93NUMPY\x01\x00\x08\x00[1, 2]\n")),
    "header-too-long": zip_archive(("w0000.npy", b"\x93NUMPY\x02\x00" + (200_000).to_bytes(4, "little")
                             + b"{" + b" " * 199_998 + b"}")),
    "npy-version-3": zip_archive(("w0000.npy", b"\x93NUMPY\x03\x00" + npy_member((2,))[8:])),
    "not-npy-member": zip_archive(("w0000.npy", npy_member((2,))), ("notes.txt", b"hello")),
    "duplicate-member": zip_archive(("w0000.npy", npy_member((2,))), ("w0000.npy", npy_member((3,)))),
    "bzip2-member": zip_archive(("w0000.npy", npy_member((2,))), compression=zipfile.ZIP_BZIP2),
    "int-weights": zip_archive(("w0000.npy", npy_member((2,), descr="<i8"))),
    "meta-not-an-object": codec.encode_arrays(
        {"w0000": np.ones(1, np.float32),
         codec.META_KEY: np.frombuffer(b"[1, 2, 3]", dtype=np.uint8)}),
    "meta-deeply-nested": codec.encode_arrays(
        {"w0000": np.ones(1, np.float32),
         codec.META_KEY: np.frombuffer(b"[" * 100_000 + b"]" * 100_000, dtype=np.uint8)}),
    "meta-wrong-dtype": codec.encode_arrays(
        {"w0000": np.ones(1, np.float32), codec.META_KEY: np.zeros(3, np.float32)}),
    "pickle-stream": b"\x80\x04\x95" + b"\x00" * 30,
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_archive_raises_corrupt_object_error_only(name):
    """Each malformed archive raises CorruptObjectError naming the object, nothing else
    (no zlib.error, MemoryError, ValueError...), and allocates nothing near a declared size."""
    # Prepare
    import tracemalloc

    data = MALFORMED[name]
    tracemalloc.start()
    # Execute
    try:
        with pytest.raises(Exception) as excinfo:
            codec.decode_weights(data, "deltas/bad.npz")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Assert
    assert type(excinfo.value) is CorruptObjectError, repr(excinfo.value)
    assert str(excinfo.value).startswith("deltas/bad.npz: ")
    assert "expected" in str(excinfo.value) or "metadata" in str(excinfo.value)
    assert peak < 64 * 1024**2


def test_valid_deflated_and_fortran_archives_still_decode():
    """What np.savez_compressed writes (deflated members, Fortran order) decodes as before."""
    # Prepare
    fortran = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, w0000=fortran, w0001=np.array([True, False]),
                        y=np.array([3, 1], dtype=">i4"))
    # Execute
    arrays, meta = codec.decode_arrays(buffer.getvalue())
    # Assert
    assert meta == {}
    np.testing.assert_array_equal(arrays["w0000"], fortran)
    np.testing.assert_array_equal(arrays["w0001"], [True, False])
    assert arrays["y"].tolist() == [3, 1]
    arrays["w0000"] += 1  # writable, like np.load's arrays


def _valid_payloads():
    weights = codec.encode_weights([np.arange(6, dtype=np.float32).reshape(2, 3),
                                    np.ones(4, np.float32)], {"base_version": 3, "examples": 8})
    shard = codec.encode_arrays({"x": np.ones((5, 3), np.float32),
                                 "y": np.arange(5, dtype=np.int32)})
    buffer = io.BytesIO()
    np.savez_compressed(buffer, w0000=np.linspace(0, 1, 50, dtype=np.float32))
    return [weights, shard, buffer.getvalue()]


VALID_PAYLOADS = _valid_payloads()


@st.composite
def mutated_payloads(draw):
    """A valid archive with 1-4 mutations: byte flips, interesting values written over a
    field (sizes, offsets, header digits), cuts, insertions, deleted ranges."""
    data = bytearray(draw(st.sampled_from(VALID_PAYLOADS)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "overwrite", "truncate", "insert", "delete",
                                     "digits"]))
        if not data:
            break
        position = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif kind == "overwrite":
            value = draw(st.sampled_from([0, 1, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF]))
            width = draw(st.sampled_from([1, 2, 4]))
            data[position:position + width] = (value & ((1 << 8 * width) - 1)).to_bytes(
                width, "little")
        elif kind == "truncate":
            del data[position:]
        elif kind == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[position:position + draw(st.integers(1, 64))]
        else:  # grow a number in a .npy header (shapes): '(2, 3)' -> '(2999999, 3)'
            text = bytes(data)
            starts = [i for i in range(len(text) - 1) if text[i:i + 1] == b"(" and
                      text[i + 1:i + 2].isdigit()]
            if starts:
                at = draw(st.sampled_from(starts)) + 1
                data[at:at] = b"9" * draw(st.integers(1, 12))
    return bytes(data)


@settings(max_examples=600, deadline=None)
@given(data=mutated_payloads())
def test_fuzzed_archives_decode_or_raise_corrupt_object_error(data):
    """Mutations of valid payloads either decode to numeric arrays or raise CorruptObjectError;
    nothing else ever escapes decode_arrays or decode_weights."""
    # Execute / Assert
    for decode in (codec.decode_arrays, codec.decode_weights):
        try:
            arrays, meta = decode(data, "fuzz.npz")
        except CorruptObjectError:
            continue
        values = arrays if isinstance(arrays, list) else list(arrays.values())
        assert all(a.dtype.kind in "biuf" for a in values)
        assert isinstance(meta, dict)
