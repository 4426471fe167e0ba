"""The bucketlearn dashboard's page (``streamlit run dashboard/app.py``): ``main(services)``.

Layout and widgets only; what is shown is computed in the modules of
``bucketlearn.services.dashboard`` (unit-tested), one for each part of the page. The page is
handed its Services: ``main`` takes a factory, which ``dashboard/app.py`` gives as
``bootstrap.process_services`` (settings from the environment, made once per process) and the
AppTest as its own (``AppTest.from_function`` passes it in). Each run calls the factory once and
hands the Services down to the parts of the page that read or write. The page never writes
model state; the upload form writes a CSV to the uploads bucket, and a job's "Cancel job" button
calls the core's ``cancel_job`` (as ``bucketlearn cancel`` does).

The cached queries (``st.cache_data``) are shared by every session of the process and keyed by
what they read, not by the Services (an argument named with a leading underscore is not hashed):
a process serves one deployment's Services.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pandas as pd
import streamlit as st

from bucketlearn.domain.job import CANCELLED, FAILED, REJECTED, Job
from bucketlearn.domain.task import TaskRecord
from bucketlearn.domain.version import Version
from bucketlearn.errors import ConfigError
from bucketlearn.options import OPTION_SPECS
from bucketlearn.ports import Registry, Services
from bucketlearn.services.cancel import cancel_job
from bucketlearn.services.dashboard import (
    actions,
    costs,
    downloads,
    headline,
    jobs_list,
    options_data,
    reads,
    throughput,
    training,
    workers_tasks,
)
from bucketlearn.services.dashboard.formats import plain, timestamp
from bucketlearn.services.models import model_bytes

JOB_LIMIT = 100
UNREADABLE = object()  # a query failed (already reported)


@st.cache_data(ttl=reads.CACHE_SECONDS, show_spinner=False)
def overview_data(_registry: Registry, limit: int) -> dict:
    return reads.overview_bundle(_registry, limit)


@st.cache_data(ttl=reads.CACHE_SECONDS, show_spinner=False)
def job_data(_registry: Registry, job_id: str) -> dict | None:
    return reads.job_bundle(_registry, job_id, time.time())


@st.cache_data(ttl=reads.CACHE_SECONDS, show_spinner=False)
def model_files(_svc: Services, job_id: str) -> list[downloads.ModelFile]:
    return downloads.model_files(_svc.store, _svc.settings.models_bucket, job_id)


def upload_form(svc: Services) -> None:
    """The upload form: a file of at most ``upload_limit_bytes``, written from Streamlit's copy
    as a stream, the form cleared on submit (Streamlit lets go of the file)."""
    settings = svc.settings
    with st.sidebar.form("upload", clear_on_submit=True):
        st.subheader("Train on a CSV")
        file = st.file_uploader("CSV file", type=["csv"], key="upload_file",
                                max_upload_size=actions.upload_limit_mb(settings),
                                help=f"At most {actions.upload_limit_bytes(settings):,} bytes "
                                     "here.")
        st.caption("Options: leave blank for the default.")
        raw = {}
        for spec in OPTION_SPECS:
            if spec.choices:
                raw[spec.name] = st.selectbox(
                    spec.name, ("", *spec.choices), help=spec.help,
                    format_func=lambda c, d=spec.default: c or f"default ({d})")
            else:
                default = "auto" if spec.default is None else spec.default
                raw[spec.name] = st.text_input(spec.name, placeholder=f"default: {default}",
                                               help=spec.help)
        submitted = st.form_submit_button("Upload and train", type="primary")
    if not submitted:
        return
    if file is None:
        st.sidebar.error("Choose a CSV file first.")
        return
    if problem := actions.upload_size_problem(settings, file.size):
        st.sidebar.error(f"{plain(file.name)}: {problem}")
        return
    try:
        metadata = actions.option_metadata(raw)
    except ConfigError as exc:
        st.sidebar.error(plain(exc))
        return
    try:
        job_id, uri = actions.upload_csv(svc, file.name, file, file.size, metadata)
    except Exception as exc:  # noqa: BLE001 - shown to the user, who can simply retry
        st.sidebar.error(f"Upload failed: {plain(exc)}")
        return
    st.sidebar.success(f"Uploaded to {plain(uri)}.\n\nJob id: `{job_id}` — "
                       f"[open it](?job={job_id})")


def read(load, *args):
    """A cached query; a backend hiccup shows as a warning (the next refresh retries)."""
    try:
        return load(*args)
    except Exception as exc:  # noqa: BLE001 - shown to the user; the fragment retries
        st.warning(f"Could not read bucketlearn's state: {plain(exc)}")
        return UNREADABLE


@st.fragment(run_every=reads.REFRESH_SECONDS)
def jobs_overview(registry: Registry) -> None:
    bundle = read(overview_data, registry, JOB_LIMIT)
    if bundle is UNREADABLE:
        return
    rows = jobs_list.overview_rows(bundle["jobs"], time.time())
    if not rows:
        st.info("No jobs yet. Upload a CSV (sidebar) or drop one into the uploads bucket.")
        return
    st.dataframe(
        pd.DataFrame(rows), hide_index=True, width="stretch",
        column_order=("link", "status", "source", "created", "version", "accuracy", "r2",
                      "progress", "tasks", "eta", "reason"),
        column_config={
            "link": st.column_config.LinkColumn("job", display_text=r"\?job=(.*)"),
            "created": st.column_config.DatetimeColumn("created (UTC)",
                                                       format="YYYY-MM-DD HH:mm:ss"),
            "version": st.column_config.NumberColumn("head version"),
            "accuracy": st.column_config.NumberColumn("holdout accuracy", format="percent"),
            "r2": st.column_config.NumberColumn("holdout R² (numeric target)", format="%.3f"),
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0,
                                                        max_value=1.0, format="percent"),
            "tasks": "tasks applied/planned",
            "eta": "ETA",
            "reason": st.column_config.TextColumn("reason", width="large"),
        })
    for row in [r for r in rows if r["status"] == REJECTED][:5]:
        st.error(f"**{plain(row['job_id'])}** was rejected: {plain(row['reason'])}")


def pick_job(job_docs: list[Job]) -> str | None:
    ids = [j.job_id for j in job_docs]
    status = {j.job_id: j.status for j in job_docs}
    wanted, problem = jobs_list.wanted_job(st.query_params.get("job"))
    if problem:
        st.warning(problem)
    if wanted and wanted not in ids:
        ids.insert(0, wanted)
    if not ids:
        return None
    picked = st.selectbox("Job", ids, index=ids.index(wanted) if wanted in ids else 0,
                          key="job_picker", format_func=lambda i: f"{i}  ({status.get(i) or '?'})")
    if picked != wanted:  # the URL names the job shown: shareable, and stable as jobs arrive
        st.query_params["job"] = picked
    return picked


def ask_to_cancel(job_id: str) -> None:
    st.session_state["cancel_asked"] = job_id


def keep_running() -> None:
    st.session_state.pop("cancel_asked", None)


def confirm_cancel(svc: Services, job_id: str) -> None:
    """The confirmed cancel: the core decides; the page shows what it answered."""
    st.session_state.pop("cancel_asked", None)
    try:
        headers = dict(st.context.headers)
    except Exception:  # noqa: BLE001 - no request headers (tests, some proxies): no user name
        headers = {}
    try:
        outcome = cancel_job(svc, job_id, actions.canceller(headers),
                             st.session_state.get("cancel_reason") or None)
        st.session_state["cancel_outcome"] = (job_id, "success", outcome.message)
    except Exception as exc:  # noqa: BLE001 - shown to the user, who can simply retry
        st.session_state["cancel_outcome"] = (job_id, "error", f"Could not cancel: {exc}")
    job_data.clear()
    overview_data.clear()


def cancel_controls(svc: Services, job: Job) -> None:
    """A "Cancel job" button for a job that has not ended, with a confirmation step."""
    job_id = job.job_id
    said = st.session_state.get("cancel_outcome")
    if said and said[0] == job_id:
        (st.success if said[1] == "success" else st.error)(plain(said[2]))
    if job.is_terminal:
        return
    if st.session_state.get("cancel_asked") != job_id:
        st.button("Cancel job", key="cancel_job", on_click=ask_to_cancel, args=(job_id,))
        return
    st.warning(actions.cancel_prompt(job))
    st.text_input("Reason (optional)", key="cancel_reason", max_chars=500)
    left, right = st.columns(2)
    left.button("Yes, cancel this job", key="cancel_confirm", type="primary",
                on_click=confirm_cancel, args=(svc, job_id))
    right.button("No, keep it running", key="cancel_keep", on_click=keep_running)


def metric_row(items: list[tuple[str, str]]) -> None:
    for column, (label, value) in zip(st.columns(len(items)), items, strict=True):
        column.metric(label, value)


@st.fragment(run_every=reads.REFRESH_SECONDS)
def job_page(svc: Services) -> None:
    overview = read(overview_data, svc.registry, JOB_LIMIT)
    job_id = None if overview is UNREADABLE else pick_job(overview["jobs"])
    bundle = UNREADABLE if job_id is None else read(job_data, svc.registry, job_id)
    if bundle is None:
        st.warning(f"No job {plain(job_id)}.")
    if bundle is None or bundle is UNREADABLE:
        return
    now = time.time()
    job, versions, tasks = bundle["job"], bundle["versions"], bundle["tasks"]
    s = headline.job_summary(job, versions, now)
    created = timestamp(s["created_at"])
    when = f" · created {created:%Y-%m-%d %H:%M:%S} UTC" if created is not None else ""
    st.caption(f"{plain(s['source'])}{when}")
    cancel_controls(svc, job)
    if s["status"] == REJECTED:
        st.error(f"Rejected: {plain(s['reason'])}")
        st.table(pd.DataFrame(jobs_list.rejection_details(job)).map(plain))  # cells are Markdown
        options_tab(job)
        return
    if s["status"] == FAILED:
        st.error(f"Failed: {plain(s['reason'])}")
    if s["status"] == CANCELLED:
        st.warning(f"Cancelled: {plain(s['reason'])}")
    metric_row(headline.headline_metrics(s))
    if s.get("warning"):
        st.warning(f"Head version v{s['version']}: {plain(s['warning'])}")
    if s["progress"] is not None:
        st.progress(s["progress"], text=plain(headline.progress_text(s)))
    if note := headline.versions_note(job, versions):
        st.caption(note)
    tabs = st.tabs(["Training", "Throughput", "Workers & tasks", "Usage & cost",
                    "Options & data", "Model"])
    with tabs[0]:
        training_tab(versions, headline.is_regression(s))
        report_section(job, versions)
    with tabs[1]:
        throughput_tab(versions, now)
        plan_section(s)
    with tabs[2]:
        workers_tab(job, tasks, bundle["workers"], bundle["versions"], now)
    with tabs[3]:
        usage_tab(s)
    with tabs[4]:
        options_tab(job)
    with tabs[5]:
        model_tab(svc, job, versions)


def training_tab(versions: list[Version], regression: bool = False) -> None:
    frame = training.version_frame(versions)
    figure = "holdout_rmse" if regression else "holdout_accuracy"
    if frame[figure].notna().sum() == 0:
        st.info("No evaluated version yet: the first one is committed after the first deltas.")
        return
    x = st.radio("x axis", ("version", "time"), horizontal=True, key="training_x")
    left, right = st.columns(2)
    if regression:  # a numeric target: its error in the target's units
        left.markdown("**Holdout RMSE and MAE**")
        left.line_chart(frame, x=x, y=["holdout_rmse", "holdout_mae"])
    else:
        left.markdown("**Holdout accuracy and macro-F1**")
        left.line_chart(frame, x=x, y=["holdout_accuracy", "holdout_macro_f1"])
    right.markdown("**Loss**")
    right.line_chart(frame, x=x, y=["holdout_loss", "train_loss"])


def report_section(job: Job, versions: list[Version]) -> None:
    """One version's figures beyond accuracy: macro-F1, the majority baseline, ROC AUC (two
    classes), per-class precision/recall and the confusion matrix (the newest by default)."""
    numbers = training.evaluated_versions(versions)
    if not numbers:
        return
    st.markdown("**Holdout report**")
    picked = st.selectbox("Version", numbers, key="report_version",
                          format_func=lambda n: f"v{n}" + (" (newest)" if n == numbers[0] else ""))
    version = next((v for v in versions if v.version == picked), None)
    report = training.version_report(version, job.classes)
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


def throughput_tab(versions: list[Version], now: float) -> None:
    rate = throughput.current_rate(versions, now)
    metric_row([("Samples/s (last minute)", f"{rate['samples_per_s']:.1f}"),
                ("Tasks/min (last minute)", f"{rate['tasks_per_min']:.1f}")])
    frame = throughput.throughput_frame(versions, now)
    if len(frame) < 2:
        st.caption("Throughput charts appear once training has run for a little while.")
        return
    left, right = st.columns(2)
    left.markdown("**Samples/s**")
    left.line_chart(frame, x="time", y="samples_per_s")
    right.markdown("**Tasks/min**")
    right.line_chart(frame, x="time", y="tasks_per_min")


def plan_section(summary: dict) -> None:
    """How training was laid out, how long it should take on how many learners, and what the
    job measured (issue #25)."""
    lines = throughput.plan_text(summary)
    if not lines:
        return
    st.markdown("**Plan and forecast**")
    for label, text in lines:
        st.caption(f"{label.capitalize()}: {plain(text)}")
    rows = throughput.forecast_rows(summary)
    if rows:
        st.table(pd.DataFrame(rows).map(plain))


def usage_tab(summary: dict) -> None:
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


def workers_tab(job: Job, tasks: list[TaskRecord], workers: list[dict],
                versions: list[Version], now: float) -> None:
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


def options_tab(job: Job) -> None:
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


def model_tab(svc: Services, job: Job, versions: list[Version]) -> None:
    files = read(model_files, svc, job.job_id)
    if files is UNREADABLE:
        return
    note = downloads.download_note(job, versions, files)
    if files:
        choice = st.selectbox("Model file", files, format_func=lambda f: f"{f.label} "
                              f"({f.size / 1e6:.2f} MB)", key="model_choice")
        st.download_button(f"Download {choice.label}.keras", key="model_download",
                           data=lambda: svc.store.read_bytes(svc.settings.models_bucket,
                                                             choice.path),
                           file_name=choice.file_name, mime="application/octet-stream",
                           on_click="ignore", type="primary")
    elif job.status == CANCELLED and job.version is not None:
        version = job.version
        st.download_button(f"Download v{version}.keras", key="model_build",
                           data=lambda: model_bytes(svc, job.job_id, version)[0],
                           file_name=f"{job.job_id}-v{version}.keras",
                           mime="application/octet-stream", on_click="ignore", type="primary")
    if note:
        st.info(plain(note))


def main(services: Callable[[], Services]) -> None:
    """One run of the page on the Services ``services()`` gives (its entry point chooses:
    ``dashboard/app.py``), handed to the parts that read and write."""
    st.set_page_config(page_title="bucketlearn", page_icon="🪣", layout="wide")
    st.title("bucketlearn")
    try:
        svc = services()
    except Exception as exc:  # noqa: BLE001 - show a misconfiguration instead of a traceback
        st.error(f"Cannot reach bucketlearn's services: {plain(exc)}")
        st.stop()
    upload_form(svc)
    st.header("Jobs")
    jobs_overview(svc.registry)
    st.header("Job")
    job_page(svc)
