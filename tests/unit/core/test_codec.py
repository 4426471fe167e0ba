"""codec.py: pickle-free array objects (safetensors)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketlearn import codec
from bucketlearn.codec import CorruptObjectError
from bucketlearn.errors import PermanentError
from tests.unit.helpers import safetensors_bytes, tensor_entry


def _npz(**arrays) -> bytes:
    """An .npz archive (the format stored before safetensors), pickles allowed."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
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


def test_state_round_trip_keeps_the_step_count_and_order():
    """A training state: float32 weights, an int64 scalar step count and the moments, in order."""
    # Prepare
    weights = [np.ones((3, 2), np.float32), np.zeros(2, np.float32)]
    optimizer = [np.array(41, np.int64)] + [np.full(s, i, np.float32)
                                            for i, s in enumerate([(3, 2), (3, 2), (2,), (2,)])]
    # Execute
    back_w, back_o, meta = codec.decode_state(codec.encode_state(weights, optimizer, {"v": 1}))
    # Assert
    assert meta == {"v": 1}
    assert back_o[0].shape == () and back_o[0].dtype == np.int64 and int(back_o[0]) == 41
    assert [o.shape for o in back_o] == [o.shape for o in optimizer]
    assert codec.state_digest(back_w, back_o) == codec.state_digest(weights, optimizer)


def test_transposed_strided_and_big_endian_arrays_round_trip_in_order():
    """What is not C-contiguous little-endian is stored by value (safetensors.numpy.save alone
    writes an array's memory as it lies: a transposed view would come back scrambled)."""
    # Prepare
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    arrays = {"t": base.T, "f": np.asfortranarray(base), "s": base[:, ::2],
              "b": np.array([3, 1, 2], dtype=">i4"), "z": np.zeros((0, 40), np.float32),
              "k": np.array([True, False]), "h": np.array([0.5], np.float16)}
    # Execute
    decoded, _ = codec.decode_arrays(codec.encode_arrays(arrays))
    # Assert
    for name, array in arrays.items():
        np.testing.assert_array_equal(decoded[name], array)
        assert decoded[name].shape == array.shape
    assert decoded["b"].dtype == np.dtype("<i4")
    decoded["t"] += 1  # writable, each array in its own memory
    assert decoded["f"][0, 0] == 0


@pytest.mark.parametrize("array", [np.array([{"a": 1}, None], dtype=object),
                                   np.array(["abc"]), np.array([b"abcd"]),
                                   np.array([1 + 2j]), np.array(["2024-01-01"], "M8[s]")],
                         ids=["object", "str", "bytes", "complex", "datetime"])
def test_encode_refuses_what_is_not_numeric(array):
    """Object arrays (and strings, complex numbers, datetimes) are refused on the way in."""
    # Execute
    with pytest.raises(TypeError) as excinfo:
        codec.encode_arrays({"x": array})
    # Assert
    assert "expected a numeric dtype" in str(excinfo.value)
    assert str(array.dtype) in str(excinfo.value)


def test_planted_pickles_are_refused_never_unpickled():
    """An .npz holding a pickled object array, and a safetensors header declaring an object
    dtype over a pickle, raise CorruptObjectError; nothing is unpickled."""
    # Prepare
    class Boom:
        def __reduce__(self):
            return (pytest.fail, ("unpickled!",))

    import pickle

    pickled = pickle.dumps(np.array([Boom(), 1], dtype=object))
    planted = [_npz(w0000=np.array([Boom(), 1], dtype=object)),
               safetensors_bytes({"w0000": tensor_entry((len(pickled),), "O")}, pickled)]
    for data in planted:
        # Execute
        with pytest.raises(CorruptObjectError) as excinfo:
            codec.decode_weights(data, "deltas/x.safetensors")
        # Assert
        assert str(excinfo.value).startswith("deltas/x.safetensors: expected")
        assert isinstance(excinfo.value, PermanentError)


