"""split.handle_upload on the in-memory ports: one upload -> one job, duplicates, rejections."""

from __future__ import annotations

import dataclasses

import pytest

from bucketlearn import layout
from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.bootstrap import memory_services
from bucketlearn.config import Limits, Settings
from bucketlearn.domain.job import Job, round_key
from bucketlearn.domain.lifecycle import FAILED, QUEUED, REJECTED, SPLITTING, TRAINING
from bucketlearn.domain.plan import epoch_tasks
from bucketlearn.errors import (
    BackendRejectedError,
    ObjectChangedError,
    PermanentError,
    TransientError,
)
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.services import task_messages
from bucketlearn.usecases.upload import Outcome, StorageEvent, handle_upload
from tests.unit.helpers import REPO_DIR, csv_bytes


def upload(svc, name, data, metadata=None):
    info = svc.store.write_bytes(svc.settings.uploads_bucket, name, data, "text/csv",
                                 metadata=metadata)
    return StorageEvent(info.bucket, info.name, info.generation, info.size)


def work_objects(svc, job_id):
    return [i.name for i in svc.store.list(svc.settings.work_bucket, layout.job_prefix(job_id))]


@pytest.fixture(scope="module")
def digits_job():
    """digits.csv uploaded with epochs=1 and handled once (builds the Keras model: slow)."""
    svc = memory_services()
    data = (REPO_DIR / "data" / "digits.csv").read_bytes()
    event = upload(svc, "digits.csv", data, metadata={"epochs": "1"})
    outcome, job_id = handle_upload(svc, event)
    return svc, event, outcome, job_id, data


def test_upload_is_accepted_as_one_job(digits_job):
    """An upload gives ACCEPTED and exactly one job, in training, with its options."""
    # Prepare
    svc, event, outcome, job_id, _ = digits_job
    # Execute
    job = svc.registry.get_job(job_id)
    # Assert
    assert outcome is Outcome.ACCEPTED
    assert job_id == layout.job_id_for(event.bucket, event.name, event.generation)
    assert [j.job_id for j in svc.registry.list_jobs()] == [job_id]
    assert job.phase == TRAINING and not job.is_terminal
    assert job.options["epochs"] == 1
    assert job.dataset["rows"] == 1797 and len(job.dataset["classes"]) == 10
    assert job.version == 0 and job.epoch == 1 and job.round == 0
    assert job.published == round_key(1, 0)
    assert job.tasks_planned == job.tasks_per_epoch == job.plan.tasks_per_epoch


def test_the_first_round_is_published(digits_job):
    """Only round 0 of epoch 1 is published: one message per task of the round, each naming its
    shards' parts and rows, the version it trains from (v0) and the share of the job its round
    spans."""
    # Prepare
    svc, _, _, job_id, _ = digits_job
    job = svc.registry.get_job(job_id)
    manifest = Manifest.from_json(
        svc.store.read_bytes(svc.settings.work_bucket, layout.manifest_path(job_id)))
    plan = job.plan
    tasks = epoch_tasks(plan, len(manifest.shards), 0, 1)
    # Execute
    messages = [m for m in svc.queue.published if m.job_id == job_id]
    # Assert
    assert [m.task_index for m in messages] == list(plan.round_range(0))
    assert sorted(i for t in tasks for i in t) == list(range(len(manifest.shards)))
    for m in messages:
        shards = [manifest.shards[i] for i in tasks[m.task_index]]
        assert (m.epoch, m.round, m.base_version) == (1, 0, 0)
        assert list(m.parts) == [p for shard in shards for p in shard.parts]
        assert m.rows == sum(shard.rows for shard in shards)
        assert m.weights_path == job.head.weights_path
        assert m.span == plan.span(1, 0) and m.span[0] == 0.0 < m.span[1]
    assert svc.registry.get_version(job_id, 0).weights_path.startswith(f"weights/{job_id}/")


def test_redelivered_event_is_duplicate_and_publishes_nothing(digits_job):
    """The same event again: DUPLICATE, same job id, no new messages, no new job (invariant 1)."""
    # Prepare
    svc, event, _, job_id, _ = digits_job
    published_before = len(svc.queue.published)
    jobs_before = len(svc.registry.list_jobs())
    work_before = work_objects(svc, job_id)
    # Execute
    outcome, again = handle_upload(svc, event)
    # Assert
    assert outcome is Outcome.DUPLICATE
    assert again == job_id
    assert len(svc.queue.published) == published_before
    assert len(svc.registry.list_jobs()) == jobs_before
    assert work_objects(svc, job_id) == work_before


def test_new_generation_is_a_new_job(digits_job):
    """Overwriting the object (new generation) starts a new job with a new id."""
    # Prepare
    svc, event, _, job_id, data = digits_job
    new_event = upload(svc, "digits.csv", data, metadata={"epochs": "1"})
    # Execute
    outcome, new_job_id = handle_upload(svc, new_event)
    # Assert
    assert new_event.generation != event.generation
    assert outcome is Outcome.ACCEPTED
    assert new_job_id != job_id
    assert new_job_id == layout.job_id_for(new_event.bucket, new_event.name,
                                           new_event.generation)
    assert len([m for m in svc.queue.published if m.job_id == new_job_id]) == \
        len(task_messages.current_round_tasks(svc.registry.get_job(new_job_id)))


