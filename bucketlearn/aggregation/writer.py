"""Folding one job's rounds into versions: the single writer of a job's head.

A ``JobAggregator`` keeps between rounds what one job's aggregation needs, so that a round costs
its fold and one commit: the job as its last commit left it, the results it has heard of
(``hear``: learners' result messages, or the deltas bucket's listing, the backstop; a chaining
learner runs ahead), and the base state it folds into, in memory since it wrote it.

``step`` does what is due: publish a round never published, fold a complete round
(``domain.rounds.sort_round``), export a finished job (``services.export``). ``services.results``
reads each result and decides whether it is applied or refused; the round is folded
(``domain.fold.fold_round``), the new state written under a write-once name, and the version
committed with the job's position, counters, next round, last evaluation and health in one
commit (``domain.job.commit_refusal`` decides inside it, the holder's fence included). Then the
next round is published, unless this one-task round's learner chains into it (R = 1).

Evaluation is off the critical path (``evaluators``): the process evaluates on a thread of its
own, calling ``evaluated`` back (``aggregate_job``, the synchronous pass, evaluates inline).
A searched job's steps are its ``search_writer.SearchWriter``'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bucketlearn import codec, layout, ports
from bucketlearn.aggregation.evaluators import Evaluator, InlineEvaluator
from bucketlearn.aggregation.refusals import refuse
from bucketlearn.aggregation.search_writer import SearchWriter
from bucketlearn.aggregation.wind_up import wind_up
from bucketlearn.domain import fold, health
from bucketlearn.domain.job import Job, commit_fields, done_tasks, fail_fields
from bucketlearn.domain.lifecycle import EXPORTING, RUNNING, TRAINING
from bucketlearn.domain.recipe import Score
from bucketlearn.domain.rounds import DeltaRef, RoundObjects, sort_round
from bucketlearn.domain.usage import added, task_usage
from bucketlearn.domain.version import Evaluation, Version
from bucketlearn.errors import TransientError
from bucketlearn.events import Outcome
from bucketlearn.faults import crash_point
from bucketlearn.logs import Stopwatch
from bucketlearn.ports import FAILED, NUDGE, Received, ResultMessage, Services, VersionCommit
from bucketlearn.services import endings, task_messages
from bucketlearn.services.caches import job_runtime
from bucketlearn.services.evaluate import Scoring, record_evaluation
from bucketlearn.services.export import export_final
from bucketlearn.services.results import (
    HeardResult,
    ResultReader,
    RoundRead,
    delete_all,
    list_deltas,
)
from bucketlearn.services.selection import Selector, checkpoint_epoch, selecting
from bucketlearn.usecases.publish import publish_round

log = logging.getLogger(__name__)


FENCE_ATTEMPTS = 10  # conditional writes of the job's fence before giving up for now


def lease_name(job_id: str) -> str:
    return f"aggregate-{job_id}"


@dataclass
class Chain:
    """A round the aggregator did not publish because the learner that trained the round before
    it chains into it (R = 1); published for everyone if its result is not heard by
    ``deadline``."""

    key: str
    worker_id: str
    deadline: float


class JobAggregator:
    """One job's aggregation, by the holder of its lease (see the module docstring).

    Args:
        svc: the services.
        job_id: the job.
        evaluator: where committed versions are evaluated (calling ``evaluated`` back).
        collect_in_background: delete a committed round's results on the reader threads.
        carry_evaluations: figures wait for the next commit (or ``flush_evaluations``).
        holder: the identity of the aggregator that holds the job's lease: ``take_on`` fences
            the job with it, and every write about the job's training expects it.
    """

    def __init__(self, svc: Services, job_id: str, evaluator: Evaluator,
                 collect_in_background: bool = False, holder: str = "",
                 carry_evaluations: bool = False) -> None:
        self.svc = svc
        self.carry_evaluations = carry_evaluations
        self.holder = holder
        # results deleted on the reader threads, after the fold published what comes next
        self.collect_in_background = collect_in_background
        self.job_id = job_id
        self.evaluator = evaluator
        self.job: Job | None = None
        self.heard: dict[str, HeardResult] = {}  # by object name
        self.chain: Chain | None = None
        self.evaluations: list[Evaluation] = []  # measured, not yet carried by a commit
        self.health: dict[str, Any] | None = None
        self.usage: dict[str, float] = {}  # the learners' measured use since the last commit
        self.wound_up = False
        self.last_commit_seconds: float | None = None
        self._fold_started = time.perf_counter()
        self.reader = ResultReader(svc)  # its result objects, read ahead and at the fold
        self.selector = Selector(svc, job_id)  # the version it exports, and when it stops
        self.search = SearchWriter(svc, job_id)  # a searched job's (``search_writer``)

    # -- what the aggregator knows ----------------------------------------------------------------
    def refresh(self) -> Job | None:
        """Read the job again (after a refused commit, a nudge, a takeover)."""
        self.job = self.svc.registry.get_job(self.job_id)
        self.reader.follow(self.job)
        self.selector.load(self.job)
        if self.job is not None and self.health is None:  # later, this holder's is the newest
            self.health = dict(self.job.health or {})
        return self.job

    def take_on(self) -> Job | None:
        """Read the job and fence it for this holder (``Job.aggregated_by``): from now on a
        commit or a refusal by any other aggregator is refused, whatever its lease says."""
        for _ in range(FENCE_ATTEMPTS):
            job = self.refresh()
            if job is None or job.is_terminal or not self.holder or (
                    job.aggregated_by == self.holder):
                return job
            fence = {"aggregated_by": self.holder}
            if self.svc.registry.update_job_if(self.job_id,
                                               {"aggregated_by": job.aggregated_by}, fence):
                self.job = job.updated(fence)
                return self.job
        raise TransientError(f"job {self.job_id}: could not take it on in {FENCE_ATTEMPTS} "
                             "attempts (its document kept changing)")

    def hear(self, message: ResultMessage, received: Received | None = None) -> None:
        """A result message: remember its object for the round it belongs to."""
        if message.kind == NUDGE or not message.path:
            return
        if message.kind == ports.SEGMENT:
            self.search.hear(message, received)
            return
        parsed = layout.parse_delta_path(message.path)
        if parsed is None or parsed.job_id != self.job_id:
            log.warning("job %s: ignoring a result message naming %r", self.job_id, message.path)
            if received is not None:
                received.ack()
            return
        earlier = self.heard.get(message.path)
        if earlier is not None and earlier.received is not None and received is not None:
            earlier.received.ack()  # the same announcement delivered twice
        self.heard[message.path] = HeardResult(DeltaRef(message.path, parsed.task_index,
                                                  message.kind == FAILED), parsed.epoch,
                                         message, received, time.time())
        if message.kind != FAILED:
            self.reader.prefetch(message.path)

    def listen_to_bucket(self) -> None:
        """The backstop: every result object and failure marker of the job's current epoch in the
        deltas bucket (a result whose message was lost, a takeover); a search's segments."""
        job = self.job
        if job is not None and job.search:
            return self.search.listen()
        if job is None:
            return
        for ref in list_deltas(self.svc, self.job_id, job.epoch):
            self.heard.setdefault(ref.name, HeardResult(ref, job.epoch))

    # -- doing what is due ------------------------------------------------------------------------
    def step(self) -> bool:
        """Publish, fold or export what is due now; True when it did something (call again)."""
        job = self.job if self.job is not None else self.refresh()
        if job is None or job.is_terminal:
            self._settle_ended(job)
            return False
        if job.search:
            did, self.job = self.search.step(job)
            if self.job.is_terminal:  # exported, or failed
                self._settle_ended(self.job)
            return did
        if job.phase == EXPORTING:
            export_final(self.svc, job, self.selector.state, self.evaluator.scoring.evaluate_parts)
            job = self.refresh()
            if job is None or job.is_terminal:
                self._settle_ended(job)
            return False
        if job.phase != TRAINING:
            return False
        if not job.is_published:
            publish_round(self.svc, job)
            self.refresh()
            return True
        objects = self._round_objects(job)
        self.drop(objects.garbage, delete=True)
        if not objects.complete and self._chain_overdue(job):
            # the chain's result may be written with its message late or lost (a Pub/Sub
            # stream that broke): the listing, before the round goes to every learner
            self.listen_to_bucket()
            objects = self._round_objects(job)
            if not objects.complete:
                self._publish_chained_round(job)
        if not objects.complete:
            return False
        return self._fold(job, objects)

    def _round_objects(self, job: Job) -> RoundObjects:
        refs = [h.ref for h in self.heard.values() if h.epoch == job.epoch]
        # a late duplicate of a folded round's task is garbage (acknowledged and deleted, so
        # it holds no prefetch slot); a chaining learner's result of a later round waits
        objects = sort_round(task_messages.current_round_tasks(job), done_tasks(job), refs,
                             job.tasks_per_epoch)
        # results of past epochs are garbage too (their rounds were folded)
        objects.garbage.extend(h.ref for h in self.heard.values() if h.epoch < job.epoch)
        return objects

    def _chain_overdue(self, job: Job) -> bool:
        chain = self.chain
        return (chain is not None and chain.key == job.round_key
                and self.svc.clock() >= chain.deadline)

    def _publish_chained_round(self, job: Job) -> None:
        chain = self.chain
        assert chain is not None
        log.warning("job %s: round %s: no result from %s's chain by its deadline; "
                    "published for every learner", self.job_id, chain.key, chain.worker_id)
        publish_round(self.svc, job, record=False)
        self.chain = None

    def next_deadline(self) -> float | None:
        """When ``step`` has something to do without a new message (a chain's deadline)."""
        return self.chain.deadline if self.chain is not None else None

    # -- the fold ---------------------------------------------------------------------------------
    def _fold(self, job: Job, objects: RoundObjects) -> bool:
        """Fold a complete round, write and commit its version, publish the next round. True
        when it did something (a commit; a result refused or found stale); False when the
        commit was refused (the job is read again)."""
        started = self.svc.clock()
        self._fold_started = time.perf_counter()
        steps = Stopwatch()
        runtime = job_runtime(self.svc, job)
        head = job.head
        assert head is not None  # a trainable job has its head since the split
        base, base_optimizer = runtime.state(head.weights_path, head.digest)
        read = self.reader.read_round(job, objects, base, base_optimizer, self.heard,
                                      self._count_usage)  # applied, refused or stale
        if read.stale:
            self.drop(read.stale, delete=True)
            return True
        if read.refused:  # their tasks train again (or failed for good: the round may be complete)
            refuse(self, job, objects, read.refused)
            return True
        steps.lap("read_seconds")
        new_version = int(job.version or 0) + 1
        assert job.plan is not None  # a trainable job has its plan since the split
        server_lr = fold.server_learning_rate(str(job.model["kind"]), len(read.results),
                                              job.plan.rates)  # recorded by _commit
        folded = fold.fold_round(base, base_optimizer, read.results, server_lr)
        if folded is not None:
            weights, optimizer = folded
            digest = codec.state_digest(weights, optimizer)
            data = codec.encode_state(weights, optimizer, {"job_id": job.job_id,
                                                           "version": new_version})
            steps.lap("fold_seconds")
            weights_path = layout.weights_path(job.job_id, new_version, layout.new_nonce())
            self.svc.store.write_bytes(self.svc.settings.models_bucket, weights_path, data,
                                       "application/octet-stream")
            steps.lap("write_seconds")
            checksum = codec.checksum(data)
        else:  # every task of the round failed: the version records it, the weights stay
            weights, optimizer = base, base_optimizer
            weights_path, checksum, digest = head.weights_path, head.checksum, head.digest
        chained = self._chained(read, digest)
        commit = self._commit(job, read, new_version, weights_path, checksum, digest, chained,
                              started, steps.laps, server_lr)
        crash_point(self.svc.settings, "aggregator.before_commit")
        committed_at = time.perf_counter()
        if not self.svc.registry.commit_version(commit):
            self.selector.changed = self.selector.changed or "selection" in commit.job_fields
            log.warning("job %s: v%d not committed: the head moved past v%d or the job ended "
                        "during the fold", job.job_id, new_version, new_version - 1)
            self.refresh()
            return False
        commit_seconds = time.perf_counter() - committed_at
        crash_point(self.svc.settings, "aggregator.after_commit")
        runtime.keep(digest, weights, optimizer, weights_path)
        self.job = job.updated(commit.job_fields)
        self._after_commit(read, chained, commit_seconds)
        self._evaluate(job, commit, weights, bool(read.results))
        log.info("job %s: v%d (epoch %d round %d, %d results, %d failed)%s", job.job_id,
                 new_version, commit.epoch, commit.round, len(read.results), len(read.failures),
                 f", chained by {chained.worker_id}" if chained else "")
        return True

    def _after_commit(self, read: RoundRead, chained: ResultMessage | None,
                      commit_seconds: float) -> None:
        """Publish the next round (unless a learner chains into it), settle the round's
        messages, collect its objects."""
        job = self.job
        assert job is not None
        self.evaluations.clear()
        self.usage.clear()
        if job.phase == TRAINING and job.status == RUNNING:
            if chained is not None:
                seconds = float(chained.stats.get("train_seconds") or 0.0)
                self.chain = Chain(job.round_key, chained.worker_id, self.svc.clock()
                                   + self.svc.settings.chain_grace_seconds + 3 * seconds)
            else:
                self.chain = None
                publish_round(self.svc, job, record=False)
        self.last_commit_seconds = commit_seconds
        self.drop(read.folded, delete=True, background=self.collect_in_background)

    def _evaluate(self, job: Job, commit: VersionCommit, weights: list[Any],
                  trained: bool) -> None:
        """Hand a committed version to the evaluator: its holdout figures when it applied a
        result, its validation score when it closes an epoch of a job that selects."""
        version = commit.version.version
        current = self.job
        if trained and current is not None:
            self.evaluator.submit(self.svc, current, version, weights, self.evaluated)
        closed = checkpoint_epoch(job, commit.job_fields)
        if closed is not None and selecting(job) and self.selector.state.stop_epoch is None \
                and current is not None:
            self.evaluator.score_checkpoint(self.svc, current, closed, version, weights, self.validated)

    def _chained(self, read: RoundRead, digest: str) -> ResultMessage | None:
        """The message of a one-task round's result whose learner chains into the next round,
        when the fold is exactly that result's end state (R = 1)."""
        if len(read.results) != 1 or read.failures:
            return None
        message = read.messages.get(read.results[0].task_index)
        if message is None or not message.chained or message.end_digest != digest:
            return None
        return message

    def _commit(self, job: Job, read: RoundRead, new_version: int, weights_path: str,
                checksum: str | None, digest: str, chained: ResultMessage | None,
                planning_started: float, timings: dict[str, float],
                server_lr: float) -> VersionCommit:
        """The version document and the job's new fields, as one commit."""
        job_id, head = job.job_id, job.head
        assert head is not None
        results, failures = read.results, read.failures
        train_loss = fold.weighted_mean_loss(results)
        samples = sum(r.examples for r in results)
        now = self.svc.clock()
        evaluation = self.evaluations[-1] if self.evaluations else None
        used = {**self.svc.usage(job_id),
                "aggregator_seconds": round(time.perf_counter() - self._fold_started, 6)}
        version = Version(  # its holdout figures come with a later commit, or on their own
            new_version, weights_path, checksum, parent=new_version - 1, epoch=job.epoch,
            round=job.round,
            tasks_applied=tuple(layout.task_id_for(job_id, job.epoch, r.task_index)
                                for r in results),
            tasks_failed=tuple(layout.task_id_for(job_id, job.epoch, f.task_index)
                               for f in failures),
            samples=samples, train_loss=train_loss, created_at=now,
            delta_norms=tuple(round(fold.delta_norm(r.delta), 6) for r in results),
            server_lr=server_lr,
            aggregator={"planning_started_at": planning_started, **timings},
            digest=digest, evaluation=evaluation, task_stats=read.stats)
        new_head = head.advanced(new_version, weights_path, checksum or "", bool(results),
                                 train_loss, digest)
        if evaluation is not None:
            new_head = new_head.with_evaluation(evaluation)
        job_fields = self.selector.fields(job) | commit_fields(
            job, new_head, len(results), [f.error for f in failures], samples,
            fold.running_norm(job.delta_norm, results),
            added(added(job.usage, self.usage), used), self.health, now,
            chained.worker_id if chained else None)
        return VersionCommit(job_id=job_id, base_version=new_version - 1, version=version,
                             epoch=job.epoch, round=job.round, job_fields=job_fields,
                             holder=self.holder)

    def _count_usage(self, message: ResultMessage | None) -> None:
        """Add a folded task's learner-side use to what the next commit records."""
        if message is not None:
            self.usage = added(self.usage, task_usage(message.stats))

    def drop(self, refs: list[DeltaRef], delete: bool, background: bool = False) -> None:
        """Forget these objects: acknowledge their messages, delete them from the bucket (on the
        reader threads when ``background``: only a committed round's results, which no listing
        can bring back into a round; a refused or stale result is deleted before the job's
        thread goes on, or a listing could hear it again and refuse it twice)."""
        names = []
        for ref in refs:
            self.reader.forget(ref.name)
            heard = self.heard.pop(ref.name, None)
            if heard is not None and heard.received is not None:
                _settle(heard.received.ack)
            if delete:
                names.append(ref.name)
        if names and background:
            self.reader.pool().submit(delete_all, self.svc, names)
        else:
            delete_all(self.svc, names)

    def _settle_ended(self, job: Job | None) -> None:
        """The job has ended: settle every message heard, then wind it up (a cancelled job's
        model exported, its work objects, old weights and results deleted: ``ending``)."""
        self.drop([h.ref for h in list(self.heard.values())], delete=False)
        self.search.settle_all()
        if job is not None and not self.wound_up:
            wind_up(self.svc, job)
            self.wound_up = True

    # -- evaluation -------------------------------------------------------------------------------
    def evaluated(self, evaluation: Evaluation, loss: float) -> str | None:
        """An evaluation of one of this job's versions is in: watch the job's health (a
        diverging job ends FAILED now); keep the figures for the next commit. Returns the
        reason the job was failed, if it was."""
        job = self.job
        if job is None:
            return None
        runtime = job_runtime(self.svc, job)
        spec = runtime.spec
        chance = spec.target_std ** 2 if spec.regression else None
        after, reason = health.observe(health.Health.from_dict(self.health), evaluation.version,
                                       loss, len(job.classes), float(job.options["learning_rate"]),
                                       chance)
        self.health = after.to_dict()
        self.evaluations.append(evaluation)
        if reason is None and not self.carry_evaluations:
            self.job = record_evaluation(self.svc, job, evaluation)
            self.evaluations.clear()
        if reason is not None:
            now = self.svc.clock()
            if endings.end_job(self.svc.registry, job.job_id,
                            fail_fields(now, reason, health=self.health))[0]:
                log.error("job %s: %s", job.job_id, reason)
            self.refresh()
        return reason

    def validated(self, score: Score) -> None:
        """A checkpoint's validation score is in: advance the selection; stop training once it
        says so (the job goes to its export)."""
        if self.job is not None and not self.job.is_terminal:
            self.selector.scored(self.job, score)
            if self.selector.stop_if_due(self.job, self.holder):
                self.refresh()

    def flush_evaluations(self, older_than: float) -> None:
        """Write the newest evaluation on its own when no commit has carried it for
        ``older_than`` seconds (a round that trains for long)."""
        if not self.evaluations or self.job is None or self.job.head is None:
            return
        newest = self.evaluations[-1]
        if self.svc.clock() - newest.evaluated_at < older_than:
            return
        self.job = record_evaluation(self.svc, self.job, newest)
        self.evaluations.clear()


