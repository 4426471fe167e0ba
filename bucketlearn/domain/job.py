"""A job's vocabulary and the rules every service and both registries ask: one place each.

Statuses say how a job stands for its user; phases refine what the pipeline is doing. A version
commit is allowed or refused by ``commit_refusal`` (asked by the in-memory registry under its
lock and by Firestore's inside its transaction); a round is trainable once it is published
(``Job.is_published``); a job ends with the field update of ``ending_fields``, whoever ends it.
Pure: typed records in, answers out; each record's document is built and read by its own
``to_doc``/``from_doc``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from bucketlearn.domain.metrics import HOLDOUT_FIGURES, REGRESSION_FIGURES
from bucketlearn.domain.plan import TrainingPlan
from bucketlearn.domain.version import Evaluation, Version

_FIGURES = (*HOLDOUT_FIGURES, *REGRESSION_FIGURES)  # a head's figures beside accuracy and loss

QUEUED, RUNNING, DONE, REJECTED, FAILED = "QUEUED", "RUNNING", "DONE", "REJECTED", "FAILED"
CANCELLED = "CANCELLED"
TERMINAL = (DONE, REJECTED, FAILED, CANCELLED)
STATUSES = (QUEUED, RUNNING, DONE, REJECTED, FAILED, CANCELLED)

# Phases refine the status: what the pipeline is doing right now.
SPLITTING, TRAINING, EXPORTING = "splitting", "training", "exporting"
# and, once it has ended, the phase each ending writes (``ending_fields``)
DONE_PHASE, REJECTED_PHASE, FAILED_PHASE = "done", "rejected", "failed"
CANCELLED_PHASE = "cancelled"
ENDING_PHASES = {DONE: DONE_PHASE, REJECTED: REJECTED_PHASE, FAILED: FAILED_PHASE,
                 CANCELLED: CANCELLED_PHASE}


class Commit(Protocol):
    """What ``commit_refusal`` reads of a version commit (``ports.VersionCommit``)."""

    epoch: int
    round: int
    base_version: int
    version: Version


def is_terminal(job: Job | None) -> bool:
    """The job exists and has ended (DONE, REJECTED, FAILED or CANCELLED)."""
    return job is not None and job.is_terminal


def round_key(epoch: int, round_index: int) -> str:
    """The name of one round (``e0002r00013``), recorded once its tasks are published."""
    return f"e{epoch:04d}r{round_index:05d}"


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
    plan = job.training_plan
    assert plan is not None
    return frozenset(range(0, min(plan.tasks_per_epoch, job.round * plan.parallel_tasks)))


def commit_refusal(job: Job | None, version_exists: bool, commit: Commit) -> str | None:
    """Why a version commit must not happen (None: it may). Both registries ask this inside
    their lock or transaction, with the documents read there.

    A commit needs a job that has not ended (a fold racing a cancel must not advance it), the
    head still at the commit's base, the job still at the round the commit folds (so no round,
    hence no task, is folded twice: invariant 2) and a new version number.
    """
    if job is None:
        return "no such job"
    if job.is_terminal:
        return f"the job is {job.status}"
    if version_exists:
        return f"version {commit.version.version} exists"
    if job.version != commit.base_version:
        return f"the head is v{job.version}, not the base v{commit.base_version}"
    if (job.epoch, job.round) != (commit.epoch, commit.round):
        return (f"the job is at epoch {job.epoch} round {job.round}, not at the folded "
                f"epoch {commit.epoch} round {commit.round}")
    return None


@dataclass(frozen=True)
class Head:
    """The job's pointer to its newest version, and that version's figures once evaluated.

    Beyond accuracy and loss, an evaluated head carries the figures of ``metrics.holdout_fields``
    (macro-F1, the majority-class baseline, binary ROC AUC, the per-class report); a head
    written before they existed has None there.
    """

    version: int
    weights_path: str
    checksum: str
    holdout_accuracy: float | None = None
    holdout_loss: float | None = None
    train_loss: float | None = None
    # the digest of the version's arrays (``codec.state_digest``): tasks name their base by it
    digest: str = ""
    # which version the figures are of (the head's own, or an earlier one while the newest is
    # being evaluated off the critical path); None when there are none
    evaluated_version: int | None = None
    holdout_macro_f1: float | None = None
    holdout_majority_accuracy: float | None = None
    holdout_roc_auc: float | None = None
    holdout_report: Mapping[str, Any] | None = None
    # a regression's figures (``metrics.regression_fields``); a head without them (any
    # classification head) stores none of these keys
    holdout_rmse: float | None = None
    holdout_mae: float | None = None
    holdout_r2: float | None = None

    def to_doc(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        if not doc["digest"]:
            del doc["digest"]
        if doc["evaluated_version"] is None:
            del doc["evaluated_version"]
        if all(doc[name] is None for name in REGRESSION_FIGURES):
            for name in REGRESSION_FIGURES:
                del doc[name]
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Head:
        return cls(version=int(doc["version"]), weights_path=str(doc.get("weights_path") or ""),
                   checksum=str(doc.get("checksum") or ""),
                   holdout_accuracy=doc.get("holdout_accuracy"),
                   holdout_loss=doc.get("holdout_loss"), train_loss=doc.get("train_loss"),
                   digest=str(doc.get("digest") or ""),
                   evaluated_version=_optional(doc.get("evaluated_version"), int),
                   **{name: doc.get(name) for name in _FIGURES})

    def evaluated(self, accuracy: float | None, loss: float,
                  figures: Mapping[str, Any] | None = None, version: int | None = None) -> Head:
        """The same head with the holdout figures of ``version`` (its own by default;
        ``figures``: the fields of ``metrics.holdout_fields``, or of
        ``metrics.regression_fields``)."""
        extra = {name: (figures or {}).get(name)
                 for name in _FIGURES}
        return dataclasses.replace(self, holdout_accuracy=accuracy, holdout_loss=loss,
                                   evaluated_version=self.version if version is None else version,
                                   **extra)

    def with_evaluation(self, evaluation: Evaluation) -> Head:
        """The head with an evaluation's figures, unless it already shows a newer version's."""
        if self.evaluated_version is not None and self.evaluated_version > evaluation.version:
            return self
        return self.evaluated(evaluation.figures.get("holdout_accuracy"),
                              evaluation.figures.get("holdout_loss"), evaluation.figures,
                              evaluation.version)

    def advanced(self, version: int, weights_path: str, checksum: str, folded_results: bool,
                 train_loss: float | None, digest: str = "") -> Head:
        """The head after a fold into ``version``. Its figures stay those of the version they
        were measured on (``evaluated_version``) until the new version's evaluation arrives; a
        fold that only recorded failures has the previous version's weights, hence its figures."""
        kept = dataclasses.replace(self, version=version, weights_path=weights_path,
                                   checksum=checksum, digest=digest or self.digest,
                                   train_loss=train_loss if train_loss is not None
                                   else self.train_loss)
        if not folded_results and self.evaluated_version == self.version:
            return dataclasses.replace(kept, evaluated_version=version)
        return kept


