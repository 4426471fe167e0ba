"""bucketlearn.domain.job: the commit check, the round vocabulary and the job record."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from bucketlearn.domain import job as J
from bucketlearn.domain import lifecycle as L
from bucketlearn.domain import version as V
from bucketlearn.domain.head import Head
from bucketlearn.domain.plan import TrainingPlan


@dataclass
class Commit:
    epoch: int = 1
    round: int = 1
    base_version: int = 4
    version: V.Version = field(default_factory=lambda: V.Version(5, "w5"))
    holder: str = "agg-1"


PLAN = TrainingPlan(parallel_tasks=2, shards_per_task=1, tasks_per_epoch=5, epochs=2,
                    serial_steps=40, decided="test")
JOB = J.Job("j1", status=L.RUNNING, phase=L.TRAINING, version=4, epoch=1, round=1, plan=PLAN)


@pytest.mark.parametrize(("job", "exists", "commit", "reason"), [
    (JOB, False, Commit(), None),
    (None, False, Commit(), "no such job"),
    (replace(JOB, status=L.CANCELLED), False, Commit(), "the job is CANCELLED"),
    (JOB, True, Commit(), "version 5 exists"),
    (replace(JOB, version=5), False, Commit(), "the head is v5, not the base v4"),
    (replace(JOB, round=2), False, Commit(),
     "the job is at epoch 1 round 2, not at the folded epoch 1 round 1"),
    (JOB, False, Commit(epoch=2),
     "the job is at epoch 1 round 1, not at the folded epoch 2 round 1"),
    (replace(JOB, aggregated_by="agg-2"), False, Commit(),
     "the job is aggregated by agg-2, not agg-1"),
    (replace(JOB, aggregated_by="agg-1"), False, Commit(), None),
    (replace(JOB, aggregated_by="agg-2"), False, Commit(holder=""), None),
], ids=["allowed", "no-job", "ended", "version-used", "head-moved", "round-folded-already",
        "another-epoch", "taken-over", "own-fence", "not-fencing"])
def test_commit_refusal_names_the_first_rule_broken(job, exists, commit, reason) -> None:
    """A commit needs a live job, an unused version, the head at its base and the job still at
    the round it folds (so no round, hence no task, is folded twice); the answer says which rule
    failed."""
    # Execute / Assert
    assert J.commit_refusal(job, exists, commit) == reason


def test_the_rounds_before_the_current_one_are_the_epochs_done_tasks() -> None:
    """A round is committed whole, so an epoch's done tasks are those of the rounds before the
    job's current round (rounds of 2 of 5 tasks: round 2 starts at task 4)."""
    # Execute / Assert
    assert J.done_tasks(replace(JOB, round=0)) == set()
    assert J.done_tasks(JOB) == {0, 1}
    assert J.done_tasks(replace(JOB, round=2)) == {0, 1, 2, 3}
    assert J.done_tasks(None) == set()
    assert J.done_tasks(J.Job("j0")) == set()  # not split yet: no plan


def test_figures_a_later_commit_carried_go_back_on_their_version() -> None:
    """An evaluation travels with a later commit (one write to the job per version); listing
    the versions puts its figures back on the version they are of. A version's own figures
    (written directly) win; a version never evaluated keeps none."""
    # Prepare
    evaluation = V.Evaluation(2, {"holdout_accuracy": 0.75, "holdout_loss": 0.5}, 10.0, 0.02)
    docs = [V.Version(1, "w1", figures={"holdout_accuracy": 0.5}).to_doc(),
            V.Version(2, "w2").to_doc(), V.Version(3, "w3").to_doc(),
            V.Version(4, "w4", evaluation=evaluation).to_doc()]
    # Execute
    versions = V.attach_evaluations([V.Version.from_doc(d) for d in docs])
    # Assert
    assert [v.figure("holdout_accuracy") for v in versions] == [0.5, 0.75, None, None]
    assert versions[1].evaluated_at == 10.0 and versions[1].aggregator["eval_seconds"] == 0.02
    assert versions[3].evaluation == evaluation  # the carrier still says what it carried


