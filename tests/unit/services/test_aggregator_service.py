"""The aggregation service on the in-memory ports: whole pipeline, duplicate deltas, commits."""

from __future__ import annotations

import copy
import dataclasses
import threading

import numpy as np
import pytest

from bucketlearn import codec, layout
from bucketlearn.adapters.memory import MemoryRegistry
from bucketlearn.aggregation.evaluators import InlineEvaluator, Scoring
from bucketlearn.aggregation.writer import JobAggregator, aggregate_job
from bucketlearn.bootstrap import memory_services
from bucketlearn.config import Settings
from bucketlearn.domain.job import Job, round_key
from bucketlearn.domain.lifecycle import DONE, SPLITTING, TRAINING
from bucketlearn.domain.version import Version
from bucketlearn.local.simulation import simulate_pipeline
from bucketlearn.loops.learner import Learner
from bucketlearn.options import JobOptions
from bucketlearn.ports import ResultMessage, VersionCommit
from bucketlearn.services import task_messages
from bucketlearn.usecases.status import status_object
from bucketlearn.usecases.train_local import sample_figures, train_local
from bucketlearn.usecases.upload import Outcome
from tests.unit.helpers import (
    safetensors_bytes,
    tensor_entry,
    wait_until,
    write_blobs_csv,
)
from tests.unit.steps import record_attempt, upload


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """simulate_pipeline on 600 rows of 3 well-separated blobs, 2 epochs, 64 rows per shard,
    rounds of 3 tasks, batches of 32."""
    path = write_blobs_csv(tmp_path_factory.mktemp("sim") / "blobs.csv", n_rows=600,
                           n_classes=3, n_features=4)
    return simulate_pipeline(str(path), JobOptions(epochs=2, rows_per_shard=64, batch_size=32,
                                                   parallel_tasks=3), workers=2,
                             svc=memory_services())


def test_pipeline_finishes_done(pipeline):
    """The job ends DONE after both epochs, with a usable model."""
    # Prepare
    job = pipeline["job"]
    # Execute
    status = status_object(job)
    # Assert
    assert status["status"] == DONE
    assert status["phase"] == "done"
    assert status["epoch"] == 2 and status["epochs"] == 2
    assert status["tasks_failed"] == 0
    assert status["accuracy"] > 0.9  # the blobs are far apart


def test_versions_are_dense(pipeline):
    """Versions are 0..N with no gap, each the child of the previous; N is the head."""
    # Prepare
    job, svc = pipeline["job"], pipeline["svc"]
    # Execute
    versions = svc.registry.list_versions(job.job_id)
    # Assert
    numbers = [v.version for v in versions]
    assert numbers == list(range(job.version + 1))
    assert len(numbers) > 2
    assert [v.parent for v in versions] == [None] + numbers[:-1]
    assert job.head.weights_path == versions[-1].weights_path


def test_every_task_applied_exactly_once(pipeline):
    """Σ tasks_applied over versions == tasks_planned, and every task id appears once."""
    # Prepare
    job, versions = pipeline["job"], pipeline["versions"]
    expected = {layout.task_id_for(job.job_id, e, t)
                for e in (1, 2) for t in range(job.tasks_per_epoch)}
    # Execute
    applied = [task for v in versions for task in v.tasks_applied]
    # Assert
    assert len(applied) == job.tasks_planned == 2 * job.tasks_per_epoch
    assert len(set(applied)) == len(applied)
    assert set(applied) == expected
    assert job.tasks_applied == job.tasks_planned


def test_every_version_folds_one_whole_round(pipeline):
    """Each version folds exactly the tasks of one round, in order: 7 tasks per epoch (the
    validation rows out) in rounds of 3 are versions of 3, 3 and 1 tasks, each recording its
    round and every delta's norm."""
    # Prepare
    job, versions = pipeline["job"], pipeline["versions"]
    plan = job.plan
    # Execute
    folds = versions[1:]
    # Assert
    assert plan.parallel_tasks == 3 and plan.tasks_per_epoch == 7
    assert [len(v.tasks_applied) for v in folds] == [3, 3, 1] * 2
    for v in folds:
        indices = [int(t.rsplit(":t", 1)[1]) for t in v.tasks_applied]
        assert indices == list(range(3 * v.round, 3 * v.round + len(indices)))
        assert len(v.delta_norms) == len(indices) and min(v.delta_norms) > 0


