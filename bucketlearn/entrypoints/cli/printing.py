"""How the CLI prints a job: its progress line while ``submit --wait`` follows it, its status
(``bucketlearn status``), the holdout figure, the columns kept and left out."""

from __future__ import annotations

from typing import Any

from bucketlearn.domain.columns import kinds_text
from bucketlearn.domain.forecast import plan_lines
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import CANCELLED
from bucketlearn.domain.metrics import regression_headline
from bucketlearn.domain.prediction import RequestState, error_text, source_file
from bucketlearn.domain.recipe import selection_sentence
from bucketlearn.domain.target import REGRESSION
from bucketlearn.usecases.status import status_object


def format_accuracy(value: Any) -> str:
    """A holdout accuracy to four places, or "-" before the first evaluation."""
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


def figure_text(status: dict[str, Any]) -> str:
    """The head's holdout figure for one line: accuracy, or a numeric target's RMSE/MAE/R²."""
    if status.get("task") == REGRESSION:
        return regression_headline(status.get("rmse"), status.get("mae"), status.get("r2"))
    return f"accuracy {format_accuracy(status.get('accuracy'))}"


def progress_line(job: Job) -> str:
    status = status_object(job)
    return (f"{status['job_id']}: {status['status']} ({status['phase']}) "
            f"epoch {status['epoch'] or 0}/{status['epochs'] or '?'} v{status['version'] or 0} "
            f"tasks {status['tasks_applied'] or 0}/{status['tasks_planned'] or '?'} "
            f"holdout {figure_text(status)}")


def columns_lines(status: dict[str, Any]) -> list[str]:
    """The job's feature columns by kind, and those left out with their reasons."""
    columns = status.get("columns") or {}
    lines = []
    if columns.get("kinds"):
        lines.append(f"columns:   {kinds_text(columns['kinds'])}")
    for dropped in status.get("dropped_columns") or []:
        lines.append(f"left out:  {dropped['name']}: {dropped['reason']}")
    return lines


def continued_text(parent: dict[str, Any], status: dict[str, Any]) -> str:
    """The job a continued job started from, and its model's figure on this job's holdout."""
    text = f"{parent['job_id']} v{parent['version']}"
    figures = parent.get("parent_holdout")
    if figures:
        mine = figure_text(status)
        theirs = figure_text({**figures, "task": status.get("task")})
        text += f" (on this job's holdout: its model {theirs}, this job's {mine})"
    return text


def prediction_lines(summary: dict[str, Any] | None) -> list[str]:
    """The job's batch prediction requests (``status["predictions"]``): a heading with how
    many, then one line for each of the newest, as ``prediction_line``; none without any."""
    summary = summary or {}
    count, recent = int(summary.get("count") or 0), list(summary.get("recent") or [])
    if not count:
        return []
    newest = f", the newest {len(recent)}" if len(recent) < count else ""
    heading = f"predictions: {count} request{'s' if count != 1 else ''}{newest}"
    return [heading, *(f"  {prediction_line(entry)}" for entry in recent)]


def prediction_line(entry: dict[str, Any]) -> str:
    """'DONE     rows.csv: 2,000 rows in 0.4 s, 2 parts -> gs://…/rows.csv', the rows so far of
    a RUNNING request, or why one FAILED (after its rows) or was REJECTED (its file named once)."""
    source, state = entry.get("source") or {}, str(entry.get("state") or "?")
    seconds, parts = entry.get("seconds"), int(entry.get("parts") or 0)
    took = (f" in {seconds:.1f} s" if seconds is not None
            else " so far" if state == RequestState.RUNNING else "")
    rows = (f" {int(entry.get('rows') or 0):,} rows{took}"
            + (f", {parts} parts" if parts > 0 else ""))
    text = f"{state:8s} {source_file(source) or '?'}:"
    if entry.get("error"):
        rows = "" if state == RequestState.REJECTED else f"{rows}:"
        return f"{text}{rows} {error_text(str(entry['error']), source)}"
    output = entry.get("output_uri") or entry.get("output")
    return f"{text}{rows}" + (f" -> {output}" if output else "")


def print_status(status: dict[str, Any]) -> None:
    print(f"job:       {status['job_id']}")
    print(f"status:    {status['status']}")
    if status.get("error"):
        label = "cancelled:" if status["status"] == CANCELLED else "error:"
        print(f"{label:11s}{status['error']}")
    print(f"version:   {status['version']}")
    if status.get("continued_from"):
        print(f"continues: {continued_text(status['continued_from'], status)}")
    if status.get("task") == REGRESSION:
        print(f"target:    numeric ({status.get('task_reason') or 'task=regression'})")
        print(f"holdout:   {figure_text(status)}")
    else:
        print(f"accuracy:  {format_accuracy(status.get('accuracy'))}")
    for line in columns_lines(status):
        print(line)
    if status.get("macro_f1") is not None:
        auc = status.get("roc_auc")
        print(f"macro-F1:  {format_accuracy(status['macro_f1'])} (majority baseline "
              f"{format_accuracy(status.get('majority_accuracy'))}"
              + ("" if auc is None else f", ROC AUC {format_accuracy(auc)}") + ")")
    if status.get("warning"):
        print(f"warning:   {status['warning']}")
    print(f"tasks:     {status.get('tasks_applied')}/{status.get('tasks_planned')} applied, "
          f"{status.get('tasks_failed') or 0} failed")
    for label, text in plan_lines(status.get("plan"), status.get("forecast"),
                                  status.get("actual")):
        print(f"{label + ':':11s}{text}")
    chosen = selection_sentence(status)
    if chosen:
        print(f"selected:  {chosen}")
    ranked = status.get("feature_importance") or []
    if ranked:
        shown = ", ".join(f"{c['column']} {c['importance']:.3f}" for c in ranked[:6])
        print(f"relies on: {shown}{', …' if len(ranked) > 6 else ''} (the holdout figure's "
              "fall when the column is shuffled)")
    if status.get("model_uri"):
        print(f"model:     {status['model_uri']}")
    elif status["status"] == CANCELLED and status.get("version") is not None:
        print(f"model:     v{status['version']}, built from its weights by: bucketlearn "
              f"download {status['job_id']}")
    for line in prediction_lines(status.get("predictions")):
        print(line)