def test_a_checkpoints_validation_score_does_not_hide_its_carried_holdout_figures() -> None:
    """A checkpoint's validation score is written on its own document; the holdout figures a
    later commit carried for it still go back on it."""
    # Prepare
    evaluation = V.Evaluation(2, {"holdout_accuracy": 0.75, "holdout_loss": 0.5}, 10.0, 0.02)
    docs = [V.Version(2, "w2", figures={"validation_accuracy": 0.7}).to_doc(),
            V.Version(3, "w3", evaluation=evaluation).to_doc()]
    # Execute
    versions = V.attach_evaluations([V.Version.from_doc(d) for d in docs])
    # Assert
    assert versions[0].figure("holdout_accuracy") == 0.75
    assert versions[0].figure("validation_accuracy") == 0.7


def test_a_heads_figures_say_which_version_they_are_of() -> None:
    """A fold keeps the head's last figures (of the version they were measured on) until the
    new version's evaluation arrives; an older evaluation never replaces a newer one."""
    # Prepare
    head = Head(3, "w3", "c3", digest="d3").evaluated(0.8, 0.4)
    # Execute
    moved = head.advanced(4, "w4", "c4", True, 0.3, "d4")
    newer = moved.with_evaluation(V.Evaluation(4, {"holdout_accuracy": 0.9,
                                                   "holdout_loss": 0.2}, 1.0))
    stale = newer.with_evaluation(V.Evaluation(3, {"holdout_accuracy": 0.1,
                                                   "holdout_loss": 9.0}, 2.0))
    # Assert
    assert (moved.version, moved.digest, moved.holdout_accuracy, moved.evaluated_version) == (
        4, "d4", 0.8, 3)
    assert (newer.holdout_accuracy, newer.evaluated_version) == (0.9, 4)
    assert stale == newer
    assert Head.from_doc(newer.to_doc()) == newer


def test_a_job_document_reads_back_as_it_was_written() -> None:
    """``Job.to_doc`` and ``from_doc`` are inverse: the head is a ``Head``, counters left out of
    an older document read as 0, a key this code does not know is kept, and a field update
    (``updated``) is what a registry would store."""
    # Prepare
    head = Head(3, "w3", "c3", holdout_accuracy=0.9, holdout_loss=0.3)
    job = J.Job("j1", status=L.RUNNING, phase=L.TRAINING, version=3, epoch=2, round=1,
                options={"epochs": 4, "learning_rate": 0.01}, head=head, plan=PLAN,
                dataset={"classes": ["a", "b"], "task": "classification"},
                extra={"added_later": [1, 2]})
    # Execute
    doc = job.to_doc()
    # Assert
    assert J.Job.from_doc(doc) == job
    assert doc["head"] == head.to_doc() and doc["added_later"] == [1, 2]
    assert doc["plan"] == PLAN.to_dict()  # the plan is read once, and stored as it was
    assert J.Job.from_doc(doc).plan == PLAN
    assert doc["published"] is None and "cancelled_by" not in doc  # None kept only where asked
    old = J.Job.from_doc({"job_id": "j0", "status": L.QUEUED, "phase": L.SPLITTING})
    assert (old.tasks_applied, old.epoch, old.head, old.classes, old.plan) == (0, 0, None, [],
                                                                               None)
    assert "plan" not in old.to_doc()
    moved = job.updated({"version": 4, "status": L.DONE})
    assert (moved.version, moved.is_terminal, job.version) == (4, True, 3)
    assert job.classes == ["a", "b"] and job.options["epochs"] == 4


def test_only_the_split_holding_the_claim_may_start_training() -> None:
    """``may_start_training``: the job is still splitting under this claim and has not ended."""
    # Prepare
    splitting = J.Job("j1", status=L.QUEUED, phase=L.SPLITTING, claim="c1")
    # Execute / Assert
    assert J.may_start_training(splitting, "c1")
    assert not J.may_start_training(splitting, "c2")
    assert not J.may_start_training(None, "c1")
    assert not J.may_start_training(replace(splitting, status=L.CANCELLED), "c1")
    assert not J.may_start_training(replace(splitting, phase=L.TRAINING), "c1")


def test_a_round_is_published_only_under_its_own_name() -> None:
    """``published`` names the last round published; an older round's name is not this one."""
    # Prepare
    job = J.Job("j1", epoch=2, round=13, published="e0002r00012")
    # Execute / Assert
    assert job.round_key == J.round_key(2, 13) == "e0002r00013"
    assert not job.is_published
    assert replace(job, published="e0002r00013").is_published
    assert J.Job("j", status=L.DONE).is_terminal
    assert not J.Job("j", status=L.RUNNING).is_terminal


