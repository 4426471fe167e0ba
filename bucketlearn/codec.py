"""Pickle-free encodings for arrays: safetensors, written and read by the ``safetensors`` library.

Weights, task results (weights or a delta with the optimizer state), shard parts and holdout
parts all use this (docs/DESIGN.md, "Stored arrays", compares it with the ``.npz`` archives used
before, Arrow IPC and Parquet). An object is an 8-byte header length, a JSON header naming each
array's dtype, shape and byte range, and the arrays' bytes. The library checks the header
against the bytes before it copies anything out (a header under 100 MB, every range inside the
object, the ranges contiguous and covering it, each exactly the size its dtype and shape need,
no overflow), and nothing in the format is ever executed. On top of it: a header longer than
``MAX_HEADER_BYTES`` (a result's: ``RESULT_HEADER_BYTES``) is refused before it is parsed; only
numeric arrays (bool, int, uint, float) are written or read; metadata rides along as one UTF-8
JSON object (the header's string ``__meta__``); a header naming an array twice is refused (in
time linear in its names); and whatever is wrong with an object, decoding raises
``CorruptObjectError`` and nothing else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from bucketlearn.errors import PermanentError

META_KEY = "__meta__"
# the longest header read (the format allows 100 MB, whose JSON alone takes seconds to parse):
# any object; a task's result, whose arrays are the model's state, far less
MAX_HEADER_BYTES = 16 * 1024**2
RESULT_HEADER_BYTES = 1024**2


class CorruptObjectError(PermanentError):
    """A stored object is not the pickle-free array object bucketlearn writes."""


# What is stored, by the format's dtype names: bool, integers and floats, nothing else (the
# library also knows bfloat16, float8 and complex; none of them is written here, none is read).
_DTYPES = {name: np.dtype(code) for name, code in (
    ("BOOL", "?"), ("U8", "u1"), ("I8", "i1"), ("U16", "<u2"), ("I16", "<i2"), ("F16", "<f2"),
    ("U32", "<u4"), ("I32", "<i4"), ("F32", "<f4"), ("U64", "<u8"), ("I64", "<i8"),
    ("F64", "<f8"))}
_STORABLE = {dtype.newbyteorder("=") for dtype in _DTYPES.values()}


def encode_arrays(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None = None) -> bytes:
    """Serialize named numeric arrays (and JSON metadata) to safetensors bytes.

    Raises:
        TypeError: an array is not bool, int, uint or float (object arrays above all).
    """
    payload: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        array = np.asarray(value)
        if array.dtype.newbyteorder("=") not in _STORABLE:
            raise TypeError(f"array {key!r}: expected a numeric dtype; found: {array.dtype}")
        # little-endian and C-contiguous: safetensors.numpy.save writes an array's memory as it
        # lies, so a transposed or strided view would otherwise be stored in the wrong order
        # (np.asarray, not np.ascontiguousarray, which turns a 0-d array into shape (1,))
        payload[key] = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
    metadata = None if meta is None else {META_KEY: json.dumps(meta, sort_keys=True)}
    return safetensors.numpy.save(payload, metadata)


def decode_arrays(data: bytes, what: str = "object", max_header_bytes: int = MAX_HEADER_BYTES
                  ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read safetensors bytes; return (arrays, metadata).

    ``safetensors.deserialize`` checks every size and range the header declares against the
    bytes present before it copies an array out; each array comes back writable, in its own
    memory. Only the dtypes ``encode_arrays`` writes are accepted.

    Args:
        data: the object's bytes.
        what: how to name the object in errors (its path).
        max_header_bytes: a longer header is refused before it is parsed.

    Returns:
        (arrays by name, the ``__meta__`` JSON object or {}).

    Raises:
        CorruptObjectError: the bytes are not such an object, whatever is wrong with them.
    """
    declared = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
    if declared > max_header_bytes:
        raise CorruptObjectError(f"{what}: expected a safetensors object whose header is at most "
                                 f"{max_header_bytes} bytes; found a header of {declared} bytes")
    try:  # SafetensorError is all that fuzzing met; the others are a backstop
        tensors = safetensors.deserialize(bytes(data))
    except (safetensors.SafetensorError, ValueError, OverflowError) as exc:
        raise CorruptObjectError(f"{what}: expected a safetensors object; found unreadable bytes "
                                 f"({_cut(str(exc))})") from None
    header = _header(data, what)
    arrays: dict[str, np.ndarray] = {}
    for name, view in tensors:
        dtype = _DTYPES.get(view["dtype"])
        if dtype is None:
            raise CorruptObjectError(f"{what}: expected a numeric array (bool, int, uint, float) "
                                     f"in {_cut(name, 80)!r}; found dtype {_cut(view['dtype'], 80)}")
        try:
            arrays[name] = np.frombuffer(view["data"], dtype=dtype).reshape(view["shape"])
        except (ValueError, TypeError) as exc:  # the library checked this; kept as a backstop
            raise CorruptObjectError(f"{what}: expected the bytes of {_cut(name, 80)!r} to fit "
                                     f"its shape; found {_cut(str(exc))}") from None
    return arrays, _meta(header.get("__metadata__") or {}, what)


