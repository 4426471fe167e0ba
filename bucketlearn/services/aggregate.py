"""Folding one job's rounds into versions: the single writer of a job's head.

A ``JobAggregator`` holds what one job's aggregation needs between rounds, so that a round costs
its fold and one commit, not a re-read of everything:

* the job as its last commit left it (a refused commit reads it again);
* the results it has heard of (``hear``: the result messages learners publish, or the deltas
  bucket's listing, the backstop), for the current round and the ones after it (a chaining
  learner runs ahead);
* the base state it folds into, in memory since it wrote it.

``step`` does what is due: publish a round never published, fold a complete round, export a
finished job. A round is complete when every task of it has a result or a failure marker
(``domain.rounds.plan_round``, pure); each result is checked (``domain.fold.check_delta``: a
non-finite or outlying delta is refused and its task trained again; a result trained from
another base than the head is never folded), the round folded (``domain.fold.fold_round``), the
new state written under a write-once name and the version committed with the job's new position,
counters, the next round's publish record, the figures of the last evaluation and the job's
health, in one commit (``domain.job.commit_refusal`` decides inside it). Then the next round is
published, unless the learner that trained this one-task round chains into it (R = 1), and the
round's messages are acknowledged.

Evaluation is off the critical path: the long-running aggregator (``services.aggregator``)
evaluates in a thread of its own and hands the figures to the next commit; ``aggregate_job``, the
synchronous pass used by the tests and the in-process simulation, evaluates each
version as it commits it and writes the figures at once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from bucketlearn import codec, layout
from bucketlearn.bootstrap import Services
from bucketlearn.codec import CorruptObjectError
from bucketlearn.domain import fold, health
from bucketlearn.domain.job import (
    DONE,
    EXPORTING,
    RUNNING,
    TRAINING,
    Evaluation,
    Job,
    Version,
    decide_after_fold,
    ending_fields,
    is_terminal,
    round_key,
)
from bucketlearn.domain.job import FAILED as JOB_FAILED
from bucketlearn.domain.metrics import holdout_fields, regression_fields, regression_headline
from bucketlearn.domain.rounds import DeltaRef, RoundPlan, plan_round
from bucketlearn.domain.target import REGRESSION
from bucketlearn.errors import NotFoundError
from bucketlearn.events import Outcome
from bucketlearn.faults import crash_point
from bucketlearn.ml.model import export_keras, model_inputs
from bucketlearn.ml.training import evaluate_detail, evaluate_parts
from bucketlearn.ports import FAILED, NUDGE, Received, ResultMessage, VersionCommit
from bucketlearn.services import jobs
from bucketlearn.services.ending import wind_up
from bucketlearn.services.publish import announce_failure, publish_round
from bucketlearn.services.runtime import JobRuntime, job_runtime

log = logging.getLogger(__name__)

MAX_REFUSALS = 3  # a task whose result is refused this many times fails for good
READERS = 8  # result objects of a round read at once
PREFETCH_LIMIT = 64  # result objects read ahead of their round's fold, at most


def lease_name(job_id: str) -> str:
    return f"aggregate-{job_id}"


@dataclass
class Heard:
    """A result object or failure marker the aggregator knows of: from its message (which is
    acknowledged once the result is folded or found to be garbage) or from a listing."""

    ref: DeltaRef
    epoch: int
    message: ResultMessage | None = None
    received: Received | None = None
    heard_at: float | None = None  # wall clock, when its message was handed to this job


class Evaluator(Protocol):
    """Where a committed version's holdout evaluation happens."""

    def submit(self, aggregator: JobAggregator, version: int, weights: list[Any]) -> None: ...


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
        evaluator: where committed versions are evaluated.
    """

    def __init__(self, svc: Services, job_id: str, evaluator: Evaluator,
                 collect_in_background: bool = False) -> None:
        self.svc = svc
        # delete a committed round's results on the reader threads, after the fold has
        # published what comes next, not on the job's thread (the long-running aggregator):
        # R deletes in sequence sat between a parallel round's publish and the next results
        self.collect_in_background = collect_in_background
        self.job_id = job_id
        self.evaluator = evaluator
        self.job: Job | None = None
        self.heard: dict[str, Heard] = {}  # by object name
        self.chain: Chain | None = None
        self.evaluations: list[Evaluation] = []  # measured, not yet carried by a commit
        self.health: dict[str, Any] | None = None
        self.usage: dict[str, float] = {}  # the learners' measured use since the last commit
        self.folds = 0
        self.wound_up = False
        self.last_commit_seconds: float | None = None
        self._fold_started = time.perf_counter()
        self._readers: ThreadPoolExecutor | None = None
        # result objects read (and decoded) as their messages come, before the round is complete
        self._prefetched: dict[str, Future[_Loaded]] = {}

    # -- what the aggregator knows ----------------------------------------------------------------
    def refresh(self) -> Job | None:
        """Read the job again (after a refused commit, a nudge, a takeover)."""
        self.job = self.svc.registry.get_job(self.job_id)
        if self.job is not None and self.health is None:  # later, this holder's is the newest
            self.health = dict(self.job.health or {})
        return self.job

    def hear(self, message: ResultMessage, received: Received | None = None) -> None:
        """A result message: remember its object for the round it belongs to."""
        if message.kind == NUDGE or not message.path:
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
        self.heard[message.path] = Heard(DeltaRef(message.path, parsed.task_index,
                                                  message.kind == FAILED), parsed.epoch,
                                         message, received, time.time())
        if message.kind != FAILED:
            self._prefetch(message.path)

    def _prefetch(self, name: str) -> None:
        """Read and decode a result object now, while the rest of its round trains: the fold
        of a complete round then waits only for its last result's read (a round of R tasks
        read its R objects after the last one came)."""
        if name in self._prefetched or len(self._prefetched) >= PREFETCH_LIMIT:
            return
        self._prefetched[name] = self._pool().submit(self._load, name)

    def _pool(self) -> ThreadPoolExecutor:
        if self._readers is None:
            self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="read-results")
        return self._readers

    def _load(self, name: str) -> _Loaded:
        raw = self._read_object(name)
        return _Loaded(None if raw is None else _decode_result(raw, name))

    def _loaded(self, name: str) -> Future[_Loaded]:
        """A result object's read: the one under way since its message came, or a new one
        (also when that one failed: storage may be back)."""
        reading = self._prefetched.pop(name, None)
        if reading is not None and not (reading.done() and reading.exception() is not None):
            return reading
        return self._pool().submit(self._load, name)

    def listen_to_bucket(self) -> None:
        """The backstop: every result object and failure marker of the job's current epoch in the
        deltas bucket (a result whose message was lost, a takeover)."""
        job = self.job
        if job is None:
            return
        for ref in list_deltas(self.svc, self.job_id, job.epoch):
            self.heard.setdefault(ref.name, Heard(ref, job.epoch))

    # -- doing what is due ------------------------------------------------------------------------
    def step(self) -> bool:
        """Publish, fold or export what is due now; True when it did something (call again)."""
        job = self.job if self.job is not None else self.refresh()
        if job is None or job.is_terminal:
            self._settle_ended(job)
            return False
        if job.phase == EXPORTING:
            export_final(self.svc, job)
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
        plan = self._plan(job)
        self._drop(plan.garbage, delete=True)
        if not plan.complete and self._chain_overdue(job):
            # the chain's result may be written with its message late or lost (a Pub/Sub
            # stream that broke): the listing, before the round goes to every learner
            self.listen_to_bucket()
            plan = self._plan(job)
            if not plan.complete:
                self._publish_chained_round(job)
        if not plan.complete:
            return False
        return self._fold(job, plan)

    def _plan(self, job: Job) -> RoundPlan:
        refs = [h.ref for h in self.heard.values() if h.epoch == job.epoch]
        plan = plan_round(jobs.current_round_tasks(job), (), refs, job.tasks_per_epoch)
        # results of past epochs are garbage too (their rounds were folded)
        plan.garbage.extend(h.ref for h in self.heard.values() if h.epoch < job.epoch)
        return plan

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
    def _fold(self, job: Job, plan: RoundPlan) -> bool:
        """Fold a complete round, write and commit its version, publish the next round. True
        when it did something (a commit; a result refused or found stale); False when the
        commit was refused (the job is read again)."""
        started = self.svc.clock()
        self._fold_started = time.perf_counter()
        steps = _Stopwatch()
        runtime = job_runtime(self.svc, job)
        head = job.head
        assert head is not None  # a trainable job has its head since the split
        base, base_optimizer = runtime.state(head.weights_path, head.digest)
        read = self._read_round(job, plan, base, base_optimizer)
        if read.stale:
            self._drop(read.stale, delete=True)
            return True
        if read.refused:  # their tasks train again (or failed for good: the round may be complete)
            self._refuse(job, plan, read.refused)
            return True
        steps.lap("read_seconds")
        new_version = int(job.version or 0) + 1
        server_lr = fold.server_learning_rate(str(job.model["kind"]), len(read.results),
                                              jobs.job_plan(job).rates)  # recorded by _commit
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
            log.warning("job %s: v%d not committed: the head moved past v%d or the job ended "
                        "during the fold", job.job_id, new_version, new_version - 1)
            self.refresh()
            return False
        commit_seconds = time.perf_counter() - committed_at
        crash_point(self.svc.settings, "aggregator.after_commit")
        runtime.keep(digest, weights, optimizer, weights_path)
        self.job = job.updated(commit.job_fields)
        self._after_commit(read, chained, commit_seconds)
        if read.results:
            self.evaluator.submit(self, new_version, weights)
        self.folds += 1
        log.info("job %s: v%d (epoch %d round %d, %d results, %d failed)%s", job.job_id,
                 new_version, commit.epoch, commit.round, len(read.results), len(read.failures),
                 f", chained by {chained.worker_id}" if chained else "")
        return True

    def _after_commit(self, read: _Read, chained: ResultMessage | None,
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
        self._drop(read.folded, delete=True, background=self.collect_in_background)

    def _chained(self, read: _Read, digest: str) -> ResultMessage | None:
        """The message of a one-task round's result whose learner chains into the next round,
        when the fold is exactly that result's end state (R = 1)."""
        if len(read.results) != 1 or read.failures:
            return None
        message = read.messages.get(read.results[0].task_index)
        if message is None or not message.chained or message.end_digest != digest:
            return None
        return message

    def _commit(self, job: Job, read: _Read, new_version: int, weights_path: str,
                checksum: str | None, digest: str, chained: ResultMessage | None,
                planning_started: float, timings: dict[str, float],
                server_lr: float) -> VersionCommit:
        """The version document and the job's new fields, as one commit."""
        job_id, head = job.job_id, job.head
        assert head is not None
        plan = jobs.job_plan(job)
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
            tasks_failed=tuple(layout.task_id_for(job_id, job.epoch, int(f["task_index"]))
                               for f in failures),
            samples=samples, train_loss=train_loss, created_at=now,
            delta_norms=tuple(round(fold.delta_norm(r.delta), 6) for r in results),
            server_lr=server_lr,
            aggregator={"planning_started_at": planning_started, **timings},
            digest=digest, evaluation=evaluation, task_stats=read.stats)
        tasks_failed = job.tasks_failed + len(failures)
        new_head = head.advanced(new_version, weights_path, checksum or "", bool(results),
                                 train_loss, digest)
        if evaluation is not None:
            new_head = new_head.with_evaluation(evaluation)
        job_fields: dict[str, Any] = {
            "version": new_version, "status": RUNNING, "updated_at": now,
            "tasks_applied": job.tasks_applied + len(results), "tasks_failed": tasks_failed,
            "samples_seen": job.samples_seen + samples,
            "delta_norm": fold.running_norm(job.delta_norm, results),
            "head": new_head.to_doc(),
            "usage": _added(_added(job.usage, self.usage), used),
        }
        if self.health is not None and self.health != dict(job.health or {}):
            job_fields["health"] = self.health
        if job.started_at is None:
            job_fields["started_at"] = now
        after = decide_after_fold(job.epoch, job.round, plan.rounds_per_epoch, plan.epochs,
                                  tasks_failed, int(job.options.get("max_failed_tasks", 0)),
                                  failures[0]["error"] if failures else None, now)
        job_fields.update(after.job_fields)
        if after.training_continues:  # the next round's publish record, in this commit
            following = round_key(after.job_fields.get("epoch", job.epoch),
                                  after.job_fields["round"])
            job_fields.update(published=following, published_at=now,
                              chained_by=chained.worker_id if chained else None)
        return VersionCommit(job_id=job_id, base_version=new_version - 1, version=version,
                             epoch=job.epoch, round=job.round, job_fields=job_fields)

    def _read_round(self, job: Job, plan: RoundPlan, base: list[Any],
                    base_optimizer: list[Any]) -> _Read:
        """Read and check every result of a complete round (``READERS`` at a time); read its
        failure markers."""
        read = _Read()
        shapes = [tuple(b.shape) for b in base]
        optimizer_shapes = [tuple(o.shape) for o in base_optimizer]
        recent = job.delta_norm
        head = job.head
        assert head is not None
        items = sorted(plan.results.items())
        reads = [self._loaded(ref.name) for _, ref in items]
        for (task_index, ref), reading in zip(items, reads, strict=True):
            loaded = reading.result()
            heard = self.heard.get(ref.name)
            message = heard.message if heard is not None else None
            if message is not None:
                read.messages[task_index] = message
            problem, result, meta = _check_result(loaded, ref.name, base, shapes,
                                                  optimizer_shapes, recent)
            based_on = (message.base_digest if message is not None else "") or str(
                meta.get("base_digest") or "")
            if result is not None and based_on and head.digest and based_on != head.digest:
                read.stale.append(ref)  # trained from another state (a broken chain): garbage
                continue
            if problem is None:
                assert result is not None
                read.results.append(result)
                read.stats[layout.task_id_for(job.job_id, job.epoch, task_index)] = _task_stats(
                    message, meta, heard.heard_at if heard is not None else None)
                self._count_usage(message)
            else:
                read.refused[task_index] = problem
            read.folded.append(ref)
        for task_index, ref in sorted(plan.failures.items()):
            try:
                marker = json.loads(self._read_object(ref.name) or b"{}")
                reason = str(marker.get("error") or "task failed")
            except Exception:  # noqa: BLE001 - the marker's existence is what counts
                reason = "task failed"
            read.failures.append({"task_index": task_index, "error": reason[:2000]})
            read.folded.append(ref)
        return read

    def _read_object(self, name: str) -> bytes | None:
        try:
            return self.svc.store.read_bytes(self.svc.settings.deltas_bucket, name)
        except NotFoundError:
            return None

    def _count_usage(self, message: ResultMessage | None) -> None:
        """Add a folded task's learner-side use to what the next commit records."""
        if message is None:
            return
        for key, value in (message.stats.get("usage") or {}).items():
            if isinstance(value, (int, float)):
                self.usage[key] = self.usage.get(key, 0.0) + float(value)
        cpu = message.stats.get("cpu_seconds")
        if isinstance(cpu, (int, float)):
            self.usage["worker_cpu_seconds"] = self.usage.get("worker_cpu_seconds", 0.0) + cpu

    def _refuse(self, job: Job, plan: RoundPlan, refused: dict[int, str]) -> None:
        """Never fold a refused result: delete it and train its task again, or fail the task for
        good once its results were refused ``MAX_REFUSALS`` times in this epoch."""
        job_id, epoch = job.job_id, job.epoch
        prefix = f"{epoch}-"
        counts = {k: int(v) for k, v in (job.refusals or {}).items() if k.startswith(prefix)}
        retrain = []
        for task_index, reason in sorted(refused.items()):
            task_id = layout.task_id_for(job_id, epoch, task_index)
            key = f"{prefix}{task_index}"
            counts[key] = counts.get(key, 0) + 1
            log.error("job %s: refused the result of %s (%s)", job_id, task_id, reason)
            self._drop([plan.results[task_index]], delete=True)
            if counts[key] >= MAX_REFUSALS:
                path = announce_failure(self.svc, job_id, epoch, task_index,
                                        f"task {task_id}: its result was refused {counts[key]} "
                                        f"times, last because {reason}", round_index=job.round)
                self.heard.setdefault(path, Heard(DeltaRef(path, task_index, True), epoch))
            else:
                retrain.append(task_index)
        if retrain:
            shards = job_runtime(self.svc, job).manifest.shards
            self.svc.queue.publish(jobs.round_messages(job, shards, retrain))
        first = min(refused)
        last = f"{layout.task_id_for(job_id, epoch, first)}: {refused[first]}"
        fields = {"refusals": counts, "deltas_refused": job.deltas_refused + len(refused),
                  "last_refusal": last[:2000], "updated_at": self.svc.clock()}
        self.svc.registry.update_job(job_id, fields)
        self.job = job.updated(fields)

    def _drop(self, refs: list[DeltaRef], delete: bool, background: bool = False) -> None:
        """Forget these objects: acknowledge their messages, delete them from the bucket (on the
        reader threads when ``background``: only a committed round's results, which no listing
        can bring back into a round; a refused or stale result is deleted before the job's
        thread goes on, or a listing could hear it again and refuse it twice)."""
        names = []
        for ref in refs:
            reading = self._prefetched.pop(ref.name, None)
            if reading is not None:
                reading.cancel()
            heard = self.heard.pop(ref.name, None)
            if heard is not None and heard.received is not None:
                _settle(heard.received.ack)
            if delete:
                names.append(ref.name)
        if names and background:
            self._pool().submit(_delete_all, self.svc, names)
        else:
            _delete_all(self.svc, names)

    def _settle_ended(self, job: Job | None) -> None:
        """The job has ended: settle every message heard, then wind it up (a cancelled job's
        model exported, its work objects, old weights and results deleted: ``ending``)."""
        self._drop([h.ref for h in list(self.heard.values())], delete=False)
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
        if reason is not None:
            now = self.svc.clock()
            if jobs.end_job(self.svc.registry, job.job_id, ending_fields(
                    JOB_FAILED, now, error=reason, health=self.health))[0]:
                log.error("job %s: %s", job.job_id, reason)
            self.refresh()
        return reason

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


