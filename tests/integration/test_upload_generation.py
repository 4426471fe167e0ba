"""The upload service reads an upload at its event's generation, on the real storage emulator.

These tests overwrite the upload while it is being split. In the uploads bucket, which keeps
noncurrent versions (as Terraform creates it), the split goes on reading its own generation and
the job trains the first file; in a bucket that keeps none, the generation
is gone and the job is REJECTED with a clear reason. Never a crash (a KeyError for a label only
the new file has) nor shards dealt from two files. fake-gcs-server, like Cloud Storage, serves a
pinned generation while it exists and answers 404 once it is gone.
"""

from __future__ import annotations

from typing import Any

import pytest

from bucketlearn import layout
from bucketlearn.domain.lifecycle import REJECTED
from bucketlearn.usecases.upload import Outcome, StorageEvent, handle_upload
from tests.unit.helpers import csv_bytes

pytestmark = pytest.mark.integration

# Larger than the adapter's 8 MiB read chunk, so that pass 2 reads the object in several
# ranges: after an overwrite, the later ones find another generation.
FIRST = csv_bytes(["x", "y", "label"], [[i, i % 7, "ab"[i % 2]] for i in range(900_000)])
SECOND = csv_bytes(["x", "y", "label"], [[i, i % 5, "abc"[i % 3]] for i in range(900_000)])
# Few large shards: the test is about reading, and thousands of shard parts written to the
# storage emulator took minutes.
OPTIONS = {"rows_per_shard": "100000"}


class ReuploadDuringSplit:
    """The real store, re-uploading the object at its ``at``-th open (header 1, pass 1 2, pass 2
    3) or, with ``mid_stream``, after the first read of that stream."""

    def __init__(self, store: Any, name: str, data: bytes, at: int, mid_stream: bool) -> None:
        self._store, self.name, self.data, self.at, self.mid_stream = (store, name, data, at,
                                                                       mid_stream)
        self.opens = 0

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._store, attribute)

    def open_read(self, bucket: str, name: str, generation: int | None = None) -> Any:
        if name != self.name:
            return self._store.open_read(bucket, name, generation)
        self.opens += 1
        if self.opens == self.at and not self.mid_stream:
            self._store.write_bytes(bucket, name, self.data, "text/csv")
        stream = self._store.open_read(bucket, name, generation)
        if self.opens != self.at or not self.mid_stream:
            return stream
        outer = self

        class OverwriteAfterFirstRead:
            def __init__(self) -> None:
                self.reads = 0

            def __getattr__(self, attribute: str) -> Any:
                return getattr(stream, attribute)

            def read(self, size: int = -1) -> bytes:
                self.reads += 1
                data = stream.read(size)
                if self.reads == 1:
                    outer._store.write_bytes(bucket, name, outer.data, "text/csv")
                return data

            def __enter__(self) -> Any:
                return self

            def __exit__(self, *exc: Any) -> None:
                stream.close()

        return OverwriteAfterFirstRead()


def split_with_reupload(svc: Any, mid_stream: bool) -> tuple[Any, Any, str, Any, Any]:
    """Upload FIRST, then split it while SECOND is uploaded under the same name (before or
    during pass 2): (services, outcome, job id, the first upload, the object now)."""
    bucket = svc.settings.uploads_bucket
    info = svc.store.write_bytes(bucket, "reupload.csv", FIRST, "text/csv", OPTIONS)
    svc.store = ReuploadDuringSplit(svc.store, "reupload.csv", SECOND, at=3, mid_stream=mid_stream)
    outcome, job_id = handle_upload(svc, StorageEvent(bucket, "reupload.csv", info.generation,
                                                      info.size))
    return svc, outcome, job_id, info, svc.store.stat(bucket, "reupload.csv")


@pytest.mark.parametrize("mid_stream", [False, True], ids=["before-pass-2", "during-pass-2"])
def test_a_reupload_during_the_split_leaves_the_first_job_its_own_file(cloud: Any,
                                                                      mid_stream: bool) -> None:
    """The uploads bucket keeps noncurrent versions: overwritten before or during pass 2, the
    first upload's split reads its own generation to the end and its job trains the first file
    (before: the live generation was compared and the first job REJECTED)."""
    # Execute
    svc, outcome, job_id, info, now = split_with_reupload(cloud, mid_stream)
    # Assert
    job = svc.registry.get_job(job_id)
    assert svc.store.opens >= 3 and now.generation != info.generation
    assert outcome is Outcome.ACCEPTED, job.error
    assert sorted(job.classes) == ["a", "b"]  # the first file's labels ("c" is the second's)
    assert job.dataset["rows"] == 900_000


@pytest.mark.parametrize("mid_stream", [False, True], ids=["before-pass-2", "during-pass-2"])
def test_reupload_during_the_split_is_rejected_without_versions(cloud: Any,
                                                                mid_stream: bool) -> None:
    """In a bucket that keeps no noncurrent versions, overwritten before or during pass 2:
    REJECTED naming both generations; no shards left (before: a KeyError for label 'c', or pass
    2 dealing the first file's first 8 MiB and the second file's rest)."""
    # Prepare
    import dataclasses

    assert len(FIRST) > 8 * 1024**2 and len(SECOND) > 8 * 1024**2
    bucket = cloud.settings.uploads_bucket + "-unversioned"
    cloud.store.ensure_bucket(bucket)
    unversioned = dataclasses.replace(cloud, settings=dataclasses.replace(
        cloud.settings, uploads_bucket=bucket))
    # Execute
    svc, outcome, job_id, info, now = split_with_reupload(unversioned, mid_stream)
    # Assert
    job = svc.registry.get_job(job_id)
    assert svc.store.opens >= 3
    assert outcome is Outcome.REJECTED, job
    assert job.status == REJECTED
    assert "the upload was replaced or deleted while it was being read" in job.error
    assert f"expected generation {info.generation} until the split ends" in job.error
    assert f"found: generation {now.generation}" in job.error
    assert list(svc.store.list(svc.settings.work_bucket, layout.job_prefix(job_id))) == []
