"""Poison on the results topic and in the deltas bucket, against the real long-running
aggregator and chaining learners (in threads, on the in-memory ports, messages carried as the
bytes Pub/Sub carries): bad ids, bytes that are not JSON, unknown jobs, oversized stats, forged
nonces, stale bases, late duplicates, a registry that fails, a lease lost, a read that hangs.
Each scenario checks that the message is settled and the job still ends DONE with
``train-local``'s model, or that nothing of the poison is folded."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bucketlearn import codec, layout
from bucketlearn.adapters.memory import MemoryBlobStore, MemoryRegistry
from bucketlearn.aggregation.evaluators import InlineEvaluator
from bucketlearn.aggregation.process import AggregatorService, AggregatorTuning
from bucketlearn.aggregation.writer import JobAggregator, aggregate_job, lease_name
from bucketlearn.bootstrap import memory_services
from bucketlearn.config import Settings
from bucketlearn.domain.lifecycle import DONE
from bucketlearn.errors import TransientError
from bucketlearn.loops.heartbeat import LearnerTuning
from bucketlearn.loops.learner import Learner
from bucketlearn.options import JobOptions
from bucketlearn.ports import RESULT, ResultMessage, RuntimeCache
from bucketlearn.usecases.train_local import train_local
from bucketlearn.usecases.waiting import wait_terminal
from tests.unit import steps
from tests.unit.helpers import wait_until, write_blobs_csv

TUNING = AggregatorTuning(pull_seconds=0.05, idle_seconds=30.0, error_pause_seconds=0.05,
                          busy_retry_seconds=0)
LEARNING = LearnerTuning(transient_backoff_seconds=0.01, heartbeat_seconds=0.5,
                         report_min_seconds=0.05, chain_poll_seconds=0.005,
                         chain_confirm_seconds=10.0)
OPTIONS = JobOptions(epochs=2, rows_per_shard=32, parallel_tasks=1)


class FlakyLeases(MemoryRegistry):
    """A registry whose first ``failures`` lease calls fail as an outage would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def acquire_lease(self, name, holder, seconds):
        if self.failures > 0:
            self.failures -= 1
            raise TransientError("firestore acquire lease: ServiceUnavailable: outage")
        return super().acquire_lease(name, holder, seconds)


