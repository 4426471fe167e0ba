"""bucketlearn.domain.job: the commit check, the round vocabulary and the job record."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from bucketlearn.domain import job as J


@dataclass
class Commit:
    epoch: int = 1
    base_version: int = 4
    version: J.Version = field(default_factory=lambda: J.Version(5, "w5"))
    applied: list[int] = field(default_factory=lambda: [2, 3])
    failed: list[int] = field(default_factory=list)


JOB = J.Job("j1", status=J.RUNNING, phase=J.TRAINING, version=4, epoch=1, round=1)


@pytest.mark.parametrize(("job", "epoch", "exists", "commit", "reason"), [
    (JOB, J.Epoch(1, 4, applied=(0, 1)), False, Commit(), None),
    (None, J.Epoch(1, 4), False, Commit(), "no such job"),
    (replace(JOB, status=J.CANCELLED), J.Epoch(1, 4), False, Commit(), "the job is CANCELLED"),
    (JOB, None, False, Commit(), "epoch 1 has no document"),
    (JOB, J.Epoch(1, 4), True, Commit(), "version 5 exists"),
    (replace(JOB, version=5), J.Epoch(1, 4), False, Commit(), "the head is v5, not the base v4"),
    (JOB, J.Epoch(1, 4, applied=(3,)), False, Commit(),
     "a task of it is already applied or failed"),
    (JOB, J.Epoch(1, 4, failed=(2,)), False, Commit(),
     "a task of it is already applied or failed"),
], ids=["allowed", "no-job", "ended", "no-epoch", "version-used", "head-moved", "applied-twice",
        "failed-then-applied"])
def test_commit_refusal_names_the_first_rule_broken(job, epoch, exists, commit, reason) -> None:
    """A commit needs a live job, its epoch, an unused version, the head at its base and no
    task finished twice; the answer says which rule failed."""
    # Execute / Assert
    assert J.commit_refusal(job, epoch, exists, commit) == reason


def test_an_epoch_ledger_adds_a_commit_and_reads_back_from_its_document() -> None:
    """A commit's tasks are added after those already done; the document round-trips, and one
    written without lists (an older or hand-made document) reads as nothing done."""
    # Prepare
    epoch = J.Epoch(2, 6, applied=(0,), created_at=7.5)
    # Execute
    after = epoch.with_results([3, 1], [4])
    # Assert
    assert (after.applied, after.failed, after.done) == ((0, 3, 1), (4,), {0, 1, 3, 4})
    assert epoch.applied == (0,)  # unchanged: a ledger is a value
    assert J.Epoch.from_doc(after.to_doc()) == after
    assert J.Epoch.from_doc({"epoch": 3, "planned": 2}) == J.Epoch(3, 2)


def test_a_job_document_reads_back_as_it_was_written() -> None:
    """``Job.to_doc`` and ``from_doc`` are inverse: the head is a ``Head``, counters left out of
    an older document read as 0, a key this code does not know is kept, and a field update
    (``updated``) is what a registry would store."""
    # Prepare
    head = J.Head(3, "w3", "c3", holdout_accuracy=0.9, holdout_loss=0.3)
    job = J.Job("j1", status=J.RUNNING, phase=J.TRAINING, version=3, epoch=2, round=1,
                options={"epochs": 4, "learning_rate": 0.01}, head=head,
                dataset={"classes": ["a", "b"], "task": "classification"},
                extra={"added_later": [1, 2]})
    # Execute
    doc = job.to_doc()
    # Assert
    assert J.Job.from_doc(doc) == job
    assert doc["head"] == head.to_doc() and doc["added_later"] == [1, 2]
    assert doc["published"] is None and "cancelled_by" not in doc  # None kept only where asked
    old = J.Job.from_doc({"job_id": "j0", "status": J.QUEUED, "phase": J.SPLITTING})
    assert (old.tasks_applied, old.epoch, old.head, old.classes) == (0, 0, None, [])
    moved = job.updated({"version": 4, "status": J.DONE})
    assert (moved.version, moved.is_terminal, job.version) == (4, True, 3)
    assert job.classes == ["a", "b"] and job.options["epochs"] == 4


def test_only_the_split_holding_the_claim_may_start_training() -> None:
    """``may_start_training``: the job is still splitting under this claim and has not ended."""
    # Prepare
    splitting = J.Job("j1", status=J.QUEUED, phase=J.SPLITTING, claim="c1")
    # Execute / Assert
    assert J.may_start_training(splitting, "c1")
    assert not J.may_start_training(splitting, "c2")
    assert not J.may_start_training(None, "c1")
    assert not J.may_start_training(replace(splitting, status=J.CANCELLED), "c1")
    assert not J.may_start_training(replace(splitting, phase=J.TRAINING), "c1")


def test_a_round_is_published_only_under_its_own_name() -> None:
    """``published`` names the last round published; an older round's name is not this one."""
    # Prepare
    job = J.Job("j1", epoch=2, round=13, published="e0002r00012")
    # Execute / Assert
    assert job.round_key == J.round_key(2, 13) == "e0002r00013"
    assert not job.is_published
    assert replace(job, published="e0002r00013").is_published
    assert J.done_tasks(J.Epoch(1, 9, applied=(1, 2), failed=(7,))) == {1, 2, 7}
    assert J.done_tasks(None) == set()
    assert J.is_terminal(J.Job("j", status=J.DONE))
    assert not J.is_terminal(J.Job("j", status=J.RUNNING))
    assert not J.is_terminal(None)


