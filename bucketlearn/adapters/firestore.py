"""Firestore adapter for the Registry port (also serves the Firestore emulator).

Layout::

    jobs/{job}                      status, options, dataset, head pointer, counters
    jobs/{job}/versions/{v:06d}     one per version: weights path, digest, tasks applied or
                                    given up on (with their learners' timings), figures
    jobs/{job}/tasks/{e-t}          per task: attempts, state, worker, timings (workers write)
    jobs/{job}/predictions/{req}    per batch prediction request: state, rows, seconds, error
    leases/{name}                   one aggregation writer per job
    workers/{id}                    heartbeats
    control/{name}                  controller state (the autoscaler's last change)

Only the aggregator writes a job's head and versions, under its lease, in one commit per version
(two document writes: the version's, the job's); workers write one task document per task and
their heartbeats, so the job document sees one write per version. A version commit is one RPC
while nothing else wrote the job since this process's last commit (a batch whose job update is
conditional on that write's update time); otherwise a transaction reads the job and decides.
Leases are taken with create/update *preconditions*, not transactions: the emulator stalls
~30 s on contended transactions.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1.field_path import FieldPath

from bucketlearn.adapters import google_errors
from bucketlearn.config import Settings, export_emulator_env
from bucketlearn.domain.head import Head
from bucketlearn.domain.job import Job, commit_refusal, may_start_training
from bucketlearn.domain.lifecycle import QUEUED, RUNNING, ended_refuses, move_refusal
from bucketlearn.domain.prediction import PredictionRecord
from bucketlearn.domain.task import TaskRecord, attempt_keys
from bucketlearn.domain.version import Version, attach_evaluations
from bucketlearn.errors import BackendRejectedError, NotFoundError, TransientError, bounded
from bucketlearn.ports import Lease, VersionCommit

log = logging.getLogger(__name__)

TIMEOUT = 30.0
_TRANSIENT = google_errors.TRANSIENT
_PERMANENT = google_errors.PERMANENT
_ERROR_TEXT_CHARS = 500


def make_client(settings: Settings) -> firestore.Client:
    if settings.firestore_emulator_host:
        from google.auth.credentials import AnonymousCredentials  # noqa: PLC0415

        export_emulator_env(settings)
        return firestore.Client(project=settings.project, database=settings.firestore_database,
                                credentials=AnonymousCredentials())
    return firestore.Client(project=settings.project, database=settings.firestore_database)


def _transient(what: str, exc: Exception) -> TransientError:
    return TransientError(f"firestore {what}: {type(exc).__name__}: "
                          f"{bounded(str(exc), _ERROR_TEXT_CHARS)}")


def _translated(method: Callable[..., Any]) -> Callable[..., Any]:
    """Turn what escapes a registry method into TransientError / BackendRejectedError."""
    what = method.__name__.replace("_", " ")

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except _TRANSIENT as exc:
            raise _transient(what, exc) from exc
        except _PERMANENT as exc:
            if _lost_transaction(exc):
                raise _transient(what, exc) from exc
            raise BackendRejectedError(f"firestore {what}: {type(exc).__name__}: "
                                       f"{bounded(str(exc), _ERROR_TEXT_CHARS)}") from exc

    return wrapper


def _lost_transaction(exc: BaseException) -> bool:
    """A transaction the backend no longer knows (it lost it with a dropped connection, or it
    expired): InvalidArgument, yet the method run again begins a new one and may succeed. Taken
    for a permanent answer after a Firestore outage mid-commit, it would end a job's aggregation
    for good and leave the job without new versions (tests/e2e/test_crashes.py)."""
    text = str(exc).lower()
    return isinstance(exc, gexc.InvalidArgument) and "transaction" in text and (
        "invalid or closed" in text or "expired" in text)


def _translate_errors(cls: type) -> type:
    """Apply ``_translated`` to every public method of a registry class: the one place where a
    Google error becomes the project's (a method catches only what it turns into an answer,
    such as AlreadyExists into False)."""
    for name, member in list(vars(cls).items()):
        if callable(member) and not name.startswith("_"):
            setattr(cls, name, _translated(member))
    return cls


def _read(ref: Any) -> dict[str, Any] | None:
    """One document, or None when it does not exist."""
    snap = ref.get(timeout=TIMEOUT)
    return snap.to_dict() if snap.exists else None


@_translate_errors
class FirestoreRegistry:
    def __init__(self, settings: Settings, client: firestore.Client | None = None) -> None:
        self.client = client or make_client(settings)
        # job id -> (update time, document) as of this process's last version commit: the next
        # commit is a conditional batch when the job was not written since (one RPC)
        self._committed: dict[str, tuple[Any, dict[str, Any]]] = {}

    # -- references -----------------------------------------------------------------------------
    def _job(self, job_id: str) -> firestore.DocumentReference:
        return self.client.collection("jobs").document(job_id)

    def _version(self, job_id: str, version: int) -> firestore.DocumentReference:
        return self._job(job_id).collection("versions").document(f"{version:06d}")

    def _task(self, job_id: str, task_id: str) -> firestore.DocumentReference:
        return self._job(job_id).collection("tasks").document(task_id)

    # -- jobs -------------------------------------------------------------------------------------
    def create_job(self, job: Job) -> bool:
        try:
            self._job(job.job_id).create(job.to_doc(), timeout=TIMEOUT)
            return True
        except (gexc.AlreadyExists, gexc.Conflict):
            return False

    def get_job(self, job_id: str) -> Job | None:
        doc = _read(self._job(job_id))
        return Job.from_doc(doc) if doc is not None else None

    def update_job(self, job_id: str, fields: Mapping[str, Any]) -> None:
        try:
            self._job(job_id).update(dict(fields), timeout=TIMEOUT)
        except gexc.NotFound:
            raise NotFoundError(f"job {job_id}: no such job") from None

    def update_job_if(self, job_id: str, expect: Mapping[str, Any],
                      fields: Mapping[str, Any]) -> bool:
        ref = self._job(job_id)
        try:
            snap = ref.get(timeout=TIMEOUT)
            data = snap.to_dict() if snap.exists else None
            if data is None or any(data.get(k) != v for k, v in expect.items()):
                return False
            if ended_refuses(data, fields):  # an ended job: a condition not met
                return False
            refusal = move_refusal(data, fields)
            if refusal is not None:  # a move the table does not allow: a bug
                raise ValueError(f"jobs/{job_id}: {refusal}")
            ref.update(dict(fields), option=self.client.write_option(
                last_update_time=snap.update_time), timeout=TIMEOUT)
            return True
        except (gexc.FailedPrecondition, gexc.NotFound):
            return False

    def list_jobs(self, limit: int = 100) -> list[Job]:
        query = (self.client.collection("jobs")
                 .order_by("created_at", direction=firestore.Query.DESCENDING).limit(limit))
        return [Job.from_doc(snap.to_dict()) for snap in query.stream(timeout=TIMEOUT)]

    def list_active_jobs(self) -> list[Job]:
        query = self.client.collection("jobs").where(
            filter=firestore.FieldFilter("status", "in", [QUEUED, RUNNING]))
        return [Job.from_doc(snap.to_dict()) for snap in query.stream(timeout=TIMEOUT)]

    def start_training(self, job_id: str, claim: str, job_fields: Mapping[str, Any],
                       version: Version) -> bool:
        job_ref = self._job(job_id)

        @firestore.transactional
        def run(transaction: firestore.Transaction) -> bool:
            snap = job_ref.get(transaction=transaction)
            data = snap.to_dict() if snap.exists else None
            if not may_start_training(Job.from_doc(data) if data is not None else None, claim):
                return False
            refusal = move_refusal(data or {}, job_fields)
            if refusal is not None:
                raise ValueError(f"jobs/{job_id}: {refusal}")
            transaction.set(self._version(job_id, version.version), version.to_doc())
            transaction.update(job_ref, dict(job_fields))
            return True

        return bool(run(self.client.transaction()))

    def commit_version(self, commit: VersionCommit) -> bool:
        if self._commit_unchanged(commit):
            return True
        job_ref = self._job(commit.job_id)
        version_ref = self._version(commit.job_id, commit.version.version)

        @firestore.transactional
        def run(transaction: firestore.Transaction) -> bool:
            job_snap, version_snap = (job_ref.get(transaction=transaction),
                                      version_ref.get(transaction=transaction))
            job = Job.from_doc(job_snap.to_dict()) if job_snap.exists else None
            if commit_refusal(job, version_snap.exists, commit) is not None:
                return False
            refusal = move_refusal(job_snap.to_dict(), commit.job_fields)
            if refusal is not None:
                raise ValueError(f"jobs/{commit.job_id}: {refusal}")
            transaction.create(version_ref, commit.version.to_doc())
            transaction.update(job_ref, dict(commit.job_fields))
            return True

        committed = self._contended(run, "commit version")
        self._committed.pop(commit.job_id, None)
        if committed:  # the next commit can be one RPC again
            snap = job_ref.get(timeout=TIMEOUT)
            if snap.exists:
                self._remember(commit.job_id, snap.update_time, snap.to_dict())
        return committed

    def _commit_unchanged(self, commit: VersionCommit) -> bool:
        """Commit in one RPC if the job is as this process's last commit left it: a batch that
        creates the version and updates the job on condition that the job's update time is
        that commit's. False (nothing written) when there is no such commit, the commit is
        refused on that document, or the job was written since."""
        known = self._committed.get(commit.job_id)
        if known is None:
            return False
        update_time, doc = known
        if commit_refusal(Job.from_doc(doc), False, commit) is not None:
            return False
        batch = self.client.batch()
        batch.create(self._version(commit.job_id, commit.version.version),
                     commit.version.to_doc())
        batch.update(self._job(commit.job_id), dict(commit.job_fields),
                     option=self.client.write_option(last_update_time=update_time))
        try:
            results = batch.commit(timeout=TIMEOUT)
        except (gexc.FailedPrecondition, gexc.AlreadyExists, gexc.Conflict, gexc.NotFound,
                gexc.Aborted):
            self._committed.pop(commit.job_id, None)
            return False
        self._remember(commit.job_id, results[-1].update_time, {**doc, **commit.job_fields})
        return True

    def _remember(self, job_id: str, update_time: Any, doc: dict[str, Any]) -> None:
        self._committed.pop(job_id, None)
        self._committed[job_id] = (update_time, doc)
        while len(self._committed) > 1000:
            self._committed.pop(next(iter(self._committed)))

    def record_evaluation(self, job_id: str, version: int, version_fields: Mapping[str, Any],
                          head: Head | None) -> bool:
        job_ref = self._job(job_id)
        version_ref = self._version(job_id, version)

        @firestore.transactional
        def run(transaction: firestore.Transaction) -> bool:
            job_snap = job_ref.get(transaction=transaction)
            version_snap = version_ref.get(transaction=transaction)
            if not version_snap.exists:
                return False
            transaction.update(version_ref, dict(version_fields))
            job = job_snap.to_dict() if job_snap.exists else None
            if head is None or job is None or job.get("version") != version:
                return False  # a newer version is the head: its own evaluation fills it in
            if move_refusal(job, {"head": head.to_doc()}) is not None:
                return False  # ended with a head that stands (a DONE job's, the export's)
            transaction.update(job_ref, {"head": head.to_doc()})
            return True

        return self._contended(run, "record evaluation")

    def _contended(self, run: Any, what: str) -> bool:
        """Run a transaction that may meet concurrent writers (up to 5 attempts)."""
        try:
            return bool(run(self.client.transaction(max_attempts=5)))
        except ValueError as exc:  # "Failed to commit transaction in 5 attempts": contention
            raise _transient(f"{what} (contended)", exc) from exc

    # -- versions, epochs, tasks ------------------------------------------------------------------
    def get_version(self, job_id: str, version: int) -> Version | None:
        doc = _read(self._version(job_id, version))
        return Version.from_doc(doc) if doc is not None else None

    def list_versions(self, job_id: str, last: int | None = None) -> list[Version]:
        versions = self._job(job_id).collection("versions")
        if last is None:
            docs = [snap.to_dict() for snap in
                    versions.order_by("version").stream(timeout=TIMEOUT)]
        else:  # the newest ``last``: one read per version returned
            query = versions.order_by("version", direction=firestore.Query.DESCENDING)
            docs = [snap.to_dict() for snap in query.limit(last).stream(timeout=TIMEOUT)][::-1]
        return attach_evaluations([Version.from_doc(doc) for doc in docs])

    def read_for_attempt(self, job_id: str, task_id: str) -> tuple[Job | None, list[str]]:
        job_ref, task_ref = self._job(job_id), self._task(job_id, task_id)
        docs = {snap.reference.path: snap.to_dict()
                for snap in self.client.get_all([job_ref, task_ref], timeout=TIMEOUT)
                if snap.exists}
        job = docs.get(job_ref.path)
        return (Job.from_doc(job) if job is not None else None,
                attempt_keys(docs.get(task_ref.path) or {}))

    def record_attempt(self, job_id: str, task_id: str, fields: Mapping[str, Any],
                       attempt_key: str, known_keys: Sequence[str] | None = None) -> int:
        ref = self._task(job_id, task_id)
        if known_keys is None:
            known_keys = attempt_keys(_read(ref) or {})
        # an array union: a retried write (its answer lost) adds the key once
        ref.set({**dict(fields), "attempt_keys": firestore.ArrayUnion([attempt_key])},
                merge=True, timeout=TIMEOUT)
        return len({*known_keys, attempt_key})

    def refund_attempt(self, job_id: str, task_id: str, attempt_key: str) -> None:
        try:
            self._task(job_id, task_id).update(
                {"attempt_keys": firestore.ArrayRemove([attempt_key])}, timeout=TIMEOUT)
        except gexc.NotFound:
            return  # no attempt was recorded: nothing to give back

    def update_task(self, job_id: str, task_id: str, fields: Mapping[str, Any]) -> None:
        self._task(job_id, task_id).set(dict(fields), merge=True, timeout=TIMEOUT)

    def get_task(self, job_id: str, task_id: str) -> TaskRecord | None:
        doc = _read(self._task(job_id, task_id))
        return TaskRecord.from_doc(doc) if doc is not None else None

    def list_tasks(self, job_id: str, epoch: int | None = None) -> list[TaskRecord]:
        query = self._job(job_id).collection("tasks")
        if epoch is not None:
            query = query.where(filter=firestore.FieldFilter("epoch", "==", epoch))
        return [TaskRecord.from_doc(snap.to_dict()) for snap in query.stream(timeout=TIMEOUT)]

    # -- batch prediction requests ---------------------------------------------------------------
    def _prediction(self, job_id: str, request_id: str) -> firestore.DocumentReference:
        return self._job(job_id).collection("predictions").document(request_id)

    def create_prediction(self, record: PredictionRecord) -> bool:
        try:
            self._prediction(record.job_id, record.request_id).create(record.to_doc(),
                                                                      timeout=TIMEOUT)
            return True
        except (gexc.AlreadyExists, gexc.Conflict):
            return False

    def update_prediction(self, job_id: str, request_id: str, fields: Mapping[str, Any],
                          claim: str | None = None) -> bool:
        ref = self._prediction(job_id, request_id)
        try:
            if claim is None:
                ref.update(dict(fields), timeout=TIMEOUT)
                return True
            snap = ref.get(timeout=TIMEOUT)
            if not snap.exists or (snap.to_dict() or {}).get("claim") != claim:
                return False
            ref.update(dict(fields), option=self.client.write_option(
                last_update_time=snap.update_time), timeout=TIMEOUT)
            return True
        except (gexc.FailedPrecondition, gexc.NotFound):
            return False

    def get_prediction(self, job_id: str, request_id: str) -> PredictionRecord | None:
        doc = _read(self._prediction(job_id, request_id))
        return PredictionRecord.from_doc(doc) if doc is not None else None

    def count_predictions(self, job_id: str) -> int:
        (result,) = self._job(job_id).collection("predictions").count().get(timeout=TIMEOUT)
        return int(result[0].value)

    def list_predictions(self, job_id: str, limit: int = 20) -> list[PredictionRecord]:
        """One query on the job's ``predictions``: a single-field order needs no composite
        index."""
        if limit < 1:  # (Firestore reads a limit of 0 as none)
            return []
        query = (self._job(job_id).collection("predictions")
                 .order_by("created_at", direction=firestore.Query.DESCENDING).limit(limit))
        return [PredictionRecord.from_doc(snap.to_dict()) for snap in
                query.stream(timeout=TIMEOUT)]

    def record_prediction_part(self, job_id: str, request_id: str, part: int,
                               entry: Mapping[str, Any]) -> PredictionRecord | None:
        """One field of the record written, conditional on the document as read (a part
        entry that another writer recorded first stands; a conflict reads and tries again):
        the record after is the one read with the entry, no second read."""
        ref = self._prediction(job_id, request_id)
        key = FieldPath("part_results", str(part)).to_api_repr()
        for _ in range(20):
            snap = ref.get(timeout=TIMEOUT)
            if not snap.exists:
                return None
            record = PredictionRecord.from_doc(snap.to_dict() or {})
            if record.ended or str(part) in record.part_results:
                return record
            try:
                ref.update({key: dict(entry)}, option=self.client.write_option(
                    last_update_time=snap.update_time), timeout=TIMEOUT)
            except gexc.FailedPrecondition:
                continue  # written meanwhile (another part, an attempt): read it again
            except gexc.NotFound:
                return None
            return dataclasses.replace(record, part_results={**record.part_results,
                                                             str(part): dict(entry)})
        raise TransientError(f"prediction {request_id}: part {part} not recorded: the record "
                             "changed under every one of 20 tries")

    def count_part_attempt(self, job_id: str, request_id: str, part: int, at: float
                           ) -> PredictionRecord | None:
        """An increment of one field (attempts at once do not contend), then the record."""
        ref = self._prediction(job_id, request_id)
        key = FieldPath("part_attempts", str(part)).to_api_repr()
        try:
            ref.update({key: firestore.Increment(1), "updated_at": at}, timeout=TIMEOUT)
        except gexc.NotFound:
            return None
        return self.get_prediction(job_id, request_id)

    def running_predictions(self) -> list[PredictionRecord]:
        """A collection-group query on ``state`` (its index: infra/firestore.tf)."""
        query = self.client.collection_group("predictions").where(
            filter=firestore.FieldFilter("state", "==", "RUNNING"))
        return [PredictionRecord.from_doc(snap.to_dict()) for snap in
                query.stream(timeout=TIMEOUT)]

    # -- leases and heartbeats --------------------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, seconds: float) -> Lease:
        import time  # noqa: PLC0415

        ref = self.client.collection("leases").document(name)
        now = time.time()
        body = {"holder": holder, "expires_at": now + seconds, "acquired_at": now}
        try:
            try:
                ref.create(body, timeout=TIMEOUT)
                return Lease(True)
            except (gexc.AlreadyExists, gexc.Conflict):
                pass
            snap = ref.get(timeout=TIMEOUT)
            if not snap.exists:
                ref.create(body, timeout=TIMEOUT)
                return Lease(True)
            current = snap.to_dict() or {}
            previous = current.get("holder")
            if previous != holder and float(current.get("expires_at", 0)) > now:
                return Lease(False)
            if previous == holder:
                body.pop("acquired_at")  # a renewal
            ref.update(body, option=self.client.write_option(last_update_time=snap.update_time),
                       timeout=TIMEOUT)
            return Lease(True, previous if previous != holder else None)
        except (gexc.AlreadyExists, gexc.Conflict, gexc.FailedPrecondition, gexc.NotFound):
            return Lease(False)

    def release_lease(self, name: str, holder: str) -> None:
        ref = self.client.collection("leases").document(name)
        try:
            snap = ref.get(timeout=TIMEOUT)
            if snap.exists and (snap.to_dict() or {}).get("holder") == holder:
                ref.delete(option=self.client.write_option(last_update_time=snap.update_time),
                           timeout=TIMEOUT)
        except (gexc.FailedPrecondition, gexc.NotFound):
            return
        except _TRANSIENT:
            log.warning("could not release lease %s; it expires by itself", name)

    def heartbeat(self, worker_id: str, fields: Mapping[str, Any]) -> None:
        self.client.collection("workers").document(worker_id).set(dict(fields), merge=True,
                                                                  timeout=TIMEOUT)

    def list_workers(self, seen_since: float | None = None) -> list[dict[str, Any]]:
        query = self.client.collection("workers")
        if seen_since is not None:
            query = query.where(filter=firestore.FieldFilter("last_seen", ">=", seen_since))
        return [snap.to_dict() for snap in query.stream(timeout=TIMEOUT)]

    def get_control(self, name: str) -> dict[str, Any] | None:
        return _read(self.client.collection("control").document(name))

    def set_control(self, name: str, fields: Mapping[str, Any]) -> None:
        self.client.collection("control").document(name).set(dict(fields), merge=True,
                                                              timeout=TIMEOUT)