@dataclasses.dataclass
class Served:
    svc: Any
    job_id: str
    service: AggregatorService
    thread: threading.Thread


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """Upload a job, then run the aggregator service and one chaining learner on it (threads
    stopped afterwards); ``before`` runs between the upload and the start."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(registry: MemoryRegistry | None = None, before: Any = None,
              settings: Settings | None = None) -> Served:
        svc = memory_services(settings)
        if registry is not None:
            svc = dataclasses.replace(svc, registry=registry)
        path = write_blobs_csv(tmp_path / "blobs.csv", n_rows=400, n_classes=3, n_features=4)
        _, job_id = steps.upload(svc, path, OPTIONS.to_metadata())
        if before is not None:
            before(svc, job_id)
        service = AggregatorService(svc, stop, TUNING)
        learner = Learner(dataclasses.replace(svc, cache=RuntimeCache()), "w0", tuning=LEARNING,
                          chain=True)
        main = threading.Thread(target=service.run, daemon=True)
        threads.extend([main, threading.Thread(target=learner.run, args=(stop,),
                                               kwargs={"pull_timeout": 0.05}, daemon=True)])
        for thread in threads:
            thread.start()
        return Served(svc, job_id, service, main)

    yield start
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a thread outlived the test"


def assert_train_locals_model(svc: Any, job_id: str, tmp_path: Path) -> Any:
    job = wait_terminal(svc.registry, job_id, 120, poll=0.05)
    assert job is not None and job.status == DONE, job
    last = svc.registry.list_versions(job_id)[-1]
    weights, _, _ = codec.decode_state(svc.store.read_bytes(svc.settings.models_bucket,
                                                            last.weights_path))
    serial = train_local(str(tmp_path / "blobs.csv"), OPTIONS, svc=memory_services())
    assert [w.tobytes() for w in weights] == [np.asarray(w).tobytes() for w in serial.weights]
    applied = [t for v in svc.registry.list_versions(job_id) for t in v.tasks_applied]
    assert sorted(applied) == sorted(set(applied)) and len(applied) == job.tasks_planned
    return job


def poison_bodies(job_id: str) -> list[bytes]:
    """Messages no learner sends: each must be acknowledged once and change nothing."""
    good = ResultMessage(job_id=job_id, kind=RESULT, epoch=1, task_index=0,
                         path=layout.delta_path(job_id, 1, 0, "0" * 16)).to_dict()
    return [
        b"not json at all",
        json.dumps({**good, "job_id": "a/b"}).encode(),  # Firestore refuses such a path
        json.dumps({**good, "job_id": "nosuch-000000000000"}).encode().replace(
            job_id.encode(), b"nosuch-000000000000"),  # a well-formed id of no job
        json.dumps({**good, "stats": {"pad": "x" * 100_000}}).encode(),
        json.dumps({**good, "stats": {"usage": {"worker_seconds": 1}}}).encode().replace(
            b"1}}", b"Infinity}}"),
        json.dumps({**good, "epoch": 10**9}).encode(),
    ]


def test_poison_messages_are_dropped_once_and_the_job_ends_with_train_locals_model(
        serve: Any, tmp_path: Path) -> None:
    """Bad ids, bytes that are not JSON, a job that does not exist, oversized stats, a number
    that is not finite, an epoch out of range: each is acknowledged (never redelivered, so a
    restarted aggregator does not meet it again) and the job trains on untouched."""
    # Prepare
    def poison(svc: Any, job_id: str) -> None:
        for body in poison_bodies(job_id):
            svc.results.publish_raw(body)

    # Execute
    served = serve(before=poison)
    job = assert_train_locals_model(served.svc, served.job_id, tmp_path)
    # Assert
    acked = served.svc.results.acked
    assert acked.count(None) == 5  # the five refused at the edge, each settled once
    assert served.thread.is_alive() and job.deltas_refused == 0
    assert set(served.service.slots) <= {served.job_id}
    assert "nosuch-000000000000" not in served.svc.registry.leases  # taken, then let go
    assert lease_name("nosuch-000000000000") not in served.svc.registry.leases


def test_a_registry_outage_while_taking_a_job_on_does_not_end_the_aggregator(
        serve: Any, tmp_path: Path) -> None:
    """The lease call fails as an outage would when the job's first message comes: the message
    goes back for later, the loop goes on, and the job still ends with train-local's model."""
    # Execute
    served = serve(registry=FlakyLeases(failures=3))
    assert_train_locals_model(served.svc, served.job_id, tmp_path)
    # Assert
    assert served.thread.is_alive() and served.svc.registry.failures == 0


def test_a_forged_result_is_never_folded(serve: Any, tmp_path: Path) -> None:
    """A result object no recorded attempt wrote (nonce 0000000000000000, first by name), with
    a message announcing it: ignored and deleted; the learner's own result is folded and the
    model is train-local's to the bit."""
    # Prepare
    forged: list[str] = []

    def plant(svc: Any, job_id: str) -> None:
        job = svc.registry.get_job(job_id)
        base = svc.store.read_bytes(svc.settings.models_bucket, job.head.weights_path)
        weights, optimizer, _ = codec.decode_state(base)
        bad = [w + 1.0 for w in weights]  # a model no one trained
        for epoch in (1, 2):
            for task_index in range(job.tasks_per_epoch):
                path = layout.delta_path(job_id, epoch, task_index, "0" * 16)
                svc.store.write_bytes(svc.settings.deltas_bucket, path, codec.encode_state(
                    bad, optimizer, {"content": "weights", "base_digest": job.head.digest,
                                     "examples": 64}), "application/octet-stream")
                forged.append(path)
        svc.results.publish([ResultMessage(job_id=job_id, epoch=1, task_index=0, path=forged[0],
                                           base_digest=job.head.digest)])

    # Execute
    served = serve(before=plant)
    job = assert_train_locals_model(served.svc, served.job_id, tmp_path)
    # Assert
    left = {i.name for i in served.svc.store.list(served.svc.settings.deltas_bucket)}
    assert job.deltas_refused == 0 and not left & set(forged[:job.tasks_per_epoch])