class RecordingStore(MemoryBlobStore):
    """A MemoryBlobStore that remembers every name written."""

    def __init__(self):
        super().__init__()
        self.written = []

    def write_bytes(self, bucket, name, data, content_type, metadata=None):
        self.written.append((bucket, name))
        return super().write_bytes(bucket, name, data, content_type, metadata)


def test_bad_csv_is_rejected_and_its_partial_shards_removed():
    """A bad value late in a multi-block file: REJECTED naming row/column, no shards left."""
    # Prepare: 1 MB read blocks; shards of the first block are complete and written (each
    # part a pack of its own) before the 'inf' in the second block is seen
    settings = Settings(limits=Limits(max_line_bytes=1024, pack_bytes=0))
    svc = memory_services(settings)
    svc.store = RecordingStore()
    rows = [[i, (i * 7) % 13, i % 3] for i in range(150_000)]
    rows[149_000][1] = "inf"
    event = upload(svc, "late-bad.csv", csv_bytes(["id", "f1", "label"], rows),
                   metadata={"rows_per_shard": "5000"})
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    shard_writes = [n for b, n in svc.store.written
                    if b == settings.work_bucket and n.startswith(f"jobs/{job_id}/shards/")]
    assert shard_writes, "precondition: some shards were written before the bad row"
    assert outcome is Outcome.REJECTED
    assert job.status == REJECTED and job.is_terminal
    assert job.error_detail["row"] == 149_001
    assert job.error_detail["column"] == "f1"
    assert "row 149001" in job.error and "column 'f1'" in job.error
    assert "expected a finite number" in job.error and "found: inf" in job.error
    assert work_objects(svc, job_id) == []
    assert svc.queue.published == []


def test_small_bad_csv_is_rejected_with_row_and_column():
    """A non-numeric feature: REJECTED, the job's error names the row and the column."""
    # Prepare
    svc = memory_services()
    rows = [[i, i % 2] for i in range(20)]
    rows[4][0] = "twelve"
    event = upload(svc, "bad.csv", csv_bytes(["x", "label"], rows))
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    assert outcome is Outcome.REJECTED
    assert job.status == REJECTED
    assert (job.error_detail["row"], job.error_detail["column"]) == (5, "x")
    assert job.error.startswith(f"gs://{event.bucket}/bad.csv, row 5, column 'x'")
    assert work_objects(svc, job_id) == []
    assert svc.queue.published == []
    assert handle_upload(svc, event) == (Outcome.DUPLICATE, job_id)


def test_invalid_metadata_is_rejected_naming_the_option():
    """epochs=-1 in the object metadata: REJECTED, the error names 'epochs' and the value."""
    # Prepare
    svc = memory_services()
    event = upload(svc, "ok.csv", csv_bytes(["x", "label"], [[i, i % 2] for i in range(20)]),
                   metadata={"epochs": "-1"})
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    assert outcome is Outcome.REJECTED
    assert job.status == REJECTED
    assert "'epochs'" in job.error
    assert "expected 'auto' or a whole number from 1 to 1000" in job.error
    assert "'-1'" in job.error
    assert svc.queue.published == []
    assert work_objects(svc, job_id) == []


@pytest.mark.parametrize("name", ["notes.txt", "data.csv.gz", "folder/"])
def test_non_csv_objects_are_ignored(name):
    """Objects that are not .csv are ignored: no job."""
    # Prepare
    svc = memory_services()
    event = upload(svc, name, b"whatever")
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    assert (outcome, job_id) == (Outcome.IGNORED, None)
    assert svc.registry.list_jobs() == []


def test_the_same_name_uploaded_twice_is_two_jobs_each_of_its_own_file():
    """The same object name uploaded twice in a row (both events delivered after the second
    upload): the uploads bucket keeps the first generation, so each generation is its own job,
    split from its own bytes; the first is not REJECTED for not being the live one."""
    # Prepare
    svc = memory_services()
    first = upload(svc, "r.csv", csv_bytes(["x", "label"], [[i, i % 2] for i in range(20)]),
                   metadata={"epochs": "1"})
    second = upload(svc, "r.csv", csv_bytes(["x", "label"], [[i, "ab"[i % 2]]
                                                            for i in range(30)]))
    # Execute
    outcomes = [handle_upload(svc, event) for event in (first, second)]
    # Assert
    jobs_made = [svc.registry.get_job(job_id) for _, job_id in outcomes]
    assert [outcome for outcome, _ in outcomes] == [Outcome.ACCEPTED, Outcome.ACCEPTED]
    assert jobs_made[0].job_id != jobs_made[1].job_id
    assert [j.dataset["classes"] for j in jobs_made] == [["0", "1"], ["a", "b"]]
    assert jobs_made[0].options["epochs"] == 1  # the first generation's own options


