"""The learner: pull one task, train it from the head version, write the delta, then ack.

Delivery is at least once, so a task may be trained twice; the aggregator applies it once.
Attempts are counted in Firestore (the Pub/Sub emulator has no dead-lettering): after
``max_task_attempts`` the task is marked FAILED, a failure marker is written to the deltas
bucket (so the aggregator hears of it) and the message is acked.
"""

from __future__ import annotations

import enum
import json
import logging
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from bucketlearn import codec, jobs, layout
from bucketlearn.aggregator import list_deltas
from bucketlearn.bootstrap import Services
from bucketlearn.config import JobOptions
from bucketlearn.errors import NotFoundError, PermanentError, TransientError
from bucketlearn.ingest import load_parts
from bucketlearn.ports import ReceivedTask, TaskMessage
from bucketlearn.runtime import job_runtime
from bucketlearn.training import subtract, train_on_shard

log = logging.getLogger(__name__)


TRANSIENT_BACKOFF_SECONDS = 2.0
FLOW_POLL_SECONDS = 0.1
HEARTBEAT_SECONDS = 10.0
REPORT_MIN_SECONDS = 1.0
REPORTER_JOIN_SECONDS = 5.0
# How long the final heartbeat ("stopped") waits for a write still in flight (each write is
# bounded by the registry's own timeout, 30 s for Firestore).
HEARTBEAT_WRITE_WAIT_SECONDS = 60.0


def pending_deltas(svc: Services, job_id: str, epoch: int, done: set[int]) -> int:
    """Tasks of ``epoch`` with a delta (or failure marker) written but not yet applied."""
    return len({ref.task_index for ref in list_deltas(svc, job_id, epoch)} - done)


def pending_limit(options: dict[str, Any]) -> int:
    """How many unapplied deltas a worker lets pile up before it pauses: ``max_pending``, but
    never below ``buffer_size`` (the aggregator cuts a version only once that many wait)."""
    job_options = JobOptions.from_dict(options)  # a job older than an option gets its default
    return max(job_options.max_pending, job_options.buffer_size)


def _epoch_over(job: dict[str, Any], task: TaskMessage) -> bool:
    """The job has ended, or the task's epoch is complete (every one of its tasks applied)."""
    return jobs.is_terminal(job) or int(job.get("epoch") or 0) > task.epoch


