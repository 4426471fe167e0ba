"""What Firestore refuses, as the in-memory registry checks it: a document's size by
Firestore's rules (over 1 MiB is refused) and an array directly inside an array."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bucketlearn.errors import BackendRejectedError

FIRESTORE_MAX_DOCUMENT_BYTES = 1_048_576


def firestore_size(value: Any) -> int:
    """Storage size of a Firestore value, by Firestore's rules (strings: UTF-8 bytes + 1)."""
    if value is None or isinstance(value, bool):
        return 1
    if isinstance(value, (int, float)):
        return 8
    if isinstance(value, str):
        return len(value.encode("utf-8", errors="surrogatepass")) + 1
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, Mapping):
        return sum(firestore_size(str(k)) + firestore_size(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(firestore_size(v) for v in value)
    return 8  # timestamps and other scalars


def document_size(path: str, fields: Mapping[str, Any]) -> int:
    """Storage size of the document at ``path`` (e.g. 'jobs/j1/versions/000001') with ``fields``:
    its name (each path segment + 1, plus 16), its fields, plus 32 bytes."""
    name = sum(len(part.encode()) + 1 for part in path.split("/")) + 16
    return name + firestore_size(dict(fields)) + 32


def nested_array(value: Any, inside_array: bool = False) -> bool:
    """Whether a value holds an array directly inside an array, which Firestore refuses (an
    array of maps that hold arrays is fine)."""
    if isinstance(value, Mapping):
        return any(nested_array(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return inside_array or any(nested_array(v, inside_array=True) for v in value)
    return False


def check_document(path: str, fields: Mapping[str, Any]) -> None:
    """Refuse, as Firestore does (InvalidArgument), a document larger than 1 MiB or with an
    array directly inside an array."""
    size = document_size(path, fields)
    if size > FIRESTORE_MAX_DOCUMENT_BYTES:
        raise BackendRejectedError(
            f"firestore write of {path}: expected a document of at most "
            f"{FIRESTORE_MAX_DOCUMENT_BYTES} bytes (Firestore's limit); found {size} bytes")
    if nested_array(fields):
        raise BackendRejectedError(
            f"firestore write of {path}: expected no array directly inside an array "
            f"(Firestore's rule); found one")
