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

from bucketlearn import messages as wire
from bucketlearn.adapters.firestore_rules import (  # noqa: F401 - also the tests' import
    FIRESTORE_MAX_DOCUMENT_BYTES,
    check_document,
    document_size,
    firestore_size,
    nested_array,
)
from bucketlearn.adapters.memory_predictions import MemoryPredictions
from bucketlearn.domain.job import Head, Job, commit_refusal, may_start_training, unknown_fields
from bucketlearn.domain.lifecycle import TERMINAL, ended_refuses, move_refusal
from bucketlearn.domain.task import TaskRecord, attempt_keys
from bucketlearn.domain.version import Version, attach_evaluations
from bucketlearn.errors import NotFoundError, ObjectChangedError
from bucketlearn.ports import BlobInfo, Lease, VersionCommit


class MemoryBlobStore:
    """Objects in memory. A bucket named in ``versioned`` keeps every generation readable by a
    pinned read (``open_read(generation=)``) after it is replaced, as a Cloud Storage bucket with
    versioning does (Terraform's uploads bucket); in the others a replaced generation is gone."""

    write_threads = 0  # a write takes no time: a split writes its parts in its own thread

    def __init__(self, versioned: tuple[str, ...] = ()) -> None:
        self._objects: dict[tuple[str, str], tuple[bytes, BlobInfo]] = {}
        self._noncurrent: dict[tuple[str, str, int], tuple[bytes, BlobInfo]] = {}
        self.versioned = set(versioned)
        self._lock = threading.Lock()
        self._generation = 1000

    def write_bytes(self, bucket: str, name: str, data: bytes, content_type: str,
                    metadata: Mapping[str, str] | None = None) -> BlobInfo:
        with self._lock:
            self._generation += 1
            info = BlobInfo(bucket, name, len(data), self._generation, dict(metadata or {}),
                            content_type)
            replaced = self._objects.get((bucket, name))
            if replaced is not None and bucket in self.versioned:
                self._noncurrent[(bucket, name, replaced[1].generation)] = replaced
            self._objects[(bucket, name)] = (bytes(data), info)
            return info

    def write_file(self, bucket: str, name: str, path: str, content_type: str,
                   metadata: Mapping[str, str] | None = None) -> BlobInfo:
        with open(path, "rb") as handle:
            return self.write_bytes(bucket, name, handle.read(), content_type, metadata)

    def write_stream(self, bucket: str, name: str, stream: IO[bytes], content_type: str,
                     metadata: Mapping[str, str] | None = None,
                     size: int | None = None) -> BlobInfo:
        data = bytearray()
        while size is None or len(data) < size:
            chunk = stream.read(1 << 20 if size is None else min(1 << 20, size - len(data)))
            if not chunk:
                break
            data += chunk
        return self.write_bytes(bucket, name, bytes(data), content_type, metadata)

    def read_bytes(self, bucket: str, name: str) -> bytes:
        return self._data(bucket, name)

    def read_range(self, bucket: str, name: str, offset: int, length: int) -> bytes:
        return self._data(bucket, name)[offset:offset + length]

    def _data(self, bucket: str, name: str) -> bytes:
        with self._lock:
            if (bucket, name) not in self._objects:
                raise NotFoundError(f"gs://{bucket}/{name}: no such object")
            return self._objects[(bucket, name)][0]

    def open_read(self, bucket: str, name: str, generation: int | None = None,
                  start: int = 0) -> IO[bytes]:
        """A snapshot of the object from byte ``start`` (of ``generation``:
        ObjectChangedError if it is gone)."""
        stream = self._open(bucket, name, generation)
        stream.seek(start)
        return stream

    def _open(self, bucket: str, name: str, generation: int | None) -> io.BytesIO:
        with self._lock:
            found = self._objects.get((bucket, name))
            kept = self._noncurrent.get((bucket, name, generation or -1))
            if kept is not None:
                return io.BytesIO(kept[0])
            if generation is not None and (found is None or found[1].generation != generation):
                raise ObjectChangedError(bucket, name, generation,
                                         None if found is None else found[1].generation)
            if found is None:
                raise NotFoundError(f"gs://{bucket}/{name}: no such object")
            return io.BytesIO(found[0])

    def stat(self, bucket: str, name: str, generation: int | None = None) -> BlobInfo | None:
        with self._lock:
            found = self._objects.get((bucket, name))
            if generation is not None and (found is None or found[1].generation != generation):
                found = self._noncurrent.get((bucket, name, generation))
            return found[1] if found else None

    def list(self, bucket: str, prefix: str = "") -> Iterator[BlobInfo]:
        with self._lock:
            infos = sorted((info for (b, n), (_, info) in self._objects.items()
                            if b == bucket and n.startswith(prefix)), key=lambda i: i.name)
        return iter(infos)

    def compose(self, bucket: str, name: str, sources: Sequence[str], content_type: str,
                metadata: Mapping[str, str] | None = None) -> BlobInfo:
        if len(sources) > 32:
            raise ValueError(f"expected at most 32 objects to compose; found {len(sources)}")
        data = b"".join(self._data(bucket, source) for source in sources)
        return self.write_bytes(bucket, name, data, content_type, metadata)

    def delete(self, bucket: str, name: str) -> None:
        with self._lock:
            deleted = self._objects.pop((bucket, name), None)
            if deleted is not None and bucket in self.versioned:  # kept, as noncurrent
                self._noncurrent[(bucket, name, deleted[1].generation)] = deleted


