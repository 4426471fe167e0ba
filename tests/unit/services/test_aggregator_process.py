"""The long-running aggregator and chaining learners, on the in-memory ports, in threads.

These run the real ``AggregatorService`` (results pulled from the results topic, a slot per job,
leases, the background evaluator) against real ``Learner`` threads: the shape the stack runs,
without its processes. What the e2e suite checks on the emulators, this checks in seconds.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bucketlearn import codec
from bucketlearn.adapters.memory import MemoryRegistry
from bucketlearn.aggregation.process import AggregatorService, AggregatorTuning
from bucketlearn.bootstrap import memory_services
from bucketlearn.config import Settings
from bucketlearn.domain.lifecycle import CANCELLED, DONE, FAILED
from bucketlearn.domain.usage import estimate_cost
from bucketlearn.faults import inject
from bucketlearn.ingest.parts import part_address
from bucketlearn.loops.heartbeat import LearnerTuning
from bucketlearn.loops.learner import Learner
from bucketlearn.options import NONE, JobOptions
from bucketlearn.ports import NUDGE, ResultMessage, RuntimeCache
from bucketlearn.services.caches import AHEAD, part_cache
from bucketlearn.services.evaluate import Scoring
from bucketlearn.usecases.train_local import train_local
from bucketlearn.usecases.waiting import wait_terminal
from tests.unit import steps
from tests.unit.helpers import wait_until, write_blobs_csv

TUNING = AggregatorTuning(pull_seconds=0.05, idle_seconds=30.0, error_pause_seconds=0.05)
LEARNING = LearnerTuning(transient_backoff_seconds=0.01, heartbeat_seconds=0.5,
                         report_min_seconds=0.05, chain_poll_seconds=0.005,
                         chain_confirm_seconds=10.0)


class CountingRegistry(MemoryRegistry):
    """Counts the writes each collection's documents get (job documents, task documents)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: Counter[str] = Counter()

    def _count(self, what: str, done: bool = True) -> None:
        if done:
            self.writes[what] += 1

    def update_job(self, job_id, fields):
        super().update_job(job_id, fields)
        self._count("job")

    def update_job_if(self, job_id, expect, fields):
        done = super().update_job_if(job_id, expect, fields)
        self._count("job", done)
        return done

    def start_training(self, *args, **kwargs):
        done = super().start_training(*args, **kwargs)
        self._count("job", done)
        return done

    def commit_version(self, commit):
        done = super().commit_version(commit)
        self._count("job", done)
        self._count("version", done)
        return done

    def record_evaluation(self, job_id, version, version_fields, head):
        current = super().record_evaluation(job_id, version, version_fields, head)
        self._count("version")
        self._count("job", current)
        return current

    def record_attempt(self, *args, **kwargs):
        self._count("task")
        return super().record_attempt(*args, **kwargs)

    def update_task(self, *args, **kwargs):
        self._count("task")
        return super().update_task(*args, **kwargs)


@dataclasses.dataclass
class Running:
    svc: Any
    job_id: str
    service: AggregatorService
    learners: list[Learner]


def upload(svc: Any, path: Path, options: JobOptions) -> str:
    _, job_id = steps.upload(svc, path, options.to_metadata())
    assert job_id is not None
    return job_id


