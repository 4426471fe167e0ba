"""The bucketlearn dashboard's page (``streamlit run dashboard/app.py``): ``main(services)``.

Layout and widgets only; what is shown is computed in the modules of
``bucketlearn.views`` (unit-tested), one for each part of the page. The page is
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

from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import CANCELLED, FAILED, REJECTED
from bucketlearn.entrypoints.dashboard_tabs import (
    TABS,
    JobView,
    importance_section,
    metric_row,
    options_section,
)
from bucketlearn.errors import ConfigError
from bucketlearn.ports import Registry, Services
from bucketlearn.usecases.cancel import cancel_job
from bucketlearn.usecases.model_files import model_bytes
from bucketlearn.views import (
    actions,
    downloads,
    headline,
    jobs_list,
    options_data,
    reads,
)
from bucketlearn.views.formats import plain, timestamp

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
    as a stream, the form cleared on submit (Streamlit lets go of the file). The options most
    people set come first, the others in an "Advanced" section (``options_data.form_fields``),
    each labelled in words with its key in its help and its true default as placeholder."""
    settings = svc.settings
    with st.sidebar.form("upload", clear_on_submit=True):
        st.subheader("Train on a CSV")
        file = st.file_uploader("CSV file", type=["csv"], key="upload_file",
                                max_upload_size=actions.upload_limit_mb(settings),
                                help=f"At most {actions.upload_limit_bytes(settings):,} bytes "
                                     "here.")
        fields = options_data.form_fields()
        raw = {field.name: option_field(field) for field in fields if field.front}
        with st.expander("Advanced"):
            st.caption("Leave a field blank for its default.")
            raw.update({field.name: option_field(field) for field in fields if not field.front})
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


def option_field(field: options_data.FormField) -> str:
    """One option's field of the upload form: a choice, or text ('' leaves the default)."""
    if field.choices:
        return st.selectbox(field.label, ("", *field.choices), key=f"option_{field.name}",
                            help=field.help,
                            format_func=lambda c: c or f"default ({field.default})")
    return st.text_input(field.label, placeholder=field.placeholder, help=field.help,
                         key=f"option_{field.name}")


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
            "version": st.column_config.NumberColumn("model version"),
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
    job, versions = bundle["job"], bundle["versions"]
    s = headline.job_summary(job, versions, now)
    view = JobView(job, versions, bundle["tasks"], bundle["workers"], s, now,
                   bundle["predictions"], bundle["prediction_count"])
    job_header(s)
    cancel_controls(svc, job)
    if s["status"] == REJECTED:
        st.error(f"Rejected: {plain(s['reason'])}")
        st.table(pd.DataFrame(jobs_list.rejection_details(job)).map(plain))  # cells are Markdown
        options_section(job)
        return
    if s["status"] == FAILED:
        st.error(f"Failed: {plain(s['reason'])}")
    if s["status"] == CANCELLED:
        st.warning(f"Cancelled: {plain(s['reason'])}")
    for row in headline.headline_rows(s):
        metric_row(row)
    if s.get("warning"):
        st.warning(f"Model version v{s['model_version']}: {plain(s['warning'])}")
    if s["progress"] is not None:
        st.progress(s["progress"], text=plain(headline.progress_text(s)))
    if note := headline.versions_note(job, versions):
        st.caption(note)
    names = headline.job_tabs(job, view.prediction_count)
    parts = {**TABS, "Model": model_tab}
    for name, tab in zip(names, st.tabs(names), strict=True):
        with tab:
            parts[name](svc, view)


def job_header(summary: dict) -> None:
    """The job's status as a badge, its source file and when it was created, and the job it
    was continued from."""
    status, color = headline.status_badge(summary)
    created = timestamp(summary["created_at"])
    when = f" · created {created:%Y-%m-%d %H:%M:%S} UTC" if created is not None else ""
    st.badge(status, color=color)
    st.caption(f"{plain(summary['source'])}{when}")
    if (lineage := headline.lineage_text(summary)) is not None:
        st.caption(lineage)


def model_tab(svc: Services, view: JobView) -> None:
    """The exported models to download (a cancelled job's last version, built on demand)."""
    job, versions = view.job, view.versions
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
    importance_section(job)


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
