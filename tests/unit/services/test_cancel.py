"""Cancelling a job on the in-memory ports: the job ends CANCELLED, workers
acknowledge its tasks without training, the aggregator folds and exports nothing more (not even a
fold or an export already in flight), a split in progress stops, and the last version stays
downloadable as a .keras that plain Keras loads in safe mode."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from bucketlearn import layout
from bucketlearn.aggregation import writer as aggregator
from bucketlearn.bootstrap import memory_services
from bucketlearn.domain.lifecycle import CANCELLED, DONE, RUNNING
from bucketlearn.domain.task import skip_reason
from bucketlearn.errors import JobStateError, NotFoundError
from bucketlearn.faults import inject
from bucketlearn.loops.autoscale import outstanding_tasks
from bucketlearn.loops.learner import Decision, Learner
from bucketlearn.loops.watchdog import watchdog_pass
from bucketlearn.services import task_messages
from bucketlearn.services.evaluate import Scoring
from bucketlearn.usecases.cancel import CancelResult, cancel_job
from bucketlearn.usecases.model_files import model_bytes, predict_file
from bucketlearn.usecases.publish import publish_round
from bucketlearn.usecases.status import status_object
from bucketlearn.usecases.upload import Outcome, StorageEvent, handle_upload
from bucketlearn.usecases.upload_steps import UploadSteps
from bucketlearn.usecases.waiting import wait_terminal
from tests.unit.helpers import csv_bytes, write_blobs_csv
from tests.unit.steps import run_rounds, start_job, train_pending

BY = "alice@laptop (bucketlearn cancel)"


def round_size(svc: Any, job_id: str) -> int:
    return len(task_messages.current_round_tasks(svc.registry.get_job(job_id)))


@pytest.fixture
def running(tmp_path: Path) -> tuple[Any, str]:
    """A job at v1 (one round folded), RUNNING, with its second round published."""
    svc, job_id = start_job(tmp_path, epochs=2, parallel_tasks=2)
    train_pending(svc, round_size(svc, job_id))
    aggregator.aggregate_job(svc, job_id)
    job = svc.registry.get_job(job_id)
    assert (job.status, job.version) == (RUNNING, 1) and len(svc.queue) == 2
    return svc, job_id


def delta_objects(svc: Any, job_id: str) -> list[str]:
    return [i.name for i in svc.store.list(svc.settings.deltas_bucket, f"{job_id}/")]


def test_cancel_ends_a_running_job_saying_who_when_and_why(running):
    # Prepare
    svc, job_id = running
    # Execute
    outcome = cancel_job(svc, job_id, BY, "wrong file")
    # Assert
    job = svc.registry.get_job(job_id)
    assert outcome.result is CancelResult.CANCELLED
    assert (outcome.previous_status, outcome.status, outcome.version) == ("RUNNING",
                                                                           "CANCELLED", 1)
    assert f"job {job_id} cancelled" in outcome.message and "v1" in outcome.message
    assert (job.status, job.phase) == (CANCELLED, "cancelled")
    assert job.is_terminal and job.finished_at == job.cancelled_at
    assert (job.cancelled_by, job.cancel_reason) == (BY, "wrong file")
    assert job.error.startswith(f"cancelled by {BY} at 20") and job.error.endswith(
        " UTC: wrong file")
    status = status_object(job)
    assert (status["status"], status["version"], status["cancelled_by"]) == ("CANCELLED", 1, BY)


def test_workers_ack_a_cancelled_jobs_tasks_without_training(running):
    """Item 11: workers skip and ack its tasks (before: they trained every one of them)."""
    # Prepare
    svc, job_id = running
    tasks_before = svc.registry.list_tasks(job_id)
    cancel_job(svc, job_id, BY)
    learner = Learner(svc, "w1")
    # Execute
    decisions = []
    while (received := svc.queue.pull(0)) is not None:
        decisions.append(learner.process(received.message))
    # Assert
    assert decisions == [Decision.ACK, Decision.ACK]
    assert learner.tasks_done == 0
    assert delta_objects(svc, job_id) == []  # nothing trained, nothing written
    assert svc.registry.list_tasks(job_id) == tasks_before  # not even an attempt counted


def applied_indices(svc, job_id):
    """The task indices the job's versions applied, in order."""
    return [int(t.rsplit(":t", 1)[1]) for v in svc.registry.list_versions(job_id)
            for t in v.tasks_applied]