@pytest.fixture
def run_job(tmp_path: Path) -> Iterator[Any]:
    """Start the aggregator service (measuring with ``scoring``, production's if None) and
    ``learners`` chaining learner threads on a job; stop every thread afterwards."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(options: JobOptions, learners: int = 1, settings: Settings | None = None,
              rows: int = 400, scoring: Scoring | None = None) -> Running:
        svc = dataclasses.replace(memory_services(settings), registry=CountingRegistry())
        path = write_blobs_csv(tmp_path / "blobs.csv", n_rows=rows, n_classes=3, n_features=4)
        job_id = upload(svc, path, options)
        service = AggregatorService(svc, stop, TUNING, scoring)
        workers = [Learner(dataclasses.replace(svc, cache=RuntimeCache()), f"w{i}",
                           tuning=LEARNING, chain=True) for i in range(learners)]
        threads.append(threading.Thread(target=service.run, daemon=True))
        threads.extend(threading.Thread(target=w.run, args=(stop,),
                                        kwargs={"pull_timeout": 0.05}, daemon=True)
                       for w in workers)
        for thread in threads:
            thread.start()
        return Running(svc, job_id, service, workers)

    yield start
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a thread outlived the test"


def wait_ended(svc: Any, job_id: str, timeout: float = 120.0) -> Any:
    job = wait_terminal(svc.registry, job_id, timeout, poll=0.05)
    assert job is not None and job.is_terminal, f"job not ended after {timeout} s: {job}"
    return job


def test_a_chained_job_is_train_locals_model_with_one_job_write_per_version(run_job, tmp_path):
    """R = 1 on the long-running aggregator with a chaining learner: the job ends DONE with
    train-local's model to the bit; most rounds were trained by the chain (no publish, no pull
    between them); the job's document is written once per version, each task's document once;
    the versions are dense and every task applied once."""
    # Prepare
    options = JobOptions(epochs=2, rows_per_shard=32, parallel_tasks=1)
    running = run_job(options)
    serial = train_local(str(tmp_path / "blobs.csv"), options, svc=memory_services())
    # Execute
    job = wait_ended(running.svc, running.job_id)
    # Assert
    svc = running.svc
    versions = svc.registry.list_versions(running.job_id)
    last = versions[-1]
    weights, _, _ = codec.decode_state(svc.store.read_bytes(svc.settings.models_bucket,
                                                            last.weights_path))
    assert job.status == DONE, job.error
    assert [v.version for v in versions] == list(range(len(versions)))
    assert [w.tobytes() for w in weights] == [np.asarray(w).tobytes() for w in serial.weights]
    applied = [t for v in versions for t in v.tasks_applied]
    assert sorted(applied) == sorted(set(applied)) and len(applied) == job.tasks_planned
    chained = [v for v in versions[1:] if any(s.get("chained") for s in v.task_stats.values())]
    assert len(chained) >= len(versions) // 2
    folds = len(versions) - 1
    writes = svc.registry.writes
    assert writes["task"] == job.tasks_planned  # one write per task
    # the job's document: the split's claim, its start and its round-1 publish record, the
    # aggregator's fence when it takes the job on, then one write per version, then the end
    # (DONE); plus each evaluation a commit did not carry in time, written on its own (it
    # writes the version's document too): at most one a version evaluated, however slow the
    # evaluations ran beside the commits
    on_their_own = writes["version"] - folds
    evaluated = [v for v in versions if v.evaluated_at]
    assert writes["job"] <= 3 + 1 + folds + 1 + on_their_own
    assert on_their_own <= len(evaluated)


def test_evaluations_travel_with_later_commits(run_job):
    """The figures of versions evaluated off the critical path reach their versions (carried by
    a later commit) and the head says which version its figures are of."""
    # Prepare
    running = run_job(JobOptions(epochs=8, rows_per_shard=32, parallel_tasks=1))
    # Execute
    job = wait_ended(running.svc, running.job_id)
    # Assert
    versions = running.svc.registry.list_versions(running.job_id)
    carried = [v for v in versions if v.evaluation is not None]
    evaluated = [v for v in versions if v.figure("holdout_accuracy") is not None]
    assert job.status == DONE
    assert carried and all(v.evaluation.version < v.version for v in carried)
    assert {v.evaluation.version for v in carried} <= {v.version for v in evaluated}
    # the export's figures are the head's, the version it exported (the best by validation)
    assert job.head.evaluated_version == job.head.version == job.selection["best"]["version"]


def test_the_evaluator_rests_to_keep_to_its_share_of_a_core(run_job):
    """With ``eval_cpu_share`` 0.2 the background evaluator rests four times an evaluation's
    length after each one (evaluations made slow here: 60 ms), so the versions committed
    meanwhile go unevaluated but the newest; the figures still reach the versions."""
    # Prepare
    from bucketlearn.domain.version import evaluation_rest

    real = Scoring().evaluate_version

    def slow_evaluation(*args: Any) -> Any:
        time.sleep(0.06)
        return real(*args)

    settings = dataclasses.replace(Settings(), eval_cpu_share=0.2)
    # long enough to outlast the first evaluation's rest (that evaluation also builds the
    # predict function: on a slow machine over a second, so a rest at its 5-s cap)
    running = run_job(JobOptions(epochs=16, rows_per_shard=32, parallel_tasks=1,
                                 validation_fraction=NONE), settings=settings, rows=1000,
                      scoring=Scoring(evaluate_version=slow_evaluation))
    # Execute
    job = wait_ended(running.svc, running.job_id)
    # Assert
    versions = running.svc.registry.list_versions(running.job_id)
    evaluated = [v for v in versions[:-1] if v.evaluated_at is not None]  # the last: the export
    assert job.status == DONE
    assert 2 <= len(evaluated) < (len(versions) - 1) / 2, (len(evaluated), len(versions))
    for earlier, later in zip(evaluated, evaluated[1:], strict=False):
        rest = evaluation_rest(earlier.aggregator["eval_seconds"], 0.2)
        assert later.evaluated_at - earlier.evaluated_at >= 0.9 * (
            rest + later.aggregator["eval_seconds"]), (earlier.version, later.version)


def test_an_evaluation_that_ends_after_its_job_reaches_its_version(run_job):
    """A job that trains faster than its first evaluation (a chained job of a small table: the
    first evaluation also builds the predict function) ends before the figures are in: they
    reach their version's document all the same (they used to be dropped with the job's slot,
    leaving a finished job without a curve), and the head keeps the export's figures."""
    # Prepare: every evaluation is measured, then handed over only once its job has ended
    real = Scoring().evaluate_version
    measured: list[int] = []

    def evaluation_that_ends_late(svc: Any, job: Any, weights: Any, version: int) -> Any:
        found = real(svc, job, weights, version)
        measured.append(version)
        assert wait_until(lambda: svc.registry.get_job(job.job_id).is_terminal, timeout=60)
        return found

    running = run_job(JobOptions(epochs=2, rows_per_shard=32, parallel_tasks=1),
                      scoring=Scoring(evaluate_version=evaluation_that_ends_late))
    registry = running.svc.registry
    # Execute
    job = wait_ended(running.svc, running.job_id)
    # Assert
    assert job.status == DONE and measured
    assert wait_until(lambda: registry.get_version(job.job_id, measured[0]).figures, timeout=30)
    figures = registry.get_version(job.job_id, measured[0]).figures
    assert 0.0 <= figures["holdout_accuracy"] <= 1.0 and "holdout_loss" in figures
    head = registry.get_job(job.job_id).head
    assert head == job.head and head.evaluated_version == job.version  # the export's


