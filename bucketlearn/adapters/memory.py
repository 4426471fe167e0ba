"""In-memory implementations of the ports: for unit tests of the core and for ``train-local``.

They keep the semantics the services rely on (write-once names, create-if-absent, transactional
version commits, leases) so unit tests exercise the same decisions the real adapters see.
Integration tests run the same contract against the Google adapters on the emulators.
"""

from __future__ import annotations

import copy
import io
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from bucketlearn.domain.job import (
    Epoch,
    Head,
    Job,
    Version,
    commit_refusal,
    may_start_training,
    unknown_fields,
)
from bucketlearn.domain.task import TaskRecord
from bucketlearn.errors import BackendRejectedError, NotFoundError, ObjectChangedError
from bucketlearn.ports import BlobInfo, TaskMessage, VersionCommit


class MemoryBlobStore:
    def __init__(self) -> None:
        self._objects: dict[tuple[str, str], tuple[bytes, BlobInfo]] = {}
        self._lock = threading.Lock()
        self._generation = 1000

    def write_bytes(self, bucket: str, name: str, data: bytes, content_type: str,
                    metadata: Mapping[str, str] | None = None) -> BlobInfo:
        with self._lock:
            self._generation += 1
            info = BlobInfo(bucket, name, len(data), self._generation, dict(metadata or {}),
                            content_type)
            self._objects[(bucket, name)] = (bytes(data), info)
            return info

    def write_file(self, bucket: str, name: str, path: str, content_type: str,
                   metadata: Mapping[str, str] | None = None) -> BlobInfo:
        with open(path, "rb") as handle:
            return self.write_bytes(bucket, name, handle.read(), content_type, metadata)

    def read_bytes(self, bucket: str, name: str) -> bytes:
        with self._lock:
            if (bucket, name) not in self._objects:
                raise NotFoundError(f"gs://{bucket}/{name}: no such object")
            return self._objects[(bucket, name)][0]

    def open_read(self, bucket: str, name: str, generation: int | None = None) -> IO[bytes]:
        """A snapshot of the object (of ``generation``: ObjectChangedError if it is gone)."""
        with self._lock:
            found = self._objects.get((bucket, name))
            if generation is not None and (found is None or found[1].generation != generation):
                raise ObjectChangedError(bucket, name, generation,
                                         None if found is None else found[1].generation)
            if found is None:
                raise NotFoundError(f"gs://{bucket}/{name}: no such object")
            return io.BytesIO(found[0])

    def stat(self, bucket: str, name: str) -> BlobInfo | None:
        with self._lock:
            found = self._objects.get((bucket, name))
            return found[1] if found else None

    def list(self, bucket: str, prefix: str = "") -> Iterator[BlobInfo]:
        with self._lock:
            infos = sorted((info for (b, n), (_, info) in self._objects.items()
                            if b == bucket and n.startswith(prefix)), key=lambda i: i.name)
        return iter(infos)

    def delete(self, bucket: str, name: str) -> None:
        with self._lock:
            self._objects.pop((bucket, name), None)


class _MemoryReceived:
    def __init__(self, queue: MemoryQueue, message: TaskMessage, attempt: int) -> None:
        self.message: TaskMessage | None = message
        self.raw = b""
        self.delivery_attempt: int | None = attempt
        self._queue = queue

    def ack(self) -> None:
        self._queue.acked.append(self.message)

    def nack(self) -> None:
        assert self.message is not None
        self._queue.redeliver(self.message, (self.delivery_attempt or 0) + 1)

    def extend(self, seconds: int) -> None:
        return None


class MemoryQueue:
    """A FIFO with explicit nack/redelivery; unacked messages are redelivered on nack only."""

    def __init__(self) -> None:
        self._items: deque[tuple[TaskMessage, int]] = deque()
        self._lock = threading.Lock()
        self.published: list[TaskMessage] = []
        self.acked: list[TaskMessage | None] = []

    def publish(self, messages: Sequence[TaskMessage]) -> None:
        with self._lock:
            for message in messages:
                self._items.append((message, 1))
                self.published.append(message)

    def redeliver(self, message: TaskMessage, attempt: int) -> None:
        with self._lock:
            self._items.append((message, attempt))

    def pull(self, timeout: float) -> _MemoryReceived | None:
        with self._lock:
            if not self._items:
                return None
            message, attempt = self._items.popleft()
        return _MemoryReceived(self, message, attempt)

    def __len__(self) -> int:
        return len(self._items)


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


