"""Pickle-free encodings for arrays: ``.npz`` written by ``np.savez``, read by a strict parser.

Weights, deltas, shards and holdout parts all use this. Metadata rides along as a UTF-8 JSON
array named ``__meta__``; object arrays are refused on the way in and on the way out. Reading
never unpickles and never trusts a size the bytes declare: whatever is wrong with an object
(truncated, bad zlib data, a header declaring terabytes, a string or object dtype, a pickle),
decoding raises ``CorruptObjectError`` and nothing else.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import struct
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bucketlearn.errors import PermanentError

META_KEY = "__meta__"


class CorruptObjectError(PermanentError):
    """A stored object is not the pickle-free array archive bucketlearn writes."""


def encode_arrays(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None = None) -> bytes:
    """Serialize named numeric arrays (and JSON metadata) to ``.npz`` bytes."""
    payload: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        array = np.asarray(value)
        if array.dtype == object:
            raise TypeError(f"array {key!r}: expected a numeric dtype; found: object")
        payload[key] = array
    if meta is not None:
        payload[META_KEY] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **payload)
    return buffer.getvalue()


# What a decoder meets in bytes that are not what ``encode_arrays`` wrote: the zip layer
# (BadZipFile, struct/zlib errors, encrypted or unsupported members), the .npy header parser
# (ValueError, SyntaxError, TypeError on odd dtype descriptions, RecursionError on nesting).
_MALFORMED = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError,
              TypeError, KeyError, IndexError, OverflowError, struct.error, zlib.error,
              NotImplementedError, RuntimeError, SyntaxError)
_NUMERIC_KINDS = "biuf"  # bool, signed and unsigned integers, floats: nothing else is stored
_DEFLATE_MAX_RATIO = 1032  # deflate cannot expand a byte more than ~1032-fold
_READ_CHUNK = 1 << 20


def decode_arrays(data: bytes, what: str = "object") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read ``.npz`` bytes without ever unpickling; return (arrays, metadata).

    The archive is parsed here, not by ``np.load``: every size it declares (a zip member's, an
    array's shape) is checked against the bytes actually present before anything is allocated,
    and only numeric arrays (bool, int, uint, float) in uncompressed or deflated ``.npy``
    members are accepted.

    Args:
        data: the object's bytes.
        what: how to name the object in errors (its path).

    Returns:
        (arrays by name, the ``__meta__`` JSON object or {}).

    Raises:
        CorruptObjectError: the bytes are not such an archive, whatever is wrong with them.
    """
    try:
        arrays = _read_npz(data, what)
    except CorruptObjectError:
        raise
    except RecursionError:
        raise CorruptObjectError(f"{what}: expected a .npz archive; found nesting too deep to "
                                 "parse") from None
    except _MALFORMED as exc:
        raise CorruptObjectError(f"{what}: expected a .npz archive; found unreadable bytes "
                                 f"({type(exc).__name__}: {_cut(str(exc))})") from exc
    meta: dict[str, Any] = {}
    raw_meta = arrays.pop(META_KEY, None)
    if raw_meta is not None:
        if raw_meta.dtype != np.uint8 or raw_meta.ndim != 1:
            raise CorruptObjectError(f"{what}: expected metadata as a 1-D uint8 array; found "
                                     f"{raw_meta.dtype} of shape {raw_meta.shape}")
        try:
            meta = json.loads(raw_meta.tobytes().decode())
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise CorruptObjectError(f"{what}: metadata is not UTF-8 JSON ({_cut(str(exc))})"
                                     ) from None
        if not isinstance(meta, dict):
            raise CorruptObjectError(f"{what}: expected metadata as a JSON object; found "
                                     f"{type(meta).__name__}")
    return arrays, meta