def test_the_same_upload_gives_the_same_versions_on_any_number_of_workers(tmp_path):
    """Training in rounds makes the result independent of the workers: 1, 2, 4 and 16 simulated
    workers produce the same versions, bit for bit (invariant 10 by construction)."""
    # Prepare
    path = write_blobs_csv(tmp_path / "blobs.csv", n_rows=400, n_classes=3, n_features=4)
    options = JobOptions(epochs=1, rows_per_shard=64, parallel_tasks=2)
    # Execute
    runs = [simulate_pipeline(str(path), options, workers=w, svc=memory_services())
            for w in (1, 2, 4, 16)]
    # Assert
    checksums = [[v.checksum for v in run["versions"]] for run in runs]
    assert len(checksums[0]) > 2 and all(c == checksums[0] for c in checksums[1:])


def test_one_task_at_a_time_takes_train_locals_steps_to_the_bit(tmp_path):
    """With R = 1 a pipeline job is train-local: the same split, tasks, rows and rates, and a
    fold that gives back each task's weights exactly; each epoch's last version scored on the
    same validation rows, so the version it exports (the best by validation, its head at DONE)
    is train-local's model bit for bit (on the same machine and thread settings)."""
    # Prepare
    path = write_blobs_csv(tmp_path / "blobs.csv", n_rows=800, n_classes=3, n_features=4)
    options = JobOptions(epochs=4, rows_per_shard=32, parallel_tasks=1)
    serial = train_local(str(path), options, svc=memory_services())
    # Execute
    run = simulate_pipeline(str(path), options, workers=2, svc=memory_services())
    # Assert
    svc, job = run["svc"], run["job"]
    weights, _, _ = codec.decode_state(svc.store.read_bytes(svc.settings.models_bucket,
                                                            job.head.weights_path))
    assert job.status == "DONE" and run["versions"][-1].version >= 8
    assert job.selection == {k: v for k, v in serial.selection.items()
                             if k not in ("scores", "best_seconds")}
    assert job.head.version == serial.selection["best"]["version"]
    assert [w.tobytes() for w in weights] == [np.asarray(w).tobytes() for w in serial.weights]
    assert job.head.holdout_accuracy == serial.accuracy


def test_train_local_on_the_evaluation_sample_gives_the_last_versions_figures(tmp_path):
    """``sample_figures`` measures train-local's model on the rows a version is evaluated on (a
    fixed sample smaller than the holdout here): with R = 1 the last version is that model, so
    its recorded figures are train-local's on the sample, not on the whole holdout."""
    # Prepare
    path = write_blobs_csv(tmp_path / "blobs.csv", n_rows=600, n_classes=3, n_features=4)
    options = JobOptions(epochs=1, rows_per_shard=64, parallel_tasks=1)
    settings = Settings(eval_max_rows=37)
    local_svc = memory_services(settings)
    serial = train_local(str(path), options, svc=local_svc)
    # Execute
    sample = sample_figures(serial, local_svc, settings.eval_max_rows)
    run = simulate_pipeline(str(path), options, workers=1, svc=memory_services(settings))
    # Assert
    last = run["versions"][-1]
    assert sample["rows"] == 37 < serial.manifest.holdout_rows
    assert last.figure("holdout_accuracy") == sample["accuracy"]
    assert last.figure("holdout_loss") == pytest.approx(sample["loss"], rel=1e-6)


