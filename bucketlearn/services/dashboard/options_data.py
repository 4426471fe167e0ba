"""The Options & data tab: the job's options against their defaults, its dataset's facts (rows,
classes, shards, how the target was taken) and its columns worth naming."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bucketlearn.domain.columns import kinds_text
from bucketlearn.domain.job import Job
from bucketlearn.domain.target import CLASSIFICATION, REGRESSION
from bucketlearn.options import OPTION_SPECS
from bucketlearn.services.dashboard.formats import as_float, as_int


def option_rows(job: Job) -> list[dict[str, str]]:
    """The job's options (every OPTION_SPECS entry), marking those that differ from the default."""
    options = job.options
    rows = []
    for spec in OPTION_SPECS:
        value = options.get(spec.name, spec.default)
        rows.append({"option": spec.name, "value": "" if value is None else str(value),
                     "default": "" if spec.default is None else str(spec.default),
                     "changed": "yes" if value != spec.default else ""})
    return rows


def dataset_facts(job: Job) -> dict[str, Any]:
    """Rows, columns, classes and shards of the job's dataset (empty before the split)."""
    dataset = job.dataset or {}
    if not dataset:
        return {}
    classes = list(dataset.get("classes") or [])
    features = as_int(dataset.get("features"))
    shown = ", ".join(str(c) for c in classes[:20]) + (" …" if len(classes) > 20 else "")
    return {
        "rows": as_int(dataset.get("rows")),
        "train rows": as_int(dataset.get("train_rows")),
        "holdout rows": as_int(dataset.get("holdout_rows")),
        "columns": features + 1,
        "feature columns": features,
        "feature kinds": column_kinds(job),
        "label column": str(dataset.get("label_column") or ""),
        "classes": len(classes),
        "class names": shown,
        "shards": as_int(dataset.get("shards")),
        "tasks per epoch": job.tasks_per_epoch or 0,
        **target_facts(dataset),
    }


def target_facts(dataset: Mapping[str, Any]) -> dict[str, Any]:
    """How the label column was taken (issue #15), and a numeric target's statistics."""
    facts: dict[str, Any] = {"task": str(dataset.get("task") or CLASSIFICATION)}
    if dataset.get("task_reason"):
        facts["task decided"] = str(dataset["task_reason"])
    if dataset.get("task") == REGRESSION:
        facts.update({"target mean (training rows)": as_float(dataset.get("target_mean")),
                      "target std (training rows)": as_float(dataset.get("target_std")),
                      "rows without a target (left out)": as_int(dataset.get("missing_targets")),
                      "stratified by": f"{len(dataset.get('bin_counts') or [])} quantile bins"})
    return facts


def column_rows(job: Job) -> list[dict[str, str]]:
    """The feature columns worth naming (text, dates, missing cells) and those left out, with
    why; empty for a table of complete numbers (and for jobs split before column kinds)."""
    dataset = job.dataset or {}
    columns = dataset.get("columns") or {}
    rows = []
    for column in columns.get("detail") or []:
        kind = str(column.get("kind") or "")
        note = (f"{as_int(column.get('categories'))} categories of "
                f"{as_int(column.get('distinct'))} distinct values" if kind == "category" else "")
        rows.append({"column": str(column.get("name")), "kind": kind,
                     "missing cells": str(as_int(column.get("missing"))), "note": note})
    for dropped in dataset.get("dropped_columns") or []:
        rows.append({"column": str(dropped.get("name")), "kind": "left out",
                     "missing cells": "", "note": str(dropped.get("reason") or "")})
    return rows


def column_kinds(job: Job) -> str:
    """Kept feature columns by kind, e.g. '2 category, 1 datetime, 2 numeric'."""
    return kinds_text(((job.dataset or {}).get("columns") or {}).get("kinds") or {})
