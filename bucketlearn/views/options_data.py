"""The Options & data tab: the job's options against their defaults, its dataset's facts (rows,
classes, shards, how the target was taken) and its columns worth naming; and the upload form's
fields (``form_fields``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bucketlearn.domain.columns import kinds_text
from bucketlearn.domain.job import Job
from bucketlearn.domain.target import CLASSIFICATION, REGRESSION
from bucketlearn.options import OPTION_SPECS, default_text, option_text
from bucketlearn.views.formats import as_float, as_int

# The options most people set, up front in the upload form; the others are in its "Advanced"
# section. A new everyday option (a search over models, once there is one) joins these.
FRONT_OPTIONS = ("label_column", "epochs")


@dataclass(frozen=True)
class FormField:
    """One option of the upload form: its key, its label in words, its help (which names the
    key), its true default in words, its choices (a text field when None), and whether it is
    up front or in the "Advanced" section."""

    name: str
    label: str
    help: str
    default: str
    choices: tuple[str, ...] | None
    front: bool

    @property
    def placeholder(self) -> str:
        return f"default: {self.default}"


def form_fields() -> list[FormField]:
    """Every option of ``OPTION_SPECS`` as the upload form shows it: those of
    ``FRONT_OPTIONS`` first (in that order), then the others (in the table's order)."""
    fields = [FormField(spec.name, spec.title,
                        f"{spec.help[:1].upper()}{spec.help[1:]}. Option `{spec.name}` "
                        f"(`--{spec.name.replace('_', '-')}` of `bucketlearn submit`).",
                        default_text(spec.name), spec.choices, spec.name in FRONT_OPTIONS)
              for spec in OPTION_SPECS]
    front = sorted((f for f in fields if f.front), key=lambda f: FRONT_OPTIONS.index(f.name))
    return front + [f for f in fields if not f.front]


def option_rows(job: Job) -> list[dict[str, str]]:
    """The job's options (every OPTION_SPECS entry: its key, in words, its value, its true
    default), marking those that differ from the default; an ``auto`` the job resolved for its
    size (its ``budget``) shows what it became, and is no change."""
    options = job.options
    resolved = set((job.budget or {}).get("reasons") or {})
    rows = []
    for spec in OPTION_SPECS:
        value = options.get(spec.name, spec.default)
        shown = "" if value is None else option_text(spec.name, value)
        rows.append({"option": spec.name, "in words": spec.title,
                     "value": f"{shown} (auto)" if spec.name in resolved and shown != "auto"
                     else shown,
                     "default": default_text(spec.name),
                     "changed": "yes" if value != spec.default and spec.name not in resolved
                     else ""})
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
    """How the label column was taken, and a numeric target's statistics."""
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
