"""What a process asks of the cloud, counted per job: the ports wrapped in meters.

Every call through a metered port is counted under the job it concerns (read from its
arguments: a job id, a ``VersionCommit``, messages, or an object name bucketlearn built from a
job id) and under what it is billed as: Firestore document reads and writes, Cloud Storage
class A operations (writes, listings) and class B operations (reads, metadata), bytes stored
and read, Pub/Sub messages and bytes. The learner sends what one task used with its result, the
aggregator adds its own and records the sum on the job with each commit (``Job.usage``), so a
job's usage costs no write of its own; ``domain.usage`` prices it.

With ``record`` the meter also keeps each call's start and end (wall clock, comparable across
the processes of one machine) and thread, and appends them every half second to
``<directory>/<process>-<pid>.jsonl``: the round-trip benchmark reads them to count the remote
calls made one after another on a round's critical path.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bucketlearn.ports import VersionCommit

_JOB_IN_NAME = re.compile(r"(?:^|/)([a-z0-9][a-z0-9-]{0,40}-[0-9a-f]{12})(?:/|$)")
NO_JOB = ""  # calls that concern no one job (heartbeats, listings of every job)


def job_of_name(name: str) -> str:
    """The job id inside an object name bucketlearn wrote (``jobs/<job>/…``, ``<job>/e…``,
    ``weights/<job>/…``), or ``NO_JOB``."""
    found = _JOB_IN_NAME.search(name)
    return found.group(1) if found else NO_JOB


@dataclass
class Call:
    """One remote call, as recorded for the round-trip benchmark."""

    kind: str
    job: str
    started: float
    ended: float
    thread: str


@dataclass
class Meter:
    """Counters per job, and (with ``record``) the calls themselves."""

    record: bool = False
    counts: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _path: Path | None = None

    def write_to(self, directory: str, process: str) -> None:
        """Append the recorded calls to ``<directory>/<process>-<pid>.jsonl`` every half
        second from a daemon thread, and at exit."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        self._path = Path(directory) / f"{process}-{os.getpid()}.jsonl"
        self.record = True

        def loop() -> None:
            while True:
                time.sleep(0.5)
                self.flush()

        threading.Thread(target=loop, name="call-log", daemon=True).start()
        atexit.register(self.flush)

    def flush(self) -> None:
        if self._path is None:
            return
        with self._lock:
            calls, self.calls = self.calls, []
        if calls:
            with open(self._path, "a", encoding="utf-8") as handle:
                handle.writelines(json.dumps(asdict(c)) + "\n" for c in calls)

    def add(self, job: str, **amounts: float) -> None:
        with self._lock:
            counter = self.counts[job]
            for key, value in amounts.items():
                counter[key] += value

    def take(self, job: str) -> dict[str, float]:
        """The job's counters since the last ``take`` (and reset them)."""
        with self._lock:
            found = self.counts.pop(job, Counter())
        return {k: round(float(v), 6) for k, v in found.items() if v}

    def peek(self, job: str) -> dict[str, float]:
        with self._lock:
            return {k: float(v) for k, v in self.counts.get(job, Counter()).items()}

    def log(self, kind: str, job: str, started: float, ended: float) -> None:
        if self.record:
            with self._lock:
                self.calls.append(Call(kind, job, started, ended,
                                       threading.current_thread().name))


def _size(data: Any) -> int:
    try:
        return len(data)
    except TypeError:
        return 0


class _Metered:
    """Forwards every attribute to ``inner``; the methods in ``table`` are counted."""

    # method -> (service, job of the call, amounts to count given its result); the call log
    # names a call ``<service>.<method>``, e.g. ``firestore.commit_version``
    table: Mapping[str, tuple[str, Callable[..., str], Callable[..., dict[str, float]]]] = {}

    def __init__(self, inner: Any, meter: Meter) -> None:
        self._inner = inner
        self._meter = meter

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        entry = self.table.get(name)
        if entry is None or not callable(target):
            return target
        service, job_of, amounts = entry
        kind = f"{service.split('.', 1)[0]}.{name}"
        meter = self._meter

        def metered(*args: Any, **kwargs: Any) -> Any:
            started = time.time()
            result = target(*args, **kwargs)
            ended = time.time()
            job = job_of(*args, **kwargs)
            if job == NO_JOB and name == "pull" and result is not None:
                job = str(getattr(getattr(result, "message", None), "job_id", "") or "")
            meter.add(job, **amounts(result, *args, **kwargs))
            meter.log(kind, job, started, ended)
            return result

        return metered


