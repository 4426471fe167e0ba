"""A job's vocabulary, its life and the rules every service and both registries ask: one place
each.

Statuses and phases, and which moves between them are allowed, are ``domain.lifecycle``'s. A job
changes by field updates the services write (the registries' ``update_job``, ``update_job_if``
and transactions); each change of its life is spelled here, once, by the function that returns
its fields:

* ``start_fields``: training begins (the split's end, beside version 0): epoch 1, round 0;
* ``publish_fields``: the tasks of the job's current round are published;
* ``commit_fields``: a version is committed (a round folded): the job's counters and head, then
  the next round (its publish record too), the export or a failure (``decide_after_fold``);
* ``fail_fields``, ``cancel_fields`` and ``ending_fields`` (any ending: DONE, REJECTED, FAILED,
  CANCELLED): the job ends.

A version commit is allowed or refused by ``commit_refusal`` (asked by the in-memory registry
under its lock and by Firestore's inside its transaction); training may start only under the
split's claim (``may_start_training``); a round is trainable once it is published
(``Job.is_published``). Pure: typed records in, answers out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from bucketlearn.domain.forecast import Forecast, ModelCost
from bucketlearn.domain.head import Head
from bucketlearn.domain.lifecycle import (
    CANCELLED,
    ENDING_PHASES,
    EXPORTING,
    FAILED,
    QUEUED,
    RUNNING,
    SPLITTING,
    TERMINAL,
    TRAINING,
    Phase,
    Status,
)
from bucketlearn.domain.plan import TrainingPlan
from bucketlearn.domain.version import Version
from bucketlearn.errors import bounded

MAX_ERROR_CHARS = 2000  # a failure's reason, as the job document stores it
MAX_CANCEL_CHARS = 500  # who cancelled and why: user input stored in the job document


class Commit(Protocol):
    """What ``commit_refusal`` reads of a version commit (``ports.VersionCommit``)."""

    epoch: int
    round: int
    base_version: int
    version: Version
    holder: str


def round_key(epoch: int, round_index: int) -> str:
    """The name of one round (``e0002r00013``), recorded once its tasks are published."""
    return f"e{epoch:04d}r{round_index:05d}"


def splitting_under(claim: str | None) -> dict[str, Any]:
    """What every write of a split expects to find unchanged: the job still splitting under
    its ``claim`` (a splitter that lost its claim writes nothing more)."""
    return {"claim": claim, "phase": SPLITTING}


def may_start_training(job: Job | None, claim: str) -> bool:
    """The split holding ``claim`` may start the job's training: the job is still being split
    under that claim and has not ended (e.g. cancelled during the split). Both registries ask
    this inside their lock or transaction."""
    return (job is not None and job.claim == claim and job.phase == SPLITTING
            and not job.is_terminal)


def claim_renewal_due(renewed_at: float, now: float, lease_seconds: float) -> bool:
    """Whether a split's claim renewed at ``renewed_at`` is due for renewal (every lease/3 s,
    so that two renewals can be missed before the claim counts as abandoned)."""
    return now - renewed_at >= lease_seconds / 3


def done_tasks(job: Job | None) -> frozenset[int]:
    """The task indices of the job's current epoch that are done (applied, or failed for good):
    every task of the rounds before its current one. A round is committed whole, each of its
    tasks applied or given up on in the one version that folds it, so the job's position is the
    epoch's ledger; which tasks a version applied or gave up on is in that version's document."""
    if job is None or job.plan is None:
        return frozenset()
    plan = job.plan
    return frozenset(range(0, min(plan.tasks_per_epoch, job.round * plan.parallel_tasks)))


def commit_refusal(job: Job | None, version_exists: bool, commit: Commit) -> str | None:
    """Why a version commit must not happen (None: it may). Both registries ask this inside
    their lock or transaction, with the documents read there.

    A commit needs a job that has not ended (a fold racing a cancel must not advance it), still
    fenced by the committing aggregator (one whose lease ran out while another took the job
    over commits nothing), the head still at the commit's base, the job still at the round the
    commit folds (so no round, hence no task, is folded twice: invariant 2) and a new version.
    """
    if job is None:
        return "no such job"
    if job.is_terminal:
        return f"the job is {job.status}"
    if commit.holder and job.aggregated_by not in (None, commit.holder):
        return f"the job is aggregated by {job.aggregated_by}, not {commit.holder}"
    if version_exists:
        return f"version {commit.version.version} exists"
    if job.version != commit.base_version:
        return f"the head is v{job.version}, not the base v{commit.base_version}"
    if (job.epoch, job.round) != (commit.epoch, commit.round):
        return (f"the job is at epoch {job.epoch} round {job.round}, not at the folded "
                f"epoch {commit.epoch} round {commit.round}")
    return None


def _optional(value: Any, kind: type) -> Any:
    return kind(value) if value is not None else None

def _plan(value: Any) -> TrainingPlan | None:
    """The plan as its document stores it (``TrainingPlan.to_dict``); None before the split."""
    return TrainingPlan.from_dict(dict(value)) if value else None


def _int(value: Any) -> int:
    """A counter as stored; 0 where an older document has none."""
    return int(value) if value is not None else 0


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}

@dataclass(frozen=True)
class Job:
    """One upload's job as its document records it: how it stands (``status``, ``phase``), where
    training is (``version``, ``epoch``, ``round``, the round last ``published``), what was
    decided at the split (``options``, ``plan``, ``dataset``, ``model``) and its ``head``.

    Services read a job as this and change it with field updates (the registries' ``update_job``
    and transactions), whose keys are these attribute names. A document key this code does not
    know (a newer writer's) is kept in ``extra``. ``from_doc``/``to_doc`` are the one place a
    job document is read or built.
    """

    job_id: str
    status: Status = QUEUED
    phase: Phase | None = None
    file: str = ""
    source: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    claim: str | None = None
    claimed_at: float | None = None
    split_attempts: int = 0  # splits begun (a retried event that takes the split over counts)
    created_at: float = 0.0
    updated_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    # where training is
    version: int | None = None
    epoch: int = 0
    round: int = 0
    published: str | None = None
    published_at: float | None = None
    tasks_per_epoch: int | None = None  # both set by the split
    tasks_planned: int | None = None
    tasks_applied: int = 0
    tasks_failed: int = 0
    samples_seen: int = 0
    # decided at the split (the plan read once, from its document: ``TrainingPlan.to_dict``)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    plan: TrainingPlan | None = None
    # what auto options became, and the best version by validation so far (``domain.recipe``)
    budget: Mapping[str, Any] | None = None
    selection: Mapping[str, Any] | None = None
    # how long the plan should train, on how many learners (``domain.forecast``)
    forecast: Mapping[str, Any] | None = None
    feature_importance: Mapping[str, Any] | None = None  # the export's (domain.importance)
    search: Mapping[str, Any] | None = None  # a searched job's candidates (usecases.search_publish)
    dataset: Mapping[str, Any] | None = None
    model: Mapping[str, Any] | None = None
    head: Head | None = None
    # what the aggregator, the watchdog and the health watch recorded
    delta_norm: float | None = None
    health: Mapping[str, Any] | None = None
    refusals: Mapping[str, Any] | None = None
    deltas_refused: int = 0
    last_refusal: str | None = None
    watchdog_actions: int = 0
    watchdog_at: float | None = None
    last_watchdog_action: str | None = None
    # the current round is trained by a learner chaining from its own last result (R = 1):
    # its worker id; the aggregator publishes the round itself if the chain's result is late
    chained_by: str | None = None
    # the aggregator that took the job on last: another's commits are refused (commit_refusal)
    aggregated_by: str | None = None
    # what the job has used so far (``domain.usage``): CPU seconds, calls, messages
    usage: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # how it ended
    error: str | None = None
    error_detail: Mapping[str, Any] | None = None
    cancelled_at: float | None = None
    cancelled_by: str | None = None
    cancel_reason: str | None = None
    model_path: str | None = None
    final_holdout_rows: int | None = None
    # a continued job's parent: {job_id, version}, and at DONE the parent's model's figures on
    # this job's holdout (``parent_holdout``)
    continued_from: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        """The job has ended (DONE, REJECTED, FAILED or CANCELLED); nothing may change it."""
        return self.status in TERMINAL

    @property
    def round_key(self) -> str:
        """The name of the job's current round."""
        return round_key(self.epoch, self.round)

    @property
    def is_published(self) -> bool:
        """The job's current round has been published (its tasks can be trained)."""
        return self.published == self.round_key

    @property
    def status_and_phase(self) -> dict[str, Any]:
        """How the job stands (status and phase) as read: what a write that ends it expects to
        find unchanged (``endings.end_job``, the watchdog), so no ending overwrites another."""
        return {"status": self.status, "phase": self.phase}

    @property
    def epoch_round_version(self) -> dict[str, Any]:
        """Where the job is in its training (epoch, round, version) as its document stores them:
        what a write about its current round expects to find unchanged (``publish_round``)."""
        return {"epoch": self.epoch, "round": self.round, "version": self.version}

    @property
    def classes(self) -> list[Any]:
        """The class names the split found (empty for a regression, or before the split)."""
        return list((self.dataset or {}).get("classes") or [])

    def updated(self, fields: Mapping[str, Any]) -> Job:
        """This job after the field update ``fields`` (document keys), as a registry stores it."""
        return Job.from_doc({**self.to_doc(), **fields})

    def to_doc(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "extra"}
        doc["head"] = self.head.to_doc() if self.head is not None else None
        doc["plan"] = self.plan.to_dict() if self.plan is not None else None
        for name in ("source", "options"):
            doc[name] = dict(doc[name])
        if not doc["usage"]:
            del doc["usage"]
        else:
            doc["usage"] = dict(doc["usage"])
        doc = {k: v for k, v in doc.items() if v is not None or k in _ALWAYS_STORED}
        return {**self.extra, **doc}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Job:
        get = doc.get
        head = get("head")
        return cls(
            job_id=str(doc["job_id"]), status=Status(get("status") or QUEUED),
            phase=Phase(get("phase")) if get("phase") else None,
            file=str(get("file") or ""), source=_dict(get("source")), claim=get("claim"),
            claimed_at=_optional(get("claimed_at"), float),
            split_attempts=_int(get("split_attempts")),
            created_at=float(get("created_at") or 0.0),
            updated_at=_optional(get("updated_at"), float),
            started_at=_optional(get("started_at"), float),
            finished_at=_optional(get("finished_at"), float),
            version=_optional(get("version"), int), epoch=_int(get("epoch")),
            round=_int(get("round")), published=get("published"),
            published_at=_optional(get("published_at"), float),
            tasks_per_epoch=_optional(get("tasks_per_epoch"), int),
            tasks_planned=_optional(get("tasks_planned"), int),
            tasks_applied=_int(get("tasks_applied")), tasks_failed=_int(get("tasks_failed")),
            samples_seen=_int(get("samples_seen")), options=_dict(get("options")),
            plan=_plan(get("plan")), budget=get("budget"), selection=get("selection"),
            forecast=get("forecast"), dataset=get("dataset"), model=get("model"),
            feature_importance=get("feature_importance"), search=get("search"),
            head=Head.from_doc(head) if head else None,
            delta_norm=_optional(get("delta_norm"), float), health=get("health"),
            refusals=get("refusals"), deltas_refused=_int(get("deltas_refused")),
            last_refusal=get("last_refusal"), watchdog_actions=_int(get("watchdog_actions")),
            watchdog_at=_optional(get("watchdog_at"), float), last_watchdog_action=get("last_watchdog_action"),
            chained_by=get("chained_by"), aggregated_by=get("aggregated_by"),
            usage=_dict(get("usage")),
            error=get("error"), error_detail=get("error_detail"),
            cancelled_at=_optional(get("cancelled_at"), float),
            cancelled_by=get("cancelled_by"), cancel_reason=get("cancel_reason"),
            model_path=get("model_path"),
            final_holdout_rows=_optional(get("final_holdout_rows"), int),
            continued_from=get("continued_from"),
            extra={k: v for k, v in doc.items() if k not in JOB_FIELDS})


_ALWAYS_STORED = ("version", "published", "error")  # stored even while None, as they were
JOB_FIELDS = frozenset(f.name for f in dataclasses.fields(Job)) - {"extra"}


def unknown_fields(fields: Mapping[str, Any]) -> list[str]:
    """The keys of a job field update that name no ``Job`` attribute: a typo, or a field that
    nothing would ever read back."""
    return sorted(k for k in fields if k not in JOB_FIELDS)


# -- the changes of a job's life: each returns the field update its service writes -------------

def start_fields(plan: TrainingPlan, head: Head, now: float, forecast: Forecast,
                 cost: ModelCost, dataset: Mapping[str, Any], model: Mapping[str, Any],
                 usage: Mapping[str, Any]) -> dict[str, Any]:
    """Training begins: the split's last write (the registries' ``start_training``, beside
    version 0 and only under the split's claim: ``may_start_training``). The job trains from
    ``head`` (version 0) at round 0 of epoch 1, none published yet, and records what the split
    decided: the ``plan``, its ``forecast`` for a model costing ``cost`` (made ``now``), the
    ``dataset`` summary, the ``model`` spec, and what the split used (``usage``).

    Raises:
        ValueError: ``head`` is not version 0.
    """
    if head.version != 0:
        raise ValueError(f"training starts from version 0, not v{head.version}")
    return {"phase": TRAINING, "version": 0, "epoch": 1, "round": 0, "published": None,
            "plan": plan.to_dict(), "tasks_per_epoch": plan.tasks_per_epoch,
            "forecast": {**forecast.to_dict(), "model": cost.to_dict(), "made_at": now},
            "tasks_planned": plan.total_tasks, "dataset": dataset, "model": model,
            "updated_at": now, "head": head.to_doc(), "usage": usage}


def publish_fields(job: Job, now: float) -> dict[str, Any]:
    """The tasks of the job's current round are published (``publish_round``, written only
    while the job is at the ``position`` it was read at): ``published`` names the round, and no
    learner chains into it.

    Raises:
        ValueError: the job has no round to publish (not split yet: no plan or no head).
    """
    if job.plan is None or job.head is None:
        raise ValueError(f"job {job.job_id} has no round to publish (not split yet)")
    return {"published": job.round_key, "published_at": now, "updated_at": now,
            "chained_by": None}


def commit_fields(job: Job, head: Head, applied: int, failures: Sequence[str], samples: int,
                  delta_norm: float | None, usage: Mapping[str, Any],
                  health: Mapping[str, Any] | None, now: float,
                  chained_by: str | None = None) -> dict[str, Any]:
    """A version is committed: the fold of the job's current round (the registries'
    ``commit_version``, beside the version's document; ``commit_refusal`` decides inside it).

    The job is RUNNING at ``head`` (the new version, ``Head.advanced``), its counters advanced
    by the round (``applied`` results, ``failures``: the reason of each task given up on, in
    task order; ``samples`` rows), with the fold's running ``delta_norm``, its total ``usage``,
    ``health`` when the health watch changed it, and ``started_at`` at its first commit. Then
    where the fold takes it (``decide_after_fold``): the next round, recorded as published in
    this same commit (``chained_by``: the learner that chains into it at R = 1), the export, or
    FAILED once more tasks failed than the job allows.

    Raises:
        ValueError: the job has ended or has no plan, or ``head`` is not the next version.
    """
    plan = job.plan
    if job.is_terminal or plan is None:
        raise ValueError(f"job {job.job_id} has no round to commit (it is {job.status}"
                         f"{'' if plan is not None else ', not split yet'})")
    if head.version != (job.version or 0) + 1:
        raise ValueError(f"job {job.job_id}: a commit onto v{job.version} makes "
                         f"v{(job.version or 0) + 1}, not v{head.version}")
    tasks_failed = job.tasks_failed + len(failures)
    fields: dict[str, Any] = {
        "version": head.version, "status": RUNNING, "updated_at": now,
        "tasks_applied": job.tasks_applied + applied, "tasks_failed": tasks_failed,
        "samples_seen": job.samples_seen + samples, "delta_norm": delta_norm,
        "head": head.to_doc(), "usage": usage}
    if health is not None and health != dict(job.health or {}):
        fields["health"] = health
    if job.started_at is None:
        fields["started_at"] = now
    after = decide_after_fold(job.epoch, job.round, plan.rounds_per_epoch, plan.epochs,
                              tasks_failed, int(job.options.get("max_failed_tasks", 0)),
                              failures[0] if failures else None, now)
    fields.update(after.job_fields)
    if after.training_continues:  # the next round's publish record, in this commit
        following = round_key(after.job_fields.get("epoch", job.epoch),
                              after.job_fields["round"])
        fields.update(published=following, published_at=now, chained_by=chained_by)
    return fields


def ending_fields(status: str, now: float, error: str | None = None,
                  error_detail: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """The field update that ends a job with ``status`` (one of ``TERMINAL``, its phase
    ``ENDING_PHASES[status]``) at ``now`` (``finished_at`` and ``updated_at``): every ending
    records these fields; its writer decides only whether the job may still be ended.

    ``error`` (the sentence shown) and ``error_detail`` (the problem as data) are left out when
    None; ``extra`` fields (a DONE's ``model_path``, a cancel's who and why) are written as given.

    Raises:
        ValueError: ``status`` is not an ending, or ``extra`` names a field the ending sets
            itself or no ``Job`` attribute.
    """
    if status not in ENDING_PHASES:
        raise ValueError(f"{status!r} is not how a job ends (one of {', '.join(TERMINAL)})")
    fields: dict[str, Any] = {"status": status, "phase": ENDING_PHASES[status],
                              "finished_at": now, "updated_at": now}
    clashing = sorted(set(extra) & set(fields)) + unknown_fields(extra)
    if clashing:
        raise ValueError(f"an ending's extra fields may not be {clashing}")
    if error is not None:
        fields["error"] = error
    if error_detail is not None:
        fields["error_detail"] = error_detail
    return {**fields, **extra}


def fail_fields(now: float, error: str, **extra: Any) -> dict[str, Any]:
    """The job fails: the ending FAILED with ``error`` (its first ``MAX_ERROR_CHARS``), whoever
    fails it (the aggregation, the export's degenerate model, the health watch with its
    ``health`` in ``extra``, the watchdog, a split whose state a backend refused).

    Raises:
        ValueError: no reason is given, or ``extra`` is not an ending's (``ending_fields``).
    """
    if not error.strip():
        raise ValueError("a job fails with a reason")
    return ending_fields(FAILED, now, error=error[:MAX_ERROR_CHARS], **extra)


def utc_text(seconds: float) -> str:
    """Epoch seconds as '2026-11-03 14:05:09 UTC'."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def cancel_fields(by: str, reason: str | None, now: float) -> dict[str, Any]:
    """The job is cancelled (``usecases.cancel``): the ending CANCELLED with when, who (``by``,
    "someone" when blank) and why (``reason``, if given), each text at most
    ``MAX_CANCEL_CHARS``; ``error`` says all three in one sentence, as it does for other
    endings."""
    by = bounded(by.strip() or "someone", MAX_CANCEL_CHARS)
    reason = bounded(reason.strip(), MAX_CANCEL_CHARS) if reason and reason.strip() else None
    sentence = f"cancelled by {by} at {utc_text(now)}" + (f": {reason}" if reason else "")
    return ending_fields(CANCELLED, now, error=sentence, cancelled_at=now, cancelled_by=by,
                         cancel_reason=reason)


@dataclass(frozen=True)
class AfterFold:
    """Where a job goes once a round is folded: the job fields that say so."""

    job_fields: dict[str, Any]

    @property
    def training_continues(self) -> bool:
        """The fold opens another round (not the export, not an ending)."""
        return "round" in self.job_fields


def decide_after_fold(epoch: int, round_index: int, rounds_per_epoch: int, epochs: int,
                      tasks_failed: int, allowed_failures: int, first_failure: str | None,
                      now: float) -> AfterFold:
    """The transition a fold makes (pure): too many failed tasks end the job FAILED; the last
    round of the last epoch starts the export; the last round of another epoch opens the next
    epoch; any other round moves to the next round."""
    if tasks_failed > allowed_failures:
        reason = first_failure or "tasks failed"
        return AfterFold(fail_fields(now, f"{tasks_failed} task(s) failed for good (the job "
                                          f"allows {allowed_failures}): {reason}"))
    following = next_round(epoch, round_index, rounds_per_epoch, epochs)
    if following is None:
        return AfterFold({"phase": EXPORTING})
    return AfterFold({"epoch": following[0], "round": following[1]})


def next_round(epoch: int, round_index: int, rounds_per_epoch: int, epochs: int
               ) -> tuple[int, int] | None:
    """The (epoch, round) after this one; None after the last round of the last epoch."""
    if round_index + 1 < rounds_per_epoch:
        return epoch, round_index + 1
    if epoch >= epochs:
        return None
    return epoch + 1, 0
