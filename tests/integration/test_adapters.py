"""Port contracts, run against the in-memory implementations *and* the real emulators.

The same assertions on both keep the fakes honest: what unit tests rely on is what the Google
adapters do on the emulators.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from bucketlearn.adapters.memory import MemoryBlobStore, MemoryQueue, MemoryRegistry
from bucketlearn.domain.head import Head
from bucketlearn.domain.job import Job, ending_fields
from bucketlearn.domain.version import Version
from bucketlearn.errors import BackendRejectedError, NotFoundError, ObjectChangedError
from bucketlearn.ports import TaskMessage, VersionCommit

pytestmark = pytest.mark.integration


@pytest.fixture(params=["memory", "emulator"])
def backend(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        from bucketlearn.bootstrap import memory_services

        svc = memory_services()
        return svc
    return request.getfixturevalue("cloud")


def new_job(registry: Any, **extra: Any) -> str:
    job_id = f"job-{uuid.uuid4().hex[:12]}"
    doc = {"job_id": job_id, "status": "QUEUED", "phase": "splitting", "claim": "c1",
           "version": None, "epoch": 0, "created_at": time.time(), **extra}
    assert registry.create_job(Job.from_doc(doc)) is True
    return job_id


def test_create_job_is_create_once(backend: Any) -> None:
    """A second create for the same job id is refused (invariant 1 rests on this)."""
    registry = backend.registry
    job_id = new_job(registry)
    assert registry.create_job(Job.from_doc({"job_id": job_id, "status": "QUEUED"})) is False
    assert registry.get_job(job_id).phase == "splitting"


def test_update_job_if_compares_fields(backend: Any) -> None:
    registry = backend.registry
    job_id = new_job(registry)
    assert registry.update_job_if(job_id, {"claim": "other"}, {"claim": "c2"}) is False
    assert registry.update_job_if(job_id, {"claim": "c1"}, {"claim": "c2"}) is True
    assert registry.get_job(job_id).claim == "c2"


def test_update_job_if_matches_a_time_as_read(backend: Any) -> None:
    """A split's takeover expects ``claimed_at`` as it read it (a float): the same value read
    back matches, a renewed one does not."""
    registry = backend.registry
    job_id = new_job(registry, claimed_at=time.time() + 0.123456789)
    read = registry.get_job(job_id)
    expect = {"claim": "c1", "phase": "splitting", "claimed_at": read.claimed_at}
    assert registry.update_job_if(job_id, {"claim": "c1", "phase": "splitting"},
                                  {"claimed_at": read.claimed_at + 20.0}) is True
    assert registry.update_job_if(job_id, expect, {"claim": "c2"}) is False
    expect["claimed_at"] = registry.get_job(job_id).claimed_at
    assert registry.update_job_if(job_id, expect, {"claim": "c2"}) is True
    assert registry.get_job(job_id).claim == "c2"


PLAN = {"parallel_tasks": 2, "shards_per_task": 1, "tasks_per_epoch": 3, "epochs": 2,
        "serial_steps": 12, "decided": "test"}


def start(registry: Any, job_id: str) -> None:
    ok = registry.start_training(
        job_id, "c1", {"phase": "training", "version": 0, "epoch": 1, "round": 0,
                       "plan": PLAN}, Version(0, "w0"))
    assert ok


def commit(job_id: str, base: int, round_index: int, applied: list[int] = (),
           failed: list[int] = (), epoch: int = 1) -> VersionCommit:
    """The commit of round ``round_index`` of ``epoch`` (rounds of 2 of 3 tasks) on ``base``."""
    following = {"round": round_index + 1} if round_index == 0 else {"epoch": epoch + 1,
                                                                      "round": 0}
    task = f"{job_id}:e{epoch:04d}:t{{:05d}}"
    version = Version(base + 1, f"w{base + 1}", parent=base, epoch=epoch, round=round_index,
                      tasks_applied=tuple(task.format(t) for t in applied),
                      tasks_failed=tuple(task.format(t) for t in failed))
    return VersionCommit(job_id=job_id, base_version=base, version=version, epoch=epoch,
                         round=round_index, job_fields={"version": base + 1, **following})


def test_a_document_over_1_mib_is_refused_for_good(backend: Any) -> None:
    """Firestore refuses a document over 1 MiB (InvalidArgument): the adapter raises
    BackendRejectedError (permanent), and the in-memory registry does the same."""
    registry = backend.registry
    job_id = new_job(registry)
    with pytest.raises(BackendRejectedError):
        registry.update_job(job_id, {"last_watchdog_action": "x" * 1_100_000})
    assert registry.get_job(job_id).last_watchdog_action is None
    registry.update_job(job_id, {"last_watchdog_action": "x" * 1_000_000})  # under the limit: fine


def test_start_training_requires_the_claim(backend: Any) -> None:
    registry = backend.registry
    job_id = new_job(registry)
    assert registry.start_training(job_id, "not-mine", {"phase": "training"},
                                   Version(0, "w0")) is False
    start(registry, job_id)
    assert registry.get_job(job_id).version == 0


def test_commit_version_is_dense_and_applies_each_task_once(backend: Any) -> None:
    """Invariants 2 and 3 at the registry: stale bases and a round folded twice are refused,
    and what each version applied or gave up on is on its document."""
    # Prepare
    registry = backend.registry
    job_id = new_job(registry)
    start(registry, job_id)
    # Execute / Assert
    assert registry.commit_version(commit(job_id, 0, 0, [0, 1])) is True
    assert registry.commit_version(commit(job_id, 0, 1, [2])) is False  # stale base
    assert registry.commit_version(commit(job_id, 1, 0, [1])) is False  # round 0 folded already
    assert registry.commit_version(commit(job_id, 1, 1, failed=[2])) is True
    versions = registry.list_versions(job_id)
    assert [v.version for v in versions] == [0, 1, 2]
    assert [len(v.tasks_applied) for v in versions] == [0, 2, 0] and len(versions[2].tasks_failed) == 1
    job = registry.get_job(job_id)
    assert (job.version, job.epoch, job.round) == (2, 2, 0)


def test_commits_in_a_row_after_an_outside_write_stay_correct(backend: Any) -> None:
    """A commit right after this process's last one (Firestore: one conditional RPC) and one
    after another writer touched the job (the condition fails; a transaction decides) are both
    taken; one on a job cancelled in between is refused."""
    # Prepare
    from bucketlearn.usecases.cancel import cancel_job

    registry = backend.registry
    job_id = new_job(registry)
    start(registry, job_id)
    # Execute
    first = registry.commit_version(commit(job_id, 0, 0, [0, 1]))
    registry.update_job(job_id, {"watchdog_at": 1.0, "status": "RUNNING"})  # someone else writes
    second = registry.commit_version(commit(job_id, 1, 1, [2]))
    third = registry.commit_version(commit(job_id, 2, 0, [0, 1], epoch=2))
    cancel_job(backend, job_id, "test")
    fourth = registry.commit_version(commit(job_id, 3, 1, [2], epoch=2))
    # Assert
    job = registry.get_job(job_id)
    assert (first, second, third, fourth) == (True, True, True, False)
    assert (job.version, job.status, job.watchdog_at) == (3, "CANCELLED", 1.0)
    assert [v.version for v in registry.list_versions(job_id)] == [0, 1, 2, 3]


def test_no_version_is_committed_onto_a_cancelled_job(backend: Any) -> None:
    """A fold racing a cancel cannot advance the job. The commit that would
    have been v2 is refused once the job is CANCELLED (status, version and epoch untouched), by
    the Firestore transaction as by the in-memory lock."""
    # Prepare
    from bucketlearn.usecases.cancel import cancel_job

    registry = backend.registry
    job_id = new_job(registry)
    start(registry, job_id)
    assert registry.commit_version(commit(job_id, 0, 0, [0, 1]))
    registry.update_job(job_id, {"status": "RUNNING"})
    assert cancel_job(backend, job_id, "test").status == "CANCELLED"
    # Execute
    committed = registry.commit_version(commit(job_id, 1, 1, [2]))
    # Assert
    job = registry.get_job(job_id)
    assert committed is False
    assert (job.status, job.phase, job.version) == ("CANCELLED", "cancelled", 1)
    assert [v.version for v in registry.list_versions(job_id)] == [0, 1]


def test_a_job_cancelled_during_its_split_is_not_made_trainable(backend: Any) -> None:
    """start_training refuses a job cancelled while it was split, even with the right claim."""
    # Prepare
    from bucketlearn.usecases.cancel import cancel_job

    registry = backend.registry
    job_id = new_job(registry)
    cancel_job(backend, job_id, "test")
    # Execute
    started = registry.start_training(job_id, "c1", {"phase": "training", "version": 0,
                                                     "epoch": 1},
                                       Version(0, "w0"))
    # Assert
    job = registry.get_job(job_id)
    assert started is False
    assert (job.status, job.phase, job.version) == ("CANCELLED", "cancelled", None)
    assert registry.list_versions(job_id) == []


def test_record_evaluation_fills_the_version_and_only_a_current_head(backend: Any) -> None:
    """A version's accuracy, recorded after its commit, lands on the version document; on the
    job's head only while that version is still the head (a newer head is left alone)."""
    # Prepare
    registry = backend.registry
    job_id = new_job(registry)
    start(registry, job_id)
    assert registry.commit_version(commit(job_id, 0, 0, [0, 1]))
    assert registry.commit_version(commit(job_id, 1, 1, [2]))
    # Execute
    late = registry.record_evaluation(job_id, 1, {"holdout_accuracy": 0.5},
                                      Head(1, "w1", "c1", holdout_accuracy=0.5))
    current = registry.record_evaluation(job_id, 2, {"holdout_accuracy": 0.75},
                                         Head(2, "w2", "c2", holdout_accuracy=0.75))
    missing = registry.record_evaluation(job_id, 9, {"holdout_accuracy": 1.0},
                                         Head(9, "w9", "c9", holdout_accuracy=1.0))
    # Assert
    assert (late, current, missing) == (False, True, False)
    versions = registry.list_versions(job_id)
    assert [v.figure("holdout_accuracy") for v in versions] == [None, 0.5, 0.75]
    assert versions[1].parent == 0  # the rest of the document is kept
    assert registry.get_job(job_id).head == Head(2, "w2", "c2", holdout_accuracy=0.75)
    # Execute: an evaluation that arrived once the job's aggregation ended, of the head's own
    # version: no head given, so the head (a finished job's: its export's) stays as it is
    late_of_head = registry.record_evaluation(job_id, 2, {"holdout_accuracy": 0.7}, None)
    # Assert
    assert late_of_head is False
    assert registry.list_versions(job_id)[2].figure("holdout_accuracy") == 0.7
    assert registry.get_job(job_id).head == Head(2, "w2", "c2", holdout_accuracy=0.75)