def test_parallel_rounds_on_two_learners_give_the_simulations_versions(run_job, tmp_path):
    """R = 2 with two learners and the long-running aggregator: the same versions, to the
    bit, as the synchronous in-process simulation of the same upload."""
    # Prepare
    from bucketlearn.local.simulation import simulate_pipeline

    options = JobOptions(epochs=2, rows_per_shard=32, parallel_tasks=2)
    running = run_job(options, learners=2)
    # Execute
    job = wait_ended(running.svc, running.job_id)
    simulated = simulate_pipeline(str(tmp_path / "blobs.csv"), options, workers=2,
                                  svc=memory_services())
    # Assert
    versions = running.svc.registry.list_versions(running.job_id)
    assert job.status == DONE
    assert [v.digest for v in versions] == [v.digest for v in simulated["versions"]]
    assert all(len(v.tasks_applied) == 2 for v in versions[1:] if v.round is not None
               and (v.round + 1) * 2 <= job.tasks_per_epoch)


def test_a_job_records_what_it_used_and_what_that_costs(run_job):
    """With metered ports the job's usage (reads, writes, operations, messages, learner and
    aggregator seconds) is recorded with its commits, and priced."""
    # Prepare
    from bucketlearn.adapters.metered import Meter, metered

    svc = memory_services()
    meter = Meter()
    metered_svc = metered(svc, meter)
    assert metered_svc.usage("nobody") == {}
    # Execute
    running = run_job(JobOptions(epochs=1, rows_per_shard=32, parallel_tasks=1))
    job = wait_ended(running.svc, running.job_id)
    # Assert: the unmetered in-memory services record the seconds, not calls
    usage = job.usage
    assert usage["worker_seconds"] > 0 and usage["aggregator_seconds"] > 0
    assert usage["function_invocations"] == 1
    cost = estimate_cost(usage)
    assert cost["total"] == pytest.approx(sum(v for k, v in cost.items() if k != "total"),
                                          abs=1e-5)
    assert cost["learners"] > 0


