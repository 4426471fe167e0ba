"""Ports in front of the cloud services: blob storage, task queue, model registry.

Each has one Google adapter (``bucketlearn.adapters``; the same code serves the emulators) and
one in-memory implementation (``bucketlearn.adapters.memory``) for unit tests and ``train-local``.
"""

from __future__ import annotations

import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from bucketlearn import errors, layout, messages
from bucketlearn.config import Settings
from bucketlearn.domain.head import Head
from bucketlearn.domain.job import Job
from bucketlearn.domain.task import TaskRecord
from bucketlearn.domain.version import Version
from bucketlearn.prediction_ports import PREDICT_KIND, PredictionRecords, PredictPart


@dataclass(frozen=True)
class BlobInfo:
    bucket: str
    name: str
    size: int
    generation: int
    metadata: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None


class BlobStore(Protocol):
    # an adapter may say how many writes at once pay off (``write_threads``; a split writes its
    # parts on that many threads); without it, 0: one at a time in the caller's thread
    def write_bytes(self, bucket: str, name: str, data: bytes, content_type: str,
                    metadata: Mapping[str, str] | None = None) -> BlobInfo: ...

    def write_file(self, bucket: str, name: str, path: str, content_type: str,
                   metadata: Mapping[str, str] | None = None) -> BlobInfo: ...

    def write_stream(self, bucket: str, name: str, stream: IO[bytes], content_type: str,
                     metadata: Mapping[str, str] | None = None,
                     size: int | None = None) -> BlobInfo:
        """Write an object from a readable stream, read from where it stands to its end (or
        ``size`` bytes), in chunks: no second copy of the whole object in memory."""
        ...

    def read_bytes(self, bucket: str, name: str) -> bytes: ...

    def read_range(self, bucket: str, name: str, offset: int, length: int) -> bytes:
        """``length`` bytes of the object from ``offset`` (fewer where the object ends
        sooner): a packed part (``ingest.parts.read_part``)."""
        ...

    def open_read(self, bucket: str, name: str, generation: int | None = None,
                  start: int = 0) -> IO[bytes]:
        """A stream of the object's bytes from byte ``start``; with ``generation``, of that
        generation only.

        A pinned stream never yields another generation's bytes: when the object is no longer
        ``generation`` (replaced or deleted), opening it or reading it (at the latest when the
        end of the stream is reached) raises ``ObjectChangedError``.
        """
        ...

    def stat(self, bucket: str, name: str, generation: int | None = None) -> BlobInfo | None:
        """The object's metadata; with ``generation``, that generation's (a noncurrent one too,
        while a versioned bucket keeps it); None when there is none."""
        ...

    def list(self, bucket: str, prefix: str = "") -> Iterator[BlobInfo]: ...

    def delete(self, bucket: str, name: str) -> None: ...

    def compose(self, bucket: str, name: str, sources: Sequence[str], content_type: str,
                metadata: Mapping[str, str] | None = None) -> BlobInfo:
        """Write ``name`` as the objects ``sources`` (at most 32, in the same bucket) one after
        another, without moving their bytes through the caller."""
        ...