def test_an_array_inside_an_array_is_refused_for_good(backend: Any) -> None:
    """Firestore stores no array directly inside an array (a confusion matrix is stored as a
    list of {"row": [...]} maps instead): the adapter raises BackendRejectedError, and the
    in-memory registry refuses it the same way; an array of maps holding arrays is fine."""
    registry = backend.registry
    job_id = new_job(registry)
    with pytest.raises(BackendRejectedError):
        registry.update_job(job_id, {"health": {"matrix": [[1, 2], [3, 4]]}})
    assert registry.get_job(job_id).health is None
    registry.update_job(job_id, {"health": {"matrix": [{"row": [1, 2]}, {"row": [3, 4]}]}})
    assert registry.get_job(job_id).health == {"matrix": [{"row": [1, 2]}, {"row": [3, 4]}]}


def test_a_holdout_report_round_trips_on_the_version_and_the_head(backend: Any) -> None:
    """The figures an evaluation records (``metrics.holdout_fields``: scalars, None for a
    missing ROC AUC, the per-class report with its confusion matrix) read back as written, from
    the version document and from the job's head."""
    # Prepare
    import numpy as np

    from bucketlearn.domain.metrics import classification_report, holdout_fields

    registry = backend.registry
    job_id = new_job(registry)
    start(registry, job_id)
    assert registry.commit_version(commit(job_id, 0, 0, [0, 1]))
    figures = holdout_fields(classification_report(np.array([[8, 2, 0], [0, 3, 1], [0, 0, 1]]),
                                                   loss=0.4))
    # Execute
    head = Head(1, "w1", "c1").evaluated(0.8, 0.4, figures)
    recorded = registry.record_evaluation(job_id, 1, {"holdout_accuracy": 0.8, **figures}, head)
    # Assert
    version = registry.get_version(job_id, 1)
    assert recorded is True
    assert {k: version.figure(k) for k in figures} == figures
    assert registry.get_job(job_id).head == head
    assert {k: getattr(head, k) for k in figures} == figures


