"""The learner: pull one task, train it from the version it names, write its result, then ack.

A task message names the version it trains from (the head when its round was published), its
rows and its learning rate, so there is nothing to wait for and nothing to decide: the worker
loads that version's weights and optimizer state, trains, and writes the weights and optimizer
state it ended with (the aggregator takes the delta against that version, exactly: domain.fold).
Only the current round's tasks are ever published, so a worker never trains from a stale version.

Delivery is at least once, so a task may be trained twice; the aggregator applies it once.
Attempts are counted in Firestore (the Pub/Sub emulator has no dead-lettering): after
``max_task_attempts`` the task is marked FAILED, a failure marker is written to the deltas
bucket (so the aggregator hears of it) and the message is acked.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bucketlearn import codec, layout
from bucketlearn.bootstrap import Services
from bucketlearn.domain import task as attempt
from bucketlearn.domain.fold import WEIGHTS
from bucketlearn.domain.job import Job
from bucketlearn.domain.plan import class_weights, step_rates
from bucketlearn.errors import NotFoundError, PermanentError
from bucketlearn.ingest.split import load_parts
from bucketlearn.ml.training import train_task
from bucketlearn.ports import ReceivedTask, TaskMessage
from bucketlearn.services import jobs
from bucketlearn.services.recycle import LEARNER_CHILD_ENV, RECYCLE_EXIT
from bucketlearn.services.runtime import job_runtime, models_built

log = logging.getLogger(__name__)


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


def skip_reason(job: Job | None, task: TaskMessage) -> str | None:
    """Why a delivered task needs no training (None: train it).

    The job is gone or has ended; the message predates rounds (no base version); or the job has
    moved past the task's round (its version is newer than the task's base: the round was folded,
    so this task was applied or failed for good).
    """
    if job is None:
        return "the job is gone"
    if jobs.is_terminal(job):
        return f"the job is {job.status}"
    if task.base_version < 0 or not task.weights_path:
        return "the message names no version to train from"
    if (job.version or 0) > task.base_version:
        return f"its round was folded (the job is at v{job.version})"
    return None


class Decision(enum.Enum):
    ACK = "ack"
    NACK = "nack"


class _LeaseExtender:
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

    def __enter__(self) -> _LeaseExtender:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


class _Reporter:
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

    def __enter__(self) -> _Reporter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.changed.set()  # wake the thread; it sees ``closing`` and ends without writing
        self.thread.join(timeout=self.tuning.reporter_join_seconds)


class Learner:
    def __init__(self, svc: Services, worker_id: str | None = None,
                 stop: threading.Event | None = None, max_models: int = 0,
                 tuning: LearnerTuning = LearnerTuning()) -> None:
        self.svc = svc
        self.tuning = tuning
        # Once this process has built this many models (``runtime.models_built``: one per job,
        # again if the job left the runtime cache), ``run`` returns between tasks with
        # ``recycle`` set: the process is to be replaced (bucketlearn.entrypoints.worker; 0:
        # never)
        self.max_models = max_models
        self.recycle = False
        self.worker_id = worker_id or svc.settings.worker_id or svc.identity
        self.tasks_done = 0
        self.started_at = svc.clock()
        self.stop = stop or threading.Event()
        self._reporter: _Reporter | None = None  # while ``run`` runs; else heartbeats are written
        self._owed_refunds: list[tuple[str, str, str]] = []  # (job, task doc, attempt key)
        self._heartbeat_lock = threading.Lock()  # one heartbeat write at a time, in order
        self._heartbeats_closed = threading.Event()  # "stopped" is written: nothing lands after

    def heartbeat(self, state: str, task: TaskMessage | None = None) -> None:
        """Say what this worker is doing: through the reporter thread while ``run`` runs (the
        dashboard sees it within a second), else written at once."""
        if self._reporter is not None:
            self._reporter.set(state, task)
        else:
            self._write_heartbeat(state, task)

    def _write_heartbeat(self, state: str, task: TaskMessage | None,
                         final: bool = False) -> None:
        """Write the heartbeat document. Writes go one at a time, in order; the ``final`` one
        ("stopped") closes the series: it waits for a write in flight (the reporter's, which
        ``run`` may have stopped waiting for) and no write can land after it."""
        if final:
            self._heartbeats_closed.set()  # a reporter write not yet started will not start
        wait = self.tuning.heartbeat_write_wait_seconds
        locked = self._heartbeat_lock.acquire(timeout=wait)
        if not locked:
            log.warning("a heartbeat write is still in flight after %.0f s; %s",
                        wait,
                        "writing 'stopped' anyway" if final else "skipping this one")
            if not final:
                return
        try:
            if self._heartbeats_closed.is_set() and not final:
                return
            self.svc.registry.heartbeat(self.worker_id, {
                "worker_id": self.worker_id, "state": state, "last_seen": self.svc.clock(),
                "job_id": task.job_id if task else None,
                "task_id": task.task_id if task else None,
                "tasks_done": self.tasks_done, "started_at": self.started_at,
            })
        except Exception:  # noqa: BLE001 - heartbeats are advisory
            log.warning("heartbeat failed", exc_info=True)
        finally:
            if locked:
                self._heartbeat_lock.release()

    def handle(self, received: ReceivedTask) -> Decision:
        """Process one delivered task; return whether to ack or nack it."""
        pulled_at = self.svc.clock()
        if received.message is None:
            log.error("dropping a task message that is not valid JSON: %r", received.raw[:200])
            return Decision.ACK
        task = received.message
        with _LeaseExtender(received, self.svc.settings.ack_deadline_seconds):
            return self.process(task, pulled_at, received.delivery_attempt)

    def process(self, task: TaskMessage, pulled_at: float | None = None,
                delivery_attempt: int | None = None) -> Decision:
        """Train one task (``pulled_at``: when its message arrived, recorded with the attempt).

        Attempts are counted once per delivery, idempotently (an attempt key per delivery), and
        only for failures that are the task's: through a backend outage the worker keeps the
        message and retries for up to ``tuning.transient_retry_seconds`` (every nack would count
        as a Pub/Sub delivery towards dead-lettering), and an attempt it could not give back during
        the outage is given back later (``_settle_refunds``).
        """
        svc, registry = self.svc, self.svc.registry
        self._settle_refunds()
        job = registry.get_job(task.job_id)
        skip = skip_reason(job, task)
        if skip is not None:
            log.info("task %s: %s; nothing to do", task.task_id, skip)
            return Decision.ACK
        assert job is not None
        if task.task_index in jobs.done_tasks(registry.get_epoch(task.job_id, task.epoch)):
            return Decision.ACK  # a duplicate delivery of a task already applied
        if self.stop.is_set():
            return Decision.NACK  # shutting down: let another worker have it
        doc_id = jobs.task_doc_id(task.job_id, task.epoch, task.task_index)
        now = svc.clock()
        key = layout.new_nonce()
        fields = attempt.started(task.task_id, task.epoch, task.task_index, task.round,
                                 task.rows, self.worker_id, now, pulled_at, delivery_attempt)
        attempts = self._with_retries(
            lambda: registry.record_attempt(task.job_id, doc_id, fields, key),
            on_give_up=lambda: self._owe_refund(task.job_id, doc_id, key))
        if attempts > svc.settings.max_task_attempts:
            self.fail_task(task, doc_id, attempts - 1)
            return Decision.ACK
        self.heartbeat("busy", task)
        try:
            timings = self._with_retries(lambda: self.train(task, job))
        except Exception as exc:  # noqa: BLE001 - every failure is retried
            return self._failed(task, doc_id, key, attempts, exc)
        self.tasks_done += 1
        registry.update_task(task.job_id, doc_id, attempt.trained(svc.clock(), timings))
        self.heartbeat("idle")
        return Decision.ACK

    def _with_retries(self, call: Callable[[], Any],
                      on_give_up: Callable[[], None] | None = None) -> Any:
        """``call()``, retried through transient failures (a backend outage) with backoff for up
        to ``tuning.transient_retry_seconds``, while this worker keeps the task's message."""
        deadline = time.monotonic() + self.tuning.transient_retry_seconds
        pause = self.tuning.transient_backoff_seconds
        while True:
            try:
                return call()
            except Exception as exc:
                if not self.svc.transient(exc) or self.stop.is_set() or time.monotonic() >= deadline:
                    if on_give_up is not None and self.svc.transient(exc):
                        on_give_up()
                    raise
                log.warning("transient failure (%s); retrying in %.1f s", exc, pause)
                if self.stop.wait(pause):
                    raise
                pause = min(pause * 2, 30.0)

    def _failed(self, task: TaskMessage, doc_id: str, key: str, attempts: int,
                exc: Exception) -> Decision:
        """Record a failed attempt (given back when the failure was transient); nack."""
        transient = self.svc.transient(exc)
        log.warning("task %s attempt %d failed (%s): %s", task.task_id, attempts,
                    "transient" if transient else "counted", exc,
                    exc_info=not isinstance(exc, (PermanentError, NotFoundError, OSError)))
        if transient:  # a backend outage is not the task's fault: give the attempt back
            self._owe_refund(task.job_id, doc_id, key)
            self._settle_refunds()
        try:
            self.svc.registry.update_task(task.job_id, doc_id, attempt.retrying(
                f"{type(exc).__name__}: {exc}", self.svc.clock()))
        except Exception:  # noqa: BLE001 - the registry may be the backend that is down
            log.warning("could not record the failure of %s", task.task_id)
        return Decision.NACK

    def _owe_refund(self, job_id: str, doc_id: str, key: str) -> None:
        self._owed_refunds.append((job_id, doc_id, key))

    def _settle_refunds(self) -> None:
        """Give back the attempts owed (those a backend outage kept this worker from giving back
        when it happened); what still cannot be given back stays owed."""
        owed, self._owed_refunds = self._owed_refunds, []
        for job_id, doc_id, key in owed:
            try:
                self.svc.registry.refund_attempt(job_id, doc_id, key)
            except Exception:  # noqa: BLE001 - still down: try again with the next task
                self._owed_refunds.append((job_id, doc_id, key))

    def train(self, task: TaskMessage, job: Job) -> dict[str, Any]:
        """Train the task from the version it names and write its result; return timings."""
        svc = self.svc
        t0 = time.perf_counter()
        runtime = job_runtime(svc, job)
        base, optimizer = runtime.state(task.weights_path)
        x, y = load_parts(svc.store, svc.settings.work_bucket, list(task.parts))
        t1 = time.perf_counter()
        options = job.options
        batch_size = int(options["batch_size"])
        rates = step_rates(float(options["learning_rate"]),
                           str(options.get("lr_schedule", "constant")), task.span,
                           math.ceil(len(y) / batch_size))
        weights = class_weights(str(options.get("class_weight", "none")),
                                runtime.manifest.train_counts)
        result = train_task(runtime.model, base, optimizer, x, y, batch_size, rates,
                            int(options["seed"]), task.epoch, task.task_index, weights)
        t2 = time.perf_counter()
        meta = {"job_id": task.job_id, "task_id": task.task_id, "epoch": task.epoch,
                "task_index": task.task_index, "round": task.round,
                "base_version": task.base_version, "examples": result.examples,
                "train_loss": result.train_loss, "worker_id": self.worker_id,
                "content": WEIGHTS}  # the aggregator takes the delta, exactly (domain.fold)
        data = codec.encode_state(result.weights, result.optimizer, meta)
        path = layout.delta_path(task.job_id, task.epoch, task.task_index, layout.new_nonce())
        svc.store.write_bytes(svc.settings.deltas_bucket, path, data, "application/octet-stream",
                              metadata={k: str(v) for k, v in meta.items()})
        t3 = time.perf_counter()
        return {"fetch_seconds": t1 - t0, "train_seconds": t2 - t1, "write_seconds": t3 - t2,
                "base_version": task.base_version, "train_loss": result.train_loss,
                "delta_path": path}

    def fail_task(self, task: TaskMessage, doc_id: str, attempts: int) -> None:
        """Give up on a task: mark it FAILED and tell the aggregator with a failure marker."""
        svc = self.svc
        previous = svc.registry.get_task(task.job_id, doc_id)
        error = (previous.error if previous is not None else None) or "unknown error"
        reason = f"task {task.task_id} failed after {attempts} attempts: {error}"
        marker = {"job_id": task.job_id, "task_id": task.task_id, "epoch": task.epoch,
                  "task_index": task.task_index, "attempts": attempts, "error": reason}
        path = layout.failure_marker_path(task.job_id, task.epoch, task.task_index,
                                          layout.new_nonce())
        svc.store.write_bytes(svc.settings.deltas_bucket, path, json.dumps(marker).encode(),
                              "application/json", metadata={"failed": "true"})
        svc.registry.update_task(task.job_id, doc_id, attempt.failed(error, svc.clock()))
        log.error("%s", reason)

    def run(self, stop: threading.Event, max_tasks: int | None = None,
            pull_timeout: float = 10.0) -> int:
        """Pull and process tasks until ``stop`` is set (or ``max_tasks`` are done)."""
        self.stop = stop
        self._heartbeats_closed.clear()
        self._write_heartbeat("idle", None)
        try:
            with _Reporter(self._write_heartbeat, self.tuning) as self._reporter:
                return self._loop(stop, max_tasks, pull_timeout)
        finally:
            self._reporter = None
            self._write_heartbeat("stopped", None, final=True)

    def _loop(self, stop: threading.Event, max_tasks: int | None, pull_timeout: float) -> int:
        handled = 0
        while not stop.is_set() and (max_tasks is None or handled < max_tasks):
            try:
                received = self.svc.queue.pull(timeout=pull_timeout)
            except Exception:  # noqa: BLE001 - the queue may be briefly unavailable
                log.warning("pull failed; retrying", exc_info=True)
                stop.wait(2.0)
                continue
            if received is None:
                continue
            try:
                decision = self.handle(received)
            except Exception:  # noqa: BLE001 - backend trouble: let the message come back
                log.error("task handling failed:\n%s", traceback.format_exc())
                decision = Decision.NACK
            try:
                received.ack() if decision is Decision.ACK else received.nack()
            except Exception:  # noqa: BLE001 - an unacked message is redelivered: no loss
                log.warning("ack/nack failed", exc_info=True)
            handled += 1
            if self.max_models and models_built(self.svc) >= self.max_models:
                log.info("built %d models: handing over to a fresh process (TensorFlow frees a "
                         "model's memory only at exit)", models_built(self.svc))
                self.recycle = True
                break
        return handled


def main() -> None:
    """The learner process (started by ``bucketlearn.entrypoints.worker``, which replaces it
    when it exits with ``RECYCLE_EXIT``)."""
    from bucketlearn.bootstrap import process_services  # noqa: PLC0415
    from bucketlearn.logs import setup_logging  # noqa: PLC0415

    svc = process_services()
    setup_logging(svc.settings.log_format)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # recycling needs the parent that starts a fresh process (bucketlearn.entrypoints.worker)
    max_models = svc.settings.worker_max_models if os.environ.get(LEARNER_CHILD_ENV) else 0
    learner = Learner(svc, max_models=max_models)
    log.info("worker %s started", learner.worker_id)
    learner.run(stop)
    if learner.recycle and not stop.is_set():
        sys.exit(RECYCLE_EXIT)


if __name__ == "__main__":
    main()
