"""The Training tab: accuracy (or a numeric target's error) and losses per version, the curve
the page draws, and one version's holdout report (macro-F1, the majority baseline, ROC AUC,
per-class figures, the confusion matrix)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from bucketlearn.domain.metrics import confusion_rows, majority_warning
from bucketlearn.domain.version import Version
from bucketlearn.views.formats import (
    as_float,
    as_int,
    format_number,
    format_percent,
    timestamp,
)

VERSION_COLUMNS = ("version", "epoch", "time", "created_at", "holdout_accuracy",
                   "holdout_macro_f1", "holdout_loss", "train_loss", "samples", "tasks",
                   "holdout_rmse", "holdout_mae", "holdout_r2",  # (these: numeric targets)
                   "validation_accuracy", "validation_loss", "validation_rmse")
FIGURES = ("holdout_accuracy", "holdout_macro_f1", "holdout_loss", "holdout_rmse", "holdout_mae",
           "holdout_r2", "validation_accuracy", "validation_loss", "validation_rmse")


def version_frame(versions: Iterable[Version]) -> pd.DataFrame:
    """Accuracy and losses per version (and its commit time), sorted by version."""
    rows = [{
        "version": v.version, "epoch": v.epoch, "time": timestamp(v.created_at),
        "created_at": v.created_at, "train_loss": v.train_loss, "samples": v.samples,
        "tasks": v.tasks,
        **{name: as_float(v.figure(name)) for name in FIGURES},
    } for v in versions]
    frame = pd.DataFrame(rows, columns=list(VERSION_COLUMNS))
    for column in (*FIGURES, "train_loss", "created_at"):
        frame[column] = frame[column].astype("float64")
    return frame.sort_values("version", kind="stable").reset_index(drop=True)


# what each line of the Training tab's charts is called
CURVE_LABELS = {"holdout_accuracy": "Holdout accuracy", "holdout_macro_f1": "Holdout macro-F1",
                "holdout_loss": "Holdout loss", "train_loss": "Train loss",
                "holdout_rmse": "Holdout RMSE", "holdout_mae": "Holdout MAE",
                "validation_accuracy": "Validation accuracy", "validation_loss": "Validation loss",
                "validation_rmse": "Validation RMSE"}


def curve(frame: pd.DataFrame, figures: Sequence[str], x: str = "version") -> pd.DataFrame:
    """The points of a chart's lines from ``version_frame``: one row per version (or commit
    time, ``x``) and figure it has a value of, as (``x``, ``figure``, ``value``), the figure
    named in words (``CURVE_LABELS``). A figure measured on a few versions only (the holdout's,
    of a job evaluated sparsely) is a line through those, not a line broken at every version
    without one, which a chart does not draw."""
    points = frame.melt(id_vars=[x], value_vars=list(figures), var_name="figure",
                        value_name="value").dropna(subset=["value"])
    points["figure"] = points["figure"].map(lambda name: CURVE_LABELS.get(name, name))
    return points.reset_index(drop=True)


def curve_note(frame: pd.DataFrame, figure: str, finished: bool,
               model_version: int | None = None) -> str:
    """Which versions the holdout curve has, said under it: '' when it has every version. A
    finished job's ``model_version`` (the one exported; the newest evaluated when None) is
    named as the final model."""
    evaluated = frame.loc[frame[figure].notna(), "version"]
    if evaluated.empty or len(evaluated) == len(frame):
        return ""
    text = (f"Holdout figures of {len(evaluated)} of the {len(frame)} versions shown: a version "
            "is evaluated beside training, the newest one whenever the evaluator is free, so a "
            "job that trains fast has few.")
    exported = int(evaluated.iloc[-1]) if model_version is None else model_version
    if finished and exported in {int(v) for v in evaluated}:
        text += f" v{exported}, the final model, on the whole holdout."
    validation = figure.replace("holdout_", "validation_")
    if validation in frame and frame[validation].notna().any():
        text += (" The validation line scores each epoch's last version on the rows held out "
                 "to select the model; the best of them is the one exported.")
    return text


def evaluated_versions(versions: Iterable[Version]) -> list[int]:
    """Numbers of the versions with a holdout evaluation, newest first (the report picker)."""
    found = [v.version for v in versions
             if as_float(v.figure("holdout_accuracy")) is not None
             or as_float(v.figure("holdout_rmse")) is not None]
    return sorted(found, reverse=True)


def version_report(version: Version | None, class_names: Iterable[Any]) -> dict[str, Any]:
    """One version's holdout figures beyond accuracy, as the page shows them.

    Keys: ``metrics`` ((label, value) pairs: accuracy, macro-F1, the majority baseline, ROC AUC
    for two classes; "—" for a figure the version does not have), ``warning`` (accuracy not
    above the majority baseline; None otherwise), ``per_class`` (a frame: class, precision,
    recall, F1, holdout rows; empty for a version evaluated before per-class figures were
    recorded), ``confusion`` (a frame, true classes down, predicted across; empty likewise) and
    ``note`` (what the tables leave out, or why there are none).
    """
    figures = version.figures if version is not None else {}
    if figures.get("holdout_rmse") is not None:
        return regression_report(figures)
    names = [str(c) for c in class_names]
    report = figures.get("holdout_report") or {}
    kept = [as_int(i) for i in report.get("class_index") or []]
    labels = [names[i] if i < len(names) else str(i) for i in kept]
    majority = report.get("majority_class")
    majority_name = (names[as_int(majority)] if majority is not None and as_int(majority)
                     < len(names) else None)
    metrics = [("Accuracy", format_percent(figures.get("holdout_accuracy"))),
               ("Macro-F1", format_number(figures.get("holdout_macro_f1"))),
               ("Majority baseline", format_percent(figures.get("holdout_majority_accuracy")))]
    if len(names) == 2:
        metrics.append(("ROC AUC", format_number(figures.get("holdout_roc_auc"))))
    per_class = pd.DataFrame({
        "class": labels,
        "precision": _floats(report.get("precision"), len(labels)),
        "recall": _floats(report.get("recall"), len(labels)),
        "f1": _floats(report.get("f1"), len(labels)),
        "holdout rows": [as_int(v) for v in (report.get("support") or [0] * len(labels))],
    }, columns=["class", "precision", "recall", "f1", "holdout rows"])
    rows = confusion_rows(report)
    square = len(rows) == len(labels) > 0 and all(len(row) == len(labels) for row in rows)
    confusion = (pd.DataFrame(rows, index=pd.Index(labels, name="true"),
                              columns=pd.Index(labels, name="predicted"))
                 if square else pd.DataFrame())
    return {
        "metrics": metrics,
        "warning": majority_warning(as_float(figures.get("holdout_accuracy")),
                                    as_float(figures.get("holdout_majority_accuracy")),
                                    majority_name),
        "per_class": per_class, "confusion": confusion, "note": _report_note(report, labels),
    }


def regression_report(figures: Mapping[str, Any]) -> dict[str, Any]:
    """A numeric target's version (its ``figures``; ``version_report``'s keys): RMSE, MAE, R²
    and the mean squared error; no per-class tables."""
    return {
        "metrics": [("RMSE", format_number(figures.get("holdout_rmse"))),
                    ("MAE", format_number(figures.get("holdout_mae"))),
                    ("R²", format_number(figures.get("holdout_r2"))),
                    ("MSE (loss)", format_number(figures.get("holdout_loss")))],
        "warning": None, "per_class": pd.DataFrame(), "confusion": pd.DataFrame(),
        "note": "A numeric target: RMSE, MAE and R² on the holdout, in the target's units "
                "(R² = 1 − MSE / the holdout target's variance).",
    }


def _floats(values: Any, count: int) -> list[float | None]:
    values = list(values or [])
    return [as_float(values[i]) if i < len(values) else None for i in range(count)]


def _report_note(report: Mapping[str, Any], labels: list[str]) -> str:
    if not report:
        return ("No per-class figures for this version (evaluated before they were recorded, "
                "or not evaluated yet).")
    if report.get("truncated"):
        return (f"Per-class figures for the {len(labels)} classes with the most holdout rows, of "
                f"{as_int(report.get('classes'))}; the confusion matrix is restricted to them.")
    return ""
