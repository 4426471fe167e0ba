"""The tabs of the dashboard's job page, drawn from what the page read (``JobView``).

Layout and widgets only, as the page (``bucketlearn.entrypoints.dashboard``): what each tab
shows is computed in ``bucketlearn.views``. The page draws its header (status,
source, the headline figures) and then one tab per name of ``headline.job_tabs``, each by the
function of ``TABS`` of that name; a tab only some jobs have (batch predictions; to come: a
model's lineage) is one more name there and one more function here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import DONE
from bucketlearn.domain.prediction import PredictionRecord
from bucketlearn.domain.task import TaskRecord
from bucketlearn.domain.version import Version
from bucketlearn.ports import Services
from bucketlearn.views import (
    costs,
    headline,
    importance,
    leaderboard,
    options_data,
    predictions,
    throughput,
    training_figures,
    workers_tasks,
)
from bucketlearn.views.formats import plain


@dataclass(frozen=True)
class JobView:
    """What the job page read and made of it: the job, its newest versions, its current
    epoch's tasks, the workers seen lately, its summary (``headline.job_summary``), the time
    of the read, and its newest batch prediction requests and how many it has."""

    job: Job
    versions: list[Version]
    tasks: list[TaskRecord]
    workers: list[dict]
    summary: dict[str, Any]
    now: float
    predictions: list[PredictionRecord] = field(default_factory=list)
    prediction_count: int = 0


def metric_row(items: list[tuple[str, str]]) -> None:
    """Figures side by side, in rows of at most ``headline.ROW_FIGURES`` columns of equal
    width: each figure has room to be read whole on a laptop (1280 px, the sidebar open)."""
    size = headline.ROW_FIGURES
    for start in range(0, len(items), size):
        for column, (label, value) in zip(st.columns(size), items[start:start + size],
                                          strict=False):
            column.metric(label, value)


def line_chart(container: Any, points: pd.DataFrame, x: str, title: str) -> None:
    """Lines through the points of ``training_figures.curve`` (x, figure, value), each point marked:
    a figure known at a few versions is still drawn (a line needs two points; a point, one)."""
    kind = "T" if x == "time" else "Q"
    chart = alt.Chart(points).mark_line(point=True).encode(
        x=alt.X(f"{x}:{kind}", title=x,  # versions are whole numbers, even one alone
                axis=alt.Axis(format="d", tickMinStep=1) if kind == "Q" else alt.Axis()),
        y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
        color=alt.Color("figure:N", title=None,
                        legend=alt.Legend(orient="bottom", columns=2, labelLimit=0)),
        tooltip=[alt.Tooltip(f"{x}:{kind}"), "figure:N", alt.Tooltip("value:Q", format=".4f")])
    container.markdown(f"**{title}**")
    container.altair_chart(chart, width="stretch", alt=title)


def training_tab(svc: Services, view: JobView) -> None:
    """The learning curve (the holdout figures and the losses by version or by time), then a
    version's holdout report."""
    if view.job.search:  # a searched job: its candidates, not one line of versions
        board, note = leaderboard.leaderboard(view.job)
        st.markdown("**Candidates** (best first)")
        st.dataframe(board, hide_index=True, width="stretch")
        st.caption(plain(note))
        return
    frame = training_figures.version_frame(view.versions)
    regression = headline.is_regression(view.summary)
    figure = "holdout_rmse" if regression else "holdout_accuracy"
    validation = figure.replace("holdout_", "validation_")
    if frame[figure].notna().sum() == 0 and frame[validation].notna().sum() == 0:
        st.info("No evaluated version yet: the first one is committed after the first deltas.")
        return
    x = st.radio("x axis", ("version", "time"), horizontal=True, key="training_x")
    left, right = st.columns(2)
    if regression:  # a numeric target: its error in the target's units
        line_chart(left, training_figures.curve(frame, ["validation_rmse", "holdout_rmse",
                                                "holdout_mae"], x), x, "RMSE and MAE by " + x)
    else:
        line_chart(left, training_figures.curve(frame, ["validation_accuracy", "holdout_accuracy",
                                                "holdout_macro_f1"], x), x,
                   "Accuracy and macro-F1 by " + x)
    line_chart(right, training_figures.curve(frame, ["validation_loss", "holdout_loss", "train_loss"],
                                     x), x, "Loss by " + x)
    model = view.job.head.version if view.job.head is not None else None
    if note := training_figures.curve_note(frame, figure, view.job.status == DONE, model):
        st.caption(note)
    report_section(view.job, view.versions)