class _MemoryReceived:
    def __init__(self, queue: MemoryQueue, message: Any, attempt: int, raw: bytes = b"",
                 problem: str | None = None, item: Any = None) -> None:
        self.message: Any = message
        self.item = message if item is None else item  # what was queued: redelivered as is
        self.raw = raw
        self.problem = problem
        self.delivery_attempt: int | None = attempt
        self._queue = queue

    def ack(self) -> None:
        self._queue.settled(self, acked=True)

    def nack(self) -> None:
        self._queue.settled(self, acked=False)

    def extend(self, seconds: int) -> None:
        if seconds <= 0:
            self.nack()


class MemoryQueue:
    """A FIFO of messages (task or result messages) with explicit nack/redelivery: a message
    pulled and neither acked nor nacked stays out (as an unacked message until its deadline);
    ``pull`` waits up to ``timeout`` for one.

    With ``kind`` (``TaskMessage`` or ``ResultMessage``), every message travels as the bytes
    Pub/Sub would carry and is decoded as the Pub/Sub adapter decodes it
    (``messages.decoder``), so the edge's checks run here too, and ``publish_raw`` delivers
    bytes of anyone's making.
    """

    def __init__(self, kind: type | None = None) -> None:
        self._items: deque[tuple[Any, int]] = deque()
        self._ready = threading.Condition()
        self._decode = wire.decoder(kind) if kind is not None else None
        self.published: list[Any] = []
        self.acked: list[Any] = []

    def publish(self, messages: Sequence[Any]) -> None:
        with self._ready:
            for message in messages:
                self._items.append((message, 1))
                self.published.append(message)
            self._ready.notify_all()

    def publish_raw(self, raw: bytes) -> None:
        """Deliver ``raw`` as a message's body (a queue with a ``kind`` only)."""
        if self._decode is None:
            raise TypeError("publish_raw needs a MemoryQueue made with a kind")
        with self._ready:
            self._items.append((_Raw(raw), 1))
            self._ready.notify_all()

    def redeliver(self, message: Any, attempt: int) -> None:
        with self._ready:
            self._items.append((message, attempt))
            self._ready.notify_all()

    def settled(self, received: _MemoryReceived, acked: bool) -> None:
        if acked:
            with self._ready:
                self.acked.append(received.message)
        else:
            self.redeliver(received.item, (received.delivery_attempt or 0) + 1)

    def pull(self, timeout: float) -> _MemoryReceived | None:
        with self._ready:
            if not self._items and timeout > 0:
                self._ready.wait_for(lambda: bool(self._items), timeout)
            if not self._items:
                return None
            message, attempt = self._items.popleft()
        if self._decode is None:
            return _MemoryReceived(self, message, attempt)
        raw = message.raw if isinstance(message, _Raw) else wire.encode(message)
        decoded, problem = self._decode(raw)
        return _MemoryReceived(self, decoded, attempt, raw, problem, message)

    def __len__(self) -> int:
        return len(self._items)


def _check_ids(cls: type) -> type:
    """Check the document ids of every public method taking one (``_document_ids``)."""
    for name, member in list(vars(cls).items()):
        if callable(member) and not name.startswith("_") and name not in (
                "list_jobs", "list_active_jobs", "list_workers"):
            setattr(cls, name, _document_ids(member))
    return cls