@pytest.mark.parametrize("data", [
    b"this is not an archive",
    b"",
    b"\x93NUMPY" + b"\x00" * 20,
    b"\x80\x04\x95" + b"\x00" * 30,  # a pickle protocol 4 header
    _npz(w0000=np.ones(3, np.float32)),  # the format stored before safetensors
], ids=["text", "empty", "npy-header", "pickle-stream", "npz-archive"])
def test_garbage_bytes_are_refused(data):
    """Bytes that are not a safetensors object raise CorruptObjectError."""
    # Prepare / Execute
    with pytest.raises(CorruptObjectError) as excinfo:
        codec.decode_arrays(data, "obj")
    # Assert
    assert str(excinfo.value).startswith("obj: expected a safetensors object")


@pytest.mark.parametrize("cut", ["half", "header-length-only", "header-only"])
def test_truncated_object_is_refused(cut):
    """A cut-off object raises CorruptObjectError."""
    # Prepare
    good = codec.encode_weights([np.ones((4, 4))], {"v": 1})
    length = 8 + int.from_bytes(good[:8], "little")
    data = {"half": good[: len(good) // 2], "header-length-only": good[:8],
            "header-only": good[:length]}[cut]
    # Execute
    with pytest.raises(Exception) as excinfo:
        codec.decode_weights(data, "w.safetensors")
    # Assert
    assert isinstance(excinfo.value, CorruptObjectError)
    assert str(excinfo.value).startswith("w.safetensors: expected")


def test_weights_need_dense_w_keys():
    """An object without w0000… (or with gaps) is not a weights object."""
    # Prepare
    gap = codec.encode_arrays({"w0000": np.ones(1), "w0002": np.ones(1)})
    other = codec.encode_arrays({"x": np.ones(1)})
    # Execute / Assert
    with pytest.raises(CorruptObjectError):
        codec.decode_weights(gap)
    with pytest.raises(CorruptObjectError):
        codec.decode_weights(other)


def test_bad_metadata_is_refused():
    """A __meta__ that is not JSON raises CorruptObjectError."""
    # Prepare
    data = safetensors.numpy.save({"w0000": np.ones(1, np.float32)},
                                  {codec.META_KEY: "\u00ff{not json"})
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


# --- malformed objects: only CorruptObjectError escapes ------------------------------------------

W = "w0000"
MALFORMED = {
    # sizes the header declares, checked against the bytes present before anything is allocated
    "terabyte-shape": safetensors_bytes({W: tensor_entry((1 << 20, 1 << 20), size=64)}),
    "overflowing-shape": safetensors_bytes({W: tensor_entry((1 << 32,) * 4, size=64)}),
    "header-length-beyond-object": safetensors_bytes({W: tensor_entry((2,))}, length=10**9),
    "header-length-terabytes": safetensors_bytes({W: tensor_entry((2,))}, length=1 << 42),
    "header-length-max": safetensors_bytes({W: tensor_entry((2,))}, length=2**64 - 1),
    "offsets-beyond-object": safetensors_bytes({W: tensor_entry((2,), size=10**9)}, b"\0" * 8),
    "offsets-overlapping": safetensors_bytes({W: tensor_entry((2,)),
                                              "w0001": tensor_entry((2,), start=4)}),
    "offsets-with-a-gap": safetensors_bytes({W: tensor_entry((2,)),
                                             "w0001": tensor_entry((2,), start=12)}),
    "offsets-reversed": safetensors_bytes({W: {"dtype": "F32", "shape": [2],
                                               "data_offsets": [8, 0]}}, b"\0" * 8),
    "size-not-the-shape's": safetensors_bytes({W: tensor_entry((3,), size=8)}),
    "truncated-data": safetensors_bytes({W: tensor_entry((64,))}, b"\0" * 10),
    "trailing-data": safetensors_bytes({W: tensor_entry((2,))}, b"\0" * 12),
    "negative-shape": safetensors_bytes({W: tensor_entry((-4,), size=0)}),
    "shape-not-a-list": safetensors_bytes({W: {"dtype": "F32", "shape": "big",
                                               "data_offsets": [0, 0]}}),
    # dtypes: the library's own that are not stored here, and names it does not know
    "bfloat16-dtype": safetensors_bytes({W: tensor_entry((2,), "BF16")}),
    "float8-dtype": safetensors_bytes({W: tensor_entry((2,), "F8_E4M3")}),
    "complex-dtype": safetensors_bytes({W: tensor_entry((2,), "C64")}),
    "object-dtype": safetensors_bytes({W: tensor_entry((2,), "O", size=8)}, b"\x80\x04N." * 2),
    "string-dtype": safetensors_bytes({W: tensor_entry((2,), "<U3", size=24)}),
    "int-weights": safetensors_bytes({W: tensor_entry((2,), "I64")}),
    # the header itself
    "header-not-json": safetensors_bytes(b"{not json"),
    "header-not-an-object": safetensors_bytes(b"[1, 2]"),
    "header-not-utf8": safetensors_bytes(b'{"\xff": 1}'),
    "header-deeply-nested": safetensors_bytes(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "header-empty": safetensors_bytes(b""),
    "entry-not-an-array": safetensors_bytes({W: "hello"}),
    "name-given-twice": safetensors_bytes(
        b'{"w0000": ' + json.dumps(tensor_entry((2,))).encode() + b', "w0000": '
        + json.dumps(tensor_entry((2,))).encode() + b"}", b"\0" * 8),
    # metadata
    "metadata-not-strings": safetensors_bytes({"__metadata__": {codec.META_KEY: 1},
                                               W: tensor_entry((1,))}),
    "meta-not-json": safetensors_bytes({"__metadata__": {codec.META_KEY: "{not json"},
                                        W: tensor_entry((1,))}),
    "meta-not-an-object": safetensors_bytes({"__metadata__": {codec.META_KEY: "[1, 2, 3]"},
                                             W: tensor_entry((1,))}),
    "meta-deeply-nested": safetensors_bytes({"__metadata__": {
        codec.META_KEY: "[" * 100_000 + "]" * 100_000}, W: tensor_entry((1,))}),
    # other formats
    "npz-archive": _npz(w0000=np.ones(4, np.float32)),
    "pickle-stream": b"\x80\x04\x95" + b"\x00" * 30,
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_object_raises_corrupt_object_error_only(name):
    """Each malformed object raises CorruptObjectError naming the object, nothing else
    (no SafetensorError, MemoryError, ValueError...), and allocates nothing near a declared size
    (the arrays the library copies out are Python bytearrays: tracemalloc sees them)."""
    # Prepare
    import tracemalloc

    data = MALFORMED[name]
    tracemalloc.start()
    # Execute
    try:
        with pytest.raises(Exception) as excinfo:
            codec.decode_weights(data, "deltas/bad.safetensors")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Assert
    assert type(excinfo.value) is CorruptObjectError, repr(excinfo.value)
    assert str(excinfo.value).startswith("deltas/bad.safetensors: ")
    assert "expected" in str(excinfo.value) or "metadata" in str(excinfo.value)
    assert peak < 64 * 1024**2


def test_objects_written_by_the_library_alone_decode():
    """What safetensors.numpy.save writes without bucketlearn (no metadata, other metadata
    keys, bool and uint8 arrays) decodes."""
    # Prepare
    data = safetensors.numpy.save({"w0000": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3),
                                   "mask": np.array([True, False]),
                                   "y": np.array([3, 1], np.uint8)}, {"format": "np"})
    # Execute
    arrays, meta = codec.decode_arrays(data)
    # Assert
    assert meta == {}
    assert arrays["w0000"].shape == (2, 3) and arrays["mask"].tolist() == [True, False]
    assert arrays["y"].tolist() == [3, 1]


def _valid_payloads():
    weights = codec.encode_weights([np.arange(6, dtype=np.float32).reshape(2, 3),
                                    np.ones(4, np.float32)], {"base_version": 3, "examples": 8})
    shard = codec.encode_arrays({"x": np.ones((5, 3), np.float32),
                                 "y": np.arange(5, dtype=np.int32)})
    state = codec.encode_state([np.linspace(0, 1, 50, dtype=np.float32)],
                               [np.array(3, np.int64), np.zeros(50, np.float32)], {"v": 1})
    return [weights, shard, state]


VALID_PAYLOADS = _valid_payloads()


@st.composite
def mutated_payloads(draw):
    """A valid object with 1-4 mutations: byte flips, interesting values written over a
    field (the header's length, offsets, header digits), cuts, insertions, deleted ranges."""
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
            value = draw(st.sampled_from([0, 1, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF,
                                          2**63 - 1]))
            width = draw(st.sampled_from([1, 2, 4, 8]))
            data[position:position + width] = (value & ((1 << 8 * width) - 1)).to_bytes(
                width, "little")
        elif kind == "truncate":
            del data[position:]
        elif kind == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[position:position + draw(st.integers(1, 64))]
        else:  # grow a number in the header (shapes, offsets): '[2,3]' -> '[2999999,3]'
            text = bytes(data)
            starts = [i for i in range(len(text) - 1) if text[i:i + 1] in (b"[", b",") and
                      text[i + 1:i + 2].isdigit()]
            if starts:
                at = draw(st.sampled_from(starts)) + 1
                data[at:at] = b"9" * draw(st.integers(1, 12))
    return bytes(data)


@settings(max_examples=600, deadline=None)
@given(data=mutated_payloads())
def test_fuzzed_objects_decode_or_raise_corrupt_object_error(data):
    """Mutations of valid payloads either decode to numeric arrays or raise CorruptObjectError;
    nothing else ever escapes decode_arrays, decode_weights or decode_state."""
    # Execute / Assert
    for decode in (codec.decode_arrays, codec.decode_weights, codec.decode_state):
        try:
            decoded = decode(data, "fuzz.safetensors")
        except CorruptObjectError:
            continue
        *arrays, meta = decoded
        values = [a for group in arrays
                  for a in (group.values() if isinstance(group, dict) else group)]
        assert all(a.dtype.kind in "biuf" for a in values)
        assert isinstance(meta, dict)


def test_a_header_over_the_bound_is_refused_before_it_is_parsed():
    """A 100 MB header (the format's own ceiling) of what would be JSON the parser chokes on is
    refused from its 8-byte length alone: the message names the bound, not a JSON error."""
    # Prepare
    header = b"{" + b" " * (100 * 1024**2 - 2) + b"x"
    data = safetensors_bytes(header)
    # Execute
    with pytest.raises(CorruptObjectError) as excinfo:
        codec.decode_state(data, "deltas/huge.safetensors", codec.RESULT_HEADER_BYTES)
    # Assert
    assert str(excinfo.value) == (
        "deltas/huge.safetensors: expected a safetensors object whose header is at most "
        f"{codec.RESULT_HEADER_BYTES} bytes; found a header of {len(header)} bytes")


def test_a_name_given_twice_among_many_is_found_in_linear_time():
    """The duplicate-name check over a header of 200,000 names (a quadratic scan took 3.6 s at
    8,000 and would take hours here) refuses the one name given twice."""
    # Prepare
    entries = [f'"w{i:07d}": {{"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}'
               for i in range(200_000)]
    entries.append(entries[-1])
    data = safetensors_bytes(("{" + ", ".join(entries) + "}").encode())
    # Execute
    with pytest.raises(CorruptObjectError) as excinfo:
        codec.decode_arrays(data, "deltas/twice.safetensors")
    # Assert
    assert "'w0199999' twice" in str(excinfo.value)
