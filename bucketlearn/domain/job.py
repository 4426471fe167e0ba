"""A job's vocabulary and the rules every service and both registries ask: one place each.

Statuses say how a job stands for its user; phases refine what the pipeline is doing. A version
commit is allowed or refused by ``commit_refusal`` (asked by the in-memory registry under its
lock and by Firestore's inside its transaction); a round is trainable once it is published
(``is_published``). Pure: documents in, answers out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

QUEUED, RUNNING, DONE, REJECTED, FAILED = "QUEUED", "RUNNING", "DONE", "REJECTED", "FAILED"
CANCELLED = "CANCELLED"
TERMINAL = (DONE, REJECTED, FAILED, CANCELLED)
STATUSES = (QUEUED, RUNNING, DONE, REJECTED, FAILED, CANCELLED)

# Phases refine the status: what the pipeline is doing right now.
SPLITTING, TRAINING, EXPORTING = "splitting", "training", "exporting"
CANCELLED_PHASE = "cancelled"


class Commit(Protocol):
    """What ``commit_refusal`` reads of a version commit (``ports.VersionCommit``)."""

    epoch: int
    base_version: int
    version_doc: Mapping[str, Any]
    applied: Sequence[int]
    failed: Sequence[int]


def is_terminal(job: Mapping[str, Any] | None) -> bool:
    """The job has ended (DONE, REJECTED, FAILED or CANCELLED); nothing may change it."""
    return bool(job) and job.get("status") in TERMINAL  # type: ignore[union-attr]


def round_key(epoch: int, round_index: int) -> str:
    """The name of one round (``e0002r00013``), recorded once its tasks are published."""
    return f"e{epoch:04d}r{round_index:05d}"


def current_round_key(job: Mapping[str, Any]) -> str:
    """The name of the job's current round."""
    return round_key(int(job.get("epoch") or 0), int(job.get("round") or 0))


def is_published(job: Mapping[str, Any]) -> bool:
    """The job's current round has been published (its tasks can be trained)."""
    return job.get("published") == current_round_key(job)


def done_tasks(epoch_doc: Mapping[str, Any]) -> set[int]:
    """An epoch's finished task indices: applied, or failed for good."""
    return set(epoch_doc.get("applied", [])) | set(epoch_doc.get("failed", []))


def commit_refusal(job: Mapping[str, Any] | None, epoch_doc: Mapping[str, Any] | None,
                   version_exists: bool, commit: Commit) -> str | None:
    """Why a version commit must not happen (None: it may). Both registries ask this inside
    their lock or transaction, with the documents read there.

    A commit needs a job that has not ended (a fold racing a cancel must not advance it), the
    head still at the commit's base, a new version number and no task applied or failed twice.
    """
    if job is None:
        return "no such job"
    if is_terminal(job):
        return f"the job is {job.get('status')}"
    if epoch_doc is None:
        return f"epoch {commit.epoch} has no document"
    if version_exists:
        return f"version {commit.version_doc.get('version')} exists"
    if job.get("version") != commit.base_version:
        return f"the head is v{job.get('version')}, not the base v{commit.base_version}"
    if done_tasks(epoch_doc) & (set(commit.applied) | set(commit.failed)):
        return "a task of it is already applied or failed"
    return None