def test_a_replaced_object_no_bucket_keeps_is_rejected():
    """In a bucket that keeps no noncurrent versions, an event for a generation that was
    replaced cannot be read: REJECTED naming the generation expected and the one found."""
    # Prepare
    svc = dataclasses.replace(memory_services(), store=MemoryBlobStore())
    data = csv_bytes(["x", "label"], [[i, i % 2] for i in range(20)])
    old = upload(svc, "r.csv", data)
    new = upload(svc, "r.csv", data)
    # Execute
    outcome, job_id = handle_upload(svc, old)
    # Assert
    job = svc.registry.get_job(job_id)
    assert outcome is Outcome.REJECTED
    assert f"expected generation {old.generation}" in job.error
    assert f"found: generation {new.generation}" in job.error
    assert svc.queue.published == []


class ReuploadingStore(MemoryBlobStore):
    """Re-uploads ``name`` with ``new_data`` when it is opened for the ``at``-th time (the
    header is open 1, pass 1 open 2, pass 2 open 3), as a user overwriting the file would."""

    def __init__(self, name, new_data, at=3, versioned=()):
        super().__init__(versioned)
        self.name, self.new_data, self.at, self.opens = name, new_data, at, 0

    def open_read(self, bucket, name, generation=None):
        if name == self.name:
            self.opens += 1
            if self.opens == self.at:
                self.write_bytes(bucket, name, self.new_data, "text/csv")
        return super().open_read(bucket, name, generation)


@pytest.mark.parametrize("new_rows", [
    [[i, ["a", "b", "c"][i % 3]] for i in range(30)],  # a label pass 1 never saw
    [[i, "a" if i < 25 else "b"] for i in range(30)],  # the same labels, other class counts
], ids=["new-label", "other-class-counts"])
def test_reupload_between_passes_is_rejected_not_mixed(new_rows):
    """The object is overwritten after pass 1 in a bucket that keeps no
    noncurrent versions: pass 2 reads the event's generation or nothing, so the job is REJECTED
    with a clear reason (before: generation N+1's
    rows dealt with N's class counts, or KeyError on a new label and an HTTP 500 retry loop)."""
    # Prepare
    svc = memory_services()
    svc.store = ReuploadingStore("swap.csv", csv_bytes(["x", "label"], new_rows))
    event = upload(svc, "swap.csv", csv_bytes(["x", "label"],
                                              [[i, ["a", "b"][i % 2]] for i in range(30)]))
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    current = svc.store.stat(event.bucket, event.name)
    assert svc.store.opens == 3
    assert outcome is Outcome.REJECTED
    assert job.status == REJECTED and job.is_terminal
    assert job.error.startswith(f"gs://{event.bucket}/swap.csv: the upload was replaced or "
                                   "deleted while it was being read")
    assert f"expected generation {event.generation} until the split ends" in job.error
    assert f"found: generation {current.generation}" in job.error
    assert work_objects(svc, job_id) == []
    assert svc.queue.published == []


def test_a_reupload_of_the_same_name_leaves_the_first_split_its_own_bytes():
    """The uploads bucket keeps noncurrent versions (as Terraform creates
    it), and every pass reads the event's generation, so a re-upload of the same name during
    the split leaves the first job training its own file (before: the live generation was
    compared, and the first job was REJECTED); the re-upload gets a job of its own."""
    # Prepare
    svc = memory_services()
    first_rows = [[i, ["a", "b"][i % 2]] for i in range(30)]
    svc.store = ReuploadingStore("same.csv", csv_bytes(["x", "label"], [[i, "c"] for i in
                                                                         range(30)]),
                                 versioned=(svc.settings.uploads_bucket,))
    event = upload(svc, "same.csv", csv_bytes(["x", "label"], first_rows))
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    current = svc.store.stat(event.bucket, event.name)
    assert svc.store.opens >= 3 and current.generation != event.generation
    assert outcome is Outcome.ACCEPTED and job.status == QUEUED, job.error
    assert sorted(job.classes) == ["a", "b"]  # the first upload's labels, not the re-upload's
    second = StorageEvent(current.bucket, current.name, current.generation, current.size)
    assert handle_upload(svc, second)[1] != job_id


def test_upload_deleted_during_the_split_is_rejected():
    """Deleted after pass 1: REJECTED, 'found: no object'."""
    # Prepare
    class DeletingStore(ReuploadingStore):
        def open_read(self, bucket, name, generation=None):
            if name == self.name:
                self.opens += 1
                if self.opens == self.at:
                    self.delete(bucket, name)
            return MemoryBlobStore.open_read(self, bucket, name, generation)

    svc = memory_services()
    svc.store = DeletingStore("gone.csv", b"")
    event = upload(svc, "gone.csv", csv_bytes(["x", "label"], [[i, i % 2] for i in range(20)]))
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    assert outcome is Outcome.REJECTED
    assert "replaced or deleted while it was being read" in job.error
    assert job.error.endswith("found: no object")