def chained_first_round(tmp_path: Any, worker_id: str) -> tuple[Any, str, Learner, Any, Any]:
    """A one-task-at-a-time job (chain grace 0.2 s) whose first round ``worker_id`` trained
    and announced as chained: (services, job id, learner, job as read, its trained task)."""
    settings = dataclasses.replace(Settings(), chain_grace_seconds=0.2)
    svc = memory_services(settings)
    job_id = upload(svc, write_blobs_csv(tmp_path / "b.csv", n_rows=200),
                    JobOptions(epochs=1, rows_per_shard=32, parallel_tasks=1,
                               validation_fraction=NONE))
    learner = Learner(svc, worker_id, tuning=LEARNING, chain=True)
    received = svc.queue.pull(0)
    job = svc.registry.get_job(job_id)
    trained = learner.train(received.message, job)
    learner.announce(trained, chained=True)
    received.ack()
    return svc, job_id, learner, job, trained


def serve(service: AggregatorService, until: Any) -> threading.Thread:
    """``service`` running in a thread of its own until ``until()`` holds."""
    thread = threading.Thread(target=service.run, kwargs={"until": until}, daemon=True)
    thread.start()
    return thread


def test_a_chain_whose_learner_dies_is_published_for_everyone(tmp_path):
    """The learner that chains into the next round dies after announcing its result: once the
    chain's deadline passes, the aggregator publishes that round for every learner."""
    # Prepare
    svc, job_id, _, _, trained = chained_first_round(tmp_path, "w-dies")  # ...then it is gone
    stop = threading.Event()
    service = AggregatorService(svc, stop, TUNING)
    # Execute
    started = time.monotonic()
    thread = serve(service, lambda: len(svc.queue) > 0)
    thread.join(timeout=30)
    stop.set()
    # Assert
    job = svc.registry.get_job(job_id)
    [message] = [svc.queue.pull(0).message]
    assert not thread.is_alive()
    assert job.version == 1 and job.chained_by == "w-dies"
    assert (message.epoch, message.round, message.base_version) == (1, 1, 1)
    assert message.base_digest == trained.end_digest == job.head.digest
    assert time.monotonic() - started >= 0.2


def test_a_chained_result_whose_message_is_late_is_folded_from_the_listing(tmp_path):
    """The chaining learner wrote its next result but its message is late (a broken stream
    holds it): at the chain's deadline the aggregator hears the listing and folds that result
    instead of publishing the round for every learner."""
    # Prepare
    svc, job_id, learner, job, first = chained_first_round(tmp_path, "w-late")
    stop = threading.Event()
    service = AggregatorService(svc, stop, TUNING)
    thread = serve(service, lambda: svc.registry.get_job(job_id).version >= 2)
    wait_until(lambda: svc.registry.get_job(job_id).version >= 1)
    published = len(svc.queue.published)
    # Execute: the next result is written once the job is served; its message never arrives
    following = learner._following(job, first.task, first.end_digest)
    second = learner.train(following, job, (first.result.weights, first.result.optimizer))
    learner.announce(second, chained=True)
    svc.results._items.pop()
    thread.join(timeout=30)
    stop.set()
    # Assert
    job = svc.registry.get_job(job_id)
    assert not thread.is_alive()
    assert job.version == 2 and job.head.digest == second.end_digest
    assert svc.queue.published[published:] == []  # the round was never published for everyone


def test_a_quiet_job_is_folded_from_the_listing_when_its_messages_are_lost(tmp_path):
    """A parallel round's results are written but their messages never arrive: after a lease
    period without a message the aggregator hears the deltas bucket's listing and folds."""
    # Prepare
    settings = dataclasses.replace(Settings(), aggregator_lease_seconds=1.0)
    svc = memory_services(settings)
    job_id = upload(svc, write_blobs_csv(tmp_path / "b.csv", n_rows=200),
                    JobOptions(epochs=1, rows_per_shard=32, parallel_tasks=2))
    stop = threading.Event()
    service = AggregatorService(svc, stop, TUNING)
    thread = serve(service, lambda: svc.registry.get_job(job_id).version >= 1)
    wait_until(lambda: job_id in service.slots)  # served (adopted) before any result exists
    # Execute
    learner = Learner(svc, "w1", tuning=LEARNING)
    for _ in range(2):
        learner.process(svc.queue.pull(0).message)
    svc.results._items.clear()  # both messages lost
    thread.join(timeout=30)
    stop.set()
    # Assert
    assert not thread.is_alive()
    assert svc.registry.get_job(job_id).version == 1