def test_leases_are_exclusive_until_released_or_expired(backend: Any) -> None:
    """One holder at a time; renewed by acquiring again; a lease that ran out is taken over,
    and the answer names the holder it was taken from (a released one names none)."""
    registry = backend.registry
    name = f"lease-{uuid.uuid4().hex[:8]}"
    assert registry.acquire_lease(name, "a", 30)
    assert not registry.acquire_lease(name, "b", 30)
    renewed = registry.acquire_lease(name, "a", 30)  # renewal by the holder
    assert renewed and renewed.taken_over is None
    registry.release_lease(name, "b")  # not the holder: no effect
    assert not registry.acquire_lease(name, "b", 30)
    registry.release_lease(name, "a")
    freed = registry.acquire_lease(name, "b", 0.5)
    assert freed and freed.taken_over is None
    time.sleep(1.0)
    taken = registry.acquire_lease(name, "c", 30)  # b's lease expired
    assert taken and taken.taken_over == "b"


def test_active_jobs_are_found_however_many_newer_jobs_ended(backend: Any) -> None:
    """``list_active_jobs`` queries by status, not by age."""
    registry = backend.registry
    old = new_job(registry)
    registry.update_job(old, {"status": "RUNNING", "created_at": 1.0})
    ended = [new_job(registry) for _ in range(3)]
    for job_id in ended:
        registry.update_job(job_id, {**ending_fields("REJECTED", 2.0), "created_at": time.time()})
    active = {j.job_id for j in registry.list_active_jobs()}
    assert old in active and not active & set(ended)