def test_versions_record_where_the_fold_time_went(pipeline):
    """Each folded version records when planning its fold began and how long reading, folding
    and writing took, all before the version was created; its holdout evaluation comes after the
    commit (workers wait for the commit, not for the evaluation) and records its time too."""
    # Prepare
    job, svc = pipeline["job"], pipeline["svc"]
    before_commit = ("read_seconds", "fold_seconds", "write_seconds")
    # Execute
    folds = [v for v in svc.registry.list_versions(job.job_id)[1:] if v.tasks_applied]
    # Assert
    assert folds
    for v in folds:
        timings = v.aggregator
        assert timings["planning_started_at"] <= v.created_at <= v.evaluated_at
        assert all(isinstance(timings[k], float) for k in (*before_commit, "eval_seconds"))
        assert sum(timings[k] for k in before_commit) <= (v.created_at
                                                         - timings["planning_started_at"])
        assert timings["eval_seconds"] <= v.evaluated_at - timings["planning_started_at"]
        assert 0.0 <= v.figure("holdout_accuracy") <= 1.0 and v.figure("holdout_loss") > 0


def test_the_next_round_is_published_before_the_fold_is_evaluated(tmp_path):
    """Workers wait for the commit, not the evaluation: the version that completes epoch 1
    publishes epoch 2's first round before its holdout evaluation and its validation score
    run."""
    # Prepare: the fold measures with a Scoring that notes what was published at each measure
    from tests.unit.steps import start_job, train_pending

    svc, job_id = start_job(tmp_path, epochs=2, parallel_tasks=5, validation="auto")
    planned = int(svc.registry.get_job(job_id).tasks_per_epoch)
    seen: list[tuple[int, int]] = []  # (head version at evaluation, epoch-2 tasks published)

    def noting(real):
        def evaluate(*args):
            second = sum(1 for m in svc.queue.published if m.epoch == 2)
            seen.append((int(svc.registry.get_job(job_id).version), second))
            return real(*args)
        return evaluate

    production = Scoring()
    scoring = Scoring(evaluate_version=noting(production.evaluate_version),
                      checkpoint_score=noting(production.checkpoint_score))
    train_pending(svc, planned)
    # Execute
    aggregate_job(svc, job_id, scoring)
    # Assert
    job = svc.registry.get_job(job_id)
    assert job.epoch == 2 and job.published == round_key(2, 0)
    assert seen[-2:] == [(job.version, planned)] * 2  # the holdout's, then validation's
    assert all(published == 0 for _, published in seen[:-2])


def test_a_late_publish_never_moves_published_back(tmp_path):
    """``published`` names the job's last published round and never goes back:
    an invocation that read the job at round 0 and publishes it after the fold of round 0 has
    published round 1 leaves ``published`` at round 1 (before: it wrote round 0 back, so the
    aggregator and the watchdog took round 1 for unpublished and published it again)."""
    # Prepare
    from bucketlearn.usecases.publish import publish_round
    from tests.unit.steps import start_job, train_pending

    svc, job_id = start_job(tmp_path, epochs=2, parallel_tasks=2)
    read_at_round_0 = svc.registry.get_job(job_id)
    train_pending(svc, len(task_messages.current_round_tasks(read_at_round_0)))
    aggregate_job(svc, job_id)
    after_fold = svc.registry.get_job(job_id)
    assert (after_fold.round, after_fold.published) == (1, round_key(1, 1))
    messages_before = len(svc.queue.published)
    # Execute
    publish_round(svc, read_at_round_0)
    # Assert
    job = svc.registry.get_job(job_id)
    assert job.published == round_key(1, 1)
    assert job.published_at == after_fold.published_at
    assert aggregate_job(svc, job_id) is Outcome.ACCEPTED
    stale = svc.queue.published[messages_before:]
    assert stale and {m.round for m in stale} == {0}  # round 1 is not published again
    from bucketlearn.domain.task import skip_reason
    folded = f"its round was folded (the job is at v{job.version})"
    assert all(skip_reason(job, m.base_version, bool(m.weights_path or m.base_digest)) == folded
               for m in stale)  # the stale round's messages are not trained


def test_final_model_is_exported(pipeline):
    """models/<job>/latest.keras exists in the models bucket (and v<N>.keras)."""
    # Prepare
    job, svc = pipeline["job"], pipeline["svc"]
    bucket = svc.settings.models_bucket
    # Execute
    latest = svc.store.stat(bucket, layout.model_path(job.job_id))
    versioned = svc.store.stat(bucket, layout.model_path(job.job_id, job.version))
    # Assert
    assert latest is not None and latest.size > 0
    assert versioned is not None
    assert job.model_path == f"models/{job.job_id}/latest.keras"
    assert svc.store.read_bytes(bucket, latest.name)[:2] == b"PK"