def test_a_result_naming_no_base_is_never_folded(tmp_path: Path) -> None:
    """A result whose message and object name no base digest (the staleness check used to be
    skipped then) is garbage, not folded, whatever its attempt."""
    # Prepare
    svc, job_id = steps.start_job(tmp_path, epochs=1, parallel_tasks=1)
    task = svc.queue.pull(0).message
    learner = Learner(svc, "w1")
    trained = learner.train(dataclasses.replace(task, base_digest=""),
                            svc.registry.get_job(job_id))
    message = learner.announce(trained)
    # Execute
    aggregate_job(svc, job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    assert job.version == 0 and job.deltas_refused == 0
    assert svc.store.stat(svc.settings.deltas_bucket, message.path) is None


def test_a_late_duplicate_of_a_folded_round_is_acknowledged_not_held(tmp_path: Path) -> None:
    """A result message of a round already folded (a redelivery after the fold) is garbage:
    acknowledged and its object deleted at once, not held unacknowledged until the epoch ends
    (where 64 of them stopped the job's read-ahead)."""
    # Prepare
    svc, job_id = steps.start_job(tmp_path, epochs=1, parallel_tasks=1)
    aggregator = JobAggregator(svc, job_id, InlineEvaluator(), holder="agg-1")
    aggregator.take_on()
    first = svc.queue.pull(0).message
    message = Learner(svc, "w1").announce(Learner(svc, "w1").train(first,
                                                                   svc.registry.get_job(job_id)))
    aggregator.hear(message, svc.results.pull(0))
    assert aggregator.step()  # round 0 folded
    copy = layout.delta_path(job_id, 1, 0, steps.record_attempt(svc, first))
    svc.store.write_bytes(svc.settings.deltas_bucket, copy, b"late", "application/octet-stream")
    svc.results.publish([dataclasses.replace(message, path=copy)])
    late = svc.results.pull(0)
    # Execute
    aggregator.hear(late.message, late)
    aggregator.step()
    # Assert
    assert late.message in svc.results.acked and copy not in aggregator.heard
    assert svc.store.stat(svc.settings.deltas_bucket, copy) is None


def test_a_holder_that_lost_the_job_commits_and_refuses_nothing(tmp_path: Path) -> None:
    """Aggregator A's lease ran out and B took the job over (fencing it): A's fold is refused
    at commit, and A's refusal path records no refusal and publishes no task, whatever its
    lease said."""
    # Prepare
    svc, job_id = steps.start_job(tmp_path, epochs=1, parallel_tasks=2)
    bad = steps.write_bad_result(svc, job_id, "nan")  # task 0's result: refused when read
    a = JobAggregator(svc, job_id, InlineEvaluator(), holder="agg-a")
    a.take_on()
    other = svc.queue.pull(0).message
    Learner(svc, "w1").announce(Learner(svc, "w1").train(other, svc.registry.get_job(job_id)))
    a.listen_to_bucket()
    b = JobAggregator(svc, job_id, InlineEvaluator(), holder="agg-b")
    b.take_on()  # B fences the job; A has not read it since
    published = len(svc.queue.published)
    # Execute
    a.step()
    # Assert
    job = svc.registry.get_job(job_id)
    assert job.aggregated_by == "agg-b"
    assert job.deltas_refused == 0 and job.refusals is None and job.version == 0
    assert len(svc.queue.published) == published
    assert svc.store.stat(svc.settings.deltas_bucket, bad) is not None  # B judges it


class HangingReads(MemoryBlobStore):
    """A store whose reads of result objects hang until ``go`` is set."""

    def __init__(self, store: MemoryBlobStore) -> None:
        self.__dict__.update(store.__dict__)
        self.go = threading.Event()

    def read_range(self, bucket, name, offset, length):
        if "/e0001/" in name:
            self.go.wait(30)
        return super().read_range(bucket, name, offset, length)


def test_a_result_that_cannot_be_read_in_time_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A result read hangs (a crafted object, a stuck backend): past the fold's deadline the
    result is refused and its task published again; the job's aggregation goes on."""
    # Prepare
    settings = Settings(result_read_seconds=0.5)
    svc, job_id = steps.start_job(tmp_path, epochs=1, parallel_tasks=1, settings=settings)
    task = svc.queue.pull(0).message
    Learner(svc, "w1").process(task)
    hanging = HangingReads(svc.store)
    svc = dataclasses.replace(svc, store=hanging)
    published = len(svc.queue.published)
    # Execute
    started = time.monotonic()
    aggregate_job(svc, job_id)
    waited = time.monotonic() - started
    hanging.go.set()
    # Assert
    job = svc.registry.get_job(job_id)
    again = svc.queue.published[published:]
    assert job.version == 0 and job.deltas_refused == 1
    assert "was not read and checked within" in job.last_refusal
    assert [(m.epoch, m.task_index) for m in again] == [(task.epoch, task.task_index)]
    assert waited < 30


def test_a_result_larger_than_the_jobs_state_is_refused_unread(tmp_path: Path) -> None:
    """A result object far larger than the job's model and optimizer state is refused from its
    first bytes: the aggregator never holds more than the bound in memory."""
    # Prepare
    svc, job_id = steps.start_job(tmp_path, epochs=1, parallel_tasks=1)
    task = svc.queue.pull(0).message
    key = steps.record_attempt(svc, task)
    path = layout.delta_path(job_id, task.epoch, task.task_index, key)
    svc.store.write_bytes(svc.settings.deltas_bucket, path, b"\0" * (64 * 1024**2),
                          "application/octet-stream")
    # Execute
    aggregate_job(svc, job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    assert job.deltas_refused == 1 and "more than the job's training state" in job.last_refusal
    assert wait_until(lambda: svc.store.stat(svc.settings.deltas_bucket, path) is None, 5)


def test_a_forged_result_first_by_name_beside_the_learners_own_does_not_displace_it(
        tmp_path: Path) -> None:
    """Both objects listed when the round is folded, the forged one first by name: the forged
    one is set aside (deleted, unfolded) and the learner's own is folded in its place, not
    collected as the forged one's duplicate (which left the task without a result)."""
    # Prepare
    svc, job_id = steps.start_job(tmp_path, epochs=1, parallel_tasks=1)
    job = svc.registry.get_job(job_id)
    task = svc.queue.pull(0).message
    Learner(svc, "w1").process(task)
    [own] = [i.name for i in svc.store.list(svc.settings.deltas_bucket)]
    weights, optimizer, _ = codec.decode_state(
        svc.store.read_bytes(svc.settings.models_bucket, job.head.weights_path))
    forged = layout.delta_path(job_id, 1, task.task_index, "0" * 16)
    svc.store.write_bytes(svc.settings.deltas_bucket, forged, codec.encode_state(
        [w + 1.0 for w in weights], optimizer, {"content": "weights",
                                                "base_digest": job.head.digest}),
        "application/octet-stream")
    end, end_optimizer, _ = codec.decode_state(svc.store.read_bytes(svc.settings.deltas_bucket,
                                                                    own))
    # Execute
    aggregate_job(svc, job_id)
    # Assert
    [first] = [v for v in svc.registry.list_versions(job_id) if v.version == 1]
    assert first.tasks_applied == (task.task_id,)
    assert first.digest == codec.state_digest(end, end_optimizer)
    assert svc.store.stat(svc.settings.deltas_bucket, forged) is None