def test_record_attempt_counts_each_key_once_and_refunds(backend: Any) -> None:
    """Attempts are counted per attempt key: the same key again (a retried call whose answer
    was lost) counts once; a refund takes that key's attempt back, idempotently."""
    registry = backend.registry
    job_id = new_job(registry)
    assert registry.record_attempt(job_id, "e0001-t00000", {"state": "RUNNING"}, "a") == 1
    assert registry.record_attempt(job_id, "e0001-t00000", {"state": "RUNNING"}, "a") == 1
    assert registry.record_attempt(job_id, "e0001-t00000", {"state": "RUNNING"}, "b") == 2
    registry.refund_attempt(job_id, "e0001-t00000", "a")
    registry.refund_attempt(job_id, "e0001-t00000", "a")
    registry.update_task(job_id, "e0001-t00000", {"state": "TRAINED"})
    [task] = registry.list_tasks(job_id)
    assert task.attempts == 1 and task.state == "TRAINED"
    assert registry.record_attempt(job_id, "e0001-t00000", {"state": "RUNNING"}, "c") == 2
    registry.refund_attempt(job_id, "e0001-t09999", "x")  # no such task: nothing to give back
    assert registry.get_task(job_id, "e0001-t09999") is None


def test_an_admission_reads_the_job_and_the_attempts_so_far_at_once(backend: Any) -> None:
    """``read_for_attempt``: the job and the task's attempt keys (none before the first);
    ``record_attempt`` with those keys counts them and its own, once however often it is
    retried, and the record keeps every key."""
    registry = backend.registry
    job_id = new_job(registry)
    # Execute / Assert: a first attempt
    job, known = registry.read_for_attempt(job_id, "e0001-t00003")
    assert job is not None and job.job_id == job_id and known == []
    assert registry.record_attempt(job_id, "e0001-t00003", {"state": "RUNNING"}, "a",
                                   known) == 1
    # a second delivery, its record retried after a lost answer
    _, known = registry.read_for_attempt(job_id, "e0001-t00003")
    assert known == ["a"]
    for _ in range(2):
        assert registry.record_attempt(job_id, "e0001-t00003", {"state": "RUNNING"}, "b",
                                       known) == 2
        assert registry.get_task(job_id, "e0001-t00003").attempts == 2  # the key once
    assert registry.read_for_attempt(job_id, "e0001-t00003")[1] == ["a", "b"]
    assert registry.get_task(job_id, "e0001-t00003").attempts == 2
    assert registry.read_for_attempt("no-such-job", "e0001-t00000") == (None, [])