def test_no_deltas_left_behind(pipeline):
    """Every applied delta is removed from the deltas bucket."""
    # Prepare
    job, svc = pipeline["job"], pipeline["svc"]
    # Execute
    left = list(svc.store.list(svc.settings.deltas_bucket, f"{job.job_id}/"))
    # Assert
    assert left == []


def test_duplicate_delta_is_applied_once(tmp_path):
    """Two copies of one task's delta (different nonces) give one application (invariant 2);
    a third copy arriving after the fold is garbage, collected by the next pass."""
    # Prepare
    svc = memory_services()
    path = write_blobs_csv(tmp_path / "dup.csv", n_rows=120, n_classes=3, n_features=4, seed=3)
    outcome, job_id = upload(svc, path, JobOptions(epochs=1, rows_per_shard=32,
                                                   parallel_tasks=1).to_metadata())
    assert outcome is Outcome.ACCEPTED
    task = svc.queue.pull(0).message
    learner = Learner(svc, "w1")
    message = learner.announce(learner.train(task, svc.registry.get_job(job_id)))
    bucket = svc.settings.deltas_bucket
    first = svc.store.stat(bucket, message.path)
    delta_bytes = svc.store.read_bytes(bucket, first.name)
    copy_path = layout.delta_path(job_id, task.epoch, task.task_index, record_attempt(svc, task))
    svc.store.write_bytes(bucket, copy_path, delta_bytes, "application/octet-stream",
                          metadata=first.metadata)
    # Execute: aggregate with both copies present, then deliver a third copy late
    result = aggregate_job(svc, job_id)
    late_path = layout.delta_path(job_id, task.epoch, task.task_index, record_attempt(svc, task))
    svc.store.write_bytes(bucket, late_path, delta_bytes, "application/octet-stream",
                          metadata=first.metadata)
    late_outcome = aggregate_job(svc, job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    versions = svc.registry.list_versions(job_id)
    applied = [t for v in versions for t in v.tasks_applied]
    assert result is Outcome.ACCEPTED and late_outcome is Outcome.ACCEPTED
    assert applied == [task.task_id]
    assert [v.version for v in versions] == [0, 1]
    assert job.tasks_applied == 1 and job.version == 1
    assert list(svc.store.list(bucket, f"{job_id}/")) == []  # copies collected as garbage


def test_a_result_trained_from_another_state_is_never_folded(tmp_path):
    """A result whose message names a base digest other than the head's (a chain that broke:
    its learner trained from a state the aggregator never committed) is garbage: deleted and
    acknowledged, never folded, and the round waits for a result from the head."""
    # Prepare
    from tests.unit.steps import start_job

    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=1)
    task = svc.queue.pull(0).message
    learner = Learner(svc, "w1")
    trained = learner.train(task, svc.registry.get_job(job_id))
    stale_task = dataclasses.replace(task, base_digest="sha256:" + "0" * 64)
    message = learner.announce(dataclasses.replace(trained, task=stale_task))
    aggregator = JobAggregator(svc, job_id, InlineEvaluator())
    aggregator.refresh()
    received = svc.results.pull(0)
    assert received.message == message
    # Execute
    aggregator.hear(message, received)
    folded = aggregator.step()
    # Assert
    assert svc.registry.get_job(job_id).version == 0
    assert svc.store.stat(svc.settings.deltas_bucket, message.path) is None
    assert message in svc.results.acked and aggregator.heard == {}
    assert folded is True  # it did something: dropped the stale result
    assert aggregator.step() is False  # and now waits