def test_a_nudge_makes_the_aggregator_publish_a_round_it_never_published(tmp_path):
    """The round after a commit was never published (the aggregator died in between): a nudge
    on the results topic makes the service read the job and publish it."""
    # Prepare
    svc = memory_services()
    job_id = upload(svc, write_blobs_csv(tmp_path / "b.csv", n_rows=200),
                    JobOptions(epochs=1, rows_per_shard=32, parallel_tasks=2))
    svc.queue._items.clear()
    svc.registry.update_job(job_id, {"published": None})
    svc.results.publish([ResultMessage(job_id=job_id, kind=NUDGE, reason="test")])
    stop = threading.Event()
    service = AggregatorService(svc, stop, TUNING)
    # Execute
    thread = threading.Thread(target=service.run,
                              kwargs={"until": lambda: len(svc.queue) > 0}, daemon=True)
    thread.start()
    thread.join(timeout=30)
    stop.set()
    # Assert
    assert not thread.is_alive()
    assert svc.registry.get_job(job_id).is_published
    assert sorted(m.task_index for m in svc.queue.published[-2:]) == [0, 1]


def test_a_job_held_by_another_aggregator_is_left_to_it(tmp_path):
    """One writer per job: a result of a job whose lease another aggregator holds goes back to
    the topic (with a delay) and nothing is folded here."""
    # Prepare
    svc = memory_services()
    job_id = upload(svc, write_blobs_csv(tmp_path / "b.csv", n_rows=200),
                    JobOptions(epochs=1, rows_per_shard=32, parallel_tasks=1))
    assert svc.registry.acquire_lease(f"aggregate-{job_id}", "elsewhere", 60)
    learner = Learner(svc, "w1")
    received = svc.queue.pull(0)
    learner.process(received.message)
    stop = threading.Event()
    service = AggregatorService(svc, stop, TUNING)
    # Execute
    thread = threading.Thread(target=service.run,
                              kwargs={"until": lambda: service.messages >= 1}, daemon=True)
    thread.start()
    thread.join(timeout=30)
    stop.set()
    # Assert
    assert not thread.is_alive()
    assert svc.registry.get_job(job_id).version == 0 and service.slots == {}
    assert svc.results.acked == []  # not settled here: Pub/Sub delivers it again later


def test_a_lease_taken_over_from_a_dead_aggregator_republishes_what_has_no_result(tmp_path):
    """A holder died holding the lease (it ran out): the aggregator that takes the job over
    publishes the current round's tasks that have no result, since the dead one may have
    died between a commit and its publish."""
    # Prepare
    svc = memory_services()
    job_id = upload(svc, write_blobs_csv(tmp_path / "b.csv", n_rows=200),
                    JobOptions(epochs=1, rows_per_shard=32, parallel_tasks=2))
    svc.registry.leases[f"aggregate-{job_id}"] = ("dead", time.time() - 1)
    first = svc.queue.pull(0).message
    svc.queue._items.clear()  # the round's messages were lost with the dead holder
    Learner(svc, "w1").process(first)
    stop = threading.Event()
    service = AggregatorService(svc, stop, TUNING)
    published = len(svc.queue.published)
    # Execute
    thread = threading.Thread(target=service.run,
                              kwargs={"until": lambda: len(svc.queue) > 0}, daemon=True)
    thread.start()
    thread.join(timeout=30)
    stop.set()
    # Assert
    again = svc.queue.published[published:]
    assert not thread.is_alive()
    assert [m.task_index for m in again] == [1 - first.task_index]