@pytest.mark.parametrize(("epoch", "round_index", "failed", "expected"), [
    (1, 0, 0, {"round": 1}),
    (1, 2, 0, {"epoch": 2, "round": 0}),
    (3, 2, 0, {"phase": L.EXPORTING}),
    (1, 0, 2, {"status": L.FAILED, "phase": L.FAILED_PHASE, "finished_at": 50.0,
               "updated_at": 50.0}),
], ids=["next-round", "next-epoch", "export", "too-many-failures"])
def test_a_fold_moves_the_job_to_its_next_round_epoch_export_or_failure(
        epoch: int, round_index: int, failed: int, expected: dict[str, Any]) -> None:
    """3 epochs of 3 rounds, 1 failure allowed."""
    # Execute
    after = J.decide_after_fold(epoch, round_index, rounds_per_epoch=3, epochs=3,
                                tasks_failed=failed, allowed_failures=1,
                                first_failure="task t3: bad shard", now=50.0)
    # Assert
    assert {k: after.job_fields[k] for k in expected} == expected
    assert after.training_continues == ("round" in expected)
    assert J.next_round(epoch, round_index, 3, 3) == (
        (expected.get("epoch", epoch), expected["round"]) if "round" in expected else
        None if "phase" in expected and expected["phase"] == L.EXPORTING else
        J.next_round(epoch, round_index, 3, 3))


def test_the_heads_figures_stay_those_of_the_version_they_were_measured_on() -> None:
    """A fold that applied results keeps the head's figures, saying they are of the older
    version (the new one is evaluated off the critical path); a fold of failures only (the same
    weights) makes them the new version's; an evaluation fills them in for the head's own."""
    # Prepare
    head = Head(3, "w/v3", "c3", 0.9, 0.3, 0.25, evaluated_version=3)
    # Execute
    folded = head.advanced(4, "w/v4", "c4", folded_results=True, train_loss=0.2)
    failures_only = head.advanced(4, "w/v4", "c4", folded_results=False, train_loss=None)
    # Assert
    assert folded == Head(4, "w/v4", "c4", 0.9, 0.3, 0.2, evaluated_version=3)
    assert failures_only == Head(4, "w/v4", "c4", 0.9, 0.3, 0.25, evaluated_version=4)
    assert folded.evaluated(0.95, 0.1).to_doc() == {
        "version": 4, "weights_path": "w/v4", "checksum": "c4", "holdout_accuracy": 0.95,
        "holdout_loss": 0.1, "train_loss": 0.2, "evaluated_version": 4,
        "holdout_macro_f1": None, "holdout_majority_accuracy": None, "holdout_roc_auc": None,
        "holdout_report": None}
    assert Head.from_doc(folded.to_doc()) == folded


def test_the_head_carries_the_figures_beyond_accuracy() -> None:
    """An evaluation with figures (macro-F1, the majority baseline, ROC AUC, the report) puts
    them on the head, and a fold keeps them with the version they are of; a head document
    written before they existed reads as None for each."""
    # Prepare
    figures = {"holdout_macro_f1": 0.5, "holdout_majority_accuracy": 0.9,
               "holdout_roc_auc": 0.75, "holdout_report": {"classes": 2, "truncated": False}}
    old_doc = {"version": 3, "weights_path": "w/v3", "checksum": "c3",
               "holdout_accuracy": 0.9, "holdout_loss": 0.3, "train_loss": 0.25}
    # Execute
    head = Head.from_doc(old_doc).evaluated(0.9, 0.3, figures)
    folded = head.advanced(4, "w/v4", "c4", folded_results=True, train_loss=0.2)
    # Assert
    assert Head.from_doc(old_doc).holdout_report is None
    assert Head.from_doc(old_doc).evaluated_version is None
    assert {k: head.to_doc()[k] for k in figures} == figures
    assert {k: folded.to_doc()[k] for k in figures} == figures
    assert folded.evaluated_version == 3
    assert Head.from_doc(head.to_doc()) == head


