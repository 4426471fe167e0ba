"""Cloud Storage adapter (also serves gcp-storage-emulator via STORAGE_EMULATOR_HOST)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import IO

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.cloud import storage

from bucketlearn.config import Settings
from bucketlearn.errors import NotFoundError, TransientError
from bucketlearn.ports import BlobInfo

log = logging.getLogger(__name__)

TIMEOUT = 60.0
_RETRY = Retry(initial=0.2, maximum=5.0, multiplier=2.0, timeout=120.0,
               predicate=lambda e: isinstance(e, (gexc.ServiceUnavailable, gexc.InternalServerError,
                                                  gexc.TooManyRequests, gexc.GatewayTimeout,
                                                  ConnectionError)))
_TRANSIENT = (gexc.ServiceUnavailable, gexc.InternalServerError, gexc.TooManyRequests,
              gexc.GatewayTimeout, gexc.RetryError, ConnectionError)


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
        """Upload a local file (streamed, resumable for large files)."""
        blob = self.client.bucket(bucket).blob(name, chunk_size=16 * 1024 * 1024)
        if metadata:
            blob.metadata = dict(metadata)
        try:
            blob.upload_from_filename(path, content_type=content_type, timeout=TIMEOUT * 10,
                                      retry=_RETRY)
        except _TRANSIENT as exc:
            raise TransientError(f"gs://{bucket}/{name}: upload failed: {exc}") from exc
        blob.reload(timeout=TIMEOUT)
        return _info(blob)

    def read_bytes(self, bucket: str, name: str) -> bytes:
        try:
            return self.client.bucket(bucket).blob(name).download_as_bytes(timeout=TIMEOUT,
                                                                          retry=_RETRY)
        except gexc.NotFound:
            raise NotFoundError(f"gs://{bucket}/{name}: no such object") from None
        except _TRANSIENT as exc:
            raise TransientError(f"gs://{bucket}/{name}: download failed: {exc}") from exc

    def open_read(self, bucket: str, name: str) -> IO[bytes]:
        blob = self.client.bucket(bucket).blob(name)
        return blob.open("rb", chunk_size=8 * 1024 * 1024, timeout=TIMEOUT, retry=_RETRY)

    def stat(self, bucket: str, name: str) -> BlobInfo | None:
        try:
            blob = self.client.bucket(bucket).get_blob(name, timeout=TIMEOUT, retry=_RETRY)
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

    def ensure_bucket(self, bucket: str) -> None:
        """Create a bucket if missing (local stack only; Terraform owns buckets in the cloud)."""
        try:
            self.client.create_bucket(bucket, timeout=TIMEOUT)
        except gexc.Conflict:
            return