def test_a_job_whose_holder_died_with_its_results_is_served_without_a_message(tmp_path):
    """The holder died holding the job's lease and the round's result messages (Pub/Sub gives
    them back only after their deadline): a live aggregator's look at the active jobs takes the
    job on once the lease has run out, hears the results from the listing and folds the round;
    a job whose lease is alive is left to its holder."""
    # Prepare
    svc = memory_services()
    dead = upload(svc, write_blobs_csv(tmp_path / "a.csv", n_rows=200, seed=1),
                  JobOptions(epochs=1, rows_per_shard=32, parallel_tasks=2))
    alive = upload(svc, write_blobs_csv(tmp_path / "b.csv", n_rows=200, seed=2),
                   JobOptions(epochs=1, rows_per_shard=32, parallel_tasks=2))
    svc.registry.leases[f"aggregate-{dead}"] = ("dead", time.time() - 1)
    assert svc.registry.acquire_lease(f"aggregate-{alive}", "elsewhere", 60)
    learner = Learner(svc, "w1")
    while len(svc.queue):
        message = svc.queue.pull(0).message
        if message.job_id == dead:
            learner.process(message)
    svc.results.published.clear()
    svc.results._items.clear()  # the dead holder took the result messages with it
    stop = threading.Event()
    service = AggregatorService(svc, stop, TUNING)
    # Execute
    thread = threading.Thread(target=service.run, kwargs={
        "until": lambda: svc.registry.get_job(dead).version >= 1}, daemon=True)
    thread.start()
    thread.join(timeout=30)
    stop.set()
    # Assert
    assert not thread.is_alive()
    assert svc.registry.get_job(dead).version == 1
    assert svc.registry.get_job(alive).version == 0
    assert svc.registry.leases[f"aggregate-{alive}"][0] == "elsewhere"


def test_an_ended_job_keeps_its_model_and_nothing_else(run_job):
    """Once DONE, the job's work prefix (shards, holdout, manifest)
    and every version's weights but the head's are deleted; the exported model stays, and a
    version whose weights are gone says which one can be downloaded."""
    # Prepare
    from bucketlearn import layout
    from bucketlearn.errors import JobStateError
    from bucketlearn.usecases.model_files import model_bytes

    running = run_job(JobOptions(epochs=2, rows_per_shard=32, parallel_tasks=1))
    svc = running.svc
    # Execute
    job = wait_ended(svc, running.job_id)
    time.sleep(0.5)  # the slot winds the job up right after DONE
    # Assert
    weights = [i.name for i in svc.store.list(svc.settings.models_bucket,
                                              f"weights/{job.job_id}/")]
    assert job.status == DONE and job.version > 2
    assert list(svc.store.list(svc.settings.work_bucket, layout.job_prefix(job.job_id))) == []
    assert weights == [job.head.weights_path]
    assert svc.store.stat(svc.settings.models_bucket, layout.model_path(job.job_id)) is not None
    assert model_bytes(svc, job.job_id, None)[1] == job.version
    with pytest.raises(JobStateError, match=f"v{job.version}"):
        model_bytes(svc, job.job_id, 1)


def test_a_cancelled_job_is_exported_by_the_aggregator(tmp_path):
    """A cancel tells the aggregator (a nudge on the results topic), which
    exports the job's last version as latest.keras, records it and winds the job up, so the
    model downloads from the models bucket alone."""
    # Prepare
    from bucketlearn import layout
    from bucketlearn.usecases.cancel import cancel_job
    from bucketlearn.usecases.model_files import model_bytes

    svc = memory_services()
    job_id = upload(svc, write_blobs_csv(tmp_path / "b.csv", n_rows=200),
                    JobOptions(epochs=2, rows_per_shard=32, parallel_tasks=1))
    cancel_job(svc, job_id, "tester")
    stop = threading.Event()
    service = AggregatorService(svc, stop, TUNING)
    # Execute
    thread = threading.Thread(target=service.run, kwargs={
        "until": lambda: svc.registry.get_job(job_id).model_path is not None}, daemon=True)
    thread.start()
    thread.join(timeout=60)
    stop.set()
    # Assert
    job = svc.registry.get_job(job_id)
    models = svc.settings.models_bucket
    assert not thread.is_alive()
    assert job.status == CANCELLED and job.model_path == layout.model_path(job_id)
    assert svc.store.stat(models, layout.model_path(job_id, 0)) is not None
    assert model_bytes(svc, job_id, None) == (svc.store.read_bytes(
        models, layout.model_path(job_id, 0)), 0)