@dataclass
class _Read:
    """A complete round's objects, read and checked."""

    results: list[fold.TaskResult] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    stale: list[DeltaRef] = field(default_factory=list)
    folded: list[DeltaRef] = field(default_factory=list)
    messages: dict[int, ResultMessage] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Loaded:
    """A result object as read: what its bytes decode to (the arrays, optimizer state and
    metadata, or the reason they could not be decoded); None when it was gone."""

    decoded: tuple[list[Any], list[Any], dict[str, Any]] | str | None  # str: why it is not

    @property
    def gone(self) -> bool:
        return self.decoded is None


def _decode_result(raw: bytes, name: str) -> tuple[list[Any], list[Any], dict[str, Any]] | str:
    try:
        arrays, optimizer, meta = codec.decode_state(raw, name)
    except CorruptObjectError as exc:
        return f"unreadable: {exc}"
    except ValueError as exc:
        return str(exc)
    return list(arrays), list(optimizer), dict(meta)


def _check_result(loaded: _Loaded, name: str, base: list[Any], shapes: list[Any],
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


def _task_stats(message: ResultMessage | None, meta: dict[str, Any],
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


def _added(before: Any, more: dict[str, float]) -> dict[str, float]:
    total = {k: float(v) for k, v in (before or {}).items() if isinstance(v, (int, float))}
    for key, value in more.items():
        total[key] = round(total.get(key, 0.0) + value, 6)
    return total


def record_evaluation(svc: Services, job: Job, evaluation: Evaluation) -> Job:
    """Write one version's figures on its own document, and on the job's head while the head
    is that version; return the job as it then stands."""
    assert job.head is not None
    head = job.head.with_evaluation(evaluation)
    fields = {**evaluation.figures, "evaluated_at": evaluation.evaluated_at,
              "eval_seconds": evaluation.seconds}
    if svc.registry.record_evaluation(job.job_id, evaluation.version, fields, head):
        return job.updated({"head": head.to_doc()})
    return job


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


def _settle(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:  # noqa: BLE001 - an unsettled message comes back; it is then garbage
        log.debug("could not settle a result message", exc_info=True)


def _delete_all(svc: Services, names: list[str]) -> None:
    for name in names:
        _delete(svc, name)


def _delete(svc: Services, name: str) -> None:
    try:
        svc.store.delete(svc.settings.deltas_bucket, name)
    except Exception:  # noqa: BLE001 - leftover objects are ignored and expire by lifecycle
        log.debug("could not delete %s", name, exc_info=True)


class InlineEvaluator:
    """Evaluate each committed version at once and write its figures (the synchronous pass)."""

    def submit(self, aggregator: JobAggregator, version: int, weights: list[Any]) -> None:
        job = aggregator.job
        if job is None:
            return
        found = evaluate_version(aggregator.svc, job, weights, version)
        if found is None:
            return
        evaluation, loss = found
        if aggregator.evaluated(evaluation, loss) is None and aggregator.job is not None:
            aggregator.job = record_evaluation(aggregator.svc, aggregator.job, evaluation)
            aggregator.evaluations.clear()


def evaluate_version(svc: Services, job: Job, weights: list[Any], version: int
                     ) -> tuple[Evaluation, float] | None:
    """One version's holdout figures on the job's fixed evaluation sample (None if it could not
    be evaluated: an unevaluated version is still a good version)."""
    started = time.perf_counter()
    try:
        runtime = job_runtime(svc, job)
        x_eval, y_eval = runtime.holdout(svc.settings.eval_max_rows)
        with runtime.lock:
            found = evaluate_detail(runtime.model, weights, x_eval, y_eval, runtime.spec.task)
    except Exception:  # noqa: BLE001 - training goes on; the export evaluates the final model
        log.warning("job %s: could not evaluate v%d", job.job_id, version, exc_info=True)
        return None
    figures = {"holdout_accuracy": found.accuracy, "holdout_loss": found.loss,
               **_figures(found, runtime.spec.regression)}
    evaluation = Evaluation(version, {k: v for k, v in figures.items() if v is not None},
                            svc.clock(), round(time.perf_counter() - started, 6))
    log.info("job %s: v%d holdout %s", job.job_id, version, _headline(found))
    return evaluation, found.loss


def aggregate_job(svc: Services, job_id: str) -> Outcome:
    """One synchronous aggregation pass over a job (the tests, the in-process simulation): take
    its lease, hear what the deltas bucket holds, fold every
    complete round (evaluating each version as it is committed) and export a finished job.

    Returns:
        ACCEPTED when it ran; BUSY if another aggregator holds the job's lease.
    """
    holder = f"{svc.identity}-{layout.new_nonce()}"
    if not svc.registry.acquire_lease(lease_name(job_id), holder,
                                      svc.settings.aggregator_lease_seconds):
        return Outcome.BUSY
    try:
        aggregator = JobAggregator(svc, job_id, InlineEvaluator())
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


def _figures(found: Any, regression: bool) -> dict[str, Any]:
    """A version's holdout figures as its document stores them (classes or a numeric target)."""
    return regression_fields(found.report) if regression else holdout_fields(found.report)


def _headline(found: Any) -> str:
    """The holdout figures of a log line: accuracy, or a regression's RMSE, MAE and R²."""
    if found.accuracy is not None:
        return f"accuracy {found.accuracy:.4f}"
    report = found.report
    return regression_headline(report.get("rmse"), report.get("mae"), report.get("r2"))


class _Stopwatch:
    """Seconds between successive ``lap`` calls, by name (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 6)
        self._last = now


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


def export_final(svc: Services, job: Job) -> None:
    """Export the head as ``models/<job>/latest.keras`` (and ``v<N>.keras``), then mark DONE;
    a degenerate final model ends the job FAILED instead (``domain.health``)."""
    started = time.perf_counter()
    runtime = job_runtime(svc, job)
    assert job.head is not None
    weights = runtime.state(job.head.weights_path, job.head.digest)[0]
    with runtime.lock:
        # the whole holdout, one part at a time: never all of it in memory
        found = evaluate_parts(runtime.model, weights, runtime.holdout_parts(),
                               runtime.spec.task)
        model_data = _export_bytes(job, runtime, found)
    manifest = runtime.manifest
    now = svc.clock()
    rate = float(job.options["learning_rate"])
    problem = (health.degenerate_regression(found.loss, rate) if runtime.spec.regression else
               health.degenerate_model(found.predicted_counts, found.true_counts,
                                       manifest.classes, found.loss, rate))
    if problem is not None:
        if jobs.end_job(svc.registry, job.job_id,
                        ending_fields(JOB_FAILED, now, error=problem))[0]:
            log.error("job %s: %s", job.job_id, problem)
        return
    if is_terminal(svc.registry.get_job(job.job_id)):
        log.info("job %s ended during its final evaluation: not exported", job.job_id)
        return
    figures = _figures(found, runtime.spec.regression)
    version = int(job.version or 0)
    bucket = svc.settings.models_bucket
    svc.store.write_bytes(bucket, layout.model_path(job.job_id, version), model_data,
                          "application/octet-stream")
    svc.store.write_bytes(bucket, layout.model_path(job.job_id), model_data,
                          "application/octet-stream")
    head = job.head.evaluated(found.accuracy, found.loss, figures)  # the whole holdout's
    used = {**svc.usage(job.job_id), "aggregator_seconds": round(time.perf_counter() - started,
                                                                 6)}
    ended, current = jobs.end_job(svc.registry, job.job_id, ending_fields(
        DONE, now, model_path=layout.model_path(job.job_id), head=head.to_doc(),
        final_holdout_rows=found.rows, usage=_added(job.usage, used),  # the export's too
    ))
    if not ended:  # cancelled during the export: it stays so (the files are its head version)
        log.info("job %s ended (%s) during its export: not marked DONE", job.job_id,
                 current.status if current is not None else None)
        return
    log.info("job %s: DONE at v%d, holdout %s", job.job_id, version, _headline(found))


def _export_bytes(job: Job, runtime: JobRuntime, found: Any) -> bytes:
    """The ``.keras`` archive of the model as evaluated (its weights are the head's)."""
    figures = _figures(found, runtime.spec.regression)
    return export_keras(runtime.model, model_sidecar(job, runtime.manifest, found.accuracy,
                                                     figures))


def model_sidecar(job: Job, manifest: Any, accuracy: float | None,
                  figures: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``bucketlearn.json`` in the exported archive says about the model: its columns,
    classes (or numeric target: ``task``, the target's training mean and std) and figures."""
    return {
        "format": 1,
        "job_id": job.job_id,
        "version": int(job.version or 0),
        "feature_names": manifest.feature_names,
        "label_column": manifest.label_column,
        "class_names": manifest.classes,
        "label_kind": manifest.label_kind,
        "holdout_accuracy": accuracy,
        "options": job.options,
        "source": manifest.source,
        **model_inputs(manifest.columns, manifest.missing_values),
        **target_sidecar(manifest, figures),
    }


def target_sidecar(manifest: Any, figures: dict[str, Any] | None) -> dict[str, Any]:
    """A regression model's part of the sidecar (nothing for classes, as before)."""
    if manifest.target is None:
        return {}
    return {"task": REGRESSION, "target_mean": manifest.target_mean,
            "target_std": manifest.target_std,
            **{k: (figures or {}).get(k) for k in ("holdout_rmse", "holdout_mae", "holdout_r2")}}