class _Raw:
    """Bytes published as they are (``MemoryQueue.publish_raw``)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw


def _check_job_update(job_id: str, stored: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
    """Refuse a job update naming a field ``Job`` does not have (stricter than Firestore, which
    stores any key: the suite's typo check, as a misspelt field would be written and never
    read), one the job's life does not allow (``lifecycle.move_refusal``), or one that would make
    the stored document one Firestore refuses."""
    unknown = unknown_fields(fields)
    if unknown:
        raise ValueError(f"jobs/{job_id}: expected fields of domain.job.Job; found {unknown}")
    refusal = move_refusal(stored, fields)
    if refusal is not None:
        raise ValueError(f"jobs/{job_id}: {refusal}")
    check_document(f"jobs/{job_id}", {**stored, **fields})


def _document_ids(method: Any) -> Any:
    """Refuse, as the Firestore client does (ValueError), a document id that holds a ``/`` (it
    would name a path, not a document), is empty, or is ``.`` or ``..``: the first argument
    (a job id, a lease or a worker's name, a commit's job) and a task's id."""
    import functools  # noqa: PLC0415

    @functools.wraps(method)
    def checked(self: Any, first: Any, *args: Any, **kwargs: Any) -> Any:
        ids = [getattr(first, "job_id", first)]
        if method.__name__ in _TASK_METHODS and args:
            ids.append(args[0])
        for value in ids:
            if not isinstance(value, str) or "/" in value or value in ("", ".", ".."):
                raise ValueError(f"{method.__name__}: {value!r} is not a document id (a "
                                 "Firestore path has an even number of elements)")
        return method(self, first, *args, **kwargs)

    return checked


_TASK_METHODS = {"read_for_attempt", "record_attempt", "refund_attempt", "update_task",
                 "get_task"}