class _CountingStore:
    """A store that counts the reads of each object (everything else passes through)."""

    def __init__(self, store):
        self.store, self.reads = store, {}

    def read_bytes(self, bucket, name, *args, **kwargs):
        self.reads[name] = self.reads.get(name, 0) + 1
        return self.store.read_bytes(bucket, name, *args, **kwargs)

    def read_range(self, bucket, name, *args, **kwargs):
        self.reads[name] = self.reads.get(name, 0) + 1
        return self.store.read_range(bucket, name, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_rounds_results_are_read_as_they_come_not_after_its_last(tmp_path):
    """R = 2: the first result's object is read and decoded when its message is heard, while
    the round's other task trains; the fold of the complete round reads only the last one."""
    # Prepare
    from tests.unit.steps import start_job

    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    counting = _CountingStore(svc.store)
    svc = dataclasses.replace(svc, store=counting)
    first, second = svc.queue.pull(0).message, svc.queue.pull(0).message
    learner = Learner(svc, "w1")
    aggregator = JobAggregator(svc, job_id, InlineEvaluator())
    aggregator.refresh()
    one = learner.announce(learner.train(first, svc.registry.get_job(job_id)))
    # Execute
    aggregator.hear(one, svc.results.pull(0))
    read_ahead = aggregator.reader.prefetched[one.path].result(timeout=30)
    idle = aggregator.step()
    two = learner.announce(learner.train(second, svc.registry.get_job(job_id)))
    aggregator.hear(two, svc.results.pull(0))
    folded = aggregator.step()
    # Assert
    assert read_ahead.gone is False and counting.reads[one.path] == 1
    assert idle is False and folded is True
    assert counting.reads[one.path] == 1 and counting.reads[two.path] == 1
    job = svc.registry.get_job(job_id)
    assert job.version == 1 and job.tasks_applied == 2
    assert aggregator.reader.prefetched == {}  # nothing kept after the fold


class _SlowDeletes:
    """A store whose deletes wait until ``go`` is set (everything else passes through)."""

    def __init__(self, store):
        self.store, self.go = store, threading.Event()

    def delete(self, bucket, name, *args, **kwargs):
        assert self.go.wait(30)
        return self.store.delete(bucket, name, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_the_long_running_aggregator_publishes_the_next_round_before_it_collects(tmp_path):
    """R = 2, collecting in the background (the long-running aggregator): the fold commits and
    publishes the next round while the folded results' deletes still wait; they are deleted
    after."""
    # Prepare
    from tests.unit.steps import start_job

    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    slow = _SlowDeletes(svc.store)
    svc = dataclasses.replace(svc, store=slow)
    learner = Learner(svc, "w1")
    aggregator = JobAggregator(svc, job_id, InlineEvaluator(), collect_in_background=True)
    aggregator.refresh()
    tasks = [svc.queue.pull(0).message for _ in range(2)]
    messages = [learner.announce(learner.train(t, svc.registry.get_job(job_id))) for t in tasks]
    for message in messages:
        aggregator.hear(message, svc.results.pull(0))
    published = len(svc.queue.published)
    # Execute
    folded = aggregator.step()
    waiting = [svc.store.stat(svc.settings.deltas_bucket, m.path) for m in messages]
    slow.go.set()
    # Assert
    assert folded is True and svc.registry.get_job(job_id).version == 1
    assert len(svc.queue.published) > published  # the next round went out first
    assert all(info is not None for info in waiting)
    assert wait_until(lambda: all(svc.store.stat(svc.settings.deltas_bucket, m.path) is None
                                for m in messages), 30)


def test_a_refused_result_is_deleted_before_the_aggregator_goes_on(tmp_path):
    """Collecting in the background applies to committed rounds only: a refused result (a NaN)
    is deleted before ``step`` returns, so no listing of the bucket can hear it again and
    refuse it a second time."""
    # Prepare
    from tests.unit.steps import start_job, write_bad_result

    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    bad = write_bad_result(svc, job_id, "nan")
    slow = _SlowDeletes(svc.store)
    svc = dataclasses.replace(svc, store=slow)
    learner = Learner(svc, "w1")
    other = svc.queue.pull(0).message
    good = learner.announce(learner.train(other, svc.registry.get_job(job_id)))
    aggregator = JobAggregator(svc, job_id, InlineEvaluator(), collect_in_background=True)
    aggregator.refresh()
    aggregator.listen_to_bucket()
    threading.Timer(0.5, slow.go.set).start()
    # Execute
    did = aggregator.step()
    # Assert
    assert did is True and slow.go.is_set()  # the step waited for the delete
    assert svc.store.stat(svc.settings.deltas_bucket, bad) is None
    assert svc.store.stat(svc.settings.deltas_bucket, good.path) is not None
    assert svc.registry.get_job(job_id).deltas_refused == 1


class _FirstReadFails(_CountingStore):
    """A store whose first read of each result object fails, as in a brief storage outage."""

    def read_bytes(self, bucket, name, *args, **kwargs):
        self._fail_first(name)
        return self.store.read_bytes(bucket, name, *args, **kwargs)

    def read_range(self, bucket, name, *args, **kwargs):
        self._fail_first(name)
        return self.store.read_range(bucket, name, *args, **kwargs)

    def _fail_first(self, name):
        self.reads[name] = self.reads.get(name, 0) + 1
        if self.reads[name] == 1 and name.endswith(".safetensors") and "/e0" in name:
            raise ConnectionError("storage briefly unreachable")


def test_a_read_ahead_that_failed_is_read_again_at_the_fold(tmp_path):
    """A result read ahead during a storage outage is read again when its round is folded
    (storage is back), not failed again from the first read."""
    # Prepare
    from tests.unit.steps import start_job

    plain, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    flaky = _FirstReadFails(plain.store)
    svc = dataclasses.replace(plain, store=flaky)
    learner = Learner(plain, "w1")
    aggregator = JobAggregator(svc, job_id, InlineEvaluator())
    aggregator.refresh()
    first, second = svc.queue.pull(0).message, svc.queue.pull(0).message
    one = learner.announce(learner.train(first, svc.registry.get_job(job_id)))
    aggregator.hear(one, svc.results.pull(0))
    failed = aggregator.reader.prefetched[one.path].exception(timeout=30)
    two = learner.announce(learner.train(second, svc.registry.get_job(job_id)))
    flaky.reads[two.path] = 1  # its first read works
    aggregator.hear(two, svc.results.pull(0))
    # Execute
    folded = aggregator.step()
    # Assert
    assert isinstance(failed, ConnectionError)
    assert folded is True and flaky.reads[one.path] == 2
    assert svc.registry.get_job(job_id).tasks_applied == 2


@pytest.mark.parametrize("case", ["bad-header", "terabyte-header"])
def test_undecodable_delta_is_retrained_not_wedging_the_job(tmp_path, case):
    """A delta whose header is not JSON or declares a 4 TiB array: the
    aggregator treats it as corrupt (deleted, its task published again) instead of raising on
    every run while planning the same delta."""
    # Prepare
    payload = (safetensors_bytes(b"{not json", b"\0" * 64) if case == "bad-header" else
               safetensors_bytes({"w0000": tensor_entry((1 << 20, 1 << 20), size=64)}))
    svc = memory_services()
    path = write_blobs_csv(tmp_path / "bad-delta.csv", n_rows=120, n_classes=3, n_features=4)
    outcome, job_id = upload(svc, path, JobOptions(epochs=1, rows_per_shard=32,
                                                   parallel_tasks=1).to_metadata())
    assert outcome is Outcome.ACCEPTED
    task = svc.queue.pull(0).message
    bucket = svc.settings.deltas_bucket
    bad_path = layout.delta_path(job_id, task.epoch, task.task_index, record_attempt(svc, task))
    svc.store.write_bytes(bucket, bad_path, payload, "application/octet-stream",
                          metadata={"base_version": "0", "examples": str(task.rows)})
    published_before = len(svc.queue.published)
    # Execute
    result = aggregate_job(svc, job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    republished = svc.queue.published[published_before:]
    assert result is Outcome.ACCEPTED
    assert [(m.epoch, m.task_index) for m in republished] == [(task.epoch, task.task_index)]
    assert svc.store.stat(bucket, bad_path) is None
    assert job.version == 0 and not job.is_terminal
    assert aggregate_job(svc, job_id) is Outcome.ACCEPTED  # nothing left to trip over


def test_a_result_message_naming_a_foreign_object_is_acked_and_ignored():
    """A result message whose path is not a bucketlearn result of its job is acknowledged and
    never heard (nothing of it can be folded). (The Pub/Sub edge refuses such a message before
    it gets here: tests/unit/core/test_messages.py; a queue without that check still cannot
    get it folded.)"""
    # Prepare
    from bucketlearn.adapters.memory import MemoryQueue

    svc = dataclasses.replace(memory_services(), results=MemoryQueue())
    aggregator = JobAggregator(svc, JOB, InlineEvaluator())
    svc.results.publish([ResultMessage(job_id=JOB, path="notes/readme.txt")])
    received = svc.results.pull(0)
    # Execute
    aggregator.hear(received.message, received)
    # Assert
    assert aggregator.heard == {} and svc.results.acked == [received.message]


JOB = "j-000000000000"


@pytest.fixture
def registry():
    """A MemoryRegistry holding one job at version 0, epoch 1 round 0 (rounds of 2 tasks)."""
    reg = MemoryRegistry()
    reg.create_job(Job.from_doc({"job_id": JOB, "phase": SPLITTING, "claim": "c", "version": None}))
    plan = {"parallel_tasks": 2, "shards_per_task": 1, "tasks_per_epoch": 4, "epochs": 2,
            "serial_steps": 16, "decided": "test"}
    started = reg.start_training(JOB, "c", {"phase": TRAINING, "version": 0, "epoch": 1,
                                            "round": 0, "plan": plan}, Version(0, "w0"))
    assert started
    return reg


def commit(base, round_index=None, epoch=1, applied=()):
    round_index = base if round_index is None else round_index
    following = {"round": round_index + 1} if round_index + 1 < 2 else {"epoch": epoch + 1,
                                                                         "round": 0}
    return VersionCommit(job_id=JOB, base_version=base,
                         version=Version(base + 1, f"w{base + 1}", parent=base, epoch=epoch,
                                         round=round_index, tasks_applied=tuple(applied)),
                         epoch=epoch, round=round_index,
                         job_fields={"version": base + 1, **following})


def test_commit_version_advances_the_head(registry):
    """A commit on the current head succeeds, records its tasks on the version and moves the
    job to the next round."""
    # Prepare
    change = commit(0, applied=["a", "b"])
    # Execute
    ok = registry.commit_version(change)
    # Assert
    job = registry.get_job(JOB)
    assert ok is True
    assert (job.version, job.epoch, job.round) == (1, 1, 1)
    assert registry.get_version(JOB, 1) == change.version
    assert registry.get_version(JOB, 1).tasks_applied == ("a", "b")


def test_commit_version_refuses_stale_base(registry):
    """A second commit on base 0 after the head moved is refused and changes nothing."""
    # Prepare
    assert registry.commit_version(commit(0))
    before = copy.deepcopy((registry.jobs, registry.versions))
    # Execute
    ok = registry.commit_version(commit(0))
    # Assert
    assert ok is False
    assert (registry.jobs, registry.versions) == before
    assert registry.commits == 1


def test_commit_version_checks_the_base_not_only_the_version_number(registry):
    """A commit whose base is not the head is refused even if its version number is free."""
    # Prepare
    assert registry.commit_version(commit(0))
    stale = commit(0)
    stale.version = Version(5, "w5", parent=0)
    # Execute
    ok = registry.commit_version(stale)
    # Assert
    assert ok is False
    assert registry.get_version(JOB, 5) is None


def test_commit_version_refuses_folding_a_round_twice(registry):
    """A commit of a round the job has moved past (its tasks are applied or failed already) is
    refused even on the current head: no task is folded twice."""
    # Prepare
    assert registry.commit_version(commit(0, round_index=0))
    # Execute
    again = registry.commit_version(commit(1, round_index=0))
    fresh = registry.commit_version(commit(1, round_index=1))
    # Assert
    assert again is False and fresh is True
    job = registry.get_job(JOB)
    assert (job.version, job.epoch, job.round) == (2, 2, 0)


def test_a_rounds_tasks_train_at_k_times_the_rate_and_fold_by_their_mean(tmp_path):
    """Rounds of 2 tasks: each task steps at twice the job's learning rate, from
    version 0, and version 1 is the mean of the two tasks' weights (η = 1), not their sum."""
    # Prepare
    from bucketlearn.domain.plan import step_rates
    from bucketlearn.ingest.parts import load_parts
    from bucketlearn.ml.training import train_task
    from bucketlearn.services.caches import job_runtime
    from tests.unit.steps import start_job, train_pending

    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    job = svc.registry.get_job(job_id)
    assert job.plan.rates == "scaled" and job.plan.parallel_tasks == 2
    runtime = job_runtime(svc, job)
    base = runtime.state(job.head.weights_path)
    messages = [svc.queue.pull(0) for _ in range(2)]
    tasks = sorted((m.message for m in messages), key=lambda t: t.task_index)
    for m in messages:
        m.nack()

    def trained(task, scale):
        x, y = load_parts(svc.store, svc.settings.work_bucket, list(task.parts))
        rates = step_rates(job.options["learning_rate"] * scale, job.options["lr_schedule"],
                           task.span, -(-len(y) // job.options["batch_size"]))
        return train_task(runtime.model, [w.copy() for w in base[0]],
                          [o.copy() for o in base[1]], x, y, job.options["batch_size"], rates,
                          job.options["seed"], task.epoch, task.task_index).weights

    expected = [np.mean([np.asarray(a, np.float64) for a in layer], axis=0)
                for layer in zip(*(trained(t, 2.0) for t in tasks), strict=True)]
    at_the_jobs_rate = [np.mean([np.asarray(a, np.float64) for a in layer], axis=0)
                        for layer in zip(*(trained(t, 1.0) for t in tasks), strict=True)]
    # Execute
    train_pending(svc, 2)
    aggregate_job(svc, job_id)
    # Assert
    version = svc.registry.list_versions(job_id)[1]
    assert version.server_lr == 1.0 and len(version.tasks_applied) == 2
    folded, _, _ = codec.decode_state(svc.store.read_bytes(svc.settings.models_bucket,
                                                           version.weights_path))
    for got, want in zip(folded, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert max(float(np.max(np.abs(g - s))) for g, s in zip(folded, at_the_jobs_rate,
                                                             strict=True)) > 1e-4


def test_the_status_says_the_plans_forecast_and_what_the_job_measured(pipeline, capsys):
    """The upload forecasts the job (its rounds are the versions it then commits;
    1 to R = 3 learners; the suggestion among them) and the status shows what it measured
    beside it, as ``status --json``, the CLI and the dashboard say it."""
    # Prepare
    from bucketlearn.entrypoints.cli import printing
    from bucketlearn.views import headline, throughput

    job = pipeline["job"]
    # Execute
    status = status_object(job)
    # Assert
    found, measured = status["forecast"], status["actual"]
    assert status["plan"]["parallel_tasks"] == 3
    assert found["rounds"] == job.version == measured["versions"]
    assert [r["workers"] for r in found["by_workers"]] == [1, 2, 3]
    assert found["suggested_workers"] in (1, 2, 3)
    assert found["model"]["parameters"] > 0 and found["steps_per_task"] == 2
    assert measured["training_seconds"] == pytest.approx(job.finished_at - found["made_at"],
                                                    abs=1e-3)
    assert measured["training_seconds"] > 0 and measured["seconds_left"] is None
    printing.print_status(status)
    out = capsys.readouterr().out
    assert ("plan:      trains 3 tasks at a time, each from the same version: as its "
            "parallel_tasks option asks; ") in out and "of about 2 steps each" in out
    assert "forecast:  about " in out and "in one process (train-local)" in out
    assert "actual:    " in out
    rows = throughput.forecast_rows(headline.job_summary(job, [], job.finished_at))
    assert [r["learners"] for r in rows] == ["1", "2", "3", "one process (train-local)"]
    assert [r[""] for r in rows].count("suggested") == 1