def _settle(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:  # noqa: BLE001 - an unsettled message comes back; it is then garbage
        log.debug("could not settle a result message", exc_info=True)


def aggregate_job(svc: Services, job_id: str, scoring: Scoring | None = None) -> Outcome:
    """One synchronous pass over a job (the tests, the simulation): take its lease, hear the
    deltas bucket, fold every complete round (measured with ``scoring``) and export it when done.

    Returns:
        ACCEPTED when it ran; BUSY if another aggregator holds the job's lease.
    """
    holder = f"{svc.identity}-{layout.new_nonce()}"
    if not svc.registry.acquire_lease(lease_name(job_id), holder,
                                      svc.settings.aggregator_lease_seconds):
        return Outcome.BUSY
    try:
        aggregator = JobAggregator(svc, job_id, InlineEvaluator(scoring), holder=holder)
        aggregator.take_on()
        deadline = time.monotonic() + svc.settings.aggregate_budget_seconds
        for _ in range(100_000):
            job = aggregator.refresh()
            aggregator.listen_to_bucket()
            if not aggregator.step() or time.monotonic() > deadline:
                break
            if job is not None and not svc.registry.acquire_lease(
                    lease_name(job_id), holder, svc.settings.aggregator_lease_seconds):
                break
    finally:
        svc.registry.release_lease(lease_name(job_id), holder)
    return Outcome.ACCEPTED