def _first(*args: Any, **_: Any) -> str:
    return str(args[0]) if args else NO_JOB


def _commit_job(commit: VersionCommit, *_: Any, **__: Any) -> str:
    return commit.job_id


def _no_job(*_: Any, **__: Any) -> str:
    return NO_JOB


def _name_job(bucket: str, name: str = "", *_: Any, **__: Any) -> str:
    return job_of_name(name)


def _messages_job(messages: Iterable[Any], *_: Any, **__: Any) -> str:
    jobs = {getattr(m, "job_id", NO_JOB) for m in messages}
    return jobs.pop() if len(jobs) == 1 else NO_JOB


def _writes(n: float, reads: float = 0.0) -> Callable[..., dict[str, float]]:
    return lambda *_, **__: {"firestore_writes": n, "firestore_reads": reads}


def _attempt_record(result: Any, *args: Any, **kwargs: Any) -> dict[str, float]:
    """An attempt's record (``record_attempt(job, task, fields, key, known_keys=None)``): one
    write, and a read of the task first without ``known_keys``."""
    known = kwargs["known_keys"] if "known_keys" in kwargs else (
        args[4] if len(args) > 4 else None)
    return {"firestore_writes": 1, "firestore_reads": 1 if known is None else 0}


def _evaluation_writes(result: Any, *args: Any, **kwargs: Any) -> dict[str, float]:
    """An evaluation's record (``record_evaluation(job, version, fields, head)``): a
    transaction reading the job and the version, writing the version and, given a head, the
    job."""
    head = args[3] if len(args) > 3 else kwargs.get("head")
    return {"firestore_writes": 1 if head is None else 2, "firestore_reads": 2}


def _reads(result: Any, *_: Any, **__: Any) -> dict[str, float]:
    """A read or a query: one read per document returned, at least one (Firestore bills a
    query that returns nothing as one read)."""
    if isinstance(result, list):
        return {"firestore_reads": max(1, len(result))}
    return {"firestore_reads": 1}


def _conditional(result: Any, *_: Any, **__: Any) -> dict[str, float]:
    return {"firestore_reads": 1, "firestore_writes": 1 if result else 0}


class MeteredRegistry(_Metered):
    """The registry, counting document reads and writes (a commit: the version's document and
    the job's; a transaction's reads too, as Firestore bills them)."""

    table = {
        "create_job": ("firestore.write", lambda job, *a, **k: job.job_id, _writes(1)),
        "get_job": ("firestore.read", _first, _reads),
        "update_job": ("firestore.write", _first, _writes(1)),
        "update_job_if": ("firestore.conditional", _first, _conditional),
        "list_jobs": ("firestore.query", _no_job, _reads),
        "list_active_jobs": ("firestore.query", _no_job, _reads),
        "start_training": ("firestore.commit", _first, _writes(2, 1)),
        "commit_version": ("firestore.commit", _commit_job, _writes(2)),
        "record_evaluation": ("firestore.commit", _first, _evaluation_writes),
        "get_version": ("firestore.read", _first, _reads),
        "list_versions": ("firestore.query", _first, _reads),
        "read_for_attempt": ("firestore.read", _first, _writes(0, 2)),
        "record_attempt": ("firestore.write", _first, _attempt_record),
        "refund_attempt": ("firestore.write", _first, _writes(1)),
        "update_task": ("firestore.write", _first, _writes(1)),
        "get_task": ("firestore.read", _first, _reads),
        "list_tasks": ("firestore.query", _first, _reads),
        "acquire_lease": ("firestore.lease", lambda name, *a, **k: name.removeprefix(
            "aggregate-"), _writes(1, 1)),
        "release_lease": ("firestore.lease", lambda name, *a, **k: name.removeprefix(
            "aggregate-"), _writes(1, 1)),
        "heartbeat": ("firestore.heartbeat", _no_job, _writes(1)),
        "list_workers": ("firestore.query", _no_job, _reads),
        "get_control": ("firestore.read", _no_job, _reads),
        "set_control": ("firestore.write", _no_job, _writes(1)),
        "create_prediction": ("firestore.write", lambda record, *a, **k: record.job_id,
                              _writes(1)),
        "update_prediction": ("firestore.conditional", _first, _conditional),
        "get_prediction": ("firestore.read", _first, _reads),
        "count_predictions": ("firestore.query", _first, lambda *a, **k: {
            "firestore_reads": 1}),
        "list_predictions": ("firestore.query", _first, _reads),
        "record_prediction_part": ("firestore.write", _first, _writes(1, 1)),
        "count_part_attempt": ("firestore.write", _first, _writes(1, 1)),
        "running_predictions": ("firestore.query", _no_job, _reads),
    }