def report_section(job: Job, versions: list[Version]) -> None:
    """One version's figures beyond accuracy: macro-F1, the majority baseline, ROC AUC (two
    classes), per-class precision/recall and the confusion matrix (the newest by default)."""
    numbers = training_figures.evaluated_versions(versions)
    if not numbers:
        return
    st.markdown("**Holdout report**")
    picked = st.selectbox("Version", numbers, key="report_version",
                          format_func=lambda n: f"v{n}" + (" (newest)" if n == numbers[0] else ""))
    version = next((v for v in versions if v.version == picked), None)
    report = training_figures.version_report(version, job.classes)
    metric_row(report["metrics"])
    if report["warning"] and picked != job.version:  # the head's is shown at the top
        st.warning(f"v{picked}: {plain(report['warning'])}")
    if report["note"]:
        st.caption(plain(report["note"]))
    if report["per_class"].empty:
        return
    left, right = st.columns(2)
    left.markdown("Per class")
    left.dataframe(report["per_class"], hide_index=True, width="stretch", column_config={
        name: st.column_config.NumberColumn(name, format="%.3f")
        for name in ("precision", "recall", "f1")})
    right.markdown("Confusion matrix (rows: true class, columns: predicted)")
    right.dataframe(report["confusion"], width="stretch")


def throughput_tab(svc: Services, view: JobView) -> None:
    """Samples/s and tasks/min now and over time, then the plan and its forecast."""
    versions, now = view.versions, view.now
    rate = throughput.current_rate(versions, now)
    metric_row([("Samples/s (last minute)", f"{rate['samples_per_s']:.1f}"),
                ("Tasks/min (last minute)", f"{rate['tasks_per_min']:.1f}")])
    frame = throughput.throughput_frame(versions, now)
    if len(frame) < 2:
        st.caption("Throughput charts appear once training has run for a little while.")
    else:
        left, right = st.columns(2)
        left.markdown("**Samples/s**")
        left.line_chart(frame, x="time", y="samples_per_s", y_label="samples/s")
        right.markdown("**Tasks/min**")
        right.line_chart(frame, x="time", y="tasks_per_min", y_label="tasks/min")
    plan_section(view.summary)


def plan_section(summary: dict) -> None:
    """How training was laid out and why, how long it should take on how many learners, and
    what the job measured, in words (the rule and its numbers: ``status --json``)."""
    lines = throughput.plan_text(summary)
    if not lines:
        return
    st.markdown("**Plan and forecast**")
    for label, text in lines:
        st.caption(f"{label.capitalize()}: {plain(text)}")
    rows = throughput.forecast_rows(summary)
    if rows:
        st.table(pd.DataFrame(rows).map(plain))


def usage_tab(svc: Services, view: JobView) -> None:
    summary = view.summary
    used, cost = costs.usage_rows(summary), costs.cost_rows(summary)
    if not used:
        st.info("Nothing counted yet: each commit records what the job used so far.")
        return
    left, right = st.columns(2)
    left.markdown("**What the job used**")
    left.table(pd.DataFrame(used).map(plain))
    right.markdown("**Estimated cost (USD)**")
    right.table(pd.DataFrame(cost).map(plain))
    st.caption(plain(costs.cost_note(summary)))


