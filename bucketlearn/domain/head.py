"""A job's head: the pointer to its newest version, and that version's holdout figures once
evaluated (``Head``), as the job document stores it under ``head``. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bucketlearn.domain.metrics import HOLDOUT_FIGURES, REGRESSION_FIGURES
from bucketlearn.domain.version import Evaluation, Version

_FIGURES = (*HOLDOUT_FIGURES, *REGRESSION_FIGURES)  # a head's figures beside accuracy and loss


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

    @property
    def figures(self) -> dict[str, Any]:
        """The head's holdout figures as a version's document holds them (those recorded)."""
        found = {"holdout_accuracy": self.holdout_accuracy, "holdout_loss": self.holdout_loss,
                 **{name: getattr(self, name) for name in _FIGURES}}
        return {name: value for name, value in found.items() if value is not None}

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


def attach_head(versions: Sequence[Version], head: Head | None) -> list[Version]:
    """Versions with the head's figures put on the version they are of (``evaluated_version``),
    over that version's own (its validation score kept): a finished job's final figures, its export's on the whole holdout
    (what its status reports), are written on the job's head only, and a job that trains fast
    may have had no other version evaluated. The dashboard reads versions through this."""
    if head is None or head.evaluated_version is None or not head.figures:
        return list(versions)
    return [dataclasses.replace(v, figures={**v.figures, **head.figures})
            if v.version == head.evaluated_version else v for v in versions]


def _optional(value: Any, kind: type) -> Any:
    return kind(value) if value is not None else None