def _cut(text: str, limit: int = 200) -> str:
    """A library's message on one line, cut short for an error text."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _read_npz(data: bytes, what: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive, every declared size checked before it is used."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = archive.infolist()
        names = [m.filename for m in members]
        if len(set(names)) != len(names):
            raise CorruptObjectError(f"{what}: expected a .npz archive with distinct members; "
                                     "found a repeated name")
        arrays: dict[str, np.ndarray] = {}
        for member in members:
            if not member.filename.endswith(".npy"):
                raise CorruptObjectError(f"{what}: expected a .npz archive of .npy arrays; "
                                         f"found a member named {_cut(member.filename, 80)!r}")
            raw = _member_bytes(archive, member, len(data), what)
            arrays[member.filename[: -len(".npy")]] = _parse_npy(raw, member.filename, what)
        return arrays


def _member_bytes(archive: zipfile.ZipFile, member: zipfile.ZipInfo, total: int,
                  what: str) -> bytearray:
    """A member's bytes, after checking its declared sizes against the archive's length."""
    if member.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise CorruptObjectError(f"{what}: expected stored or deflated members; found "
                                 f"compression method {member.compress_type} in "
                                 f"{_cut(member.filename, 80)!r}")
    ceiling = member.compress_size * (1 if member.compress_type == zipfile.ZIP_STORED
                                      else _DEFLATE_MAX_RATIO)
    if member.compress_size > total or member.file_size > ceiling:
        raise CorruptObjectError(
            f"{what}: expected member sizes that fit the {total}-byte archive; found "
            f"{_cut(member.filename, 80)!r} declaring {member.file_size} bytes "
            f"({member.compress_size} compressed)")
    buffer = bytearray(member.file_size)
    view = memoryview(buffer)
    filled = 0
    with archive.open(member) as stream:
        while filled < member.file_size:
            chunk = stream.read(min(_READ_CHUNK, member.file_size - filled))
            if not chunk:
                break
            view[filled: filled + len(chunk)] = chunk
            filled += len(chunk)
        extra = stream.read(1)
    if filled != member.file_size or extra:
        raise CorruptObjectError(f"{what}: expected {member.file_size} bytes in "
                                 f"{_cut(member.filename, 80)!r}; found "
                                 f"{'more' if extra else filled}")
    return buffer


def _parse_npy(raw: bytearray, name: str, what: str) -> np.ndarray:
    """One ``.npy`` member as an array over ``raw``, its shape checked against its length."""
    stream = io.BytesIO(raw)
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise CorruptObjectError(f"{what}: expected .npy format 1.0 or 2.0 in {name!r}; found "
                                 f"{version}")
    if dtype.hasobject or dtype.kind not in _NUMERIC_KINDS or dtype.fields is not None \
            or dtype.subdtype is not None:
        raise CorruptObjectError(f"{what}: expected a pickle-free numeric array in {name!r}; "
                                 f"found dtype {_cut(str(dtype), 80)}")
    if any(d < 0 for d in shape):
        raise CorruptObjectError(f"{what}: expected a shape of sizes >= 0 in {name!r}; found "
                                 f"{shape}")
    offset = stream.tell()
    expected = math.prod(shape) * dtype.itemsize
    if expected != len(raw) - offset:
        raise CorruptObjectError(f"{what}: expected {expected} bytes of data for shape "
                                 f"{_cut(str(shape), 80)} {dtype} in {name!r}; found "
                                 f"{len(raw) - offset}")
    flat = np.frombuffer(raw, dtype=dtype, count=math.prod(shape), offset=offset)
    return flat.reshape(shape, order="F" if fortran_order else "C")


def encode_weights(weights: Sequence[np.ndarray], meta: Mapping[str, Any] | None = None) -> bytes:
    """Weights as an ordered list: stored as ``w0000, w0001, …``."""
    return encode_arrays({f"w{i:04d}": np.asarray(w, dtype=np.float32) for i, w in enumerate(weights)},
                         meta)


def decode_weights(data: bytes, what: str = "weights") -> tuple[list[np.ndarray], dict[str, Any]]:
    """Weights written by ``encode_weights``: float arrays ``w0000, w0001, …`` and metadata."""
    arrays, meta = decode_arrays(data, what)
    return _numbered(arrays, "w", what, required=True), meta


def _numbered(arrays: Mapping[str, np.ndarray], prefix: str, what: str,
              required: bool) -> list[np.ndarray]:
    """The arrays ``<prefix>0000, <prefix>0001, …`` in order (weights must be float)."""
    keys = sorted(k for k in arrays if k.startswith(prefix))
    if (required and not keys) or keys != [f"{prefix}{i:04d}" for i in range(len(keys))]:
        raise CorruptObjectError(f"{what}: expected arrays {prefix}0000…; found: "
                                 f"{_cut(str(sorted(arrays)))}")
    if prefix == "w":
        not_float = [k for k in keys if arrays[k].dtype.kind != "f"]
        if not_float:
            raise CorruptObjectError(f"{what}: expected float arrays; found "
                                     f"{arrays[not_float[0]].dtype} in {not_float[0]}")
    return [arrays[k] for k in keys]


def encode_state(weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray],
                 meta: Mapping[str, Any] | None = None) -> bytes:
    """A training state: model arrays ``w0000…`` (float32) and optimizer arrays ``o0000…``.

    Versions store the weights and the optimizer state that goes with them; task results store
    their delta and the optimizer state they ended with.
    """
    arrays: dict[str, np.ndarray] = {f"w{i:04d}": np.asarray(w, dtype=np.float32)
                                     for i, w in enumerate(weights)}
    arrays.update({f"o{i:04d}": np.asarray(o) for i, o in enumerate(optimizer)})
    return encode_arrays(arrays, meta)


def decode_state(data: bytes, what: str = "state"
                 ) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, Any]]:
    """A training state written by ``encode_state``: (weights, optimizer arrays, metadata).

    An object with weights only (no ``o…`` arrays) decodes with an empty optimizer state.
    """
    arrays, meta = decode_arrays(data, what)
    return (_numbered(arrays, "w", what, required=True),
            _numbered(arrays, "o", what, required=False), meta)


def checksum(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def state_digest(weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray]) -> str:
    """A digest of a training state's arrays (dtype, shape and bytes of each, in order): two
    states have the same digest exactly when they hold the same numbers, whatever archive they
    came in. A task names its base by it; a learner that kept the state a round ended with
    knows it needs no download when a task names that digest."""
    digest = hashlib.sha256()
    for group, arrays in ((b"w", weights), (b"o", optimizer)):
        for array in arrays:
            value = np.ascontiguousarray(array)
            digest.update(group + value.dtype.str.encode() + repr(value.shape).encode())
            digest.update(value.tobytes())
    return "sha256:" + digest.hexdigest()