def test_the_newest_versions_and_one_epochs_tasks_are_read_alone(backend: Any) -> None:
    """What the dashboard reads: ``list_versions(last=n)`` returns the newest
    n versions in order, with the figures carried by the versions read put back (and only
    those); ``list_tasks(epoch=e)`` returns that epoch's task documents."""
    # Prepare
    from dataclasses import replace

    from bucketlearn.domain.version import Evaluation

    registry = backend.registry
    job_id = new_job(registry)
    start(registry, job_id)
    rounds = [(0, 0, [0, 1], 1), (1, 1, [2], 1), (2, 0, [0, 1], 2), (3, 1, [2], 2)]
    for base, round_index, applied, epoch in rounds:  # v(n+1) carries v(n)'s figures
        step = commit(job_id, base, round_index, applied, epoch=epoch)
        carried = Evaluation(base, {"holdout_accuracy": base / 10}, evaluated_at=1.0)
        assert registry.commit_version(replace(step, version=replace(
            step.version, evaluation=carried if base >= 1 else None)))
    for epoch in (1, 2):
        for index in range(3):
            registry.update_task(job_id, f"e{epoch:04d}-t{index:05d}", {
                "task_id": f"{job_id}:e{epoch:04d}:t{index:05d}", "epoch": epoch,
                "task_index": index, "state": "TRAINED"})
    # Execute
    every = registry.list_versions(job_id)
    newest = registry.list_versions(job_id, last=2)
    beyond = registry.list_versions(job_id, last=50)
    tasks = registry.list_tasks(job_id, epoch=2)
    # Assert
    assert [v.version for v in every] == [0, 1, 2, 3, 4]
    assert [v.version for v in newest] == [3, 4]
    assert [v.figure("holdout_accuracy") for v in newest] == [0.3, None]
    assert [v.figure("holdout_accuracy") for v in every] == [None, 0.1, 0.2, 0.3, None]
    assert beyond == every
    assert sorted((t.epoch, t.task_index) for t in tasks) == [(2, 0), (2, 1), (2, 2)]
    assert len(registry.list_tasks(job_id)) == 6 and registry.list_tasks(job_id, epoch=3) == []


def test_blob_store_round_trip_stream_list_delete(backend: Any) -> None:
    store = backend.store
    bucket = backend.settings.work_bucket
    prefix = f"t-{uuid.uuid4().hex[:8]}/"
    payload = bytes(range(256)) * 4096  # 1 MiB
    info = store.write_bytes(bucket, prefix + "a.bin", payload, "application/octet-stream",
                             {"k": "v"})
    store.write_bytes(bucket, prefix + "b.bin", b"b", "application/octet-stream")
    assert info.size == len(payload)
    assert store.read_bytes(bucket, prefix + "a.bin") == payload
    with store.open_read(bucket, prefix + "a.bin") as stream:
        assert stream.read(10) == payload[:10]
        rest = stream.read()
    assert rest == payload[10:]
    stat = store.stat(bucket, prefix + "a.bin")
    assert stat is not None and stat.metadata == {"k": "v"} and stat.generation > 0
    assert [i.name for i in store.list(bucket, prefix)] == [prefix + "a.bin", prefix + "b.bin"]
    store.delete(bucket, prefix + "a.bin")
    store.delete(bucket, prefix + "a.bin")  # deleting twice is fine
    assert store.stat(bucket, prefix + "a.bin") is None
    assert [i.name for i in store.list(bucket, prefix)] == [prefix + "b.bin"]


def test_a_range_of_an_object_reads_those_bytes_and_no_more(backend: Any) -> None:
    """A packed part is a byte range of its pack (``ingest.parts.read_part``)."""
    store = backend.store
    bucket = backend.settings.work_bucket
    name = f"t-{uuid.uuid4().hex[:8]}/pack.bin"
    payload = bytes(range(256)) * 64
    store.write_bytes(bucket, name, payload, "application/octet-stream")
    assert store.read_range(bucket, name, 0, 10) == payload[:10]
    assert store.read_range(bucket, name, 1000, 3000) == payload[1000:4000]
    assert store.read_range(bucket, name, len(payload) - 5, 50) == payload[-5:]  # ends sooner
    assert store.read_range(bucket, name, len(payload) + 10, 5) == b""
    with pytest.raises(NotFoundError):
        store.read_range(bucket, name + ".missing", 0, 5)