def test_memory_store_reads_only_the_pinned_generation():
    """open_read(generation=g) reads g, and raises ObjectChangedError once g is replaced."""
    # Prepare
    store = MemoryBlobStore()
    first = store.write_bytes("b", "o.csv", b"first", "text/csv")
    pinned = store.open_read("b", "o.csv", generation=first.generation)
    second = store.write_bytes("b", "o.csv", b"second", "text/csv")
    # Execute
    with pytest.raises(ObjectChangedError) as excinfo:
        store.open_read("b", "o.csv", generation=first.generation)
    # Assert
    assert pinned.read() == b"first"  # opened before the overwrite: still the first's bytes
    assert store.open_read("b", "o.csv", generation=second.generation).read() == b"second"
    assert excinfo.value.expected_generation == first.generation
    assert excinfo.value.found_generation == second.generation
    assert isinstance(excinfo.value, PermanentError)


def test_label_over_1_mib_is_rejected_with_a_short_reason():
    """A 1.2 MB label: REJECTED naming row and column, the limit and the
    label's length with a short prefix; before, the job document listing it was over 1 MiB,
    which Firestore refuses (InvalidArgument -> HTTP 500 -> retried for a day)."""
    # Prepare
    svc = memory_services()
    rows = [[i, ["a", "b"][i % 2]] for i in range(20)]
    rows[6][1] = "Z" * 1_200_000
    event = upload(svc, "huge-label.csv", csv_bytes(["x", "label"], rows))
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    assert outcome is Outcome.REJECTED
    assert (job.error_detail["row"], job.error_detail["column"]) == (7, "label")
    assert "a label is longer than the limit" in job.error
    assert "expected class labels of at most 256 bytes (UTF-8)" in job.error
    assert "found: a label of 1200000 bytes: 'ZZZZ" in job.error
    assert len(job.error) < 1000
    assert svc.queue.published == []


def test_column_name_over_1_mib_is_rejected_with_a_short_reason():
    """A 1.2 MB column name: REJECTED at the header (row 0), naming the column by position."""
    # Prepare
    svc = memory_services()
    header = ["x", "Y" * 1_200_000, "label"]
    event = upload(svc, "huge-column.csv", csv_bytes(header, [[i, i, i % 2] for i in range(20)]))
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    assert outcome is Outcome.REJECTED
    assert (job.error_detail["row"], job.error_detail["column"]) == (0, "#2")
    assert "expected column names of at most 256 bytes (UTF-8)" in job.error
    assert "found: a name of 1200000 bytes: 'YYYY" in job.error
    assert len(job.error) < 1000


def test_memory_registry_refuses_a_job_field_the_job_record_does_not_have():
    """A misspelt field in a job update would be written and never read: the in-memory
    registry (what the service tests run on) refuses it, naming it, and stores nothing."""
    # Prepare
    registry = memory_services().registry
    registry.create_job(Job("j-000000000000", status="QUEUED"))
    # Execute
    with pytest.raises(ValueError) as excinfo:
        registry.update_job("j-000000000000", {"staus": "DONE", "error": "x"})
    with pytest.raises(ValueError):
        registry.update_job_if("j-000000000000", {"status": "QUEUED"}, {"tasks_aplied": 1})
    # Assert
    assert "expected fields of domain.job.Job; found ['staus']" in str(excinfo.value)
    job = registry.get_job("j-000000000000")
    assert (job.status, job.error, job.extra) == ("QUEUED", None, {})


def test_memory_registry_refuses_documents_over_1_mib_as_firestore_does():
    """A job update that makes the document larger than 1 MiB raises BackendRejectedError
    (permanent) and changes nothing; just under the limit is fine."""
    # Prepare
    from bucketlearn.adapters.memory import FIRESTORE_MAX_DOCUMENT_BYTES, document_size

    registry = memory_services().registry
    registry.create_job(Job.from_doc({"job_id": "j-000000000000", "status": "QUEUED"}))
    base = document_size("jobs/j-000000000000", registry.get_job("j-000000000000").to_doc())
    fits = "x" * (FIRESTORE_MAX_DOCUMENT_BYTES - base - len("last_watchdog_action") - 2)
    # Execute
    registry.update_job("j-000000000000", {"last_watchdog_action": fits})
    with pytest.raises(BackendRejectedError) as excinfo:
        registry.update_job("j-000000000000", {"last_watchdog_action": fits + "y"})
    # Assert
    assert registry.get_job("j-000000000000").last_watchdog_action == fits
    assert "expected a document of at most 1048576 bytes" in str(excinfo.value)
    assert "found 1048577 bytes" in str(excinfo.value)
    assert isinstance(excinfo.value, PermanentError)