def _optional(value: Any, kind: type) -> Any:
    return kind(value) if value is not None else None


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
    status: str = QUEUED
    phase: str | None = None
    file: str = ""
    source: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    claim: str | None = None
    claimed_at: float | None = None
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
    # decided at the split
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    plan: Mapping[str, Any] | None = None
    # how long the plan should train, and on how many learners (``domain.forecast``), and
    # when training started
    forecast: Mapping[str, Any] | None = None
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
    def training_plan(self) -> TrainingPlan | None:
        """The plan the split decided (None before it)."""
        return TrainingPlan.from_dict(dict(self.plan)) if self.plan else None

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
            job_id=str(doc["job_id"]), status=str(get("status") or QUEUED), phase=get("phase"),
            file=str(get("file") or ""), source=_dict(get("source")), claim=get("claim"),
            claimed_at=_optional(get("claimed_at"), float),
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
            plan=get("plan"), forecast=get("forecast"), dataset=get("dataset"),
            model=get("model"),
            head=Head.from_doc(head) if head else None,
            delta_norm=_optional(get("delta_norm"), float), health=get("health"),
            refusals=get("refusals"), deltas_refused=_int(get("deltas_refused")),
            last_refusal=get("last_refusal"), watchdog_actions=_int(get("watchdog_actions")),
            watchdog_at=_optional(get("watchdog_at"), float), last_watchdog_action=get("last_watchdog_action"),
            chained_by=get("chained_by"), usage=_dict(get("usage")),
            error=get("error"), error_detail=get("error_detail"),
            cancelled_at=_optional(get("cancelled_at"), float),
            cancelled_by=get("cancelled_by"), cancel_reason=get("cancel_reason"),
            model_path=get("model_path"),
            final_holdout_rows=_optional(get("final_holdout_rows"), int),
            extra={k: v for k, v in doc.items() if k not in JOB_FIELDS})


# kept in a stored job document even while None: a new job's document has always said so
_ALWAYS_STORED = ("version", "published", "error")
JOB_FIELDS = frozenset(f.name for f in dataclasses.fields(Job)) - {"extra"}


def unknown_fields(fields: Mapping[str, Any]) -> list[str]:
    """The keys of a job field update that name no ``Job`` attribute: a typo, or a field that
    nothing would ever read back."""
    return sorted(k for k in fields if k not in JOB_FIELDS)


def ending_fields(status: str, now: float, error: str | None = None,
                  error_detail: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """The field update that ends a job: the one place an ending is spelled, so every ending
    (the export's DONE, a split's REJECTED, each FAILED, a cancel) records the same fields.

    Whoever writes it decides only whether the job may still be ended (``jobs.end_job``, the
    split's claim, the watchdog's conditional update); what an ended job's document says is
    decided here.

    Args:
        status: the ending, one of ``TERMINAL``; its phase is ``ENDING_PHASES[status]``.
        now: when it ended: both ``finished_at`` and ``updated_at``.
        error: why (the sentence the CLI and the dashboard show); left out when None.
        error_detail: the problem as data (a rejection's file, row and column); left out when
            None.
        **extra: the other fields this ending records, written as given (``model_path`` and
            ``head`` of a DONE, ``health`` of a diverging job, who cancelled and why).

    Returns:
        The field update (document keys, each a ``Job`` attribute).

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
        return AfterFold(ending_fields(
            FAILED, now, error=f"{tasks_failed} task(s) failed for good (the job allows "
                               f"{allowed_failures}): {reason}"[:2000]))
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