def test_a_version_round_trips_through_its_document_and_reads_older_ones() -> None:
    """A fold's version reads back as written; its figures are None until evaluated. A version
    0 written before tasks_failed existed, with an evaluation merged in, reads as such."""
    # Prepare
    folded = V.Version(3, "weights/j/v3", "sha", parent=2, epoch=1, round=4,
                       tasks_applied=("j:e0001:t00004",), samples=250, train_loss=0.5,
                       created_at=9.0, delta_norms=(0.25,), server_lr=1.0,
                       aggregator={"fold_seconds": 0.01})
    old = {"version": 0, "parent": None, "weights_path": "w0", "checksum": "c", "epoch": 0,
           "tasks_applied": [], "samples": 0, "train_loss": None, "holdout_accuracy": 0.5,
           "holdout_loss": 1.25, "created_at": 1.0}
    # Execute
    again = V.Version.from_doc(folded.to_doc())
    first = V.Version.from_doc(old)
    # Assert
    assert again == folded and again.holdout_accuracy is None and again.tasks == 1
    assert folded.to_doc()["holdout_accuracy"] is None  # the document says "not yet"
    assert (first.tasks_failed, first.holdout_accuracy, first.figure("holdout_loss"),
            first.round) == ((), 0.5, 1.25, None)


@pytest.mark.parametrize(("status", "phase"), [
    (L.DONE, "done"), (L.FAILED, "failed"), (L.REJECTED, "rejected"),
    (L.CANCELLED, "cancelled"),
], ids=["done", "failed", "rejected", "cancelled"])
def test_every_ending_records_its_status_phase_and_when(status: str, phase: str) -> None:
    """Each ending writes the same four fields: its status, its phase, and the time it ended as
    both ``finished_at`` and ``updated_at``; with no error given, no ``error`` key is written."""
    # Execute
    fields = J.ending_fields(status, 70.0)
    # Assert
    assert fields == {"status": status, "phase": phase, "finished_at": 70.0,
                      "updated_at": 70.0}
    assert L.ENDING_PHASES[status] == phase
    ended = JOB.updated(fields)
    assert (ended.is_terminal, ended.status, ended.phase, ended.finished_at,
            ended.updated_at) == (True, status, phase, 70.0, 70.0)


def test_an_ending_carries_its_error_and_the_callers_fields() -> None:
    """The reason (``error``, ``error_detail``) and the fields only some endings write (a DONE's
    ``model_path``, who cancelled) are in the update as given, beside the four every ending
    writes; each key names a ``Job`` attribute, so it reads back."""
    # Prepare
    detail = {"file": "a.csv", "row": 7, "column": "x"}
    # Execute
    rejected = J.ending_fields(L.REJECTED, 80.0, error="row 7: bad cell", error_detail=detail)
    done = J.ending_fields(L.DONE, 90.0, model_path="models/j1/latest.keras",
                           final_holdout_rows=40)
    cancelled = J.ending_fields(L.CANCELLED, 95.0, error="cancelled by ana", cancelled_at=95.0,
                                cancelled_by="ana", cancel_reason=None)
    # Assert
    assert rejected == {"status": L.REJECTED, "phase": L.REJECTED_PHASE, "finished_at": 80.0,
                        "updated_at": 80.0, "error": "row 7: bad cell", "error_detail": detail}
    assert done == {"status": L.DONE, "phase": L.DONE_PHASE, "finished_at": 90.0,
                    "updated_at": 90.0, "model_path": "models/j1/latest.keras",
                    "final_holdout_rows": 40}
    assert {k: cancelled[k] for k in ("error", "cancelled_by", "cancel_reason")} == {
        "error": "cancelled by ana", "cancelled_by": "ana", "cancel_reason": None}
    assert J.unknown_fields(rejected) == J.unknown_fields(done) == J.unknown_fields(
        cancelled) == []
    assert JOB.updated(rejected).error_detail == detail


@pytest.mark.parametrize(("status", "extra"), [
    (L.RUNNING, {}), (L.FAILED, {"finished_at": 1.0}), (L.FAILED, {"phase": "x"}),
    (L.DONE, {"model_pth": "typo"}),
], ids=["not-an-ending", "its-own-time", "its-own-phase", "no-such-field"])
def test_an_ending_refuses_what_is_not_one(status: str, extra: dict[str, Any]) -> None:
    """Only the four endings end a job, and an extra field may neither restate what the ending
    sets itself nor name a field no ``Job`` has."""
    # Execute / Assert
    with pytest.raises(ValueError, match="ending|how a job ends"):
        J.ending_fields(status, 1.0, **extra)


def test_a_split_claim_is_renewed_every_third_of_its_lease() -> None:
    assert not J.claim_renewal_due(renewed_at=100.0, now=109.9, lease_seconds=30.0)
    assert J.claim_renewal_due(renewed_at=100.0, now=110.0, lease_seconds=30.0)
