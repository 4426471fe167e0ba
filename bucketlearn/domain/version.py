"""A version of a job's model, as its document records it, and an evaluation's figures.

``Version`` is one commit of the fold (version 0: the initial model, written when the split is
done); ``Evaluation`` is one version's holdout figures, measured off the critical path and
carried to the registry by a later commit; ``attach_evaluations`` puts carried figures back on
the version they are of. Pure: typed records in, answers out; each record's document is built
and read by its own ``to_doc``/``from_doc``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bucketlearn.domain.metrics import HOLDOUT_FIGURES, REGRESSION_FIGURES

# what evaluation fills in: a new version's document holds the first ones as None ("not yet");
# a regression's figures are written only by its evaluation
_UNEVALUATED = ("holdout_accuracy", "holdout_loss", *HOLDOUT_FIGURES)
# a checkpoint's validation score (the last version of an epoch: ``domain.recipe``)
VALIDATION_FIGURES = ("validation_accuracy", "validation_loss", "validation_rmse")
VERSION_FIGURES = (*_UNEVALUATED, *REGRESSION_FIGURES, *VALIDATION_FIGURES)


def _task_ids(value: Any) -> tuple[str, ...]:
    return tuple(str(t) for t in value) if isinstance(value, (list, tuple)) else ()


def _optional(value: Any, kind: type) -> Any:
    return kind(value) if value is not None else None


@dataclass(frozen=True)
class Evaluation:
    """One version's holdout figures (the ``VERSION_FIGURES``), measured off the critical path:
    the long-running aggregator evaluates the newest version while the next round trains, and
    the figures travel with a later commit (the version that carries them says so in its
    ``evaluation``), so a version costs one write to the job's document, not two."""

    version: int
    figures: Mapping[str, Any]
    evaluated_at: float
    seconds: float | None = None

    def to_doc(self) -> dict[str, Any]:
        return {"version": self.version, "evaluated_at": self.evaluated_at,
                "eval_seconds": self.seconds, **dict(self.figures)}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Evaluation:
        return cls(version=int(doc["version"]),
                   figures={k: doc[k] for k in VERSION_FIGURES if doc.get(k) is not None},
                   evaluated_at=float(doc.get("evaluated_at") or 0.0),
                   seconds=_optional(doc.get("eval_seconds"), float))


MAX_EVAL_REST_SECONDS = 5.0  # a job's first evaluation builds its predict function: slow once


def evaluation_rest(seconds: float, share: float) -> float:
    """How long an evaluator that may take ``share`` of a core rests after an evaluation of
    ``seconds`` (its busy time over busy plus rest is ``share``), at most
    ``MAX_EVAL_REST_SECONDS``: the dashboard's figures stay a few seconds old at worst."""
    return min(seconds * (1.0 / share - 1.0), MAX_EVAL_REST_SECONDS)


