"""Cloud Storage adapter (also serves the local stack's fake-gcs-server via STORAGE_EMULATOR_HOST)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.cloud import storage

from bucketlearn.adapters import google_errors
from bucketlearn.config import Settings
from bucketlearn.errors import NotFoundError, ObjectChangedError, TransientError
from bucketlearn.ports import BlobInfo

log = logging.getLogger(__name__)

TIMEOUT = 60.0
_TRANSIENT = google_errors.TRANSIENT
_RETRY = Retry(initial=0.2, maximum=5.0, multiplier=2.0, timeout=120.0,
               predicate=lambda e: isinstance(e, _TRANSIENT) and not isinstance(e, gexc.RetryError))


class _PinnedReader(io.RawIOBase):
    """A read stream of one generation: a generation that is gone (replaced in a bucket without
    versioning, or deleted) is an ObjectChangedError, not a NotFound."""

    def __init__(self, reader: IO[bytes], store: GcsBlobStore, bucket: str, name: str,
                 generation: int) -> None:
        super().__init__()
        self._reader = reader
        self._store, self._bucket, self._name, self._generation = store, bucket, name, generation

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        try:
            data = self._reader.read(-1 if size is None else size)
        except gexc.NotFound:  # Cloud Storage: that generation was replaced or deleted
            raise self._store.changed(self._bucket, self._name, self._generation) from None
        except _TRANSIENT as exc:
            raise TransientError(f"gs://{self._bucket}/{self._name}: download failed: {exc}"
                                 ) from exc
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self._reader.close()
            finally:
                super().close()


def make_client(settings: Settings) -> storage.Client:
    if settings.storage_emulator_host:
        from google.auth.credentials import AnonymousCredentials  # noqa: PLC0415

        return storage.Client(project=settings.project, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": settings.storage_emulator_host})
    return storage.Client(project=settings.project)


def _info(blob: storage.Blob) -> BlobInfo:
    return BlobInfo(bucket=blob.bucket.name, name=blob.name, size=int(blob.size or 0),
                    generation=int(blob.generation or 0), metadata=dict(blob.metadata or {}),
                    content_type=blob.content_type)


class GcsBlobStore:
    # parts a split writes at once (``ingest.parts.PartWrites``): each write waits on the
    # network, and a table's split of 378 parts wrote them one after another
    write_threads = 8

    def __init__(self, settings: Settings, client: storage.Client | None = None) -> None:
        self.client = client or make_client(settings)

    def write_bytes(self, bucket: str, name: str, data: bytes, content_type: str,
                    metadata: Mapping[str, str] | None = None) -> BlobInfo:
        blob = self.client.bucket(bucket).blob(name)
        if metadata:
            blob.metadata = dict(metadata)
        try:
            blob.upload_from_string(data, content_type=content_type, timeout=TIMEOUT, retry=_RETRY)
        except _TRANSIENT as exc:
            raise TransientError(f"gs://{bucket}/{name}: upload failed: {exc}") from exc
        return _info(blob)

    def write_file(self, bucket: str, name: str, path: str, content_type: str,
                   metadata: Mapping[str, str] | None = None) -> BlobInfo:
        """Upload a local file (streamed, resumable for large files, in 64 MiB requests: a
        373 MB file took 16 s into the local stack's storage emulator in 16 MiB requests and
        4.8 s in 64 MiB ones; Cloud Storage takes any multiple of 256 KiB, and the client's own
        default is 100 MiB)."""
        blob = self.client.bucket(bucket).blob(name, chunk_size=64 * 1024 * 1024)
        if metadata:
            blob.metadata = dict(metadata)
        try:
            blob.upload_from_filename(path, content_type=content_type, timeout=TIMEOUT * 10,
                                      retry=_RETRY)
        except _TRANSIENT as exc:
            raise TransientError(f"gs://{bucket}/{name}: upload failed: {exc}") from exc
        return _info(blob)  # the upload's answer describes the object: no read (create-only)

    def write_stream(self, bucket: str, name: str, stream: IO[bytes], content_type: str,
                     metadata: Mapping[str, str] | None = None,
                     size: int | None = None) -> BlobInfo:
        """Upload from a stream (one request up to 8 MiB of a known size, else resumable, read
        in chunks of 16 MiB)."""
        blob = self.client.bucket(bucket).blob(name, chunk_size=16 * 1024 * 1024)
        if metadata:
            blob.metadata = dict(metadata)
        try:
            blob.upload_from_file(stream, size=size, content_type=content_type,
                                  timeout=TIMEOUT * 10, retry=_RETRY)
        except _TRANSIENT as exc:
            raise TransientError(f"gs://{bucket}/{name}: upload failed: {exc}") from exc
        return _info(blob)  # the upload's answer describes the object: no read (create-only)

    def read_bytes(self, bucket: str, name: str) -> bytes:
        return self._download(bucket, name)

    def read_range(self, bucket: str, name: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            return self._download(bucket, name, start=offset, end=offset + length - 1)
        except gexc.RequestRangeNotSatisfiable:
            return b""  # the object ends before ``offset``

    def _download(self, bucket: str, name: str, **span: int) -> bytes:
        """The object's bytes (``start``/``end``: that range of them, ``end`` included)."""
        try:
            return self.client.bucket(bucket).blob(name).download_as_bytes(
                timeout=TIMEOUT, retry=_RETRY, **span)
        except gexc.NotFound:
            raise NotFoundError(f"gs://{bucket}/{name}: no such object") from None
        except _TRANSIENT as exc:
            raise TransientError(f"gs://{bucket}/{name}: download failed: {exc}") from exc

    def open_read(self, bucket: str, name: str, generation: int | None = None,
                  start: int = 0) -> IO[bytes]:
        """A stream of the object; with ``generation``, every range read asks for that
        generation (``?generation=``), which Cloud Storage and fake-gcs-server serve for as long
        as it exists: in the uploads bucket, which keeps noncurrent versions, a re-upload of the
        same name leaves the first upload's split reading its own bytes (a re-upload never
        rejects the first job). A generation that no longer exists is ObjectChangedError.
        (gcp-storage-emulator, which ignores the parameter, is not the local stack's storage.)
        """
        blob = self.client.bucket(bucket).blob(name, generation=generation)
        reader = None
        try:
            reader = blob.open("rb", chunk_size=8 * 1024 * 1024, timeout=TIMEOUT, retry=_RETRY)
            if start:
                reader.seek(start)  # the next range request starts there
        except gexc.NotFound:
            if reader is not None:
                reader.close()
            if generation is None:
                raise NotFoundError(f"gs://{bucket}/{name}: no such object") from None
            raise self.changed(bucket, name, generation) from None
        if generation is None:
            return reader
        return _PinnedReader(reader, self, bucket, name, generation)

    def changed(self, bucket: str, name: str, generation: int) -> ObjectChangedError:
        """The error for a pinned read of ``generation``, naming what the object is now."""
        info = self.stat(bucket, name)
        return ObjectChangedError(bucket, name, generation,
                                  None if info is None else info.generation)

    def stat(self, bucket: str, name: str, generation: int | None = None) -> BlobInfo | None:
        """The object's metadata (of ``generation``, also a noncurrent one a versioned bucket
        keeps); None when there is no such object or generation."""
        try:
            blob = self.client.bucket(bucket).get_blob(name, generation=generation,
                                                       timeout=TIMEOUT, retry=_RETRY)
        except _TRANSIENT as exc:
            raise TransientError(f"gs://{bucket}/{name}: stat failed: {exc}") from exc
        return _info(blob) if blob is not None else None

    def list(self, bucket: str, prefix: str = "") -> Iterator[BlobInfo]:
        try:
            blobs = list(self.client.list_blobs(bucket, prefix=prefix or None, timeout=TIMEOUT,
                                                retry=_RETRY))
        except _TRANSIENT as exc:
            raise TransientError(f"gs://{bucket}/{prefix}: listing failed: {exc}") from exc
        return iter([_info(b) for b in blobs])

    def delete(self, bucket: str, name: str) -> None:
        try:
            self.client.bucket(bucket).blob(name).delete(timeout=TIMEOUT, retry=_RETRY)
        except gexc.NotFound:
            return

    def compose(self, bucket: str, name: str, sources: Sequence[str], content_type: str,
                metadata: Mapping[str, str] | None = None) -> BlobInfo:
        """One object of ``sources`` (at most 32, Cloud Storage's limit) composed server-side;
        composing the same sources again writes the same bytes."""
        target = self.client.bucket(bucket).blob(name)
        target.content_type = content_type
        if metadata:
            target.metadata = dict(metadata)
        try:
            target.compose([self.client.bucket(bucket).blob(s) for s in sources],
                           timeout=TIMEOUT, retry=_RETRY)
        except gexc.NotFound as exc:
            raise NotFoundError(f"gs://{bucket}/{name}: a source to compose is missing: "
                                f"{exc}") from None
        except _TRANSIENT as exc:
            raise TransientError(f"gs://{bucket}/{name}: compose failed: {exc}") from exc
        return _info(target)

    def ensure_bucket(self, bucket: str, versioned: bool = False) -> None:
        """Create a bucket if missing (local stack only; Terraform owns buckets in the cloud),
        keeping noncurrent versions when ``versioned`` (the uploads bucket, as Terraform
        creates it)."""
        try:
            created = self.client.bucket(bucket)
            created.versioning_enabled = versioned
            self.client.create_bucket(created, timeout=TIMEOUT)
        except gexc.Conflict:
            return