def _check_job_update(job_id: str, stored: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
    """Refuse a job update naming a field ``Job`` does not have (stricter than Firestore, which
    stores any key: the suite's typo check, as a misspelt field would be written and never
    read), or one that would make the stored document one Firestore refuses."""
    unknown = unknown_fields(fields)
    if unknown:
        raise ValueError(f"jobs/{job_id}: expected fields of domain.job.Job; found {unknown}")
    _check_document(f"jobs/{job_id}", {**stored, **fields})


def _check_document(path: str, fields: Mapping[str, Any]) -> None:
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


class MemoryRegistry:
    """The registry in memory; documents over Firestore's 1 MiB are refused as it would."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.versions: dict[tuple[str, int], dict[str, Any]] = {}
        self.epochs: dict[tuple[str, int], dict[str, Any]] = {}
        self.tasks: dict[tuple[str, str], dict[str, Any]] = {}
        self.leases: dict[str, tuple[str, float]] = {}
        self.workers: dict[str, dict[str, Any]] = {}
        self.controls: dict[str, dict[str, Any]] = {}
        self.commits = 0

    def create_job(self, job: Job) -> bool:
        with self._lock:
            if job.job_id in self.jobs:
                return False
            doc = job.to_doc()
            _check_document(f"jobs/{job.job_id}", doc)
            self.jobs[job.job_id] = copy.deepcopy(doc)
            return True

    def get_job(self, job_id: str) -> Job | None:
        with self._lock:
            doc = self.jobs.get(job_id)
            return Job.from_doc(copy.deepcopy(doc)) if doc is not None else None

    def update_job(self, job_id: str, fields: Mapping[str, Any]) -> None:
        with self._lock:
            if job_id not in self.jobs:
                raise NotFoundError(f"job {job_id}: no such job")
            _check_job_update(job_id, self.jobs[job_id], fields)
            self.jobs[job_id].update(copy.deepcopy(dict(fields)))

    def update_job_if(self, job_id: str, expect: Mapping[str, Any],
                      fields: Mapping[str, Any]) -> bool:
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None or any(job.get(k) != v for k, v in expect.items()):
                return False
            _check_job_update(job_id, job, fields)
            job.update(copy.deepcopy(dict(fields)))
            return True

    def list_jobs(self, limit: int = 100) -> list[Job]:
        with self._lock:
            jobs = sorted(self.jobs.values(), key=lambda j: j.get("created_at", 0), reverse=True)
            return [Job.from_doc(copy.deepcopy(doc)) for doc in jobs[:limit]]

    def start_training(self, job_id: str, claim: str, job_fields: Mapping[str, Any],
                       version: Version, epoch: Epoch) -> bool:
        with self._lock:
            job = self.jobs.get(job_id)
            if not may_start_training(Job.from_doc(job) if job is not None else None, claim):
                return False
            version_doc, epoch_doc = version.to_doc(), epoch.to_doc()
            _check_document(f"jobs/{job_id}/versions/{version.version:06d}", version_doc)
            _check_document(f"jobs/{job_id}/epochs/{epoch.epoch:04d}", epoch_doc)
            _check_job_update(job_id, job, job_fields)
            self.versions[(job_id, version.version)] = version_doc
            self.epochs[(job_id, epoch.epoch)] = epoch_doc
            job.update(copy.deepcopy(dict(job_fields)))
            return True

    def commit_version(self, commit: VersionCommit) -> bool:
        with self._lock:
            job = self.jobs.get(commit.job_id)
            stored = self.epochs.get((commit.job_id, commit.epoch))
            epoch = Epoch.from_doc(stored) if stored is not None else None
            version = commit.version.version
            current = Job.from_doc(job) if job is not None else None
            if commit_refusal(current, epoch, (commit.job_id, version) in self.versions,
                              commit) is not None:
                return False
            assert job is not None and epoch is not None
            done = epoch.with_results(commit.applied, commit.failed).to_doc()
            version_doc = commit.version.to_doc()
            _check_document(f"jobs/{commit.job_id}/versions/{version:06d}", version_doc)
            _check_document(f"jobs/{commit.job_id}/epochs/{commit.epoch:04d}", done)
            following = commit.next_epoch.to_doc() if commit.next_epoch is not None else None
            if following is not None:
                _check_document(f"jobs/{commit.job_id}/epochs/{following['epoch']:04d}",
                                following)
            _check_job_update(commit.job_id, job, commit.job_fields)
            self.versions[(commit.job_id, version)] = version_doc
            self.epochs[(commit.job_id, commit.epoch)] = done
            if following is not None:
                self.epochs[(commit.job_id, following["epoch"])] = following
            job.update(copy.deepcopy(commit.job_fields))
            self.commits += 1
            return True

    def record_evaluation(self, job_id: str, version: int, version_fields: Mapping[str, Any],
                          head: Head) -> bool:
        with self._lock:
            doc = self.versions.get((job_id, version))
            if doc is None:
                return False
            _check_document(f"jobs/{job_id}/versions/{version:06d}", {**doc, **version_fields})
            job = self.jobs.get(job_id)
            current = job is not None and job.get("version") == version
            head_fields = {"head": head.to_doc()}
            if current:
                _check_job_update(job_id, job, head_fields)
            doc.update(copy.deepcopy(dict(version_fields)))
            if job is None or not current:
                return False
            job.update(head_fields)
            return True

    def get_version(self, job_id: str, version: int) -> Version | None:
        with self._lock:
            stored = self.versions.get((job_id, version))
            return Version.from_doc(copy.deepcopy(stored)) if stored is not None else None

    def list_versions(self, job_id: str) -> list[Version]:
        with self._lock:
            return [Version.from_doc(copy.deepcopy(v))
                    for (j, _), v in sorted(self.versions.items()) if j == job_id]

    def get_epoch(self, job_id: str, epoch: int) -> Epoch | None:
        with self._lock:
            stored = self.epochs.get((job_id, epoch))
            return Epoch.from_doc(stored) if stored is not None else None

    def record_attempt(self, job_id: str, task_id: str, fields: Mapping[str, Any],
                       attempt_key: str) -> int:
        with self._lock:
            task = self.tasks.setdefault((job_id, task_id), {"task_id": task_id, "attempts": 0,
                                                             "attempt_keys": []})
            _check_document(f"jobs/{job_id}/tasks/{task_id}", {**task, **fields})
            keys = list(task.get("attempt_keys") or [])
            if attempt_key not in keys:
                keys.append(attempt_key)
            task.update(copy.deepcopy(dict(fields)))
            task.update(attempt_keys=keys, attempts=len(keys))
            return len(keys)

    def refund_attempt(self, job_id: str, task_id: str, attempt_key: str) -> None:
        with self._lock:
            task = self.tasks.get((job_id, task_id))
            if task is None:
                return
            keys = [k for k in task.get("attempt_keys") or [] if k != attempt_key]
            task.update(attempt_keys=keys, attempts=len(keys))

    def update_task(self, job_id: str, task_id: str, fields: Mapping[str, Any]) -> None:
        with self._lock:
            task = self.tasks.setdefault((job_id, task_id), {"task_id": task_id, "attempts": 0})
            _check_document(f"jobs/{job_id}/tasks/{task_id}", {**task, **fields})
            task.update(copy.deepcopy(dict(fields)))

    def get_task(self, job_id: str, task_id: str) -> TaskRecord | None:
        with self._lock:
            stored = self.tasks.get((job_id, task_id))
            return TaskRecord.from_doc(stored) if stored is not None else None

    def list_tasks(self, job_id: str) -> list[TaskRecord]:
        with self._lock:
            return [TaskRecord.from_doc(t) for (j, _), t in sorted(self.tasks.items())
                    if j == job_id]

    def acquire_lease(self, name: str, holder: str, seconds: float) -> bool:
        with self._lock:
            current = self.leases.get(name)
            now = time.time()
            if current is None or current[0] == holder or current[1] < now:
                self.leases[name] = (holder, now + seconds)
                return True
            return False

    def release_lease(self, name: str, holder: str) -> None:
        with self._lock:
            if self.leases.get(name, ("", 0))[0] == holder:
                del self.leases[name]

    def heartbeat(self, worker_id: str, fields: Mapping[str, Any]) -> None:
        with self._lock:
            worker = self.workers.setdefault(worker_id, {"worker_id": worker_id})
            _check_document(f"workers/{worker_id}", {**worker, **fields})
            worker.update(dict(fields))

    def list_workers(self) -> list[dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(list(self.workers.values()))

    def get_control(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return copy.deepcopy(self.controls.get(name))

    def set_control(self, name: str, fields: Mapping[str, Any]) -> None:
        with self._lock:
            control = self.controls.setdefault(name, {})
            _check_document(f"control/{name}", {**control, **fields})
            control.update(copy.deepcopy(dict(fields)))