def workers_tab(svc: Services, view: JobView) -> None:
    job, tasks, workers, versions, now = (view.job, view.tasks, view.workers, view.versions,
                                          view.now)
    counts = workers_tasks.task_state_counts(job, tasks)
    metric_row([("Workers alive", str(workers_tasks.alive_count(workers, now)))]
               + [(f"Tasks {k}", str(v)) for k, v in counts.items()])
    current = workers_tasks.epoch_progress(job, versions, tasks)
    if current:
        st.caption(f"Epoch {current['epoch']}: {current['applied']} of {current['planned']} "
                   f"tasks applied, {current['failed']} failed.")
    st.markdown(f"**Workers** (alive = heartbeat within {workers_tasks.ALIVE_SECONDS:g} s)")
    st.dataframe(pd.DataFrame(workers_tasks.worker_rows(workers, now, job.job_id)),
                 hide_index=True, width="stretch")
    summary = workers_tasks.timing_summary(versions)
    if not summary.empty:
        st.markdown("**Task timings (trained tasks, seconds)**")
        st.dataframe(summary, hide_index=True)
    st.markdown(f"**Tasks** of epoch {job.epoch} (earlier epochs' documents are not read)")
    st.dataframe(workers_tasks.task_frame(job, tasks, versions, now), hide_index=True,
                 width="stretch", column_config={
                     "started": st.column_config.DatetimeColumn("started (UTC)",
                                                                format="HH:mm:ss")})


def options_tab(svc: Services, view: JobView) -> None:
    options_section(view.job)


def options_section(job: Job) -> None:
    """The job's options against their defaults, its dataset's facts and named columns."""
    left, right = st.columns(2)
    left.markdown("**Options**")
    left.dataframe(pd.DataFrame(options_data.option_rows(job)), hide_index=True, width="stretch")
    right.markdown("**Dataset**")
    facts = options_data.dataset_facts(job)
    if facts:
        right.dataframe(pd.DataFrame(facts.items(), columns=["fact", "value"]).astype(str),
                        hide_index=True, width="stretch")
    else:
        right.caption("Not split yet (or rejected before splitting).")
    columns = options_data.column_rows(job)
    if columns:
        st.markdown("**Columns** (text, dates, missing cells; and those left out)")
        st.dataframe(pd.DataFrame(columns), hide_index=True, width="stretch")


def predictions_tab(svc: Services, view: JobView) -> None:
    """The job's newest batch prediction requests (``views.predictions``), newest first."""
    st.markdown("**Batch predictions** (newest first)")
    st.dataframe(
        predictions.prediction_frame(view.predictions, svc.settings.models_bucket),
        hide_index=True, width="stretch", column_config={
            "when": st.column_config.DatetimeColumn("when (UTC)", format="YYYY-MM-DD HH:mm:ss"),
            "rows": st.column_config.NumberColumn("rows", format="localized"),
            "seconds": st.column_config.NumberColumn("seconds", format="%.1f"),
            "rows_per_s": st.column_config.NumberColumn("rows/s", format="localized"),
            "parts": st.column_config.NumberColumn("parts", format="%d"),
            "result": st.column_config.TextColumn("output or error", width="large")})
    st.caption(plain(predictions.prediction_note(len(view.predictions), view.prediction_count,
                                                 view.job.job_id)))


# The page's tabs by name (``headline.job_tabs``), each drawn by one function of (the page's
# Services, what it read); "Model" is the page's own (it reads the models bucket, cached there)
TABS: dict[str, Callable[[Services, JobView], None]] = {
    "Training": training_tab, "Throughput": throughput_tab, "Workers & tasks": workers_tab,
    "Usage & cost": usage_tab, "Options & data": options_tab,
    headline.PREDICTIONS_TAB: predictions_tab}


def importance_section(job: Job) -> None:
    """Which columns the exported model relies on (``views.importance``)."""
    frame, note = importance.importance_view(job)
    if not note:
        return
    st.markdown("**What the model looks at**")
    if not frame.empty:
        chart = alt.Chart(frame).mark_bar().encode(
            x=alt.X("importance:Q", title="fall in the holdout figure when shuffled"),
            y=alt.Y("column:N", sort=None, title=None),
            tooltip=["column:N", alt.Tooltip("importance:Q", format=".4f")])
        st.altair_chart(chart, width="stretch", alt="What the model looks at")
    st.caption(plain(note))
