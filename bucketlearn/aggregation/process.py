"""The long-running aggregator: results in over Pub/Sub, one writer per job, evaluation aside.

``bucketlearn aggregator`` (a Cloud Run worker pool in the cloud, a process of the local stack)
pulls the results topic with a streaming pull. A message's job is served by a ``_JobSlot``: a
thread holding the job's ``JobAggregator`` (``aggregation.writer``), fed through an inbox, so a
round of one job never waits on another job's fold or export. Before it serves a job the process
takes the job's lease and renews it every third of ``aggregator_lease_seconds`` while it serves
it; a message for a job whose lease another aggregator holds goes back to Pub/Sub for a few
seconds. A process that takes over a lease from a holder that died (the lease ran out) hears
the deltas bucket's listing (results whose messages that holder took with it) and publishes the
current round's tasks that have no result yet (the holder may have died between a commit and
its publish). The messages a dead holder took with it come back only once their deadline runs
out, so the process does not wait for them: every third of the lease it looks at the active
jobs (one query) and serves any published job whose lease is free or has run out.

Committed versions are evaluated by one thread of the process (``_Evaluator``: the newest
version of each job, older ones skipped when rounds are faster than evaluations), which takes at
most ``eval_cpu_share`` of a core (it rests between evaluations); the figures go back to the
job's slot, which sends them with its next commit, or writes them on their own after
``eval_flush_seconds`` without one. Figures no commit carried when the slot ends (the job
ended while its version was being evaluated: a small job can train faster than its first
evaluation) are written on their version's document alone, the head left as the export made
it.

Results are acknowledged once folded (or found to be garbage), so a process that dies loses
nothing: Pub/Sub delivers the unacknowledged ones again, and the listing finds what was never
announced.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bucketlearn import layout
from bucketlearn.aggregation.evaluators import Evaluated, Validated
from bucketlearn.aggregation.writer import JobAggregator, lease_name
from bucketlearn.domain.job import Job, fail_fields
from bucketlearn.domain.lifecycle import TRAINING
from bucketlearn.domain.version import evaluation_rest
from bucketlearn.errors import PermanentError
from bucketlearn.faults import crash_point
from bucketlearn.ports import NUDGE, Received, ResultMessage, Services
from bucketlearn.services import endings, task_messages
from bucketlearn.services.evaluate import Scoring, record_late_evaluation
from bucketlearn.services.results import list_deltas
from bucketlearn.usecases.publish import publish_round

log = logging.getLogger(__name__)


def _settle(action: Callable[[], None]) -> None:
    """Ack, nack or extend a message; a failure is logged (the message comes back after its
    deadline)."""
    try:
        action()
    except Exception:  # noqa: BLE001 - an unsettled message is redelivered: no loss
        log.warning("could not settle a result message", exc_info=True)


@dataclass(frozen=True)
class AggregatorTuning:
    """How the long-running aggregator paces itself; tests shorten it."""

    pull_seconds: float = 0.5  # the longest a pull waits (deadlines are checked in between)
    idle_seconds: float = 300.0  # a job with no message for this long is let go (lease released)
    busy_retry_seconds: int = 5  # a message for a job another aggregator holds comes back after
    error_pause_seconds: float = 1.0  # after a step failed (a backend outage), before the next
    adopt_seconds: float | None = None  # between looks for unserved jobs (None: a third of the
    # lease, so a job whose holder died is served again within about 1.3 leases)


class _Evaluator:
    """One thread evaluating the newest committed version of each job (older ones pending for
    the same job are skipped); figures go back to the job's slot. After an evaluation of e
    seconds it rests ``domain.version.evaluation_rest(e)`` (``eval_cpu_share`` of a core at
    most): the versions committed meanwhile are skipped but the newest. A checkpoint's
    validation score (``score_checkpoint``) is never skipped: checkpoints are scored first, in
    the order they came, without resting. What it measures with is its ``scoring``."""

    def __init__(self, svc: Services, stop: threading.Event, scoring: Scoring) -> None:
        self.svc = svc
        self.scoring = scoring
        self.stop = stop
        self._pending: dict[str, tuple[_JobSlot, int, list[Any], Evaluated]] = {}
        self._checkpoints: list[tuple[_JobSlot, int, int, list[Any], Validated]] = []
        self._lock = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="evaluator", daemon=True)

    def bind(self, slot: _JobSlot) -> Any:
        """The ``Evaluator`` a slot's ``JobAggregator`` submits to."""
        evaluator = self

        class _Bound:
            scoring = evaluator.scoring

            def submit(self, svc: Services, job: Job, version: int, weights: list[Any],
                       done: Evaluated) -> None:
                with evaluator._lock:
                    evaluator._pending[slot.job_id] = (slot, version, weights, done)
                    evaluator._lock.notify()

            def score_checkpoint(self, svc: Services, job: Job, epoch: int, version: int,
                                 weights: list[Any], done: Validated) -> None:
                with evaluator._lock:
                    evaluator._checkpoints.append((slot, epoch, version, weights, done))
                    evaluator._lock.notify()

        return _Bound()

    def _run(self) -> None:
        resting_until = 0.0  # no holdout evaluation before then; checkpoints any time
        while not self.stop.is_set():
            with self._lock:
                left = resting_until - time.monotonic()
                rested = left <= 0
                self._lock.wait_for(lambda rested=rested: bool(self._checkpoints)
                                    or self.stop.is_set() or (bool(self._pending) and rested),
                                    0.5 if rested else max(0.01, min(0.5, left)))
                checkpoint = self._checkpoints.pop(0) if self._checkpoints else None
                if checkpoint is None and (not self._pending
                                           or time.monotonic() < resting_until):
                    continue
                if checkpoint is None:
                    job_id = next(iter(self._pending))
                    slot, version, weights, done = self._pending.pop(job_id)
            if checkpoint is not None:
                self._score(*checkpoint)
                continue
            job = slot.aggregator.job
            if job is None or job.is_terminal:
                continue
            started = time.perf_counter()
            found = self.scoring.evaluate_version(self.svc, job, weights, version)
            if found is not None:
                slot.deliver(found, done)
            resting_until = time.monotonic() + evaluation_rest(
                time.perf_counter() - started, self.svc.settings.eval_cpu_share)

    def _score(self, slot: _JobSlot, epoch: int, version: int, weights: list[Any],
               done: Validated) -> None:
        """A checkpoint's validation score, to its slot (the export scores it if this fails)."""
        job = slot.aggregator.job
        if job is None or job.is_terminal:
            return
        try:
            score = self.scoring.checkpoint_score(self.svc, job, epoch, version, weights)
        except Exception:  # noqa: BLE001 - the export scores every checkpoint it lacks
            log.warning("job %s: could not score v%d", job.job_id, version, exc_info=True)
            return
        slot.inbox.put(("validated", (score, done)))