def _cut(text: str, limit: int = 200) -> str:
    """A library's message on one line, cut short for an error text."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members, refusing a name given twice (JSON parsers keep the last); in
    time linear in the members."""
    members = dict(pairs)
    if len(members) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise ValueError(f"{_cut(name, 80)!r} twice")
            seen.add(name)
    return members


def _header(data: bytes, what: str) -> dict[str, Any]:
    """The header of bytes ``safetensors.deserialize`` accepted (its length and JSON checked),
    read again for the metadata it does not return; a name given twice is refused."""
    length = int.from_bytes(data[:8], "little")
    try:
        header = json.loads(bytes(data[8:8 + length]), object_pairs_hook=_unique)
    except (ValueError, RecursionError) as exc:
        raise CorruptObjectError(f"{what}: expected a safetensors header naming each array once; "
                                 f"found {_cut(str(exc))}") from None
    if not isinstance(header, dict):  # deserialize accepts only an object: a backstop
        raise CorruptObjectError(f"{what}: expected a safetensors header; found "
                                 f"{type(header).__name__}")
    return header


def _meta(metadata: Mapping[str, str], what: str) -> dict[str, Any]:
    """The JSON object stored under ``__meta__`` in the header's (string) metadata, or {}."""
    raw = metadata.get(META_KEY)
    if raw is None:
        return {}
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CorruptObjectError(f"{what}: metadata is not JSON ({_cut(str(exc))})") from None
    if not isinstance(meta, dict):
        raise CorruptObjectError(f"{what}: expected metadata as a JSON object; found "
                                 f"{type(meta).__name__}")
    return meta


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
    return encode_arrays({**_named("w", weights, np.float32), **_named("o", optimizer)}, meta)


def _named(prefix: str, values: Sequence[np.ndarray], dtype: Any = None
           ) -> dict[str, np.ndarray]:
    """``values`` as the arrays ``<prefix>0000, <prefix>0001, …`` (``_numbered`` reads them)."""
    return {f"{prefix}{i:04d}": np.asarray(v, dtype=dtype) for i, v in enumerate(values)}


def decode_state(data: bytes, what: str = "state", max_header_bytes: int = MAX_HEADER_BYTES
                 ) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, Any]]:
    """A training state written by ``encode_state``: (weights, optimizer arrays, metadata).

    An object with weights only (no ``o…`` arrays) decodes with an empty optimizer state.
    """
    arrays, meta = decode_arrays(data, what, max_header_bytes)
    return (_numbered(arrays, "w", what, required=True),
            _numbered(arrays, "o", what, required=False), meta)


def encode_segment(weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray],
                   best: Sequence[np.ndarray], meta: Mapping[str, Any]) -> bytes:
    """A search segment's end state (``loops.segment``): a line's weights (``w…``),
    optimizer state (``o…``) and best weights by validation (``b…``), with its metadata."""
    return encode_arrays({**_named("w", weights), **_named("o", optimizer),
                          **_named("b", best)}, meta)


def decode_segment(data: bytes, what: str = "segment"
                   ) -> tuple[dict[str, list[np.ndarray]], dict[str, Any]]:
    """``encode_segment``'s arrays by prefix (``w``, ``o``, ``b``; each possibly empty) and
    metadata.

    Raises:
        CorruptObjectError: not an object ``encode_segment`` wrote.
    """
    arrays, meta = decode_arrays(data, what)
    return ({prefix: _numbered(arrays, prefix, what, required=False) for prefix in "wob"},
            meta)


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
