"""A job's results, read and checked: this is where a result is applied or refused.

A learner's result object (the state its task ended with: ``learn``) is read and decoded on
reader threads (``ResultReader``), ahead of its round's fold as its message comes, or at the
fold. When the round is complete (``domain.rounds.sort_round``), ``ResultReader.read_round``
decides, for each of its results, one of:

* **stale** (garbage: deleted, no refusal counted): it was trained from another state than
  the job's head (a chain that broke); it is never folded;
* **refused** (``RoundRead.refused``, with the reason ``check_result`` gives): its object is gone or
  unreadable, its arrays are not the model's shapes, or ``domain.fold.check_delta`` finds it not
  finite or an outlier; it is never folded, its task trains again or fails for good
  (``domain.fold.count_refusals``: refused ``MAX_REFUSALS`` times in an epoch);
* **applied** (``RoundRead.results``): every other result; the round folds them into its version.

A failure marker (a task given up on) is read for its reason. The deltas bucket's listing
(``list_deltas``) is the aggregator's backstop for results whose messages were lost; results of
a folded round, refused and stale ones are deleted (``delete_all``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from typing import Any

from bucketlearn import codec, layout
from bucketlearn.codec import CorruptObjectError
from bucketlearn.domain import fold
from bucketlearn.domain.job import Job
from bucketlearn.domain.rounds import DeltaRef, RoundObjects
from bucketlearn.domain.task import FailureMarker
from bucketlearn.errors import NotFoundError
from bucketlearn.ports import Received, ResultMessage, Services
from bucketlearn.services.task_messages import task_doc_id

log = logging.getLogger(__name__)

READERS = 8  # result objects of a round read at once
PREFETCH_LIMIT = 64  # result objects read ahead of their round's fold, at most


@dataclass
class HeardResult:
    """A result object or failure marker the aggregator knows of: from its message (which is
    acknowledged once the result is folded or found to be garbage) or from a listing."""

    ref: DeltaRef
    epoch: int
    message: ResultMessage | None = None
    received: Received | None = None
    heard_at: float | None = None  # wall clock, when its message was handed to this job


@dataclass
class RoundRead:
    """A complete round's objects, read and checked."""

    results: list[fold.TaskResult] = field(default_factory=list)
    failures: list[FailureMarker] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    stale: list[DeltaRef] = field(default_factory=list)
    folded: list[DeltaRef] = field(default_factory=list)
    messages: dict[int, ResultMessage] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadedResult:
    """A result object as read: what its bytes decode to (the arrays, optimizer state and
    metadata, or the reason they could not be decoded; None when it was gone), and the keys of
    the attempts its task's record counts (the object's nonce must be one of them; None when
    they could not be read in time)."""

    decoded: tuple[list[Any], list[Any], dict[str, Any]] | str | None  # str: why it is not
    attempt_keys: frozenset[str] | None = None

    @property
    def gone(self) -> bool:
        return self.decoded is None