@pytest.mark.parametrize(("epoch", "round_index", "failed", "expected", "next_epoch"), [
    (1, 0, 0, {"round": 1}, None),
    (1, 2, 0, {"epoch": 2, "round": 0}, 2),
    (3, 2, 0, {"phase": J.EXPORTING}, None),
    (1, 0, 2, {"status": J.FAILED, "phase": "failed"}, None),
], ids=["next-round", "next-epoch", "export", "too-many-failures"])
def test_a_fold_moves_the_job_to_its_next_round_epoch_export_or_failure(
        epoch: int, round_index: int, failed: int, expected: dict[str, Any],
        next_epoch: int | None) -> None:
    """3 epochs of 3 rounds, 6 tasks an epoch, 1 failure allowed."""
    # Execute
    after = J.decide_after_fold(epoch, round_index, rounds_per_epoch=3, epochs=3,
                                tasks_per_epoch=6, tasks_failed=failed, allowed_failures=1,
                                first_failure="task t3: bad shard", now=50.0)
    # Assert
    assert {k: after.job_fields[k] for k in expected} == expected
    if next_epoch is None:
        assert after.next_epoch is None
    else:
        assert after.next_epoch == J.Epoch(next_epoch, 6, created_at=50.0)
        assert after.next_epoch.to_doc() == {"epoch": next_epoch, "planned": 6, "applied": [],
                                             "failed": [], "created_at": 50.0}
    if failed > 1:
        assert after.job_fields["error"] == ("2 task(s) failed for good (the job allows 1): "
                                             "task t3: bad shard")


def test_the_head_forgets_figures_of_older_weights_only() -> None:
    """A fold that applied results leaves the new head unevaluated; a fold of failures only
    (the same weights) keeps the figures; an evaluation fills them in."""
    # Prepare
    head = J.Head(3, "w/v3", "c3", 0.9, 0.3, 0.25)
    # Execute
    folded = head.advanced(4, "w/v4", "c4", folded_results=True, train_loss=0.2)
    failures_only = head.advanced(4, "w/v4", "c4", folded_results=False, train_loss=None)
    # Assert
    assert folded == J.Head(4, "w/v4", "c4", None, None, 0.2)
    assert failures_only == J.Head(4, "w/v4", "c4", 0.9, 0.3, 0.25)
    assert folded.evaluated(0.95, 0.1).to_doc() == {
        "version": 4, "weights_path": "w/v4", "checksum": "c4", "holdout_accuracy": 0.95,
        "holdout_loss": 0.1, "train_loss": 0.2, "holdout_macro_f1": None,
        "holdout_majority_accuracy": None, "holdout_roc_auc": None, "holdout_report": None}
    assert J.Head.from_doc(folded.to_doc()) == folded


def test_the_head_carries_and_forgets_the_figures_beyond_accuracy() -> None:
    """An evaluation with figures (macro-F1, the majority baseline, ROC AUC, the report) puts
    them on the head; a fold of new weights clears them, a fold of failures only keeps them; a
    head document written before they existed reads as None for each."""
    # Prepare
    figures = {"holdout_macro_f1": 0.5, "holdout_majority_accuracy": 0.9,
               "holdout_roc_auc": 0.75, "holdout_report": {"classes": 2, "truncated": False}}
    old_doc = {"version": 3, "weights_path": "w/v3", "checksum": "c3",
               "holdout_accuracy": 0.9, "holdout_loss": 0.3, "train_loss": 0.25}
    # Execute
    head = J.Head.from_doc(old_doc).evaluated(0.9, 0.3, figures)
    folded = head.advanced(4, "w/v4", "c4", folded_results=True, train_loss=0.2)
    failures_only = head.advanced(4, "w/v4", "c4", folded_results=False, train_loss=None)
    # Assert
    assert J.Head.from_doc(old_doc).holdout_report is None
    assert {k: head.to_doc()[k] for k in figures} == figures
    assert all(folded.to_doc()[k] is None for k in figures)
    assert {k: failures_only.to_doc()[k] for k in figures} == figures
    assert J.Head.from_doc(head.to_doc()) == head


def test_a_version_round_trips_through_its_document_and_reads_older_ones() -> None:
    """A fold's version reads back as written; its figures are None until evaluated. A version
    0 written before tasks_failed existed, with an evaluation merged in, reads as such."""
    # Prepare
    folded = J.Version(3, "weights/j/v3", "sha", parent=2, epoch=1, round=4,
                       tasks_applied=("j:e0001:t00004",), samples=250, train_loss=0.5,
                       created_at=9.0, delta_norms=(0.25,), server_lr=1.0,
                       aggregator={"fold_seconds": 0.01})
    old = {"version": 0, "parent": None, "weights_path": "w0", "checksum": "c", "epoch": 0,
           "tasks_applied": [], "samples": 0, "train_loss": None, "holdout_accuracy": 0.5,
           "holdout_loss": 1.25, "created_at": 1.0}
    # Execute
    again = J.Version.from_doc(folded.to_doc())
    first = J.Version.from_doc(old)
    # Assert
    assert again == folded and again.holdout_accuracy is None and again.tasks == 1
    assert folded.to_doc()["holdout_accuracy"] is None  # the document says "not yet"
    assert (first.tasks_failed, first.holdout_accuracy, first.figure("holdout_loss"),
            first.round) == ((), 0.5, 1.25, None)