@dataclass(frozen=True)
class TaskMessage:
    """One unit of training work: one task of one round of one job.

    A task names everything its training depends on: the version it starts from (its number and
    weights object), its rows (shard parts) and the share of the job its round spans (the
    learning-rate schedule is followed over it), so the same message trains the same way on any
    worker.
    """

    job_id: str
    epoch: int
    task_index: int
    parts: tuple[str, ...]
    rows: int
    round: int = 0
    base_version: int = -1  # -1: a message without one (not trainable; acknowledged)
    weights_path: str = ""
    span: tuple[float, float] = (0.0, 0.0)
    # the digest of the base version's arrays (``codec.state_digest``): a learner that holds a
    # state of that digest (the one its last task ended with) trains from it without a download
    base_digest: str = ""
    # a searched job's segment (``usecases.search_publish``): candidate ``task_index`` trained through
    # rung ``epoch`` from ``weights_path`` (its line's state after the rung before; none: new)
    segment: bool = False

    @property
    def task_id(self) -> str:
        return layout.task_id_for(self.job_id, self.epoch, self.task_index)

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "epoch": self.epoch, "task_index": self.task_index,
                "parts": list(self.parts), "rows": self.rows, "round": self.round,
                "base_version": self.base_version, "weights_path": self.weights_path,
                "span": list(self.span), "base_digest": self.base_digest,
                **({"segment": True} if self.segment else {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskMessage:
        """A task message as published, every field checked (``bucketlearn.messages``): its
        parts and weights inside its own job's folders (kind ``predict``: a ``PredictPart``).

        Raises:
            MessageError: a field is missing or holds what it cannot.
        """
        if data.get("kind") == PREDICT_KIND:
            return PredictPart.from_dict(dict(data))  # type: ignore[return-value]
        job_id = messages.job_id(data.get("job_id"))
        parts = data.get("parts")
        if not isinstance(parts, list) or len(parts) > messages.MAX_PARTS:
            raise messages.MessageError("parts", f"a list of at most {messages.MAX_PARTS} "
                                        "part names", parts)
        own = layout.job_prefix(job_id)
        for part in parts:
            if not isinstance(part, str) or not part.startswith(own) or len(part) > 1024:
                raise messages.MessageError("parts", f"names under {own}", part)
        weights_path = messages.text(messages.get(data, "weights_path", ""), "weights_path",
                                     1024)
        if weights_path and not weights_path.startswith(f"weights/{job_id}/"):
            raise messages.MessageError("weights_path", f"a name under weights/{job_id}/",
                                        weights_path)
        return cls(job_id=job_id, epoch=messages.integer(data.get("epoch"), "epoch"),
                   task_index=messages.integer(data.get("task_index"), "task_index"),
                   parts=tuple(parts),
                   rows=messages.integer(data.get("rows"), "rows", 0, 10**12),
                   round=messages.integer(messages.get(data, "round", 0), "round"),
                   base_version=messages.integer(messages.get(data, "base_version", -1),
                                                 "base_version", -1),
                   weights_path=weights_path, span=messages.span(data.get("span")),
                   base_digest=messages.digest(data.get("base_digest"), "base_digest"),
                   segment=messages.flag(data.get("segment"), "segment"))


RESULT, FAILED, NUDGE = "result", "failed", "nudge"
SEGMENT = "segment"  # a searched job's segment trained (``usecases.search_publish``)
RESULT_KINDS = (RESULT, FAILED, NUDGE, SEGMENT)


@dataclass(frozen=True)
class ResultMessage:
    """What the aggregator hears, on the results topic: a task's result is in the deltas bucket
    (``result``), a task was given up on and its failure marker written (``failed``), or the
    watchdog asks for a fresh look at a stalled job (``nudge``).

    A learner publishes it only after the object it names is written, and acknowledges its task
    only after the publish, so a result is never announced before it exists nor lost between
    the two (a task whose result was written but not announced is trained again, and the
    watchdog's listing of the deltas bucket finds what was written). ``stats`` carries what the
    learner measured (seconds by phase, rows, loss, its usage), recorded with the version.
    """

    job_id: str
    kind: str = RESULT
    epoch: int = 0
    task_index: int = -1
    round: int = 0
    base_version: int = -1
    base_digest: str = ""
    path: str = ""
    end_digest: str = ""
    # the learner trains the next round from this result's end state (R = 1: the fold of a
    # one-task round is that state, to the bit); the aggregator does not publish that round
    chained: bool = False
    worker_id: str = ""
    reason: str = ""
    sent_at: float = 0.0
    stats: Mapping[str, Any] = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return layout.task_id_for(self.job_id, self.epoch, self.task_index)

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "kind": self.kind, "epoch": self.epoch,
                "task_index": self.task_index, "round": self.round,
                "base_version": self.base_version, "base_digest": self.base_digest,
                "path": self.path, "end_digest": self.end_digest, "chained": self.chained,
                "worker_id": self.worker_id, "reason": self.reason, "sent_at": self.sent_at,
                "stats": dict(self.stats)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResultMessage:
        """A result message as published, every field checked (``bucketlearn.messages``): a
        result's object named in its own job's epoch, its stats bounded (``messages.stats``).

        Raises:
            MessageError: a field is missing or holds what it cannot.
        """
        get = messages.get
        kind = get(data, "kind", RESULT)
        if kind not in RESULT_KINDS:
            raise messages.MessageError("kind", f"one of {', '.join(RESULT_KINDS)}", kind)
        job_id = messages.job_id(data.get("job_id"))
        epoch = messages.integer(get(data, "epoch", 0), "epoch")
        task_index = messages.integer(get(data, "task_index", -1), "task_index", -1)
        path = messages.text(get(data, "path", ""), "path", 1024)
        if path and kind == SEGMENT:
            if layout.parse_segment_path(path) != (job_id, task_index, epoch):
                raise messages.MessageError(
                    "path", f"the result of candidate {task_index}'s rung {epoch} of job "
                    f"{job_id}", path)
        elif path:
            parsed = layout.parse_delta_path(path)
            if parsed is None or (parsed.job_id, parsed.epoch, parsed.task_index) != (
                    job_id, epoch, task_index) or parsed.failed != (kind == FAILED):
                raise messages.MessageError(
                    "path", f"the {kind} object of task {task_index} of epoch {epoch} of "
                    f"job {job_id}", path)
        elif kind != NUDGE:
            raise messages.MessageError("path", f"the object of a {kind} message", path)
        return cls(job_id=job_id, kind=kind, epoch=epoch, task_index=task_index,
                   round=messages.integer(get(data, "round", 0), "round"),
                   base_version=messages.integer(get(data, "base_version", -1),
                                                 "base_version", -1),
                   base_digest=messages.digest(data.get("base_digest"), "base_digest"),
                   path=path, end_digest=messages.digest(data.get("end_digest"), "end_digest"),
                   chained=messages.flag(data.get("chained"), "chained"),
                   worker_id=messages.worker_name(data.get("worker_id")),
                   reason=messages.text(get(data, "reason", ""), "reason"),
                   sent_at=messages.number(get(data, "sent_at", 0.0), "sent_at", 0.0, 1e11),
                   stats=messages.stats(data.get("stats")))


class Received(Protocol):
    """One delivered message: its decoded body (None when it is not one of ours) and how to
    settle it. ``extend(s)``: its ack deadline ``s`` seconds from now (0: redeliver now)."""

    message: Any
    raw: bytes
    delivery_attempt: int | None

    def ack(self) -> None: ...

    def nack(self) -> None: ...

    def extend(self, seconds: int) -> None: ...


ReceivedTask = Received  # a delivered TaskMessage


class TaskQueue(Protocol):
    def publish(self, messages: Sequence[TaskMessage]) -> None: ...

    def pull(self, timeout: float) -> Received | None: ...


class ResultQueue(Protocol):
    """The results topic: learners and the watchdog publish, the aggregator pulls."""

    def publish(self, messages: Sequence[ResultMessage]) -> None: ...

    def pull(self, timeout: float) -> Received | None: ...


@dataclass
class VersionCommit:
    """Everything one new version changes, committed at once: the version's document (which
    tasks of round ``round`` of ``epoch`` it applied or gave up on) and the job's fields (its
    head, position, counters, the next round's publish record), refused by
    ``domain.job.commit_refusal`` unless the job is still at ``base_version`` and that round."""

    job_id: str
    base_version: int
    version: Version
    epoch: int
    round: int
    job_fields: dict[str, Any]
    holder: str = ""  # the committing aggregator (``Job.aggregated_by``); empty: not fenced


class JobDocuments(Protocol):
    """The jobs collection: one document per upload, its status, options, plan and head."""

    def create_job(self, job: Job) -> bool: ...

    def get_job(self, job_id: str) -> Job | None: ...

    def update_job(self, job_id: str, fields: Mapping[str, Any]) -> None: ...

    def update_job_if(self, job_id: str, expect: Mapping[str, Any],
                      fields: Mapping[str, Any]) -> bool: ...

    def list_jobs(self, limit: int = 100) -> list[Job]:
        """The newest ``limit`` jobs, newest first (for people: the dashboard, ``status``)."""
        ...

    def list_active_jobs(self) -> list[Job]:
        """Every job that has not ended (QUEUED or RUNNING), however many newer ones there are:
        what the watchdog and the autoscaler serve."""
        ...


class VersionLedger(Protocol):
    """A job's versions and epochs: what was folded, in one transaction with the job's head
    (the commit check is ``domain.job.commit_refusal``, called by every implementation)."""

    def start_training(self, job_id: str, claim: str, job_fields: Mapping[str, Any],
                       version: Version) -> bool: ...

    def commit_version(self, commit: VersionCommit) -> bool: ...

    def record_evaluation(self, job_id: str, version: int, version_fields: Mapping[str, Any],
                          head: Head | None) -> bool:
        """Write a version's figures on its document and, while the job's head is that
        version, ``head`` on the job (True then); ``head`` None: the version's document only
        (an evaluation that arrived once its job's aggregation had ended)."""
        ...

    def get_version(self, job_id: str, version: int) -> Version | None: ...

    def list_versions(self, job_id: str, last: int | None = None) -> list[Version]:
        """Every version (or only the newest ``last``), in order, with the figures later
        commits carried for them (``domain.version.attach_evaluations``, over the versions read:
        with ``last``, the oldest of them may lack figures that an older version carried)."""
        ...


class TaskLedger(Protocol):
    """A job's task documents: attempts, states and timings."""

    def read_for_attempt(self, job_id: str, task_id: str) -> tuple[Job | None, list[str]]:
        """The job and the keys of the task's attempts so far, in one read (a learner's
        admission of a task: whether to train it, and ``record_attempt``'s ``known_keys``)."""
        ...

    def record_attempt(self, job_id: str, task_id: str, fields: Mapping[str, Any],
                       attempt_key: str, known_keys: Sequence[str] | None = None) -> int:
        """Count one attempt at a task, idempotently: the same ``attempt_key`` counts once
        (a retried call after a lost answer does not spend a second attempt). Returns the
        task's attempts so far: ``known_keys`` (read just before; None: read them here) and
        this one. One write, no transaction, so the count can be off by attempts recorded or
        given back between the read and the write (two deliveries of a task at once: an ack
        deadline passed, a duplicate delivery, a chain's task republished after its grace; an
        outage's refund landing meanwhile); the record itself keeps exactly its keys, and a
        learner reads it again before it fails a task (``Learner.fail_task``)."""
        ...

    def refund_attempt(self, job_id: str, task_id: str, attempt_key: str) -> None:
        """Take back the attempt ``attempt_key`` (a backend outage was not the task's fault);
        idempotent."""
        ...

    def update_task(self, job_id: str, task_id: str, fields: Mapping[str, Any]) -> None: ...

    def get_task(self, job_id: str, task_id: str) -> TaskRecord | None: ...

    def list_tasks(self, job_id: str, epoch: int | None = None) -> list[TaskRecord]:
        """The job's task documents (with ``epoch``, only those of that epoch)."""
        ...


@dataclass(frozen=True)
class Lease:
    """The answer to ``acquire_lease``: true when granted; ``taken_over`` names the holder it
    was taken from once that holder's lease had run out (its holder died holding it)."""

    granted: bool
    taken_over: str | None = None

    def __bool__(self) -> bool:
        return self.granted


class Leases(Protocol):
    """Named leases: one aggregator per job. A holder renews its lease by acquiring it again
    before it runs out."""

    def acquire_lease(self, name: str, holder: str, seconds: float) -> Lease: ...

    def release_lease(self, name: str, holder: str) -> None: ...


class WorkerDocuments(Protocol):
    """Workers' heartbeats, and the controller's small documents (the autoscaler's state)."""

    def heartbeat(self, worker_id: str, fields: Mapping[str, Any]) -> None: ...

    def list_workers(self, seen_since: float | None = None) -> list[dict[str, Any]]:
        """The workers' heartbeat documents (only those seen at or after ``seen_since``, a
        query on ``last_seen``)."""
        ...

    def get_control(self, name: str) -> dict[str, Any] | None: ...

    def set_control(self, name: str, fields: Mapping[str, Any]) -> None: ...


class Registry(JobDocuments, VersionLedger, TaskLedger, Leases, WorkerDocuments,
               PredictionRecords, Protocol):
    """The model registry and job ledger (Firestore in the cloud): the ports above, one per
    collection, in one backend (``adapters.firestore``, and ``adapters.memory`` for tests).
    A function that needs only one collection can take that port alone."""


@dataclass
class RuntimeCache:
    """What one process keeps between its service calls (``services.caches``): a slot for each
    thing, each filled on first use. Not shared: a simulated learner gets its own, as a process.

    Attributes:
        runtimes: each job's ``services.caches.JobRuntime`` (its model, manifest, holdout and
            last state), by job id, the most recently used last (``job_runtime`` keeps at most
            ``MAX_JOBS_CACHED``).
        parts: the shard-part cache (``services.caches.PartCache``), once made.
        models_built: how many models this process has built (TensorFlow keeps some memory for
            each until the process exits: a learner hands over to a fresh process past a number).
        predictors: exported models loaded to predict with, by job (``usecases.predict_parts``).
    """

    runtimes: OrderedDict[str, Any] = field(default_factory=OrderedDict)
    parts: Any = None
    models_built: int = 0
    predictors: OrderedDict[str, Any] = field(default_factory=OrderedDict)


@dataclass
class Services:
    """Everything a service function needs; built by ``google_services`` or ``memory_services``."""

    settings: Settings
    store: BlobStore
    queue: TaskQueue  # the tasks topic
    registry: Registry
    results: ResultQueue  # the results topic (learners and the watchdog -> the aggregator)
    clock: Callable[[], float] = time.time
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    cache: RuntimeCache = field(default_factory=RuntimeCache)
    # which exceptions are worth retrying (the adapters' backends add their own)
    transient: Callable[[BaseException], bool] = errors.is_transient
    # counts what this process asks of the cloud, per job (``adapters.metered``); None: nothing
    # is counted (the in-memory services, unless a test meters them)
    meter: Any = None

    def usage(self, job_id: str) -> dict[str, float]:
        """What this process used for a job since it was last asked (and forget it)."""
        return self.meter.take(job_id) if self.meter is not None else {}
