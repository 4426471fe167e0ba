"""The learner: pull a task, train it from the version it names, write its result, announce it.

A task names the version it trains from (number, weights object, digest of its arrays), its rows
and learning rates: the worker trains from that state, writes the end state to the deltas
bucket, publishes a small message naming it (the aggregator pulls them) and only then acks the
task. Delivery is at least once: a task may be trained twice; the aggregator applies it once.

What a round waits for is kept off its critical path:

* a learner keeps what it read: shard parts (``caches.PartCache``: written once, read every
  epoch; a chaining learner reads its next task's parts while it trains) and the state its last
  task ended with, so a task that names that state's digest reads no weights;
* the job read and the attempt record (``_admit``) run beside the training, not before it; the
  result is announced only once both said yes;
* **chaining (R = 1)**: when a job trains one task at a time, the fold of a round is its one
  task's end state, to the bit. The learner announces its result as *chained* and goes straight
  on with the next round's task from that state while the aggregator commits behind it; each
  chained task's result is published only once the aggregator's commits are within
  ``chain_depth`` versions of it, with the digests the learner expects (else the chain stops).

Attempts are counted in Firestore (the Pub/Sub emulator has no dead-lettering): after
``max_task_attempts`` the task is FAILED, its failure marker written and announced, the message
acked. A searched job's segment is ``loops.segment``'s, a part of a batch prediction
``usecases.predict_parts``'s. Pace, heartbeat and a task's lease: ``loops.heartbeat``; the
learner process: ``entrypoints.worker``.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bucketlearn import codec, layout
from bucketlearn.domain import task as attempt
from bucketlearn.domain.fold import WEIGHTS
from bucketlearn.domain.job import Job, next_round
from bucketlearn.domain.plan import class_weights, step_rates
from bucketlearn.domain.task import skip_reason
from bucketlearn.errors import NotFoundError, PermanentError
from bucketlearn.faults import crash_point
from bucketlearn.loops.heartbeat import Heartbeats, LearnerTuning, LeaseExtender, expiry
from bucketlearn.loops.segment import SegmentTrainer, run_segment, train_segment
from bucketlearn.ml.training import LocalResult, train_task
from bucketlearn.ports import RESULT, ReceivedTask, ResultMessage, Services, TaskMessage
from bucketlearn.prediction_ports import PredictPart
from bucketlearn.services import task_messages
from bucketlearn.services.caches import job_runtime, models_built, part_cache
from bucketlearn.usecases.predict_parts import predict_part
from bucketlearn.usecases.publish import announce_failure

log = logging.getLogger(__name__)
SLOW_SECONDS = 2.0  # an announcement or a chain's wait slower than this is logged


class Decision(enum.Enum):
    ACK = "ack"
    NACK = "nack"


@dataclass
class _Admission:
    """What the job read and the attempt record said about a task (``Learner._admit``)."""

    job: Job | None
    skip: str | None = None
    attempts: int = 0
    key: str = ""
    doc_id: str = ""


@dataclass
class _Trained:
    """One trained task: its result, the digest of the state it ended with, its figures."""

    task: TaskMessage
    result: LocalResult
    end_digest: str
    stats: dict[str, Any] = field(default_factory=dict)


class Learner:
    def __init__(self, svc: Services, worker_id: str | None = None,
                 stop: threading.Event | None = None, max_models: int = 0,
                 tuning: LearnerTuning = LearnerTuning(), chain: bool = False,
                 segment_trainer: SegmentTrainer = train_segment) -> None:
        self.svc = svc
        self.tuning = tuning
        # past this many models built (``caches.models_built``), ``run`` returns between tasks
        # with ``recycle`` set: a fresh process replaces this one (entrypoints.worker; 0: never)
        self.max_models = max_models
        self.recycle = False
        # chain rounds at R = 1 (a learner process does; the in-process simulation does not)
        self.chain = chain
        self.segment_trainer = segment_trainer  # a searched job's segments' (a test's own)
        self.worker_id = worker_id or svc.settings.worker_id or svc.identity
        self.tasks_done = 0
        self.started_at = svc.clock()
        self.stop = stop or threading.Event()
        self._heartbeats = Heartbeats(self._send_heartbeat, tuning)
        self._owed_refunds: list[tuple[str, str, str]] = []  # (job, task doc, attempt key)
        self._io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="learner-io")
        # results of chained tasks are written and announced from here, in order, while the
        # next task trains
        self._announcer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="announce")

    def heartbeat(self, state: str, task: TaskMessage | None = None) -> None:
        """Say what this worker is doing: through the reporter thread while ``run`` runs (the
        dashboard sees it within a second), else written at once (``heartbeat.Heartbeats``)."""
        self._heartbeats.set(state, task)

    def _send_heartbeat(self, state: str, task: TaskMessage | None) -> None:
        """Write the heartbeat document (one at a time, in order: ``heartbeat.Heartbeats``);
        ``expire_at``: the registry's TTL deletes it a day after the worker was last seen."""
        self.svc.registry.heartbeat(self.worker_id, {
            "worker_id": self.worker_id, "state": state, "last_seen": self.svc.clock(),
            "job_id": task.job_id if task else None,
            "task_id": task.task_id if task else None, "tasks_done": self.tasks_done,
            "started_at": self.started_at, "expire_at": expiry(self.svc.clock())})

    def handle(self, received: ReceivedTask) -> Decision:
        """Process one delivered task; return whether to ack or nack it."""
        pulled_at = self.svc.clock()
        if received.message is None:
            log.error("dropping a task message that is not one of ours (%s): %r",
                      getattr(received, "problem", None) or "undecodable", received.raw[:200])
            return Decision.ACK
        task = received.message
        with LeaseExtender(received, self.svc.settings.ack_deadline_seconds):
            return self.process(task, pulled_at, received.delivery_attempt)

    def process(self, task: TaskMessage, pulled_at: float | None = None,
                delivery_attempt: int | None = None) -> Decision:
        """Train one task (``pulled_at``: when its message arrived, recorded with the attempt),
        announce its result and, when the job trains one task at a time and this learner
        chains, go on with the rounds after it (``_chain``).

        Attempts are counted once per delivery, idempotently (an attempt key per delivery), and
        only for failures that are the task's: through a backend outage the worker keeps the
        message and retries for up to ``tuning.transient_retry_seconds`` (every nack would count
        as a Pub/Sub delivery towards dead-lettering), and an attempt it could not give back during
        the outage is given back later (``_settle_refunds``).
        """
        self._settle_refunds()
        if self.stop.is_set():
            return Decision.NACK  # shutting down: let another worker have it
        if isinstance(task, PredictPart) or task.segment:
            return self._aside(task, delivery_attempt)
        pulled_at = self.svc.clock() if pulled_at is None else pulled_at
        admission = self._io.submit(self._admit, task, pulled_at, delivery_attempt)
        runtime_job = self._known_job(task.job_id)
        if runtime_job is None:  # the first task of a job here: its model needs the job read
            done = admission.result()
            if done.skip is not None:
                log.info("task %s: %s; nothing to do", task.task_id, done.skip)
                return Decision.ACK
            runtime_job = done.job
        assert runtime_job is not None
        self.heartbeat("busy", task)
        try:
            trained = self._with_retries(lambda: self.train(task, runtime_job))
        except Exception as exc:  # noqa: BLE001 - every failure is retried
            return self._failed_attempt(task, admission, exc)
        admitted = admission.result()
        if admitted.skip is not None:
            log.info("task %s: %s; its result is not announced", task.task_id, admitted.skip)
            return Decision.ACK
        if (admitted.attempts > self.svc.settings.max_task_attempts
                and self.fail_task(task, admitted.doc_id, admitted.attempts - 1)):
            return Decision.ACK
        assert admitted.job is not None
        following = (self._following(admitted.job, task, trained.end_digest) if self.chain
                     else None)
        self._with_retries(lambda: self.announce(trained, following is not None, admitted.key))
        self.tasks_done += 1
        if following is not None:
            self._chain(admitted.job, trained, following)
        self.heartbeat("idle")
        return Decision.ACK

    def _aside(self, task: TaskMessage | PredictPart, delivery_attempt: int | None) -> Decision:
        """A task outside a job's rounds: a searched job's candidate through one rung
        (``loops.segment``), or a part of a batch prediction (``usecases.predict_parts``)."""
        self.heartbeat("busy", task)  # type: ignore[arg-type]
        done = (predict_part(self.svc, task, delivery_attempt, self.worker_id, self._with_retries)
                if isinstance(task, PredictPart) else run_segment(
                    self.svc, task, self.worker_id, delivery_attempt, self.segment_trainer))
        self.tasks_done += int(done)
        self.heartbeat("idle")
        return Decision.ACK if done else Decision.NACK

    def _known_job(self, job_id: str) -> Job | None:
        """The job as this process's runtime cache knows it (its model is built), or None."""
        runtime = self.svc.cache.runtimes.get(job_id)
        return runtime.job if runtime is not None else None

    def _admit(self, task: TaskMessage, pulled_at: float,
               delivery_attempt: int | None) -> _Admission:
        """Read the job and, when the task is still to train, count this attempt (before the
        result can be announced: a task that crashes its worker still runs out of attempts)."""
        registry = self.svc.registry
        doc_id = task_messages.task_doc_id(task.job_id, task.epoch, task.task_index)
        job, known = self._with_retries(lambda: registry.read_for_attempt(task.job_id, doc_id))
        skip = skip_reason(job, task.base_version, bool(task.weights_path or task.base_digest))
        if skip is not None:
            return _Admission(job, skip)
        key, attempts = self._record_attempt(task, pulled_at, delivery_attempt, known)
        return _Admission(job, None, attempts, key, doc_id)

    def _record_attempt(self, task: TaskMessage, pulled_at: float,
                        delivery_attempt: int | None, known: list[str] | None = None
                        ) -> tuple[str, int]:
        """Count one attempt at ``task`` under a new key, the nonce its result is written under
        (only a recorded attempt's result is folded); returns (the key, the attempts so far)."""
        doc_id, key = task_messages.task_doc_id(task.job_id, task.epoch, task.task_index), layout.new_nonce()
        fields = attempt.started(task.task_id, task.epoch, task.task_index, task.round, task.rows,
                                 self.worker_id, self.svc.clock(), pulled_at, delivery_attempt)
        return key, self._with_retries(
            lambda: self.svc.registry.record_attempt(task.job_id, doc_id, fields, key, known),
            on_give_up=lambda: self._owed_refunds.append((task.job_id, doc_id, key)))

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

    def _failed_attempt(self, task: TaskMessage, admission: Future[_Admission],
                        exc: Exception) -> Decision:
        """Record a failed attempt (given back when the failure was transient); nack."""
        try:
            admitted = admission.result()
        except Exception:  # noqa: BLE001 - the registry may be what failed: try again later
            log.warning("task %s failed (%s) and the registry did not answer", task.task_id, exc)
            return Decision.NACK
        if admitted.skip is not None:
            log.info("task %s failed (%s) but needs no training: %s", task.task_id, exc,
                     admitted.skip)
            return Decision.ACK
        transient = self.svc.transient(exc)
        if (admitted.attempts > self.svc.settings.max_task_attempts and not transient
                and self.fail_task(task, admitted.doc_id, admitted.attempts - 1)):
            return Decision.ACK
        log.warning("task %s attempt %d failed (%s): %s", task.task_id, admitted.attempts,
                    "transient" if transient else "counted", exc,
                    exc_info=not isinstance(exc, (PermanentError, NotFoundError, OSError)))
        if transient:  # a backend outage is not the task's fault: give the attempt back
            self._owed_refunds.append((task.job_id, admitted.doc_id, admitted.key))
            self._settle_refunds()
        try:
            self.svc.registry.update_task(task.job_id, admitted.doc_id, attempt.retrying(
                f"{type(exc).__name__}: {exc}", self.svc.clock()))
        except Exception:  # noqa: BLE001 - the registry may be the backend that is down
            log.warning("could not record the failure of %s", task.task_id)
        return Decision.NACK

    def _settle_refunds(self) -> None:
        """Give back the attempts owed (those a backend outage kept this worker from giving back
        when it happened); what still cannot be given back stays owed."""
        owed, self._owed_refunds = self._owed_refunds, []
        for job_id, doc_id, key in owed:
            try:
                self.svc.registry.refund_attempt(job_id, doc_id, key)
            except Exception:  # noqa: BLE001 - still down: try again with the next task
                self._owed_refunds.append((job_id, doc_id, key))

    def train(self, task: TaskMessage, job: Job,
              state: tuple[list[Any], list[Any]] | None = None) -> _Trained:
        """Train the task from the version it names (or from ``state``, a chain's last end
        state); return its result and figures."""
        svc = self.svc
        t0, cpu0 = time.perf_counter(), time.process_time()
        runtime = job_runtime(svc, job)
        base, optimizer = state or runtime.state(task.weights_path, task.base_digest)
        x, y = part_cache(svc).rows(svc, list(task.parts))
        if self.chain:
            self._read_ahead(job, task)
        t1, options = time.perf_counter(), job.options
        batch_size = int(options["batch_size"])
        scale = job.plan.task_rate_scale(task.round) if job.plan is not None else 1.0
        rates = step_rates(float(options["learning_rate"]) * scale,
                           str(options.get("lr_schedule", "constant")), task.span,
                           math.ceil(len(y) / batch_size))
        weights = class_weights(str(options.get("class_weight", "none")),
                                runtime.manifest.train_counts)
        train_started_at = time.time()
        with runtime.lock:
            result = train_task(runtime.model, base, optimizer, x, y, batch_size, rates,
                                int(options["seed"]), task.epoch, task.task_index, weights)
        end_digest = codec.state_digest(result.weights, result.optimizer) if self.chain else ""
        runtime.keep(end_digest, result.weights, result.optimizer)
        t2 = time.perf_counter()
        return _Trained(task, result, end_digest, {
            "fetch_seconds": round(t1 - t0, 6), "train_seconds": round(t2 - t1, 6),
            "examples": result.examples, "train_loss": result.train_loss,
            "finished_at": svc.clock(), "cpu_seconds": round(time.process_time() - cpu0, 6),
            # wall clock (comparable across processes): the round-trip benchmark's hops
            "train_started_at": train_started_at, "train_ended_at": time.time()})

    def _read_ahead(self, job: Job, task: TaskMessage) -> None:
        """Start reading the parts of the round after ``task`` when this learner will chain into
        it: the reads go on while this task trains, off the chain's path."""
        following = self._following(job, task, "")
        if following is not None:
            part_cache(self.svc).prefetch(self.svc, list(following.parts))

    def announce(self, trained: _Trained, chained: bool = False,
                 attempt_key: str | None = None) -> ResultMessage:
        """Write a trained task's result to the deltas bucket under its attempt's key, then publish
        the message naming it (never before the object exists). Without ``attempt_key``, an attempt
        is recorded first: a result is only ever written under a key the registry holds."""
        svc, task = self.svc, trained.task
        if attempt_key is None:
            attempt_key, _ = self._record_attempt(task, svc.clock(), None)
        started = time.perf_counter()
        meta = {"job_id": task.job_id, "task_id": task.task_id, "epoch": task.epoch,
                "task_index": task.task_index, "round": task.round,
                "base_version": task.base_version, "base_digest": task.base_digest,
                "examples": trained.result.examples,
                "train_loss": trained.result.train_loss, "worker_id": self.worker_id,
                "content": WEIGHTS}  # the aggregator takes the delta, exactly (domain.fold)
        data = codec.encode_state(trained.result.weights, trained.result.optimizer, meta)
        path = layout.delta_path(task.job_id, task.epoch, task.task_index, attempt_key)
        svc.store.write_bytes(svc.settings.deltas_bucket, path, data, "application/octet-stream",
                              metadata={k: str(v) for k, v in meta.items()})
        crash_point(svc.settings, "learner.before_publish")
        stats = {**trained.stats, "write_seconds": round(time.perf_counter() - started, 6),
                 "result_bytes": len(data)}
        busy = sum(float(stats.get(k) or 0.0) for k in ("fetch_seconds", "train_seconds",
                                                          "write_seconds"))
        stats["usage"] = {**svc.usage(task.job_id), "worker_seconds": round(busy, 6)}
        message = ResultMessage(
            job_id=task.job_id, kind=RESULT, epoch=task.epoch, task_index=task.task_index,
            round=task.round, base_version=task.base_version, base_digest=task.base_digest,
            path=path, end_digest=trained.end_digest, chained=chained,
            worker_id=self.worker_id, sent_at=svc.clock(), stats=stats)
        written = time.perf_counter()
        svc.results.publish([message])
        published = time.perf_counter()
        if published - started > SLOW_SECONDS:  # a clue to a slow backend
            log.warning("task %s: announcing its result took %.1f s (result write %.1f s, "
                        "publish %.1f s)", task.task_id, published - started, written - started,
                        published - written)
        crash_point(svc.settings, "learner.before_ack")
        return message

    # -- chaining (R = 1) -------------------------------------------------------------------------
    def _following(self, job: Job, task: TaskMessage, base_digest: str) -> TaskMessage | None:
        """The task of the round after ``task``, from ``base_digest``, when this learner may
        chain into it: the job trains one task at a time, that round exists (not the export)
        and the learner is neither stopping nor due to be replaced."""
        plan = job.plan
        if (plan is None or plan.parallel_tasks != 1 or self.stop.is_set()
                or (self.max_models and models_built(self.svc) >= self.max_models)):
            return None
        following = next_round(task.epoch, task.round, plan.rounds_per_epoch, plan.epochs)
        if following is None:
            return None
        shards = job_runtime(self.svc, job).manifest.shards
        [message] = task_messages.position_messages(job, shards, following[0], following[1],
                                           task.base_version + 1, "", base_digest)
        return message

    def _chain(self, job: Job, first: _Trained, task: TaskMessage) -> None:
        """Train the rounds after ``first`` from its end state, one after another, while the
        aggregator commits behind; stop when the job ends, the chain runs out (the export) or
        the aggregator's commits do not confirm the states this learner made."""
        made = {first.task.base_version: first.task.base_digest,  # version -> digest expected
                first.task.base_version + 1: first.end_digest}
        previous, pending = first, None
        while task is not None:
            admission = self._io.submit(self._admit, task, self.svc.clock(), None)
            self.heartbeat("busy", task)
            try:
                trained = self.train(task, job, (previous.result.weights,
                                                 previous.result.optimizer))
            except Exception:  # noqa: BLE001 - the chain stops; the round is published for all
                log.warning("chained task %s failed; the chain stops", task.task_id,
                            exc_info=True)
                return
            trained_at = time.perf_counter()
            admitted = admission.result()
            waited = time.perf_counter() - trained_at
            if waited > SLOW_SECONDS:
                log.warning("chained task %s: its admission (job read, attempt record) kept "
                            "the chain waiting %.1f s after training", task.task_id, waited)
            if admitted.skip is not None or admitted.attempts > self.svc.settings.max_task_attempts:
                log.info("chain stops at %s: %s", task.task_id, admitted.skip or "attempts spent")
                return
            if not self._confirmed(task, admitted.job, made):
                log.info("chain stops at %s: the aggregator did not commit the states it "
                         "trained from", task.task_id)
                return
            following = self._following(admitted.job or job, task, trained.end_digest)
            made[task.base_version + 1] = trained.end_digest
            if pending is not None:
                pending.result()  # announcements go out in order; a failed one ends the chain
            pending = self._announcer.submit(self.announce, trained, following is not None,
                                             admitted.key)
            self.tasks_done += 1
            previous, task = trained, following
        if pending is not None:
            pending.result()

    def _confirmed(self, task: TaskMessage, job: Job | None, made: dict[int, str]) -> bool:
        """Whether the chain may announce ``task``'s result: the job is still training and the
        aggregator has committed, with the digests this learner made, every version up to
        ``chain_depth - 1`` before the task's base (reading the job again until it has, for up
        to ``chain_confirm_seconds``)."""
        needed = task.base_version - (self.tuning.chain_depth - 1)
        # no longer than the aggregator waits for a chained round (``chain_grace_seconds``):
        # past that, the round is published for everyone anyway
        wait = min(self.tuning.chain_confirm_seconds, self.svc.settings.chain_grace_seconds)
        deadline = time.monotonic() + wait
        while True:
            if job is None or job.is_terminal or job.head is None:
                return False
            version = int(job.version or 0)
            if version >= needed:
                return made.get(version) == job.head.digest
            if time.monotonic() >= deadline or self.stop.wait(self.tuning.chain_poll_seconds):
                return False
            job = self.svc.registry.get_job(task.job_id)

    def fail_task(self, task: TaskMessage, doc_id: str, attempts: int) -> bool:
        """Give up on a task: mark it FAILED and tell the aggregator (a failure marker in the
        deltas bucket, announced on the results topic). Not when the task's record, read
        again, holds no more than the attempts allowed: the admission's count (the keys read,
        and this one) can run ahead of the record by an attempt given back in between (an
        outage's refund); then False, and the attempt goes on."""
        svc = self.svc
        previous = svc.registry.get_task(task.job_id, doc_id)
        if previous is not None and previous.attempts <= svc.settings.max_task_attempts:
            log.info("task %s: %d attempts recorded, not %d (one was given back meanwhile); "
                     "it is not failed", task.task_id, previous.attempts, attempts + 1)
            return False
        error = (previous.error if previous is not None else None) or "unknown error"
        reason = f"task {task.task_id} failed after {attempts} attempts: {error}"
        announce_failure(svc, task.job_id, task.epoch, task.task_index, reason,
                         {"attempts": attempts, "worker_id": self.worker_id}, task.round)
        svc.registry.update_task(task.job_id, doc_id, attempt.failed(error, svc.clock()))
        log.error("%s", reason)
        return True

    def run(self, stop: threading.Event, max_tasks: int | None = None,
            pull_timeout: float = 10.0) -> int:
        """Pull and process tasks until ``stop`` is set (or ``max_tasks`` are done)."""
        self.stop = stop
        with self._heartbeats.reporting():
            return self._loop(stop, max_tasks, pull_timeout)

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
