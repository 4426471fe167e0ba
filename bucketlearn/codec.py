"""Pickle-free encodings for arrays: ``.npz`` written and read with ``allow_pickle=False``.

Weights, deltas, shards and holdout parts all use this. Metadata rides along as a UTF-8 JSON
array named ``__meta__``; object arrays are refused on the way in and on the way out.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
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


def decode_arrays(data: bytes, what: str = "object") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read ``.npz`` bytes without ever unpickling; return (arrays, metadata)."""
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise CorruptObjectError(f"{what}: expected a .npz archive; found a single array")
        with loaded as archive:
            arrays = {key: archive[key] for key in archive.files}
    except CorruptObjectError:
        raise
    except ValueError as exc:  # raised for object arrays when allow_pickle=False
        raise CorruptObjectError(f"{what}: expected a pickle-free .npz archive; found: {exc}") from exc
    except (OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise CorruptObjectError(f"{what}: expected a .npz archive; found unreadable bytes ({exc})") from exc
    for key, value in arrays.items():
        if not isinstance(value, np.ndarray) or value.dtype == object:
            raise CorruptObjectError(f"{what}: expected a numeric array as entry {key!r}; "
                                     f"found: {type(value).__name__}")
    meta: dict[str, Any] = {}
    raw_meta = arrays.pop(META_KEY, None)
    if raw_meta is not None:
        try:
            meta = json.loads(raw_meta.tobytes().decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptObjectError(f"{what}: metadata is not UTF-8 JSON ({exc})") from exc
    return arrays, meta


def encode_weights(weights: Sequence[np.ndarray], meta: Mapping[str, Any] | None = None) -> bytes:
    """Weights as an ordered list: stored as ``w0000, w0001, …``."""
    return encode_arrays({f"w{i:04d}": np.asarray(w, dtype=np.float32) for i, w in enumerate(weights)},
                         meta)


def decode_weights(data: bytes, what: str = "weights") -> tuple[list[np.ndarray], dict[str, Any]]:
    arrays, meta = decode_arrays(data, what)
    keys = sorted(k for k in arrays if k.startswith("w"))
    if not keys or keys != [f"w{i:04d}" for i in range(len(keys))]:
        raise CorruptObjectError(f"{what}: expected arrays w0000…; found: {sorted(arrays)}")
    return [arrays[k] for k in keys], meta


def checksum(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