class ResultReader:
    """One job's result objects, read on reader threads (``READERS`` at a time): ahead of their
    round's fold as their messages come (``prefetch``), and at the fold (``read_round``).

    A read takes at most ``max_bytes`` of an object (the job's state and a header: a result
    larger than that is refused unread) and gives up after ``read_seconds`` (the fold's
    deadline: a result not read by then is refused, its task trains again).
    """

    def __init__(self, svc: Services, max_bytes: int | None = None) -> None:
        self.svc = svc
        self.max_bytes = max_bytes
        self.read_seconds = svc.settings.result_read_seconds
        self._readers: ThreadPoolExecutor | None = None
        self._records: ThreadPoolExecutor | None = None
        # result objects read (and decoded) as their messages come, before the round is complete
        self.prefetched: dict[str, Future[LoadedResult]] = {}

    def follow(self, job: Job | None) -> None:
        """Bound reads by ``job``'s model (``result_bytes_bound``), as it is now known."""
        self.max_bytes = result_bytes_bound(job)

    def prefetch(self, name: str) -> None:
        """Read and decode a result object now, while the rest of its round trains: the fold
        of a complete round then waits only for its last result's read (a round of R tasks
        read its R objects after the last one came)."""
        if name in self.prefetched or len(self.prefetched) >= PREFETCH_LIMIT:
            return
        self.prefetched[name] = self.pool().submit(self._load, name)

    def pool(self) -> ThreadPoolExecutor:
        if self._readers is None:
            self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="read-results")
        return self._readers

    def _load(self, name: str) -> LoadedResult:
        """The object's bytes decoded, and its task's attempt keys (read beside it)."""
        if self._records is None:
            self._records = ThreadPoolExecutor(READERS, thread_name_prefix="read-attempts")
        keys = self._records.submit(self._attempt_keys, name)
        raw = self.read_object(name)
        decoded = None if raw is None else decode_result(raw, name, self.max_bytes)
        return LoadedResult(decoded, keys.result(timeout=self.read_seconds))

    def _attempt_keys(self, name: str) -> frozenset[str]:
        parsed = layout.parse_delta_path(name)
        if parsed is None or parsed.failed:
            return frozenset()
        record = self.svc.registry.get_task(
            parsed.job_id, task_doc_id(parsed.job_id, parsed.epoch, parsed.task_index))
        return frozenset(record.keys) if record is not None else frozenset()

    def loaded(self, name: str) -> Future[LoadedResult]:
        """A result object's read: the one under way since its message came, or a new one
        (also when that one failed: storage may be back)."""
        reading = self.prefetched.pop(name, None)
        if reading is not None and not (reading.done() and reading.exception() is not None):
            return reading
        return self.pool().submit(self._load, name)

    def forget(self, name: str) -> None:
        """Drop an object's read ahead (its result is folded or garbage)."""
        reading = self.prefetched.pop(name, None)
        if reading is not None:
            reading.cancel()

    def read_object(self, name: str) -> bytes | None:
        """The object's bytes (its first ``max_bytes`` + 1 at most); None when it is gone."""
        bucket = self.svc.settings.deltas_bucket
        try:
            if self.max_bytes is None:
                return self.svc.store.read_bytes(bucket, name)
            return self.svc.store.read_range(bucket, name, 0, self.max_bytes + 1)
        except NotFoundError:
            return None

    def _wait(self, reading: Future[LoadedResult], name: str, deadline: float) -> LoadedResult:
        """A read's outcome by the fold's ``deadline``; past it, a result that could not be
        read (refused: its task trains again), and the read is abandoned."""
        try:
            return reading.result(timeout=max(0.0, deadline - time.monotonic()))
        except FuturesTimeout:
            reading.cancel()
            return LoadedResult(f"unreadable: gs://…/{name} was not read and checked within "
                          f"{self.read_seconds:.0f} s")

    def read_round(self, job: Job, objects: RoundObjects, base: list[Any], base_optimizer: list[Any],
                   heard: dict[str, HeardResult],
                   applied: Callable[[ResultMessage | None], None]) -> RoundRead:
        """Read and check every result of a complete round (``READERS`` at a time); read its
        failure markers. ``applied`` is told of each result's message as it is applied."""
        read = RoundRead()
        shapes = [tuple(b.shape) for b in base]
        optimizer_shapes = [tuple(o.shape) for o in base_optimizer]
        recent = job.delta_norm
        head = job.head
        assert head is not None
        items = sorted(objects.results.items())
        reads = [self.loaded(ref.name) for _, ref in items]
        deadline = time.monotonic() + self.read_seconds
        for (task_index, ref), reading in zip(items, reads, strict=True):
            loaded = self._wait(reading, ref.name, deadline)
            known = heard.get(ref.name)
            message = known.message if known is not None else None
            if message is not None:
                read.messages[task_index] = message
            unrecorded = _unrecorded(loaded, ref.name)
            if unrecorded is not None:  # not an attempt the registry knows: never folded
                log.warning("job %s: %s", job.job_id, unrecorded)
                read.stale.append(ref)
                continue
            problem, result, meta = check_result(loaded, ref.name, base, shapes,
                                                 optimizer_shapes, recent)
            based_on = (message.base_digest if message is not None else "") or str(
                meta.get("base_digest") or "")
            if result is not None and head.digest and based_on != head.digest:
                read.stale.append(ref)  # trained from another state (a broken chain): garbage
                continue
            if problem is None:
                assert result is not None
                read.results.append(result)
                read.stats[layout.task_id_for(job.job_id, job.epoch, task_index)] = task_stats(
                    message, meta, known.heard_at if known is not None else None)
                applied(message)
            else:
                read.refused[task_index] = problem
            read.folded.append(ref)
        for task_index, ref in sorted(objects.failures.items()):
            try:
                marker = FailureMarker.from_doc(json.loads(self.read_object(ref.name) or b"{}"),
                                                task_index)
            except Exception:  # noqa: BLE001 - the marker's existence is what counts
                marker = FailureMarker(task_index)
            read.failures.append(marker)
            read.folded.append(ref)
        return read