def test_a_permanent_error_ends_the_job_with_its_reason(tmp_path):
    """A backend refusing the version's commit for good (Firestore's InvalidArgument) ends the
    job FAILED saying why, instead of retrying every second for ever."""
    # Prepare
    from bucketlearn.errors import BackendRejectedError

    svc = memory_services()
    job_id = upload(svc, write_blobs_csv(tmp_path / "b.csv", n_rows=200),
                    JobOptions(epochs=1, rows_per_shard=32, parallel_tasks=1))
    Learner(svc, "w1").process(svc.queue.pull(0).message)

    def refused(real, commit):
        raise BackendRejectedError("firestore commit version: InvalidArgument: too large")

    stop = threading.Event()
    service = AggregatorService(inject(svc, "registry", commit_version=refused), stop, TUNING)
    # Execute
    thread = threading.Thread(target=service.run, kwargs={
        "until": lambda: svc.registry.get_job(job_id).is_terminal}, daemon=True)
    thread.start()
    thread.join(timeout=60)
    stop.set()
    # Assert
    job = svc.registry.get_job(job_id)
    assert not thread.is_alive()
    assert job.status == FAILED and "BackendRejectedError" in job.error
    assert "too large" in job.error


def test_a_message_that_is_not_a_result_is_acknowledged_and_dropped():
    """The results topic's entry point at its edge: bytes that are no ResultMessage (another
    producer's, a truncated one, a forged one) are logged and acknowledged, never retried nor
    served."""
    # Prepare
    from bucketlearn import messages

    decode = messages.decoder(ResultMessage)

    class Delivered:
        def __init__(self, raw: bytes) -> None:
            self.raw, self.delivery_attempt = raw, 1
            self.message, self.problem = decode(raw)
            self.settled: list[str] = []

        def ack(self) -> None:
            self.settled.append("ack")

        def nack(self) -> None:
            self.settled.append("nack")

        def extend(self, seconds: int) -> None:
            self.settled.append(f"extend {seconds}")

    service = AggregatorService(memory_services(), threading.Event(), TUNING)
    deliveries = [Delivered(b"not json"), Delivered(b'{"kind": "result"}'),
                  Delivered(b'{"job_id": "j-000000000000", "kind": "bogus"}'),
                  Delivered(b'{"job_id": "a/b", "kind": "nudge"}')]
    # Execute
    for delivered in deliveries:
        service.dispatch(delivered)
    # Assert
    assert [d.message for d in deliveries] == [None, None, None, None]
    assert [d.settled for d in deliveries] == [["ack"], ["ack"], ["ack"], ["ack"]]
    assert service.slots == {}


def test_a_chaining_learner_reads_its_next_tasks_parts_while_it_trains(tmp_path):
    """A learner that will chain into the next round starts reading that round's shard parts
    (on the read-ahead thread) once it has the rows of the task it trains; training that next
    round then reads none of them again."""
    # Prepare
    svc = memory_services()
    job_id = upload(svc, write_blobs_csv(tmp_path / "b.csv", n_rows=200),
                    JobOptions(epochs=1, rows_per_shard=32, parallel_tasks=1,
                               validation_fraction=NONE))
    reads: list[tuple[str, str]] = []

    def recorded(real: Any, bucket: str, name: str, offset: int, length: int) -> bytes:
        reads.append((part_address(name, offset, length), threading.current_thread().name))
        return real(bucket, name, offset, length)

    svc = inject(svc, "store", read_range=recorded)  # a packed part: a range of its pack
    learner = Learner(svc, "w-ahead", tuning=LEARNING, chain=True)
    job = svc.registry.get_job(job_id)
    first = learner.train(svc.queue.pull(0).message, job)
    following = learner._following(job, first.task, first.end_digest)
    assert following is not None
    # Execute
    held = wait_until(lambda: all(p in part_cache(svc)._parts for p in following.parts), 10)
    before = len(reads)
    learner.train(following, job, (first.result.weights, first.result.optimizer))
    # Assert
    ahead = {name for name, thread in reads if thread.startswith(AHEAD)}
    assert held and set(following.parts) <= ahead
    assert not set(first.task.parts) & ahead
    assert [name for name, _ in reads[before:] if name in following.parts] == []