def _read(result: Any, *_: Any, **__: Any) -> dict[str, float]:
    """A read (whole or a range): one class B operation and the bytes it returned."""
    return {"storage_class_b": 1, "storage_bytes_read": _size(result)}


class MeteredStore(_Metered):
    """The blob store, counting Cloud Storage operations by class and the bytes moved."""

    table = {
        "write_bytes": ("storage.write", _name_job,
                        lambda result, bucket, name, data, *a, **k: {
                            "storage_class_a": 1, "storage_bytes_written": _size(data)}),
        "write_file": ("storage.write", _name_job,
                       lambda result, *a, **k: {"storage_class_a": 1,
                                                "storage_bytes_written": result.size}),
        "write_stream": ("storage.write", _name_job,
                         lambda result, *a, **k: {"storage_class_a": 1,
                                                  "storage_bytes_written": result.size}),
        "read_bytes": ("storage.read", _name_job, _read),
        "read_range": ("storage.read", _name_job, _read),
        "open_read": ("storage.read", _name_job, lambda *a, **k: {"storage_class_b": 1}),
        "stat": ("storage.stat", _name_job, lambda *a, **k: {"storage_class_b": 1}),
        "list": ("storage.list", lambda bucket, prefix="", *a, **k: job_of_name(prefix),
                 lambda *a, **k: {"storage_class_a": 1}),
        "delete": ("storage.delete", _name_job, lambda *a, **k: {"storage_deletes": 1}),
        "compose": ("storage.write", _name_job, lambda *a, **k: {"storage_class_a": 1}),
    }


def _published(result: Any, messages: Iterable[Any], *_: Any, **__: Any) -> dict[str, float]:
    messages = list(messages)
    return {"pubsub_messages": len(messages),
            "pubsub_bytes": sum(len(str(m.to_dict())) for m in messages)}


def _pulled(result: Any, *_: Any, **__: Any) -> dict[str, float]:
    """A message delivered (Pub/Sub bills the bytes delivered as it bills those published)."""
    if result is None:
        return {}
    return {"pubsub_pulled": 1, "pubsub_bytes": len(getattr(result, "raw", b"") or b"")}


class MeteredQueue(_Metered):
    """A topic and its subscription, counting the messages (and their bytes) published to it
    and delivered from it. A pull is attributed to the job of the message it returned; it is
    counted as a call whether or not one came (a pull that waits is still a call)."""

    table = {"publish": ("pubsub.publish", _messages_job, _published),
             "pull": ("pubsub.pull", _no_job, _pulled)}


def metered(svc: Any, meter: Meter) -> Any:
    """The same services with their ports metered (``svc.meter`` is ``meter``)."""
    import dataclasses  # noqa: PLC0415

    return dataclasses.replace(svc, store=MeteredStore(svc.store, meter),
                               registry=MeteredRegistry(svc.registry, meter),
                               queue=MeteredQueue(svc.queue, meter),
                               results=MeteredQueue(svc.results, meter), meter=meter)