class MemoryRegistry(MemoryPredictions):
    """The registry in memory; documents over Firestore's 1 MiB, and ids Firestore's client
    refuses, are refused as it would."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_ids(cls)

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.versions: dict[tuple[str, int], dict[str, Any]] = {}
        self.tasks: dict[tuple[str, str], dict[str, Any]] = {}
        self.leases: dict[str, tuple[str, float]] = {}
        self.workers: dict[str, dict[str, Any]] = {}
        self.controls: dict[str, dict[str, Any]] = {}
        self.predictions: dict[tuple[str, str], dict[str, Any]] = {}
        self.commits = 0

    def create_job(self, job: Job) -> bool:
        with self._lock:
            if job.job_id in self.jobs:
                return False
            doc = job.to_doc()
            check_document(f"jobs/{job.job_id}", doc)
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
            if job is None or any(job.get(k) != v for k, v in expect.items()) \
                    or ended_refuses(job, fields):
                return False  # not as expected, or ended (a conditional write never moves it)
            _check_job_update(job_id, job, fields)
            job.update(copy.deepcopy(dict(fields)))
            return True

    def list_jobs(self, limit: int = 100) -> list[Job]:
        with self._lock:
            jobs = sorted(self.jobs.values(), key=lambda j: j.get("created_at", 0), reverse=True)
            return [Job.from_doc(copy.deepcopy(doc)) for doc in jobs[:limit]]

    def list_active_jobs(self) -> list[Job]:
        with self._lock:
            return [Job.from_doc(copy.deepcopy(doc)) for doc in self.jobs.values()
                    if doc.get("status") not in TERMINAL]

    def start_training(self, job_id: str, claim: str, job_fields: Mapping[str, Any],
                       version: Version) -> bool:
        with self._lock:
            job = self.jobs.get(job_id)
            if not may_start_training(Job.from_doc(job) if job is not None else None, claim):
                return False
            version_doc = version.to_doc()
            check_document(f"jobs/{job_id}/versions/{version.version:06d}", version_doc)
            _check_job_update(job_id, job, job_fields)
            self.versions[(job_id, version.version)] = version_doc
            job.update(copy.deepcopy(dict(job_fields)))
            return True

    def commit_version(self, commit: VersionCommit) -> bool:
        with self._lock:
            job = self.jobs.get(commit.job_id)
            version = commit.version.version
            current = Job.from_doc(job) if job is not None else None
            if commit_refusal(current, (commit.job_id, version) in self.versions,
                              commit) is not None:
                return False
            assert job is not None
            version_doc = commit.version.to_doc()
            check_document(f"jobs/{commit.job_id}/versions/{version:06d}", version_doc)
            _check_job_update(commit.job_id, job, commit.job_fields)
            self.versions[(commit.job_id, version)] = version_doc
            job.update(copy.deepcopy(commit.job_fields))
            self.commits += 1
            return True

    def record_evaluation(self, job_id: str, version: int, version_fields: Mapping[str, Any],
                          head: Head | None) -> bool:
        with self._lock:
            doc = self.versions.get((job_id, version))
            if doc is None:
                return False
            check_document(f"jobs/{job_id}/versions/{version:06d}", {**doc, **version_fields})
            job = self.jobs.get(job_id)
            head_fields = {"head": head.to_doc()} if head is not None else {}
            current = (head is not None and job is not None and job.get("version") == version
                       and move_refusal(job, head_fields) is None)
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

    def list_versions(self, job_id: str, last: int | None = None) -> list[Version]:
        with self._lock:
            docs = [v for (j, _), v in sorted(self.versions.items()) if j == job_id]
            if last is not None:  # as Firestore's query: the newest ``last``, figures carried
                docs = docs[max(0, len(docs) - last):]  # by versions not read are not attached
            return attach_evaluations([Version.from_doc(copy.deepcopy(v)) for v in docs])

    def read_for_attempt(self, job_id: str, task_id: str) -> tuple[Job | None, list[str]]:
        with self._lock:
            return self.get_job(job_id), attempt_keys(self.tasks.get((job_id, task_id)) or {})

    def record_attempt(self, job_id: str, task_id: str, fields: Mapping[str, Any],
                       attempt_key: str, known_keys: Sequence[str] | None = None) -> int:
        with self._lock:
            task = self.tasks.setdefault((job_id, task_id), {"task_id": task_id})
            check_document(f"jobs/{job_id}/tasks/{task_id}", {**task, **fields})
            keys = attempt_keys(task)
            known = keys if known_keys is None else known_keys
            task.update(copy.deepcopy(dict(fields)))
            # Firestore's array union: the key once, at the end
            task["attempt_keys"] = keys + ([attempt_key] if attempt_key not in keys else [])
            return len({*known, attempt_key})

    def refund_attempt(self, job_id: str, task_id: str, attempt_key: str) -> None:
        with self._lock:
            task = self.tasks.get((job_id, task_id))
            if task is None:
                return
            task["attempt_keys"] = [k for k in attempt_keys(task) if k != attempt_key]

    def update_task(self, job_id: str, task_id: str, fields: Mapping[str, Any]) -> None:
        with self._lock:
            task = self.tasks.setdefault((job_id, task_id), {"task_id": task_id})
            check_document(f"jobs/{job_id}/tasks/{task_id}", {**task, **fields})
            task.update(copy.deepcopy(dict(fields)))

    def get_task(self, job_id: str, task_id: str) -> TaskRecord | None:
        with self._lock:
            stored = self.tasks.get((job_id, task_id))
            return TaskRecord.from_doc(stored) if stored is not None else None

    def list_tasks(self, job_id: str, epoch: int | None = None) -> list[TaskRecord]:
        with self._lock:  # a document without an epoch matches no epoch, as in Firestore
            return [TaskRecord.from_doc(t) for (j, _), t in sorted(self.tasks.items())
                    if j == job_id and (epoch is None or t.get("epoch") == epoch)]

    def acquire_lease(self, name: str, holder: str, seconds: float) -> Lease:
        with self._lock:
            current = self.leases.get(name)
            now = time.time()
            if current is None or current[0] == holder or current[1] < now:
                self.leases[name] = (holder, now + seconds)
                taken = current[0] if current is not None and current[0] != holder else None
                return Lease(True, taken)
            return Lease(False)

    def release_lease(self, name: str, holder: str) -> None:
        with self._lock:
            if self.leases.get(name, ("", 0))[0] == holder:
                del self.leases[name]

    def heartbeat(self, worker_id: str, fields: Mapping[str, Any]) -> None:
        with self._lock:
            worker = self.workers.setdefault(worker_id, {"worker_id": worker_id})
            check_document(f"workers/{worker_id}", {**worker, **fields})
            worker.update(dict(fields))

    def list_workers(self, seen_since: float | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return copy.deepcopy([w for w in self.workers.values() if seen_since is None
                                  or float(w.get("last_seen") or 0.0) >= seen_since])

    def get_control(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return copy.deepcopy(self.controls.get(name))

    def set_control(self, name: str, fields: Mapping[str, Any]) -> None:
        with self._lock:
            control = self.controls.setdefault(name, {})
            check_document(f"control/{name}", {**control, **fields})
            control.update(copy.deepcopy(dict(fields)))


_check_ids(MemoryRegistry)