class _JobSlot:
    """One job served by this process: its aggregator, its inbox and the thread that works
    through it."""

    def __init__(self, service: AggregatorService, job_id: str) -> None:
        self.service = service
        self.job_id = job_id
        self.aggregator = JobAggregator(service.svc, job_id, service.evaluator.bind(self),
                                        carry_evaluations=True,
                                        collect_in_background=True, holder=service.identity)
        self.inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.lost = threading.Event()  # its lease went to another aggregator, or ran out
        self.renewed_at = time.monotonic()  # its lease's last renewal (taken just before)
        self.ended = threading.Event()
        self.closing = threading.Lock()  # "closed" and the evaluator's deliveries, in turn
        self.closed = False  # its thread is done: evaluations are written by their deliverer
        self.last_message_at = time.monotonic()
        self.listened_at = time.monotonic()
        self.thread = threading.Thread(target=self._run, name=f"job-{job_id}", daemon=True)

    def _run(self) -> None:
        try:
            while not (self.service.stop.is_set() or self.lost.is_set()):
                self._take(self._wait())
                self._listen_if_quiet()
                if self._work():
                    break
                if time.monotonic() - self.last_message_at > self.service.tuning.idle_seconds:
                    log.info("job %s: idle for %.0f s; let go", self.job_id,
                             self.service.tuning.idle_seconds)
                    break
        except Exception:  # noqa: BLE001 - the slot ends; unsettled messages come back
            log.exception("job %s: its aggregation stopped", self.job_id)
        finally:
            self.ended.set()
            self.service.let_go(self)

    def deliver(self, found: tuple[Any, float], done: Evaluated) -> None:
        """An evaluation from the evaluator (``evaluate_version``'s answer): into the inbox
        while the slot serves its job; written on its version's document at once when the slot
        has closed (the job ended while the version was being evaluated)."""
        with self.closing:
            if not self.closed:
                self.inbox.put(("evaluation", (found, done)))
                return
        self.service.record_late(self.job_id, [found[0]])

    def _wait(self) -> list[tuple[str, Any]]:
        """Every item waiting in the inbox (waiting for one up to the next deadline)."""
        deadline = self.aggregator.next_deadline()
        timeout = self.service.tuning.pull_seconds
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - self.service.svc.clock()))
        items = []
        try:
            items.append(self.inbox.get(timeout=timeout))
            while True:
                items.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        return items

    def _listen_if_quiet(self) -> None:
        """No message for a lease period: hear the deltas bucket's listing (at most once per
        period), the backstop for results whose messages are late or lost (a broken stream)."""
        every = self.service.svc.settings.aggregator_lease_seconds
        now = time.monotonic()
        if now - self.last_message_at < every or now - self.listened_at < every:
            return
        self.listened_at = now
        try:
            self.aggregator.listen_to_bucket()
        except Exception:  # noqa: BLE001 - storage briefly unreachable: the next period retries
            log.warning("job %s: listing its results failed", self.job_id, exc_info=True)

    def _take(self, items: list[tuple[str, Any]]) -> None:
        aggregator = self.aggregator
        for kind, item in items:
            if kind == "message":
                message, received = item
                self.last_message_at = time.monotonic()
                if message.kind == NUDGE:
                    log.info("job %s: nudged (%s)", self.job_id, message.reason)
                    aggregator.refresh()
                    aggregator.listen_to_bucket()
                    received.ack()
                else:
                    aggregator.hear(message, received)
            elif kind in ("evaluation", "validated"):  # the evaluator's answer, to its callback
                found, done = item
                if kind == "evaluation":
                    done(*found)
                else:
                    done(found)

    def _fail(self, exc: PermanentError) -> None:
        """End the job FAILED with a permanent error's reason (a backend refused a write for
        good, an object the fold needs is corrupt beyond retraining); settle its messages."""
        now = self.service.svc.clock()
        reason = f"the aggregation failed for good: {type(exc).__name__}: {exc}"
        log.error("job %s: %s", self.job_id, reason)
        endings.end_job(self.service.svc.registry, self.job_id, fail_fields(now, reason))
        self.aggregator.job = self.aggregator.refresh()
        self.aggregator.step()  # the job has ended: its messages are settled, it is wound up

    def _work(self) -> bool:
        """Do what is due; True when the job has ended (the slot is done)."""
        aggregator = self.aggregator
        try:
            for _ in range(10_000):
                if not aggregator.step():
                    break
            if aggregator.job is not None and not aggregator.job.is_terminal:
                # (an ended job's kept evaluations go on their versions only: ``let_go``)
                aggregator.flush_evaluations(self.service.svc.settings.eval_flush_seconds)
        except PermanentError as exc:  # retrying cannot help: the job ends with the reason
            self._fail(exc)
            return True
        except Exception:  # noqa: BLE001 - a backend outage: messages stay, try again
            log.warning("job %s: aggregation step failed; retrying", self.job_id,
                        exc_info=True)
            self.service.stop.wait(self.service.tuning.error_pause_seconds)
            aggregator.job = None  # read it again
            return False
        return aggregator.job is None or aggregator.job.is_terminal