def decode_result(raw: bytes, name: str, max_bytes: int | None = None
                  ) -> tuple[list[Any], list[Any], dict[str, Any]] | str:
    """A result object's arrays, optimizer state and metadata, or why they cannot be had (more
    than ``max_bytes`` bytes, a header over ``codec.RESULT_HEADER_BYTES``, not our format)."""
    if max_bytes is not None and len(raw) > max_bytes:
        return (f"unreadable: gs://…/{name} holds more than {max_bytes} bytes, more than the "
                "job's training state")
    try:
        arrays, optimizer, meta = codec.decode_state(raw, name, codec.RESULT_HEADER_BYTES)
    except CorruptObjectError as exc:
        return f"unreadable: {exc}"
    except ValueError as exc:
        return str(exc)
    return list(arrays), list(optimizer), dict(meta)


def result_bytes_bound(job: Job | None) -> int | None:
    """The most bytes a result of ``job`` may hold: its model's weights and optimizer state
    (4 bytes a number, three numbers a parameter under Adam; 16 allowed) and a header; None
    when the job records no parameter count (not split yet)."""
    model = ((job.forecast if job is not None else None) or {}).get("model") or {}
    parameters = model.get("parameters")
    if not isinstance(parameters, (int, float)) or parameters <= 0:
        return None
    return 16 * int(parameters) + codec.RESULT_HEADER_BYTES


def _unrecorded(loaded: LoadedResult, name: str) -> str | None:
    """Why a result object is no attempt's the registry recorded (None: it is): its nonce,
    the attempt's key, is not among its task's."""
    parsed = layout.parse_delta_path(name)
    if parsed is None or loaded.attempt_keys is None or parsed.nonce in loaded.attempt_keys:
        return None
    return (f"ignoring {name}: its task's record holds no attempt {parsed.nonce} (not a "
            "learner's result)")


def check_result(loaded: LoadedResult, name: str, base: list[Any], shapes: list[Any],
                 optimizer_shapes: list[Any], recent: float | None
                 ) -> tuple[str | None, fold.TaskResult | None, dict[str, Any]]:
    """Check one decoded result object and say why it must not be folded (None: fold it)."""
    decoded = loaded.decoded
    if decoded is None:
        return f"unreadable: gs://…/{name} is gone", None, {}
    if isinstance(decoded, str):
        return decoded, None, {}
    arrays, optimizer, meta = decoded
    try:
        delta = fold.task_delta(arrays, base, meta.get("content"))
        task_index = int(meta.get("task_index", -1))
        result = fold.TaskResult(task_index, delta, optimizer, _int(meta.get("examples"), 0),
                                 _float(meta.get("train_loss")))
    except ValueError as exc:  # end weights of the wrong shapes (task_delta)
        return str(exc), None, {}
    parsed = layout.parse_delta_path(name)
    if parsed is not None:
        result = fold.TaskResult(parsed.task_index, result.delta, result.optimizer,
                                 result.examples, result.train_loss)
    problem = fold.check_delta(result, shapes, optimizer_shapes, recent)
    return problem, result, meta


def task_stats(message: ResultMessage | None, meta: dict[str, Any],
               heard_at: float | None) -> dict[str, Any]:
    """What the version records of one folded task: who trained it, how long each phase took,
    and when its result was sent and heard (from its message; a result found by listing has only
    its object's metadata)."""
    stats = dict(message.stats) if message is not None else {}
    keep = ("fetch_seconds", "train_seconds", "write_seconds", "cpu_seconds", "finished_at",
            "train_started_at", "train_ended_at")
    return {"worker_id": (message.worker_id if message is not None else None)
            or meta.get("worker_id"), "chained": bool(message and message.chained),
            "sent_at": message.sent_at if message is not None else None, "heard_at": heard_at,
            "task_index": int(meta.get("task_index", -1)),
            **{k: stats[k] for k in keep if k in stats}}


def list_deltas(svc: Services, job_id: str, epoch: int) -> list[DeltaRef]:
    """The result objects and failure markers of one job's epoch, as listed in the deltas
    bucket."""
    refs = []
    for info in svc.store.list(svc.settings.deltas_bucket, layout.epoch_delta_prefix(job_id, epoch)):
        parsed = layout.parse_delta_path(info.name)
        if parsed is None or parsed.job_id != job_id:
            continue
        refs.append(DeltaRef(info.name, parsed.task_index, parsed.failed))
    return refs


def delete_all(svc: Services, names: list[str]) -> None:
    for name in names:
        _delete(svc, name)


def _delete(svc: Services, name: str) -> None:
    try:
        svc.store.delete(svc.settings.deltas_bucket, name)
    except Exception:  # noqa: BLE001 - leftover objects are ignored and expire by lifecycle
        log.debug("could not delete %s", name, exc_info=True)


def _int(value: Any, default: int) -> int:
    try:
        return default if value is None else int(value)
    except (TypeError, ValueError):
        return default


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
