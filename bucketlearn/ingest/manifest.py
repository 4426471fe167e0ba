"""What a split produced, stored as ``jobs/<job>/manifest.json`` in the work bucket: each shard and
its parts (``Shard``), the ``Manifest`` (the columns, the classes or a numeric target's bins,
the training rows' statistics, the holdout's parts) and the job document's view of the columns
(``columns_summary``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from bucketlearn.domain.columns import CATEGORY, NUMERIC, Column, matrix_width
from bucketlearn.domain.target import CLASSIFICATION, REGRESSION


@dataclass
class Shard:
    index: int
    rows: int = 0
    parts: list[str] = field(default_factory=list)


@dataclass
class Manifest:
    """Everything the split produced; stored as ``jobs/<job>/manifest.json`` in the work bucket."""

    job_id: str
    source: str
    feature_names: list[str]
    label_column: str
    classes: list[str]
    label_kind: str
    class_counts: list[int]
    rows: int
    train_rows: int
    holdout_rows: int
    shards: list[Shard]
    holdout_parts: list[str]
    mean: list[float]
    variance: list[float]
    # rows of each holdout part (empty in manifests written before it was recorded)
    holdout_part_rows: list[int] = field(default_factory=list)
    # the kept feature columns (``Column.to_dict``) in matrix order; empty in manifests written
    # before column kinds: every feature numeric and complete
    columns: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)
    missing_values: list[str] = field(default_factory=list)
    # training rows of each class (empty in manifests written before it was recorded)
    train_class_counts: list[int] = field(default_factory=list)
    # numeric targets: "classification" (manifests written before) or "regression";
    # a regression manifest has no classes: its rows are stratified by quantile bins of the
    # target (the boundaries between bins and their rows; ``domain.target``), y holds the
    # float32 targets, and the training rows' target mean and standard deviation scale the
    # model's output
    task: str = CLASSIFICATION
    task_reason: str = ""
    target_mean: float = 0.0
    target_std: float = 1.0
    bin_edges: list[float] = field(default_factory=list)
    bin_counts: list[int] = field(default_factory=list)
    train_bin_counts: list[int] = field(default_factory=list)
    missing_targets: int = 0  # rows left out: their label was empty or a missing value
    # validation rows: a share of each class's training rows, held out of the shards to pick
    # the version exported and stop early (none in manifests written before, or for a table
    # too small: ``domain.recipe.validation_share``), and why
    validation_rows: int = 0
    validation_parts: list[str] = field(default_factory=list)
    validation_part_rows: list[int] = field(default_factory=list)
    validation_fraction: float = 0.0
    validation_reason: str = ""
    # the numeric cells' scaling fitted on a sample of the training rows
    # (``domain.scaling.Preprocessing.to_dict``; empty in manifests written before)
    preprocessing: dict[str, Any] = field(default_factory=dict)

    @property
    def schema(self) -> list[Column]:
        """The kept columns (legacy manifests: one numeric, complete column per feature)."""
        if not self.columns:
            return [Column(name, NUMERIC) for name in self.feature_names]
        return [Column.from_dict(c) for c in self.columns]

    @property
    def width(self) -> int:
        """Cells per row of the matrix the shards hold (the model's input width)."""
        return matrix_width(self.schema)

    @property
    def target(self) -> tuple[float, float] | None:
        """A regression's training target (mean, standard deviation); None for classes."""
        return (self.target_mean, self.target_std) if self.task == REGRESSION else None

    @property
    def train_counts(self) -> list[int]:
        """Training rows of each class; the file's class counts for a manifest written before
        they were recorded (the basis of ``class_weight=balanced``)."""
        if len(self.train_class_counts) == len(self.classes):
            return list(self.train_class_counts)
        return list(self.class_counts)

    def to_json(self) -> bytes:
        data = dict(self.__dict__)
        data["shards"] = [s.__dict__ for s in self.shards]
        return json.dumps(data).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        data = json.loads(raw)
        data["shards"] = [Shard(**s) for s in data["shards"]]
        return cls(**data)

    def summary(self) -> dict[str, Any]:
        """Dataset facts for the job document (no per-feature statistics)."""
        return {
            "rows": self.rows,
            "train_rows": self.train_rows,
            "holdout_rows": self.holdout_rows,
            "validation_rows": self.validation_rows,
            "validation": self.validation_reason,
            "features": len(self.feature_names),
            "label_column": self.label_column,
            "classes": self.classes,
            "label_kind": self.label_kind,
            "class_counts": self.class_counts,
            "shards": len(self.shards),
            "columns": columns_summary(self.schema),
            "dropped_columns": list(self.dropped),
            "task": self.task,
            "task_reason": self.task_reason,
            **({"target_mean": self.target_mean, "target_std": self.target_std,
                "bin_edges": list(self.bin_edges),
                "bin_counts": list(self.bin_counts), "missing_targets": self.missing_targets}
               if self.task == REGRESSION else {}),
        }


def columns_summary(columns: list[Column], detail_limit: int = 100) -> dict[str, Any]:
    """The job document's view of the columns: counts by kind, and the columns worth naming
    (not numeric, or with missing cells), at most ``detail_limit`` of them."""
    kinds: dict[str, int] = {}
    for column in columns:
        kinds[column.kind] = kinds.get(column.kind, 0) + 1
    named = [c for c in columns if c.kind != NUMERIC or c.missing]
    detail = [{"name": c.name, "kind": c.kind, "missing": c.missing,
               **({"categories": len(c.vocabulary), "distinct": c.distinct}
                  if c.kind == CATEGORY else {})} for c in named[:detail_limit]]
    return {"kinds": kinds, "detail": detail, "detail_truncated": len(named) > detail_limit}