class AggregatorService:
    """The long-running aggregator (see the module docstring).

    Args:
        svc: the services (``svc.results`` is pulled).
        stop: set to stop (SIGTERM): each job's slot finishes its step, leases are released and
            unsettled messages go back to Pub/Sub.
        tuning: pacing.
        scoring: what versions, checkpoints and exports are measured with (None: production's
            ``evaluate.Scoring``; a test hands in its own).
    """

    def __init__(self, svc: Services, stop: threading.Event,
                 tuning: AggregatorTuning = AggregatorTuning(),
                 scoring: Scoring | None = None) -> None:
        self.svc = svc
        self.stop = stop
        self.tuning = tuning
        self.identity = f"{svc.identity}-{layout.new_nonce()}"
        self.evaluator = _Evaluator(svc, stop, scoring or Scoring())
        self.slots: dict[str, _JobSlot] = {}
        self._lock = threading.Lock()
        self._renewer = threading.Thread(target=self._renew, name="leases", daemon=True)
        self.messages = 0

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Pull and serve results until ``stop`` is set (or ``until()`` says so)."""
        self.evaluator.thread.start()
        self._renewer.start()
        adopt_every = self.tuning.adopt_seconds or self.svc.settings.aggregator_lease_seconds / 3
        adopted_at = float("-inf")
        try:
            while not self.stop.is_set() and not (until is not None and until()):
                if time.monotonic() - adopted_at >= adopt_every:
                    adopted_at = time.monotonic()
                    self.adopt()
                try:
                    received = self.svc.results.pull(timeout=self.tuning.pull_seconds)
                except Exception:  # noqa: BLE001 - Pub/Sub briefly unreachable
                    log.warning("results pull failed; retrying", exc_info=True)
                    self.stop.wait(self.tuning.error_pause_seconds)
                    continue
                if received is not None:
                    self.messages += 1
                    self.dispatch(received)  # never raises: one message cannot end the loop
        finally:
            self.shutdown()

    def dispatch(self, received: Received) -> None:
        """Hand one result message to its job's slot (taking the job on first). Never raises:
        a message that is not one of ours is logged and acknowledged (dropped once, never
        redelivered); one whose job cannot be taken on now (another aggregator holds it, or
        the registry did not answer) goes back to Pub/Sub for a few seconds."""
        message: ResultMessage | None = received.message
        if message is None:
            log.error("dropping a result message that is not one of ours (%s): %r",
                      getattr(received, "problem", None) or "undecodable", received.raw[:200])
            _settle(received.ack)
            return
        slot = self.slots.get(message.job_id)
        try:
            if slot is None or slot.ended.is_set():
                slot = self._take_on(message.job_id)
        except PermanentError as exc:  # the registry refuses this job for good: drop it
            log.error("job %s: dropping its result message: %s", message.job_id, exc)
            _settle(received.ack)
            return
        except Exception:  # noqa: BLE001 - a backend outage: the message comes back later
            log.warning("job %s: could not take it on; its message comes back later",
                        message.job_id, exc_info=True)
            slot = None
        if slot is None:
            _settle(lambda: received.extend(self.tuning.busy_retry_seconds))
            return
        slot.inbox.put(("message", (message, received)))

    def adopt(self) -> list[str]:
        """Serve the published, active jobs no aggregator holds (a holder that died took their
        result messages with it; Pub/Sub returns them only after their deadline). Taking a free
        lease early costs nothing: the job's results come here anyway. Returns the jobs taken."""
        try:
            active = self.svc.registry.list_active_jobs()
        except Exception:  # noqa: BLE001 - the registry may be briefly unreachable
            log.warning("looking for unserved jobs failed", exc_info=True)
            return []
        taken = []
        for job in active:
            slot = self.slots.get(job.job_id)
            if (slot is not None and not slot.ended.is_set()) or job.phase != TRAINING \
                    or not job.is_published:
                continue
            try:
                if self._take_on(job.job_id) is not None:
                    taken.append(job.job_id)
            except Exception:  # noqa: BLE001 - the next look tries again
                log.warning("job %s: could not take it on", job.job_id, exc_info=True)
        return taken

    def _take_on(self, job_id: str) -> _JobSlot | None:
        """Take a job's lease and start serving it; None when another aggregator holds it."""
        lease = self.svc.registry.acquire_lease(lease_name(job_id), self.identity,
                                                self.svc.settings.aggregator_lease_seconds)
        if not lease:
            return None
        crash_point(self.svc.settings, "aggregator.holding_lease")
        slot = _JobSlot(self, job_id)
        try:
            job = slot.aggregator.take_on()
        except Exception:
            self.svc.registry.release_lease(lease_name(job_id), self.identity)
            raise
        slot.aggregator.listen_to_bucket()
        if lease.taken_over and job is not None:
            log.warning("job %s: taken over from %s, whose lease ran out", job_id,
                        lease.taken_over)
            self._republish_missing(slot)
        with self._lock:
            self.slots[job_id] = slot
        slot.thread.start()
        return slot

    def _republish_missing(self, slot: _JobSlot) -> None:
        """After a takeover: the current round's tasks with no result heard, published again
        (the previous holder may have died between a commit and its publish)."""
        job = slot.aggregator.job
        if job is None or job.is_terminal or job.phase != TRAINING or not job.is_published \
                or job.search:  # a search's writer publishes what is due itself
            return
        heard = {ref.task_index for ref in list_deltas(self.svc, job.job_id, job.epoch)}
        missing = [t for t in task_messages.current_round_tasks(job) if t not in heard]
        if missing:
            publish_round(self.svc, job, task_indices=missing, record=False)

    def let_go(self, slot: _JobSlot) -> None:
        """A slot ended: release its lease, send back the messages it still holds, write the
        evaluations no commit carried on their versions' documents (and, from now on, those
        the evaluator delivers late: ``_JobSlot.deliver``)."""
        with self._lock:
            if self.slots.get(slot.job_id) is slot:
                del self.slots[slot.job_id]
        with slot.closing:
            slot.closed = True
        kept = list(slot.aggregator.evaluations)
        slot.aggregator.evaluations.clear()
        for heard in list(slot.aggregator.heard.values()):
            if heard.received is not None:
                try:
                    heard.received.nack()
                except Exception:  # noqa: BLE001 - it comes back after its deadline anyway
                    log.debug("nack failed", exc_info=True)
        while True:
            try:
                kind, item = slot.inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "message":
                item[1].nack()
            elif kind == "evaluation":
                kept.append(item[0][0])
            # a "validated" score is dropped: the export scores every checkpoint it lacks
        self.record_late(slot.job_id, kept)
        if not slot.lost.is_set():
            self.svc.registry.release_lease(lease_name(slot.job_id), self.identity)

    def record_late(self, job_id: str, evaluations: list[Any]) -> None:
        """Write evaluations of a job no longer served here on their versions' documents only
        (``evaluate.record_late_evaluation``); a failure is logged: the figures are lost, the
        job is not."""
        for evaluation in evaluations:
            try:
                record_late_evaluation(self.svc, job_id, evaluation)
            except Exception:  # noqa: BLE001 - a version left unevaluated is still a version
                log.warning("job %s: could not record the evaluation of v%d", job_id,
                            evaluation.version, exc_info=True)

    def _renew(self) -> None:
        """Renew every slot's lease each third of it. A slot whose lease went to another
        aggregator, or could not be renewed before it ran out (the registry unreachable), is
        let go: past its lease it must not fold (the job's fence refuses its commits anyway)."""
        seconds = self.svc.settings.aggregator_lease_seconds
        while not self.stop.wait(seconds / 3):
            with self._lock:
                slots = list(self.slots.values())
            for slot in slots:
                try:
                    if self.svc.registry.acquire_lease(lease_name(slot.job_id), self.identity,
                                                       seconds):
                        slot.renewed_at = time.monotonic()
                        continue
                    log.error("job %s: its lease went to another aggregator; let go",
                              slot.job_id)
                    slot.lost.set()
                except Exception:  # noqa: BLE001 - try again at the next renewal
                    log.warning("job %s: lease renewal failed", slot.job_id, exc_info=True)
                    if time.monotonic() - slot.renewed_at >= seconds:
                        log.error("job %s: its lease ran out unrenewed; let go", slot.job_id)
                        slot.lost.set()

    def shutdown(self) -> None:
        """Stop serving: each slot finishes its step; leases released; the pull closed."""
        self.stop.set()
        with self._lock:
            slots = list(self.slots.values())
        for slot in slots:
            slot.thread.join(timeout=60)
        close = getattr(self.svc.results, "close", None)
        if close is not None:
            close()