def test_the_attempt_calls_are_counted_as_the_reads_and_writes_they_make():
    """An admission is one read of two documents and one write; a record without the keys
    read first (a positional or a keyword call) reads the task itself; a refund writes once."""
    from bucketlearn.adapters.metered import Meter, metered

    # Prepare
    svc = memory_services()
    meter = Meter()
    registry = metered(svc, meter).registry
    fields = {"state": "RUNNING"}
    # Execute
    _, known = registry.read_for_attempt("job-a", "e0001-t00000")
    registry.record_attempt("job-a", "e0001-t00000", fields, "k1", known)
    registry.record_attempt("job-a", "e0001-t00000", fields, attempt_key="k2")
    registry.record_attempt("job-a", "e0001-t00000", fields, "k3", known_keys=["k1", "k2"])
    registry.refund_attempt("job-a", "e0001-t00000", "k3")
    # Assert
    assert meter.take("job-a") == {"firestore_reads": 3, "firestore_writes": 4}
    assert svc.registry.get_task("job-a", "e0001-t00000").attempts == 2


def test_training_stops_where_validation_stopped_improving_with_train_locals_model(run_job,
                                                                               tmp_path):
    """A job with patience 2 on blobs it learns within a few epochs: the long-running
    aggregator scores each epoch's last version on the validation rows, stops the job where
    train-local stops (its chaining learner runs no further than the commits allow) and exports
    the best checkpoint, train-local's model to the bit."""
    # Prepare
    options = JobOptions(epochs=40, rows_per_shard=32, parallel_tasks=1, patience=2)
    running = run_job(options, rows=1000)
    serial = train_local(str(tmp_path / "blobs.csv"), options, svc=memory_services())
    # Execute
    job = wait_ended(running.svc, running.job_id)
    # Assert
    svc = running.svc
    weights, _, _ = codec.decode_state(svc.store.read_bytes(svc.settings.models_bucket,
                                                            job.head.weights_path))
    assert job.status == DONE and serial.selection["stop_epoch"] < 40
    assert job.selection["stop_epoch"] == serial.selection["stop_epoch"]
    assert job.selection["best"] == serial.selection["best"] == {
        **job.selection["best"], "version": job.head.version}
    assert [w.tobytes() for w in weights] == [np.asarray(w).tobytes() for w in serial.weights]
    assert job.epoch < 40  # its training stopped before its last epoch
    checkpoints = [v for v in svc.registry.list_versions(running.job_id)
                   if v.figure("validation_accuracy") is not None]
    assert len(checkpoints) >= serial.selection["stop_epoch"] - 1


def test_a_lost_checkpoint_score_is_made_up_and_training_still_stops_early(run_job, tmp_path):
    """The evaluator fails to score epoch 2's checkpoint (as after a takeover, whose new holder
    never scored the epochs before it): when epoch 3's score comes, epoch 2's is scored from its
    stored weights, and the job stops where train-local stops instead of training its whole
    budget."""
    # Prepare: the evaluator's checkpoint scoring fails once, for epoch 2
    real = Scoring().checkpoint_score

    def lose_epoch_two(svc, job, epoch, version, weights):
        if epoch == 2:
            raise OSError("injected: the score of epoch 2 is lost")
        return real(svc, job, epoch, version, weights)

    options = JobOptions(epochs=40, rows_per_shard=32, parallel_tasks=1, patience=2)
    running = run_job(options, rows=1000, scoring=Scoring(checkpoint_score=lose_epoch_two))
    serial = train_local(str(tmp_path / "blobs.csv"), options, svc=memory_services())
    # Execute
    job = wait_ended(running.svc, running.job_id)
    # Assert
    assert job.status == DONE and job.epoch < 40
    assert job.selection["stop_epoch"] == serial.selection["stop_epoch"] < 40
    assert job.selection["best"]["version"] == job.head.version
    scored = {v.epoch for v in running.svc.registry.list_versions(running.job_id)
              if v.figure("validation_accuracy") is not None}
    assert 2 in scored