@dataclass(frozen=True)
class Version:
    """One version of a job's model as its document records it: its weights (and their
    ``digest``), the tasks folded into it (``tasks_applied``) or given up on (``tasks_failed``)
    with what each task's learner measured (``task_stats``: worker, seconds by phase) and, once
    evaluated, its holdout ``figures`` (the ``VERSION_FIGURES``; None until then). A version's
    figures are written on its own document (an evaluation recorded directly) or carried by a
    later version's ``evaluation`` (``attach_evaluations`` puts them back on the version they
    are of). Version 0 is the initial model, written when the split is done; every later one is
    a fold's commit. ``aggregator`` holds the fold's step timings (seconds), for the
    round-trip benchmark."""

    version: int
    weights_path: str
    checksum: str | None = None
    parent: int | None = None
    epoch: int = 0
    round: int | None = None
    tasks_applied: tuple[str, ...] = ()
    tasks_failed: tuple[str, ...] = ()
    samples: int = 0
    train_loss: float | None = None
    created_at: float = 0.0
    delta_norms: tuple[float, ...] = ()
    server_lr: float | None = None
    figures: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    aggregator: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    evaluated_at: float | None = None
    digest: str = ""
    evaluation: Evaluation | None = None  # an earlier version's figures, carried by this commit
    task_stats: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def holdout_accuracy(self) -> float | None:
        return self.figures.get("holdout_accuracy")

    def figure(self, name: str) -> Any:
        """One of the ``VERSION_FIGURES`` (None when not evaluated, or not of this task)."""
        return self.figures.get(name)

    @property
    def tasks(self) -> int:
        """Tasks this version settled: applied or failed for good."""
        return len(self.tasks_applied) + len(self.tasks_failed)

    def to_doc(self) -> dict[str, Any]:
        doc = {"version": self.version, "parent": self.parent, "weights_path": self.weights_path,
               "checksum": self.checksum, "epoch": self.epoch,
               "tasks_applied": list(self.tasks_applied), "tasks_failed": list(self.tasks_failed),
               "samples": self.samples, "train_loss": self.train_loss,
               "created_at": self.created_at,
               **dict.fromkeys(_UNEVALUATED), **self.figures}
        extra = {"round": self.round, "delta_norms": list(self.delta_norms) or None,
                 "server_lr": self.server_lr, "aggregator": dict(self.aggregator) or None,
                 "evaluated_at": self.evaluated_at, "digest": self.digest or None,
                 "evaluation": self.evaluation.to_doc() if self.evaluation else None,
                 "task_stats": dict(self.task_stats) or None}
        doc.update({k: v for k, v in extra.items() if v is not None})
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Version:
        return cls(version=int(doc["version"]), weights_path=str(doc.get("weights_path") or ""),
                   checksum=doc.get("checksum"), parent=_optional(doc.get("parent"), int),
                   epoch=int(doc.get("epoch") or 0), round=_optional(doc.get("round"), int),
                   tasks_applied=_task_ids(doc.get("tasks_applied")),
                   tasks_failed=_task_ids(doc.get("tasks_failed")),
                   samples=int(doc.get("samples") or 0),
                   train_loss=_optional(doc.get("train_loss"), float),
                   created_at=float(doc.get("created_at") or 0.0),
                   delta_norms=tuple(float(n) for n in doc.get("delta_norms") or ()),
                   server_lr=_optional(doc.get("server_lr"), float),
                   figures={k: doc[k] for k in VERSION_FIGURES if doc.get(k) is not None},
                   aggregator={**dict(doc.get("aggregator") or {}),
                               **({"eval_seconds": doc["eval_seconds"]}
                                  if doc.get("eval_seconds") is not None else {})},
                   evaluated_at=_optional(doc.get("evaluated_at"), float),
                   digest=str(doc.get("digest") or ""),
                   evaluation=(Evaluation.from_doc(doc["evaluation"])
                               if isinstance(doc.get("evaluation"), Mapping) else None),
                   task_stats=_dict(doc.get("task_stats")))

    def with_figures(self, evaluation: Evaluation) -> Version:
        """This version with an evaluation's figures (of this version), beside its own."""
        return dataclasses.replace(self, figures={**self.figures, **evaluation.figures},
                                   evaluated_at=evaluation.evaluated_at,
                                   aggregator={**self.aggregator,
                                               "eval_seconds": evaluation.seconds})


def attach_evaluations(versions: Sequence[Version]) -> list[Version]:
    """Versions with the figures later commits carried for them (``Version.evaluation``) put
    back on the version they are of; a version's own holdout figures, when it has them, win
    (a checkpoint's validation score, written on its document, is not one). Both
    registries' ``list_versions`` return this."""
    carried = {v.evaluation.version: v.evaluation for v in versions if v.evaluation is not None}
    return [v.with_figures(carried[v.version])
            if v.version in carried and not _holdout_figures(v) else v for v in versions]


def _holdout_figures(version: Version) -> bool:
    return any(name not in VALIDATION_FIGURES for name in version.figures)


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}