def test_skip_reason_names_the_cancelled_status(running):
    # Prepare
    svc, job_id = running
    task = svc.queue.pull(0).message
    cancel_job(svc, job_id, BY)
    # Execute
    reason = skip_reason(svc.registry.get_job(job_id), task.base_version,
                         bool(task.weights_path or task.base_digest))
    # Assert
    assert reason == "the job is CANCELLED"


def test_the_aggregator_folds_nothing_after_a_cancel_even_with_results_waiting(running):
    """One result of the round arrived before the cancel and waits for the other, which was in
    training at the cancel and arrives after it: nothing is folded (no version, no next round,
    the head stays), and the late result's event removes both, which nothing would read."""
    # Prepare
    svc, job_id = running
    first, second = svc.queue.pull(0).message, svc.queue.pull(0).message
    learner = Learner(svc, "w1")
    learner.announce(learner.train(first, svc.registry.get_job(job_id)))
    assert aggregator.aggregate_job(svc, job_id) is Outcome.ACCEPTED
    assert svc.registry.get_job(job_id).version == 1  # the round is not complete yet
    in_flight = svc.registry.get_job(job_id)
    cancel_job(svc, job_id, BY)
    published = len(svc.queue.published)
    # Execute: the task in training at the cancel writes its result
    learner.announce(learner.train(second, in_flight))
    outcome = aggregator.aggregate_job(svc, job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    assert outcome is Outcome.ACCEPTED
    assert (job.status, job.version) == (CANCELLED, 1)
    assert [v.version for v in svc.registry.list_versions(job_id)] == [0, 1]
    assert applied_indices(svc, job_id) == [0, 1]
    assert len(svc.queue.published) == published
    assert delta_objects(svc, job_id) == []


def test_a_fold_racing_the_cancel_cannot_commit(running):
    """The cancel lands between the fold's read and its commit: the registry refuses the commit
    (before: it committed v2 and set the job RUNNING again, undoing the cancel)."""
    # Prepare
    svc, job_id = running
    train_pending(svc, 2)

    def cancel_then_commit(real, commit):
        cancel_job(svc, job_id, BY)
        return real(commit)

    published = len(svc.queue.published)
    # Execute
    aggregator.aggregate_job(inject(svc, "registry", commit_version=cancel_then_commit), job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    assert (job.status, job.version) == (CANCELLED, 1)
    assert job.head.version == 1
    assert [v.version for v in svc.registry.list_versions(job_id)] == [0, 1]
    assert applied_indices(svc, job_id) == [0, 1]
    assert len(svc.queue.published) == published  # no next round


def test_an_export_racing_the_cancel_does_not_mark_the_job_done(tmp_path):
    """The cancel lands while the export evaluates the final model: the job is not marked DONE
    (before: DONE overwrote CANCELLED); it stays CANCELLED, and its head version is exported as
    a cancelled job's is (so that it downloads from the models bucket)."""
    # Prepare: the cancel lands in the export's evaluation (the Scoring's evaluate_parts: the
    # export is its only user; the store's reads would not single it out: the last version's
    # evaluation reads the same holdout parts, in the same exporting phase)
    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=5)
    real_evaluate = Scoring().evaluate_parts
    exporting = []

    def evaluate(*args, **kwargs):
        exporting.append(True)
        cancel_job(svc, job_id, BY)
        return real_evaluate(*args, **kwargs)

    # Execute
    run_rounds(svc, job_id, scoring=Scoring(evaluate_parts=evaluate))
    # Assert
    job = svc.registry.get_job(job_id)
    models = svc.settings.models_bucket
    assert exporting == [True], "the export never ran"
    assert (job.status, job.phase) == (CANCELLED, "cancelled")
    assert job.model_path == layout.model_path(job_id) and job.finished_at is not None
    assert svc.store.stat(models, layout.model_path(job_id, job.version)) is not None


def test_a_cancel_after_the_export_wrote_its_files_is_not_overwritten_by_done(tmp_path):
    """The narrowest window: the .keras files are written, DONE is not yet. DONE is written
    only onto a job that has not ended, so the cancel stands (the files hold its head, which
    the cancelled job's wind-up records as its model)."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=5)

    def write(real, bucket, name, *args, **kwargs):
        info = real(bucket, name, *args, **kwargs)
        if name == layout.model_path(job_id):
            cancel_job(svc, job_id, BY)
        return info

    # Execute
    run_rounds(inject(svc, "store", write_bytes=write), job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    assert (job.status, job.phase) == (CANCELLED, "cancelled")
    assert job.model_path == layout.model_path(job_id)
    assert model_bytes(svc, job_id, None)[1] == job.version


def test_the_last_version_of_a_cancelled_job_stays_downloadable(running, tmp_path):
    """The head of a CANCELLED job is built into a .keras that plain Keras loads in safe mode
    and ``bucketlearn predict`` accepts; an earlier version too."""
    # Prepare
    import keras

    svc, job_id = running
    cancel_job(svc, job_id, BY)
    csv_path = tmp_path / "blobs.csv"  # start_job's upload
    # Execute
    data, version = model_bytes(svc, job_id, None)
    first, zero = model_bytes(svc, job_id, 0)
    # Assert
    assert version == 1 and zero == 0 and data != first
    out = tmp_path / "cancelled.keras"
    out.write_bytes(data)
    model = keras.models.load_model(out, safe_mode=True)
    assert model.output_shape[-1] == 3
    report = predict_file(str(out), str(csv_path), None)
    assert report["rows"] == 400 and report["accuracy"] is not None
    assert set(report["predictions"]) <= {"0", "1", "2"}


def test_cancel_of_a_job_that_has_ended_is_refused_clearly(tmp_path):
    """A DONE job stays DONE: 'job X is already DONE'; a second cancel is a no-op."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=1)
    run_rounds(svc, job_id)
    done = svc.registry.get_job(job_id)
    assert done.status == DONE
    # Execute
    outcome = cancel_job(svc, job_id, BY)
    # Assert
    assert outcome.result is CancelResult.ALREADY_ENDED
    assert outcome.message.startswith(f"job {job_id} is already DONE")
    assert svc.registry.get_job(job_id) == done


def test_cancel_twice_says_it_is_already_cancelled(running):
    # Prepare
    svc, job_id = running
    cancel_job(svc, job_id, BY, "first")
    before = svc.registry.get_job(job_id)
    # Execute
    outcome = cancel_job(svc, job_id, "bob", "second")
    # Assert
    assert outcome.result is CancelResult.ALREADY_CANCELLED
    assert f"is already CANCELLED (cancelled by {BY}" in outcome.message
    assert svc.registry.get_job(job_id) == before


def test_cancel_of_an_unknown_job_raises_not_found():
    from bucketlearn.bootstrap import memory_services

    with pytest.raises(NotFoundError, match="job nope-000000000000: no such job"):
        cancel_job(memory_services(), "nope-000000000000", BY)


def upload(svc: Any, name: str, data: bytes) -> StorageEvent:
    info = svc.store.write_bytes(svc.settings.uploads_bucket, name, data, "text/csv",
                                 {"epochs": "1", "rows_per_shard": "64"})
    return StorageEvent(info.bucket, info.name, info.generation, info.size)


def cancel_during_split(svc: Any) -> UploadSteps:
    """Upload steps whose split cancels its own job once it has read the whole upload."""
    real = UploadSteps().split

    def split_then_cancel(source, store, bucket, job_id, *args, **kwargs):
        try:
            return real(source, store, bucket, job_id, *args, **kwargs)
        finally:
            cancel_job(svc, job_id, BY, "during the split")

    return UploadSteps(split=split_then_cancel)


def test_a_job_cancelled_during_its_split_stays_cancelled(tmp_path):
    """The splitter does not resurrect it: no version 0 (its weights, written just before, are
    deleted), no task published, its shards removed;
    the event redelivered is a duplicate (before: start_training was refused, the function
    answered 503 and Eventarc retried)."""
    # Prepare
    from bucketlearn.bootstrap import memory_services

    svc = memory_services()
    event = upload(svc, "blobs.csv", write_blobs_csv(tmp_path / "b.csv", n_rows=300).read_bytes())
    steps = cancel_during_split(svc)
    # Execute
    outcome, job_id = handle_upload(svc, event, steps)
    again, _ = handle_upload(svc, event, steps)
    # Assert
    job = svc.registry.get_job(job_id)
    assert (outcome, again) == (Outcome.CANCELLED, Outcome.DUPLICATE)
    assert (job.status, job.phase, job.version) == (CANCELLED, "cancelled", None)
    assert job.cancel_reason == "during the split"
    assert svc.queue.published == []
    assert svc.registry.list_versions(job_id) == []
    assert list(svc.store.list(svc.settings.work_bucket, layout.job_prefix(job_id))) == []
    assert list(svc.store.list(svc.settings.models_bucket, f"weights/{job_id}/")) == []
    with pytest.raises(JobStateError, match="is CANCELLED: it ended before its first version"):
        model_bytes(svc, job_id, None)


def test_a_problem_found_after_a_cancel_does_not_overwrite_it():
    """A bad upload cancelled while it is read stays CANCELLED: the rejection that follows
    does not replace the cancel (before: REJECTED overwrote it)."""
    # Prepare
    from bucketlearn.bootstrap import memory_services

    svc = memory_services()
    rows = [[i, i % 2] for i in range(20)] + [["abc", 1]]
    event = upload(svc, "bad.csv", csv_bytes(["x", "label"], rows))
    steps = cancel_during_split(svc)
    # Execute
    _, job_id = handle_upload(svc, event, steps)
    # Assert
    job = svc.registry.get_job(job_id)
    assert (job.status, job.cancel_reason) == (CANCELLED, "during the split")
    assert job.error_detail is None


def test_the_autoscaler_counts_no_task_of_a_cancelled_job(running):
    # Prepare
    svc, job_id = running
    assert outstanding_tasks(svc.registry) == 2
    # Execute
    cancel_job(svc, job_id, BY)
    # Assert
    assert outstanding_tasks(svc.registry) == 0


def test_wait_terminal_returns_on_cancelled(running):
    """``submit --wait`` follows a job until it ends: CANCELLED ends it (before: it waited for
    the whole timeout)."""
    # Prepare
    import time

    svc, job_id = running
    cancel_job(svc, job_id, BY)
    started = time.monotonic()
    # Execute
    job = wait_terminal(svc.registry, job_id, timeout=5, poll=0.01)
    # Assert
    assert job.status == CANCELLED and time.monotonic() - started < 1


def test_a_round_published_just_after_the_cancel_is_not_recorded_and_nothing_fails(tmp_path):
    """A writer that read the job just before it was cancelled publishes a round: the record of
    it is refused like any write to an ended job, and the publish ends quietly."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    job = svc.registry.get_job(job_id)
    cancel_job(svc, job_id, "me")
    published = svc.registry.get_job(job_id).published
    # Execute
    publish_round(svc, job)
    # Assert
    after = svc.registry.get_job(job_id)
    assert after.status == CANCELLED and after.published == published


def test_an_upload_cancelled_between_its_start_and_its_publish_is_accepted_and_stays_cancelled(
        tmp_path):
    # Prepare: the cancel lands right after training starts, before the first round's record
    svc = memory_services()
    path = write_blobs_csv(tmp_path / "blobs.csv", n_rows=400)

    def start_then_cancel(real, job_id, *args, **kwargs):
        started = real(job_id, *args, **kwargs)
        cancel_job(svc, job_id, "me")
        return started

    info = svc.store.write_bytes(svc.settings.uploads_bucket, path.name, path.read_bytes(),
                                 "text/csv", {"epochs": "1", "rows_per_shard": "64",
                                              "parallel_tasks": "2"})
    event = StorageEvent(info.bucket, info.name, info.generation, info.size)
    # Execute
    outcome, job_id = handle_upload(inject(svc, "registry", start_training=start_then_cancel),
                                    event)
    # Assert
    assert outcome == Outcome.ACCEPTED
    assert svc.registry.get_job(job_id).status == CANCELLED


def test_the_watchdog_acts_on_a_job_that_ends_meanwhile_without_writing_to_it(tmp_path):
    # Prepare: the job is cancelled while the watchdog publishes its stalled round again
    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)

    def publish_then_cancel(real, messages):
        real(messages)
        cancel_job(svc, job_id, "me")

    later = dataclasses.replace(svc, clock=lambda: time.time() + 10_000)
    # Execute
    actions = watchdog_pass(inject(later, "queue", publish=publish_then_cancel))
    # Assert: the action is reported; the ended job got none of the watchdog's bookkeeping
    job = svc.registry.get_job(job_id)
    assert [a["job_id"] for a in actions] == [job_id]
    assert job.status == CANCELLED and job.watchdog_actions == 0 and job.watchdog_at is None
