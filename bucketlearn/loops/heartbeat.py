"""A learner's pace and what keeps it seen, off its task path.

* ``LearnerTuning``: how a learner paces itself (retries through an outage, its heartbeat, the
  chain's depth and waits), injected, so tests shorten it;
* ``Heartbeats``: the worker's heartbeat document, written from a thread of its own
  (``Reporter``) while the learner runs, in order, "stopped" last;
* ``LeaseExtender``: keeps a task message's ack deadline ahead of a long task.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from bucketlearn.ports import ReceivedTask, TaskMessage

log = logging.getLogger(__name__)

HEARTBEAT_TTL_SECONDS = 24 * 3600.0  # a heartbeat document outlives its worker's last one by


def expiry(now: float) -> datetime:
    """When a heartbeat written at ``now`` may be deleted: the ``expire_at`` timestamp the
    registry's time-to-live policy reads (Terraform's TTL on ``workers.expire_at``)."""
    return datetime.fromtimestamp(now + HEARTBEAT_TTL_SECONDS, UTC)


@dataclass(frozen=True)
class LearnerTuning:
    """How a learner paces itself; injected (``Learner(tuning=...)``), tests shorten it."""

    transient_backoff_seconds: float = 2.0
    # how long a worker keeps a task through a backend outage
    transient_retry_seconds: float = 300.0
    heartbeat_seconds: float = 10.0  # the current state is written again this often
    report_min_seconds: float = 1.0  # a state change is written within this
    reporter_join_seconds: float = 5.0
    # How long the final heartbeat ("stopped") waits for a write still in flight (each write is
    # bounded by the registry's own timeout, 30 s for Firestore).
    heartbeat_write_wait_seconds: float = 60.0
    # Chaining (R = 1): a chained task's result is announced once the aggregator has committed
    # the version ``chain_depth - 1`` before its base; the learner waits up to
    # ``chain_confirm_seconds`` (at most the deployment's ``chain_grace_seconds``) for that,
    # reading the job every ``chain_poll_seconds``. Depth 4 rather than 2: a task may train in
    # less than a version's commit path (result write, delivery, read, fold, write, commit),
    # and at depth 2 the learner would wait for every commit. A chain that breaks retrains at
    # most that many tasks.
    chain_depth: int = 4
    chain_confirm_seconds: float = 30.0
    chain_poll_seconds: float = 0.01


class LeaseExtender:
    """Keeps a message's ack deadline ahead of a long task."""

    def __init__(self, received: ReceivedTask, deadline: int) -> None:
        self.received, self.deadline = received, deadline
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.deadline / 2):
            try:
                self.received.extend(self.deadline)
            except Exception:  # noqa: BLE001 - a missed extension means a redelivery, not a loss
                log.warning("could not extend the ack deadline", exc_info=True)

    def __enter__(self) -> LeaseExtender:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


class Reporter:
    """Writes a worker's heartbeat off the task path, from a thread of its own.

    A task lasts tenths of a second; writing "busy" and "idle" around each one put two Firestore
    writes on every task's critical path. Here a state change is written within
    ``report_min_seconds`` (when several happen in that time, the latest wins), and the current
    state is written again every ``heartbeat_seconds`` so the worker shows as alive.
    """

    def __init__(self, write: Callable[[str, TaskMessage | None], None],
                 tuning: LearnerTuning = LearnerTuning()) -> None:
        self.write = write
        self.tuning = tuning
        self.state: tuple[str, TaskMessage | None] = ("idle", None)
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def set(self, state: str, task: TaskMessage | None) -> None:
        with self.lock:
            self.state = (state, task)
        self.changed.set()

    def _run(self) -> None:
        while not self.closing.is_set():
            self.changed.wait(self.tuning.heartbeat_seconds)
            if self.closing.wait(self.tuning.report_min_seconds):
                return
            self.changed.clear()
            with self.lock:
                state, task = self.state
            self.write(state, task)

    def __enter__(self) -> Reporter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.changed.set()  # wake the thread; it sees ``closing`` and ends without writing
        self.thread.join(timeout=self.tuning.reporter_join_seconds)


class Heartbeats:
    """One worker's heartbeat document: ``send`` writes it (the learner's state, its task and
    figures); ``set`` says what the worker is doing now; ``reporting`` frames a run ("idle" at
    its start, the reporter thread while it runs, "stopped" at its end)."""

    def __init__(self, send: Callable[[str, TaskMessage | None], None],
                 tuning: LearnerTuning) -> None:
        self.send = send
        self.tuning = tuning
        self._reporter: Reporter | None = None  # while ``run`` runs; else heartbeats are written
        self._lock = threading.Lock()  # one heartbeat write at a time, in order
        self._closed = threading.Event()  # "stopped" is written: nothing lands after

    def set(self, state: str, task: TaskMessage | None = None) -> None:
        """Say what this worker is doing: through the reporter thread while ``run`` runs (the
        dashboard sees it within a second), else written at once."""
        if self._reporter is not None:
            self._reporter.set(state, task)
        else:
            self.write(state, task)

    def write(self, state: str, task: TaskMessage | None, final: bool = False) -> None:
        """Write the heartbeat document. Writes go one at a time, in order; the ``final`` one
        ("stopped") closes the series: it waits for a write in flight (the reporter's, which
        ``run`` may have stopped waiting for) and no write can land after it."""
        if final:
            self._closed.set()  # a reporter write not yet started will not start
        wait = self.tuning.heartbeat_write_wait_seconds
        locked = self._lock.acquire(timeout=wait)
        if not locked:
            log.warning("a heartbeat write is still in flight after %.0f s; %s",
                        wait,
                        "writing 'stopped' anyway" if final else "skipping this one")
            if not final:
                return
        try:
            if self._closed.is_set() and not final:
                return
            self.send(state, task)
        except Exception:  # noqa: BLE001 - heartbeats are advisory
            log.warning("heartbeat failed", exc_info=True)
        finally:
            if locked:
                self._lock.release()

    @contextmanager
    def reporting(self) -> Iterator[None]:
        """A run: "idle" written at once, state changes through the reporter thread, "stopped"
        written last."""
        self._closed.clear()
        self.write("idle", None)
        try:
            with Reporter(self.write, self.tuning) as self._reporter:
                yield
        finally:
            self._reporter = None
            self.write("stopped", None, final=True)