def test_input_problem_texts_are_bounded():
    """Every text of a reason is cut to MAX_REASON_CHARS, with the full length noted."""
    # Prepare
    from bucketlearn.errors import MAX_REASON_CHARS, InputProblem

    # Execute
    problem = InputProblem(file="f" * 5000, message="m" * 5000, column="c" * 5000,
                           expected="e" * 5000, found="x" * 2_000_000)
    # Assert
    for text in (problem.file, problem.message, problem.column, problem.expected, problem.found):
        assert len(text) <= MAX_REASON_CHARS
    assert problem.found.endswith("…(2000000 characters)")
    assert len(problem.describe()) < 6 * MAX_REASON_CHARS


# --- the split's claim ---------------------------------------------------------------------------

LEASE = 60.0


class FakeClock:
    """A clock the test moves by hand (Services.clock)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class SlowSplitStore(MemoryBlobStore):
    """Each shard part written takes ``seconds_per_part`` of the fake clock; ``after_part(n)``
    runs after the n-th (pass 2 writes them from the split's own thread: an in-memory store's
    ``write_threads`` is 0); ``on_stat`` runs before each ``stat``. Counts the upload's opens
    (the header, the kinds' first block, pass 1, and pass 2 unless it takes pass 1's batches)."""

    def __init__(self, clock, seconds_per_part=0.0):
        super().__init__()
        self.clock, self.seconds_per_part = clock, seconds_per_part
        self.after_part = self.on_stat = None
        self.parts_written = 0
        self.opens = 0
        self.names: list[str] = []

    def write_bytes(self, bucket, name, data, content_type, metadata=None):
        info = super().write_bytes(bucket, name, data, content_type, metadata)
        self.names.append(name)
        if "/shards/" in name:
            self.parts_written += 1
            self.clock.now += self.seconds_per_part
            if self.after_part is not None:
                self.after_part(self.parts_written)
        return info

    def open_read(self, bucket, name, generation=None):
        self.opens += bucket == Settings().uploads_bucket
        return super().open_read(bucket, name, generation)

    def stat(self, bucket, name, generation=None):
        if self.on_stat is not None:
            self.on_stat(bucket, name)
        return super().stat(bucket, name, generation)


@pytest.fixture(scope="module")
def long_csv():
    """A 7.7 MB CSV: 8 read batches of 1 MiB per pass with ``max_line_bytes=1024``, and about
    120 shard parts (``rows_per_shard=4700``) written evenly through pass 2."""
    return csv_bytes(["id", "f1", "label"], [[i, (i * 7) % 13, i % 3] for i in range(700_000)])


def claimed_services(store_factory):
    """Services on a fake clock, lease 60 s, 1 MiB read blocks, every part written as soon as
    it is complete (a pack of its own: the split's writes are what takes the fake time), the
    store made for that clock."""
    clock = FakeClock()
    svc = memory_services(Settings(lease_seconds=LEASE,
                                   limits=Limits(max_line_bytes=1024, pack_bytes=0)))
    svc.clock = clock
    svc.store = store_factory(clock)
    return svc, clock


def test_a_long_split_renews_its_claim_so_a_retried_event_does_not_split_again(long_csv):
    """The split renews ``claimed_at`` while it streams: the same event
    retried 90 s into a split whose lease is 60 s finds the claim fresh and is told to retry
    (TransientError); there is one split, not two (before: the retried event took the
    'abandoned' split over and split the file a second time alongside the first)."""
    # Prepare
    retried: list = []
    svc, clock = claimed_services(lambda c: SlowSplitStore(c, seconds_per_part=1.0))
    started = clock.now
    event = upload(svc, "long.csv", long_csv, metadata={"rows_per_shard": "4700"})

    def retry_the_event(parts_written):
        if not retried and clock.now - started > 1.5 * LEASE:
            try:
                retried.append(handle_upload(svc, event))
            except TransientError as exc:
                retried.append(exc)

    svc.store.after_part = retry_the_event
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    assert len(retried) == 1 and isinstance(retried[0], TransientError), retried
    assert "is being split by another invocation" in str(retried[0])
    assert outcome is Outcome.ACCEPTED and job.phase == TRAINING
    # header, the kinds' first block, pass 1 (pass 2 takes its batches): one split
    assert svc.store.opens == 3
    assert svc.store.parts_written > 100
    assert job.claimed_at > started + LEASE  # renewed as the split went on
    round_tasks = task_messages.current_round_tasks(job)
    assert sorted(m.task_index for m in svc.queue.published) == sorted(round_tasks)


def test_a_split_whose_claim_was_taken_over_stops_and_writes_nothing_more(long_csv):
    """Another invocation takes the split over while this one is stalled mid-pass 2: at
    its next renewal this one finds the claim gone and stops with TransientError;
    it writes no manifest, no version 0, publishes nothing and leaves the job as the other
    invocation's (before: it went on to the end, wrote the manifest and v0's weights over the
    other's, and only the claim check of start_training stopped it)."""
    # Prepare
    taken: dict = {}
    svc, clock = claimed_services(lambda c: SlowSplitStore(c, seconds_per_part=1.0))
    event = upload(svc, "long.csv", long_csv, metadata={"rows_per_shard": "4700"})
    job_id = layout.job_id_for(event.bucket, event.name, event.generation)

    def take_over(parts_written):
        if parts_written == 40:
            clock.now += 2 * LEASE  # this invocation stalls: its claim looks abandoned
            mine = svc.registry.get_job(job_id)
            assert svc.registry.update_job_if(  # what handle_upload's takeover writes
                job_id, {"claim": mine.claim, "phase": SPLITTING},
                {"claim": "another-invocation", "claimed_at": clock.now})
            taken["at"] = len(svc.store.names)

    svc.store.after_part = take_over
    # Execute
    with pytest.raises(TransientError) as excinfo:
        handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    written_after = svc.store.names[taken["at"]:]
    assert layout.manifest_path(job_id) not in written_after
    assert all("/shards/" in name for name in written_after)  # the batch in hand, then nothing
    assert svc.store.parts_written < 70  # of about 120: it stopped
    assert list(svc.store.list(svc.settings.models_bucket)) == []
    assert svc.queue.published == []
    assert (job.claim, job.phase, job.status) == ("another-invocation", SPLITTING, QUEUED)
    assert "another invocation took over the split" in str(excinfo.value)
    assert "found claim 'another-invocation' in phase 'splitting'" in str(excinfo.value)


def test_a_stale_splitter_never_rejects_a_job_another_invocation_started():
    """Invocation A claims the split and stalls past the lease before it
    reads the upload; the retried event (B) takes the split over, splits the file and starts
    training; then the user uploads the same name again, and A finds its generation gone. A's
    rejection is conditional on its claim and the splitting phase, so it changes nothing: the
    job stays TRAINING with its shards and manifest, and A stops with TransientError (before:
    A marked the TRAINING job REJECTED and deleted its shards)."""
    # Prepare
    other: list = []
    svc, clock = claimed_services(lambda c: SlowSplitStore(c))
    data = csv_bytes(["x", "label"], [[i, i % 3] for i in range(3000)])
    event = upload(svc, "stale.csv", data, metadata={"rows_per_shard": "256"})

    def stall_then_retry(bucket, name):
        if bucket == event.bucket and not other:
            other.append(None)
            clock.now += 2 * LEASE
            other[0] = handle_upload(svc, event)
            other.append([i.name for i in svc.store.list(svc.settings.work_bucket, "jobs/")])
            upload(svc, "stale.csv", data)  # a new generation of the same name

    svc.store.on_stat = stall_then_retry
    # Execute
    with pytest.raises(TransientError) as excinfo:
        handle_upload(svc, event)
    # Assert
    outcome, job_id = other[0]
    job = svc.registry.get_job(job_id)
    assert outcome is Outcome.ACCEPTED
    assert "another invocation took over the split" in str(excinfo.value)
    assert "found claim" in str(excinfo.value) and "in phase 'training'" in str(excinfo.value)
    assert job.phase == TRAINING and job.status == QUEUED
    assert job.error is None and job.error_detail is None
    assert [i.name for i in svc.store.list(svc.settings.work_bucket, "jobs/")] == other[1]
    assert layout.manifest_path(job_id) in work_objects(svc, job_id)
    assert len(svc.queue.published) == len(task_messages.current_round_tasks(job))


# --- the deployment's limits on one upload's cost ----------------------------------------------

# 200 rows of 2 classes, shards of 8 rows, one shard per task: 20 tasks per epoch, 60 in all
BUSY_OPTIONS = {"epochs": "3", "rows_per_shard": "8", "parallel_tasks": "2",
                "validation_fraction": "none"}


def busy_table():
    return csv_bytes(["x", "y", "label"], [[i % 17, (i * 5) % 11, i % 2] for i in range(200)])


def test_a_job_over_the_total_task_limit_is_rejected_before_version_0():
    """60 tasks in all against max_total_tasks=59: REJECTED naming tasks per epoch × epochs, the
    limit and what to change, from pass 1's counts: no shard is written (pass 2 never runs), no
    version 0, nothing is published."""
    # Prepare
    settings = Settings(limits=Limits(max_total_tasks=59))
    svc = memory_services(settings)
    svc.store = RecordingStore()
    event = upload(svc, "busy.csv", busy_table(), metadata=BUSY_OPTIONS)
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    shard_writes = [n for b, n in svc.store.written
                    if b == settings.work_bucket and n.startswith(f"jobs/{job_id}/shards/")]
    assert shard_writes == []  # refused before pass 2
    assert outcome is Outcome.REJECTED
    assert job.status == REJECTED and job.is_terminal
    assert job.error_detail["message"] == "the job would train too many tasks"
    assert job.error_detail["found"] == "20 tasks per epoch × 3 epochs = 60 tasks"
    assert job.error_detail["expected"] == (
        "at most 59 tasks in all (the deployment's max_total_tasks): epochs of at most 2 or a "
        "rows_per_shard of about 9 or more (now 8; fewer shards, so fewer tasks per epoch)")
    assert job.error.startswith(f"gs://{event.bucket}/busy.csv: the job would train too many")
    assert work_objects(svc, job_id) == []
    assert list(svc.store.list(settings.models_bucket)) == []  # no version 0 weights
    assert svc.registry.list_versions(job_id) == []
    assert svc.queue.published == []
    assert handle_upload(svc, event) == (Outcome.DUPLICATE, job_id)


def test_a_job_predicted_to_outlast_the_work_retention_is_rejected_before_version_0():
    """On a deployment whose learners are assumed to train at 1 FLOP/s, the
    busy table's job would outlast half of a 1-day retention: REJECTED naming the prediction,
    nothing left in the work bucket, no version 0; at 1 GFLOP/s the same upload trains."""
    # Prepare
    slow = memory_services(Settings(limits=Limits(worker_flops=1, work_retention_days=1)))
    fast = memory_services(Settings(limits=Limits(work_retention_days=1)))
    # Execute
    outcome, job_id = handle_upload(slow, upload(slow, "busy.csv", busy_table(),
                                                 metadata=BUSY_OPTIONS))
    accepted, _ = handle_upload(fast, upload(fast, "busy.csv", busy_table(),
                                             metadata=BUSY_OPTIONS))
    # Assert
    job = slow.registry.get_job(job_id)
    assert outcome is Outcome.REJECTED and accepted is Outcome.ACCEPTED
    assert job.error_detail["message"] == ("the job is predicted to train longer than the "
                                           "work bucket keeps its shards")
    assert job.error_detail["expected"].startswith("at most 12.0 h of training (half the "
                                                   "deployment's work_retention_days of 1")
    assert " training rows x 3 epochs at 1e-09 GFLOP/s per learner" in job.error_detail["found"]
    assert work_objects(slow, job_id) == []
    assert list(slow.store.list(slow.settings.models_bucket)) == []
    assert slow.queue.published == []


def test_a_table_whose_model_would_have_too_many_columns_is_rejected_before_pass_2():
    """30 text columns against max_model_columns=20: REJECTED naming the columns, the limit and
    what to change, before any shard is written or any model built; 30 columns of complete
    numbers (a matrix: no layers of their own) train under the same limit."""
    # Prepare
    settings = Settings(limits=Limits(max_model_columns=20))
    svc = memory_services(settings)
    svc.store = RecordingStore()
    header = [f"c{j}" for j in range(30)] + ["label"]
    text = csv_bytes(header, [["abcd"[(i + j) % 4] for j in range(30)] + [i % 2]
                              for i in range(60)])
    numbers = csv_bytes(header, [[(i * j) % 7 for j in range(30)] + [i % 2] for i in range(60)])
    # Execute
    outcome, job_id = handle_upload(svc, upload(svc, "wide.csv", text))
    accepted, _ = handle_upload(svc, upload(svc, "matrix.csv", numbers))
    # Assert
    job = svc.registry.get_job(job_id)
    assert (outcome, accepted) == (Outcome.REJECTED, Outcome.ACCEPTED)
    assert job.error_detail["message"] == "the model would have too many columns of its own"
    assert job.error_detail["found"] == "30 feature columns"
    assert "at most 20 feature columns" in job.error_detail["expected"]
    assert not [n for b, n in svc.store.written if n.startswith(f"jobs/{job_id}/shards/")]


def test_the_outline_pass_1_checks_is_the_split_the_job_trains():
    """The shards' rows of pass 1's outline (what the early checks plan from) are the
    manifest's, so the plan checked before pass 2 is the plan the job trains."""
    # Prepare
    from bucketlearn.ingest.split import split_upload
    from bucketlearn.ingest.stream import SourceFile
    from bucketlearn.options import resolve_options
    from bucketlearn.usecases.upload import outline_of

    svc = memory_services()
    event = upload(svc, "busy.csv", busy_table(), metadata=BUSY_OPTIONS)
    source = SourceFile("busy.csv", event.size, lambda: svc.store.open_read(
        event.bucket, event.name, generation=event.generation))
    seen = []
    # Execute
    manifest = split_upload(source, svc.store, svc.settings.work_bucket, "busy-000000000000",
                            resolve_options(metadata=BUSY_OPTIONS), svc.settings.limits,
                            check=seen.append)
    # Assert
    assert [o.shard_rows for o in seen] == [outline_of(manifest).shard_rows]
    assert seen[0].schema == manifest.schema and seen[0].regression is False


def test_a_job_at_the_total_task_limit_trains():
    """The same upload with max_total_tasks=60 is planned as before and starts training."""
    # Prepare
    svc = memory_services(Settings(limits=Limits(max_total_tasks=60)))
    event = upload(svc, "busy.csv", busy_table(), metadata=BUSY_OPTIONS)
    # Execute
    outcome, job_id = handle_upload(svc, event)
    # Assert
    job = svc.registry.get_job(job_id)
    assert outcome is Outcome.ACCEPTED
    assert (job.tasks_per_epoch, job.tasks_planned) == (20, 60)
    assert job.version == 0 and svc.queue.published


@pytest.mark.parametrize("requested, expected", [(None, 1), ("2", 2)])
def test_an_automatic_plan_trains_one_task_at_a_time_where_rounds_would_not_end_sooner(
        requested, expected):
    """600 rows in 8-row shards and batches of 8, 2 epochs: the bound allows rounds
    of 2 one-step tasks, but a round's critical path (0.37 s) dwarfs their compute, so the
    automatic plan chains one task of 7 shards at a time and records why; a parallel_tasks
    the user set is kept."""
    # Prepare
    from tests.unit.helpers import blobs_rows

    svc = memory_services()
    metadata = {"epochs": "2", "rows_per_shard": "8", "batch_size": "8",
                "validation_fraction": "none",
                **({"parallel_tasks": requested} if requested else {})}
    data = csv_bytes(["f0", "f1", "f2", "f3", "label"], blobs_rows(600, 3, 4, 0))
    # Execute
    outcome, job_id = handle_upload(svc, upload(svc, "blobs.csv", data, metadata))
    # Assert
    assert outcome is Outcome.ACCEPTED
    job = svc.registry.get_job(job_id)
    plan = job.plan
    assert plan.parallel_tasks == expected
    if requested is None:
        assert plan.shards_per_task == 7  # 60 shards: 7 a task keep 8 tasks an epoch
        assert plan.decided.startswith("auto: one task at a time, forecast ")
        assert "rounds of 2 tasks (the most the bound allows: R*H <= 0.25*sqrt(S)" in plan.decided
        assert job.forecast["suggested_workers"] == 1
    else:
        assert plan.shards_per_task == 1 and plan.decided == "option parallel_tasks"


def test_the_task_limit_judges_the_plan_the_job_trains():
    """600 rows in 8-row shards, 2 epochs: 120 one-shard tasks in rounds of 2, or 18 tasks of
    7 shards one at a time, which the automatic plan trains. With a limit of 50 tasks the
    automatic job is accepted (it trains 18); the same job with parallel_tasks=2 is refused,
    naming its 120."""
    # Prepare
    from tests.unit.helpers import blobs_rows

    svc = memory_services(Settings(limits=Limits(max_total_tasks=50)))
    data = csv_bytes(["f0", "f1", "f2", "f3", "label"], blobs_rows(600, 3, 4, 0))
    metadata = {"epochs": "2", "rows_per_shard": "8", "batch_size": "8",
                "validation_fraction": "none"}
    # Execute
    auto = handle_upload(svc, upload(svc, "auto.csv", data, metadata))
    forced = handle_upload(svc, upload(svc, "forced.csv", data,
                                       {**metadata, "parallel_tasks": "2"}))
    # Assert
    assert auto[0] is Outcome.ACCEPTED
    assert svc.registry.get_job(auto[1]).tasks_planned == 18
    assert forced[0] is Outcome.REJECTED
    refused = svc.registry.get_job(forced[1])
    assert "60 tasks per epoch × 2 epochs = 120 tasks" in refused.error_detail["found"]


class BrokenReads(MemoryBlobStore):
    """The uploads bucket's reads fail with an error no one foresaw (a bug, a library's
    surprise): neither transient nor the input's fault."""

    def open_read(self, bucket, name, generation=None):
        if bucket == Settings().uploads_bucket:
            raise RuntimeError("a bug in the reader")
        return super().open_read(bucket, name, generation)


def test_a_split_that_keeps_crashing_is_retried_then_failed_not_retried_for_a_day():
    """A split that fails unforeseen is retried (HTTP 503: the claim let go, so the retried
    event takes it over at once), and on its third failure the job ends FAILED with the error
    (HTTP 200: acknowledged): never a day of Eventarc retries."""
    # Prepare
    from bucketlearn.entrypoints.functions import RetryLater, handle_upload_event

    svc = dataclasses.replace(memory_services(), store=BrokenReads((Settings().uploads_bucket,)))
    event = upload(svc, "crash.csv", csv_bytes(["x", "label"], [[i, i % 2] for i in range(20)]))
    cloud_event = {"time": None}

    class Event(dict):
        data = {"bucket": event.bucket, "name": event.name,
                "generation": str(event.generation), "size": str(event.size)}

    # Execute
    answers = []
    for _ in range(4):
        try:
            answers.append(handle_upload_event(Event(cloud_event), svc))
        except RetryLater as exc:
            answers.append(f"503: {exc.description}")
    # Assert
    job_id = layout.job_id_for(event.bucket, event.name, event.generation)
    job = svc.registry.get_job(job_id)
    assert answers[0].startswith("503: ") and "attempt 1 of 3" in answers[0]
    assert "attempt 2 of 3" in answers[1]
    assert answers[2:] == ["failed", "duplicate"]
    assert job.status == FAILED and job.split_attempts == 3
    assert "failed on each of its 3 attempts, last with RuntimeError: a bug in the reader" in (
        job.error)