@pytest.mark.parametrize("name", ["dir with space/ü ñ 中文.csv", "a+b=c&d?e#f;%20.csv",
                                  "line\nbreak.csv"])
def test_blob_store_names_with_spaces_and_unicode(backend: Any, name: str) -> None:
    """Any object name goes through every call unchanged (URL-encoded on the wire)."""
    # Prepare
    store = backend.store
    bucket = backend.settings.work_bucket
    full = f"u-{uuid.uuid4().hex[:8]}/{name}"
    # Execute
    info = store.write_bytes(bucket, full, b"u", "text/csv", {"k": "ü"})
    # Assert
    assert info.name == full
    assert store.read_bytes(bucket, full) == b"u"
    with store.open_read(bucket, full, generation=info.generation) as stream:
        assert stream.read() == b"u"
    stat = store.stat(bucket, full)
    assert stat is not None and (stat.name, stat.metadata) == (full, {"k": "ü"})
    assert [i.name for i in store.list(bucket, full.split("/")[0] + "/")] == [full]
    store.delete(bucket, full)
    assert store.stat(bucket, full) is None


def test_a_large_file_goes_up_in_chunks_and_reads_back_pinned(backend: Any,
                                                              tmp_path: Path) -> None:
    """50 MB through write_file (a resumable upload in 16 MiB chunks on Cloud Storage), with
    its metadata; read back whole through a pinned stream."""
    # Prepare
    store = backend.store
    bucket = backend.settings.uploads_bucket
    name = f"large-{uuid.uuid4().hex[:8]}.bin"
    payload = os.urandom(50 * 1024 * 1024)
    path = tmp_path / "large.bin"
    path.write_bytes(payload)
    # Execute
    info = store.write_file(bucket, name, str(path), "application/octet-stream", {"rows": "7"})
    digest = hashlib.sha256()
    with store.open_read(bucket, name, generation=info.generation) as stream:
        for chunk in iter(lambda: stream.read(8 * 1024 * 1024), b""):
            digest.update(chunk)
    # Assert
    try:
        assert (info.size, info.metadata) == (len(payload), {"rows": "7"})
        assert store.stat(bucket, name) == info
        assert digest.digest() == hashlib.sha256(payload).digest()
    finally:
        store.delete(bucket, name)


def test_new_generation_on_overwrite(backend: Any) -> None:
    store = backend.store
    bucket = backend.settings.uploads_bucket
    first = store.write_bytes(bucket, "same.csv", b"a", "text/csv")
    second = store.write_bytes(bucket, "same.csv", b"b", "text/csv")
    assert second.generation != first.generation


def test_pinned_read_never_yields_another_generation(backend: Any) -> None:
    """In a bucket that keeps no noncurrent versions, open_read(generation=g) reads g, or
    raises ObjectChangedError: at open once g is gone, and while reading when g is replaced
    mid-stream (Cloud Storage and fake-gcs-server answer 404 for a replaced generation)."""
    store = backend.store
    bucket = backend.settings.work_bucket
    name = f"pinned-{uuid.uuid4().hex[:8]}.csv"
    first_bytes, second_bytes = b"a" * 70_000, b"b" * 50_000
    first = store.write_bytes(bucket, name, first_bytes, "text/csv")
    with store.open_read(bucket, name, generation=first.generation) as stream:
        assert stream.read() == first_bytes
    second = store.write_bytes(bucket, name, second_bytes, "text/csv")
    with pytest.raises(ObjectChangedError) as excinfo:  # at open, or at its first read
        store.open_read(bucket, name, generation=first.generation).read()
    assert (excinfo.value.expected_generation, excinfo.value.found_generation) == (
        first.generation, second.generation)
    # replaced while being read: the rest is never the third generation's, silently
    stream = store.open_read(bucket, name, generation=second.generation)
    try:
        head = stream.read(1000)
        store.write_bytes(bucket, name, b"c" * 60_000, "text/csv")
        try:
            whole = head + b"".join(iter(lambda: stream.read(4096), b""))
        except ObjectChangedError:
            whole = None
    finally:
        stream.close()
    assert whole in (None, second_bytes)
    store.delete(bucket, name)
    with pytest.raises(ObjectChangedError) as excinfo:
        store.open_read(bucket, name, generation=second.generation).read()
    assert excinfo.value.found_generation is None