def is_transient(exc: BaseException) -> bool:
    """Network trouble and unavailable backends: retry without counting an attempt."""
    from google.api_core import exceptions as gexc  # noqa: PLC0415

    return isinstance(exc, (TransientError, OSError, gexc.ServiceUnavailable,
                            gexc.DeadlineExceeded, gexc.InternalServerError, gexc.TooManyRequests,
                            gexc.Aborted, gexc.RetryError, gexc.GatewayTimeout))


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
    ``REPORT_MIN_SECONDS`` (when several happen in that time, the latest wins), and the current
    state is written again every ``HEARTBEAT_SECONDS`` so the worker shows as alive.
    """

    def __init__(self, write: Callable[[str, TaskMessage | None], None]) -> None:
        self.write = write
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
            self.changed.wait(HEARTBEAT_SECONDS)
            if self.closing.wait(REPORT_MIN_SECONDS):
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
        self.thread.join(timeout=REPORTER_JOIN_SECONDS)


class Learner:
    def __init__(self, svc: Services, worker_id: str | None = None,
                 stop: threading.Event | None = None) -> None:
        self.svc = svc
        self.worker_id = worker_id or svc.settings.worker_id or svc.identity
        self.tasks_done = 0
        self.started_at = svc.clock()
        self.stop = stop or threading.Event()
        self._reporter: _Reporter | None = None  # while ``run`` runs; else heartbeats are written
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
        locked = self._heartbeat_lock.acquire(timeout=HEARTBEAT_WRITE_WAIT_SECONDS)
        if not locked:
            log.warning("a heartbeat write is still in flight after %.0f s; %s",
                        HEARTBEAT_WRITE_WAIT_SECONDS,
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
            return self.process(task, pulled_at)

    def process(self, task: TaskMessage, pulled_at: float | None = None) -> Decision:
        """Train one task (``pulled_at``: when its message arrived, recorded with the attempt)."""
        svc, registry = self.svc, self.svc.registry
        job = registry.get_job(task.job_id)
        if job is None or jobs.is_terminal(job):
            log.info("task %s: job is %s, nothing to do", task.task_id,
                     job.get("status") if job else "gone")
            return Decision.ACK
        if int(job.get("epoch") or 0) > task.epoch:
            return Decision.ACK  # that epoch is complete: every one of its tasks was applied
        epoch_doc = registry.get_epoch(task.job_id, task.epoch) or {}
        if task.task_index in jobs.done_tasks(epoch_doc):
            return Decision.ACK  # a duplicate delivery of a task already applied
        job, waited = self.await_capacity(task, job, epoch_doc)
        if self.stop.is_set():
            return Decision.NACK  # shutting down: let another worker have it
        if _epoch_over(job, task):
            return Decision.ACK  # finished (or failed) while this worker waited
        doc_id = jobs.task_doc_id(task.job_id, task.epoch, task.task_index)
        now = svc.clock()
        attempts = registry.record_attempt(task.job_id, doc_id, {
            "task_id": task.task_id, "epoch": task.epoch, "task_index": task.task_index,
            "state": "RUNNING", "worker_id": self.worker_id, "started_at": now, "rows": task.rows,
            "pulled_at": pulled_at if pulled_at is not None else now,
        })
        if attempts > svc.settings.max_task_attempts:
            self.fail_task(task, doc_id, attempts - 1)
            return Decision.ACK
        self.heartbeat("busy", task)
        try:
            timings = self.train(task, job)
        except Exception as exc:  # noqa: BLE001 - every failure is retried
            transient = is_transient(exc)
            log.warning("task %s attempt %d failed (%s): %s", task.task_id, attempts,
                        "transient" if transient else "counted", exc,
                        exc_info=not isinstance(exc, (PermanentError, NotFoundError, OSError)))
            try:
                if transient:
                    # A backend outage is not the task's fault: it must not push a healthy
                    # task towards FAILED. Give the attempt back and slow the retry loop down.
                    registry.refund_attempt(task.job_id, doc_id)
                registry.update_task(task.job_id, doc_id, {
                    "state": "RETRYING", "error": f"{type(exc).__name__}: {exc}"[:2000],
                    "finished_at": svc.clock()})
            except Exception:  # noqa: BLE001 - the registry may be the backend that is down
                log.warning("could not record the failure of %s", task.task_id)
            if transient:
                time.sleep(TRANSIENT_BACKOFF_SECONDS)
            return Decision.NACK
        self.tasks_done += 1
        registry.update_task(task.job_id, doc_id, {"state": "TRAINED", "finished_at": svc.clock(),
                                                   "error": None, "flow_wait_seconds": waited,
                                                   **timings})
        self.heartbeat("idle")
        return Decision.ACK

    def await_capacity(self, task: TaskMessage, job: dict[str, Any],
                       epoch_doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """Bounded staleness: while ``pending_limit`` deltas of this epoch wait unapplied, pause
        until the aggregator folds some, so a task trains from a head that has seen them. Workers
        are faster than the aggregator's version cycle; without the pause they train many tasks
        from one head and the fold of those same-base deltas overshoots.

        Goes on regardless once the aggregator has shown no progress for
        ``flow_stall_seconds`` (an outage must slow workers down, not stop them). Returns the
        job document to train from and the seconds spent waiting.
        """
        limit = pending_limit(job["options"])
        started = time.monotonic()
        while pending_deltas(self.svc, task.job_id, task.epoch,
                             jobs.done_tasks(epoch_doc)) >= limit:
            self.heartbeat("waiting", task)
            job, progressed = self._await_progress(task, job)
            if not progressed:
                break
            epoch_doc = self.svc.registry.get_epoch(task.job_id, task.epoch) or {}
        return job, time.monotonic() - started

    def _await_progress(self, task: TaskMessage, job: dict[str, Any]
                        ) -> tuple[dict[str, Any], bool]:
        """Poll the job until the aggregator applies more deltas; return the latest job document
        and whether it did (False: the worker stops, the task's epoch is over, or
        ``flow_stall_seconds`` passed without progress)."""
        applied = job.get("tasks_applied")
        stall = self.svc.settings.flow_stall_seconds
        deadline = time.monotonic() + stall
        while time.monotonic() < deadline:
            if self.stop.wait(FLOW_POLL_SECONDS):
                return job, False
            fresh = self.svc.registry.get_job(task.job_id)
            if fresh is None:
                return job, False
            if _epoch_over(fresh, task):
                return fresh, False
            if fresh.get("tasks_applied") != applied:
                return fresh, True
            job = fresh
        log.warning("task %s: the aggregator made no progress for %.0f s; training without "
                    "waiting for it", task.task_id, stall)
        return job, False

    def train(self, task: TaskMessage, job: dict[str, Any]) -> dict[str, Any]:
        """Train the task from the head version and write its delta; return timings."""
        svc = self.svc
        t0 = time.perf_counter()
        runtime = job_runtime(svc, job)
        head = job["head"]
        base = runtime.weights(head["weights_path"])
        x, y = load_parts(svc.store, svc.settings.work_bucket, list(task.parts))
        model = runtime.model
        t1 = time.perf_counter()
        result = train_on_shard(model, base, x, y, int(job["options"]["batch_size"]),
                                int(job["options"]["seed"]), task.epoch, task.task_index)
        t2 = time.perf_counter()
        meta = {"job_id": task.job_id, "task_id": task.task_id, "epoch": task.epoch,
                "task_index": task.task_index, "base_version": int(head["version"]),
                "base_applied": int(job.get("tasks_applied") or 0),
                "examples": result.examples, "train_loss": result.train_loss,
                "worker_id": self.worker_id}
        data = codec.encode_weights(subtract(result.weights, base), meta)
        path = layout.delta_path(task.job_id, task.epoch, task.task_index, layout.new_nonce())
        svc.store.write_bytes(svc.settings.deltas_bucket, path, data, "application/octet-stream",
                              metadata={k: str(v) for k, v in meta.items()})
        t3 = time.perf_counter()
        return {"fetch_seconds": t1 - t0, "train_seconds": t2 - t1, "write_seconds": t3 - t2,
                "base_version": int(head["version"]), "train_loss": result.train_loss,
                "delta_path": path}

    def fail_task(self, task: TaskMessage, doc_id: str, attempts: int) -> None:
        """Give up on a task: mark it FAILED and tell the aggregator with a failure marker."""
        svc = self.svc
        previous = svc.registry.get_task(task.job_id, doc_id) or {}
        error = previous.get("error") or "unknown error"
        reason = f"task {task.task_id} failed after {attempts} attempts: {error}"
        marker = {"job_id": task.job_id, "task_id": task.task_id, "epoch": task.epoch,
                  "task_index": task.task_index, "attempts": attempts, "error": reason}
        path = layout.failure_marker_path(task.job_id, task.epoch, task.task_index,
                                          layout.new_nonce())
        svc.store.write_bytes(svc.settings.deltas_bucket, path, json.dumps(marker).encode(),
                              "application/json", metadata={"failed": "true"})
        svc.registry.update_task(task.job_id, doc_id, {"state": "FAILED", "error": error,
                                                       "finished_at": svc.clock()})
        log.error("%s", reason)

    def run(self, stop: threading.Event, max_tasks: int | None = None,
            pull_timeout: float = 10.0) -> int:
        """Pull and process tasks until ``stop`` is set (or ``max_tasks`` are done)."""
        self.stop = stop
        self._heartbeats_closed.clear()
        self._write_heartbeat("idle", None)
        try:
            with _Reporter(self._write_heartbeat) as self._reporter:
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
        return handled


def main() -> None:
    """Entry point of a worker process (``bucketlearn worker``)."""
    from bucketlearn.bootstrap import process_services  # noqa: PLC0415
    from bucketlearn.logs import setup_logging  # noqa: PLC0415

    svc = process_services()
    setup_logging(svc.settings.log_format)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    learner = Learner(svc)
    log.info("worker %s started", learner.worker_id)
    learner.run(stop)


if __name__ == "__main__":
    main()