def test_a_versioned_bucket_serves_a_replaced_generation_to_a_pinned_read(backend: Any) -> None:
    """The uploads bucket keeps noncurrent versions: after a re-upload of
    the same name, a read pinned to the first generation still reads the first upload's bytes,
    from its start and in the middle of a stream; a plain read reads the new one."""
    store = backend.store
    bucket = backend.settings.uploads_bucket
    name = f"versioned-{uuid.uuid4().hex[:8]}.csv"
    first_bytes, second_bytes = b"a" * 70_000, b"b" * 50_000
    first = store.write_bytes(bucket, name, first_bytes, "text/csv")
    stream = store.open_read(bucket, name, generation=first.generation)
    try:
        head = stream.read(1000)
        store.write_bytes(bucket, name, second_bytes, "text/csv")
        whole = head + b"".join(iter(lambda: stream.read(4096), b""))
    finally:
        stream.close()
    assert whole == first_bytes
    with store.open_read(bucket, name, generation=first.generation) as again:
        assert again.read() == first_bytes
    assert store.read_bytes(bucket, name) == second_bytes


def test_queue_publish_pull_ack_and_nack_redelivers(backend: Any) -> None:
    queue = backend.queue
    job = "j-0123456789ab"
    message = TaskMessage(job_id=job, epoch=1, task_index=3,
                          parts=(f"jobs/{job}/p0", f"jobs/{job}/p1"), rows=10)
    queue.publish([message])
    received = pull_within(queue, 30)
    assert received.message == message
    received.nack()
    again = pull_within(queue, 30)
    assert again.message == message
    again.ack()
    assert pull_within(queue, 3, allow_none=True) is None


def test_workers_seen_lately_are_listed_by_a_query(backend: Any) -> None:
    """``list_workers(seen_since=)`` is a query on ``last_seen``: a worker gone for long is not
    read (its document expires by the TTL on ``expire_at``, a timestamp Firestore stores)."""
    # Prepare
    from datetime import UTC, datetime

    now, name = time.time(), uuid.uuid4().hex[:8]
    registry = backend.registry
    registry.heartbeat(f"old-{name}", {"worker_id": f"old-{name}", "last_seen": now - 7200,
                                       "expire_at": datetime.fromtimestamp(now, UTC)})
    registry.heartbeat(f"new-{name}", {"worker_id": f"new-{name}", "last_seen": now})
    # Execute
    seen = {w["worker_id"] for w in registry.list_workers(seen_since=now - 3600)}
    every = {w["worker_id"] for w in registry.list_workers()}
    # Assert
    assert f"new-{name}" in seen and f"old-{name}" not in seen
    assert {f"old-{name}", f"new-{name}"} <= every


def test_queue_drops_what_is_not_one_of_ours_saying_why(backend: Any) -> None:
    """Bytes on a topic that are no task message decode to no message and a reason (the
    learner logs it and acknowledges), on Pub/Sub as in memory."""
    # Prepare
    raw = b'{"job_id": "a/b", "epoch": 1, "task_index": 0, "parts": [], "rows": 1}'
    publish_raw = getattr(backend.queue, "publish_raw", None)
    if publish_raw is None:  # Pub/Sub: bytes straight to the topic
        backend.queue.publisher.publish(backend.queue.topic_path, raw).result(timeout=30)
    else:
        publish_raw(raw)
    # Execute
    received = pull_within(backend.queue, 30)
    # Assert
    assert received.message is None and received.problem.startswith("job_id: expected a job id")
    received.ack()


def pull_within(queue: Any, seconds: float, allow_none: bool = False) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = queue.pull(timeout=2)
        if got is not None:
            return got
    if allow_none:
        return None
    raise AssertionError(f"no message within {seconds}s")


def test_memory_types_are_the_ones_under_test() -> None:
    """Guard: the memory backends used above are the module's real classes."""
    from bucketlearn.bootstrap import memory_services

    svc = memory_services()
    assert isinstance(svc.store, MemoryBlobStore)
    assert isinstance(svc.queue, MemoryQueue)
    assert isinstance(svc.registry, MemoryRegistry)
