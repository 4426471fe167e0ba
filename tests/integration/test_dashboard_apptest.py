"""The dashboard page rendered by Streamlit's AppTest on seeded registry documents.

AppTest runs the page in this process as ``dashboard/app.py`` does, calling
``bucketlearn.entrypoints.dashboard.main`` with a Services factory: where the app passes
``bootstrap.process_services``, the test passes its own (``app_on``). The services are the real
Google adapters on the session's Firestore and Storage emulators (Firestore emptied before each
test), seeded through the port methods (create_job, start_training, commit_version, ...).
"""

from __future__ import annotations

import dataclasses
import re
import time
from html import unescape

import numpy as np
import pandas as pd
import pytest
import requests
import streamlit as st
from streamlit.testing.v1 import AppTest

from bucketlearn import layout
from bucketlearn.config import Limits
from bucketlearn.domain.forecast import ModelCost, forecast_plan
from bucketlearn.domain.head import Head
from bucketlearn.domain.job import Job
from bucketlearn.domain.metrics import classification_report, holdout_fields
from bucketlearn.domain.prediction import PredictionRecord
from bucketlearn.domain.version import Version
from bucketlearn.options import OPTION_NAMES, default_text
from bucketlearn.ports import Services, VersionCommit
from bucketlearn.views import formats, headline

RUNNING_ID = "digits-0123456789ab"
DONE_ID = "iris-00000000000d"
REJECTED_ID = "broken-0000000000ee"
BINARY_ID = "churn-0000000000b1"
REASON = ("gs://bucketlearn-uploads/broken.csv, row 17, column 'petal_width': "
          "a value is not a number; expected a number; found: 'abc'")


pytestmark = pytest.mark.integration


@pytest.fixture
def services(cloud, emulators) -> Services:
    """Emulator-backed services with an empty Firestore."""
    url = (f"{emulators.urls['firestore']}/emulator/v1/projects/{cloud.settings.project}"
           "/databases/(default)/documents")
    requests.delete(url, timeout=10).raise_for_status()
    return cloud


@pytest.fixture
def registry(services):
    return services.registry


@pytest.fixture
def store(services):
    return services.store


def dashboard_script(services):
    """The app's script as ``dashboard/app.py`` is, but handed the test's Services factory.

    ``AppTest.from_function`` runs this function's body as the script and calls it with the
    ``kwargs`` the AppTest was made with, on every run: the injection point is the page's own
    parameter (``main(services)``), not a replaced module attribute. (No annotation: the body
    runs on its own, without this module's imports.)"""
    from bucketlearn.entrypoints.dashboard import main

    main(services)


def app_on(services: Services) -> AppTest:
    """An AppTest of the dashboard page on ``services``."""
    return AppTest.from_function(dashboard_script, kwargs={"services": lambda: services},
                                 default_timeout=60)


@pytest.fixture
def app(services):
    """The app, handed the test's services (and with Streamlit's caches emptied)."""
    st.cache_data.clear()
    yield app_on(services)
    st.cache_data.clear()


def _job(job_id: str, name: str, created: float) -> dict:
    return {
        "job_id": job_id, "status": "QUEUED", "phase": "splitting",
        "source": {"bucket": "bucketlearn-uploads", "name": name, "generation": 1, "size": 10},
        "file": f"gs://bucketlearn-uploads/{name}", "created_at": created,
        "updated_at": created, "claimed_at": created, "claim": "c", "version": None,
        "epoch": 0, "round": 0, "published": None, "tasks_applied": 0, "tasks_failed": 0,
        "samples_seen": 0, "error": None,
    }


def _train(registry, job_id: str, start: float, accuracies: list[float], epochs: int = 3,
           tasks_per_epoch: int = 4, evaluated: bool = True) -> None:
    """Make the job trainable (version 0) and commit one version per accuracy, 2 tasks each
    (with that accuracy as its figures unless not ``evaluated``: then on the head only)."""
    options = {"epochs": epochs, "batch_size": 32, "seed": 0, "buffer_size": 2,
               "max_failed_tasks": 0, "learning_rate": 0.001, "rows_per_shard": 256,
               "holdout_fraction": 0.2, "model": "auto", "max_staleness": 16,
               "label_column": None}
    registry.update_job(job_id, {"options": options})
    dataset = {"rows": 1000, "train_rows": 800, "holdout_rows": 200, "features": 4,
               "label_column": "species", "classes": ["a", "b", "c"], "shards": tasks_per_epoch}
    plan = {"parallel_tasks": 2, "shards_per_task": 1, "tasks_per_epoch": tasks_per_epoch,
            "epochs": epochs, "serial_steps": 100, "decided": "test"}
    assert registry.start_training(
        job_id, "c",
        {"phase": "training", "version": 0, "epoch": 1, "round": 0, "published": "e0001r00000",
         "tasks_per_epoch": tasks_per_epoch, "tasks_planned": tasks_per_epoch * epochs,
         "dataset": dataset, "updated_at": start, "plan": plan,
         "head": {"version": 0, "weights_path": "w0", "holdout_accuracy": None}},
        Version(0, "w0", created_at=start))
    applied = 0
    for n, accuracy in enumerate(accuracies, start=1):
        epoch, first = 1 + applied // tasks_per_epoch, applied % tasks_per_epoch
        indices = [first, first + 1]
        round_index = first // 2
        applied += 2
        now = start + 10 * n
        complete = applied % tasks_per_epoch == 0 and epoch < epochs
        head = {"version": n, "weights_path": f"w{n}", "holdout_accuracy": accuracy,
                "holdout_loss": 1 - accuracy, "train_loss": 1.2 - accuracy,
                "evaluated_version": n}
        assert registry.commit_version(VersionCommit(
            job_id=job_id, base_version=n - 1, epoch=epoch, round=round_index,
            version=Version(n, f"w{n}", parent=n - 1, epoch=epoch, round=round_index,
                            tasks_applied=tuple(layout.task_id_for(job_id, epoch, i)
                                                for i in indices),
                            samples=400, train_loss=1.2 - accuracy, created_at=now,
                            figures={"holdout_accuracy": accuracy,
                                     "holdout_loss": 1 - accuracy} if evaluated else {}),
            job_fields={"version": n, "status": "RUNNING", "tasks_applied": applied,
                        "samples_seen": 400 * n, "head": head, "updated_at": now,
                        **({"started_at": now} if n == 1 else {}),  # as commit_fields sets it
                        **({"epoch": epoch + 1, "round": 0} if complete
                           else {"round": round_index + 1})}))
        for i in indices:
            doc_id = f"e{epoch:04d}:t{i:05d}"
            registry.record_attempt(job_id, doc_id, {
                "task_id": layout.task_id_for(job_id, epoch, i), "epoch": epoch,
                "task_index": i, "state": "RUNNING", "worker_id": "w1",
                "started_at": now - 5, "rows": 200}, attempt_key="k1")
            registry.update_task(job_id, doc_id, {
                "state": "TRAINED", "finished_at": now - 1, "fetch_seconds": 0.5,
                "train_seconds": 3.0, "write_seconds": 0.5})


@pytest.fixture
def seeded(services, registry, store):
    now = time.time()
    registry.create_job(Job.from_doc(_job(RUNNING_ID, "digits.csv", now - 100)))
    _train(registry, RUNNING_ID, now - 50, [0.5, 0.75, 0.875])
    registry.heartbeat("w1", {"worker_id": "w1", "state": "busy", "last_seen": now - 2,
                              "job_id": RUNNING_ID,
                              "task_id": layout.task_id_for(RUNNING_ID, 2, 2), "tasks_done": 6})
    registry.heartbeat("w0", {"worker_id": "w0", "state": "idle", "last_seen": now - 300,
                              "job_id": None, "task_id": None, "tasks_done": 1})

    registry.create_job(Job.from_doc(_job(DONE_ID, "iris.csv", now - 400)))
    _train(registry, DONE_ID, now - 390, [0.6, 0.9], epochs=1)
    registry.update_job(DONE_ID, {"status": "DONE", "phase": "done", "finished_at": now - 300,
                                  "model_path": layout.model_path(DONE_ID)})
    bucket = services.settings.models_bucket
    store.write_bytes(bucket, layout.model_path(DONE_ID), b"keras-latest", "application/x")
    store.write_bytes(bucket, layout.model_path(DONE_ID, 2), b"keras-v2", "application/x")

    registry.create_job(Job.from_doc(_job(REJECTED_ID, "broken.csv", now - 10)))
    registry.update_job(REJECTED_ID, {
        "status": "REJECTED", "phase": "rejected", "error": REASON, "finished_at": now - 9,
        "error_detail": {"file": "gs://bucketlearn-uploads/broken.csv", "row": 17,
                         "column": "petal_width", "message": "a value is not a number",
                         "expected": "a number", "found": "'abc'"}})
    return now


def text_of(markdown: str) -> str:
    """The text a Markdown element shows (CommonMark rendered, tags dropped): what a user
    reads, whatever was escaped to keep it text."""
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(markdown)
    return unescape(re.sub(r"<[^>]+>", "", html)).strip()


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _run(app: AppTest, job_id: str | None = None) -> AppTest:
    if job_id is not None:
        app.query_params["job"] = job_id
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def test_overview_lists_every_job(app, seeded):
    at = _run(app)
    table = at.dataframe[0].value
    assert set(table["job_id"]) == {RUNNING_ID, DONE_ID, REJECTED_ID}
    by_id = table.set_index("job_id")
    assert by_id.loc[RUNNING_ID, "status"] == "RUNNING"
    assert by_id.loc[RUNNING_ID, "source"] == "gs://bucketlearn-uploads/digits.csv"
    assert by_id.loc[RUNNING_ID, "version"] == 3
    assert by_id.loc[RUNNING_ID, "accuracy"] == 0.875
    assert by_id.loc[RUNNING_ID, "tasks"] == "6/12"
    assert by_id.loc[RUNNING_ID, "eta"] not in ("", "—")
    assert by_id.loc[DONE_ID, "status"] == "DONE" and by_id.loc[DONE_ID, "eta"] == "finished"


def test_rejected_job_shows_its_reason(app, seeded):
    at = _run(app)
    assert at.dataframe[0].value.set_index("job_id").loc[REJECTED_ID, "reason"] == REASON
    assert any(REASON in text_of(e.value) and REJECTED_ID in text_of(e.value) for e in at.error)
    at = _run(app, REJECTED_ID)
    assert any(text_of(e.value) == f"Rejected: {REASON}" for e in at.error)
    assert "Version" not in _metrics(at)  # no training numbers for a job that never trained
    details = {text_of(field): text_of(value) for field, value
               in zip(at.table[0].value["field"], at.table[0].value["value"], strict=True)}
    assert details["row"] == "17" and details["column"] == "petal_width"


def test_job_page_shows_the_head_version_and_accuracy(app, seeded):
    at = _run(app, RUNNING_ID)
    assert at.selectbox(key="job_picker").value == RUNNING_ID
    metrics = _metrics(at)
    assert metrics["Version"] == "3"
    assert metrics["Epoch"] == "2 / 3"
    assert metrics["Holdout accuracy"] == "87.5%"
    assert metrics["Holdout loss"] == "0.1250"
    assert metrics["Train loss"] == "0.3250"
    assert metrics["Holdout macro-F1"] == "—"  # versions written before it was recorded
    assert metrics["Macro-F1"] == "—" and metrics["Accuracy"] == "87.5%"
    assert any("before they were recorded" in c.value for c in at.caption)
    assert metrics["Workers alive"] == "1"
    assert metrics["Tasks done"] == "6" and metrics["Tasks queued"] == "6"
    assert float(metrics["Samples/s (last minute)"]) > 0
    assert "6 of 12 tasks applied" in at.get("progress")[0].proto.text


def test_job_page_shows_what_the_job_used_and_cost(app, seeded, registry):
    """The estimated cost beside the accuracy, and the usage behind it by item."""
    registry.update_job(RUNNING_ID, {"usage": {"firestore_writes": 250, "worker_seconds": 7.5,
                                               "storage_class_a": 30}})
    at = _run(app, RUNNING_ID)
    cost = headline.job_summary(registry.get_job(RUNNING_ID), [], time.time())["cost_usd"]
    assert cost["total"] > 0
    assert _metrics(at)["Est. cost"] == formats.format_cost_short(cost["total"])
    cells = {text_of(str(c)) for t in at.table for c in t.value.to_numpy().ravel()}
    assert {"Firestore writes", "250", "Learner seconds (on its tasks)", "7.5", "Total",
            formats.format_cost(cost["total"])} <= cells
    assert any("list prices as of" in text_of(c.value) for c in at.caption)


def test_job_page_shows_the_plan_its_forecast_and_what_the_job_measured(app, seeded,
                                                                          registry):
    """The plan (R, steps, how it was decided), the forecast by number of learners
    with the suggestion and one process, and the job's measured time beside it."""
    # Prepare
    job = registry.get_job(RUNNING_ID)
    plan = job.plan
    found = forecast_plan(plan, 800, 32, ModelCost(flops_per_row=5e5, parameters=2000, layers=5))
    registry.update_job(RUNNING_ID, {
        "forecast": {**found.to_dict(), "made_at": job.updated_at - 30},
        "usage": {"worker_seconds": 1.2}})
    # Execute
    at = _run(app, RUNNING_ID)
    # Assert
    captions = [text_of(c.value) for c in at.caption]
    assert ("Plan: trains 2 tasks at a time, each from the same version; 4 tasks an epoch of "
            "about 7 steps each, 3 epochs") in captions
    assert any(c.startswith("Forecast: about ") and "in one process (train-local)" in c
               for c in captions), captions
    assert any(c.startswith("Actual: 30 s of training") and "a task took 0.2 s" in c
               for c in captions)
    table = next(t.value for t in at.table if "learners" in t.value.columns)
    assert [text_of(c) for c in table["learners"]] == ["1", "2", "one process (train-local)"]
    assert list(table[""]).count("suggested") == 1


def test_job_page_defaults_to_the_newest_job_and_follows_the_picker(app, seeded):
    at = _run(app)
    assert at.selectbox(key="job_picker").value == REJECTED_ID
    assert at.query_params["job"] == REJECTED_ID
    at.selectbox(key="job_picker").select(DONE_ID).run()
    assert not at.exception
    assert at.query_params["job"] == DONE_ID
    assert _metrics(at)["Version"] == "2"


def test_job_page_shows_figures_beyond_accuracy_and_warns_below_the_majority(app, registry):
    """A binary job whose head answers 'no' for every row: macro-F1 and ROC AUC beside accuracy,
    the majority warning, the per-class table and the confusion matrix named by class, all read
    back from the Firestore emulator (the report's shape is one Firestore stores)."""
    # Prepare
    now = time.time()
    registry.create_job(Job.from_doc(_job(BINARY_ID, "churn.csv", now - 100)))
    _train(registry, BINARY_ID, now - 90, [0.9], epochs=1, tasks_per_epoch=2)
    figures = {**holdout_fields(classification_report(np.array([[9, 0], [1, 0]]), loss=0.3)),
               "holdout_roc_auc": 0.5}
    registry.update_job(BINARY_ID, {"dataset": {"rows": 50, "train_rows": 40,
                                                "holdout_rows": 10, "features": 3,
                                                "label_column": "churned",
                                                "classes": ["no", "yes"], "shards": 2}})
    head = Head.from_doc({"version": 1, "weights_path": "w1", "holdout_accuracy": 0.9,
                          "holdout_loss": 0.3, "train_loss": 0.3, **figures})
    assert registry.record_evaluation(BINARY_ID, 1, {"holdout_accuracy": 0.9, **figures}, head)
    # Execute
    at = _run(app, BINARY_ID)
    # Assert
    metrics = _metrics(at)
    assert metrics["Holdout accuracy"] == "90.0%"
    assert metrics["Holdout macro-F1"] == f"{figures['holdout_macro_f1']:.4f}"
    assert metrics["Holdout ROC AUC"] == metrics["ROC AUC"] == "0.5000"
    assert metrics["Majority baseline"] == "90.0%"
    assert any("accuracy 90.00% is not above the 90.00% of always answering 'no'"
               in text_of(w.value) for w in at.warning)
    tables = [d.value for d in at.dataframe]
    per_class = next(t for t in tables if "recall" in t.columns)
    assert list(per_class["class"]) == ["no", "yes"] and list(per_class["recall"]) == [1.0, 0.0]
    confusion = next(t for t in tables if list(t.columns) == ["no", "yes"])
    assert confusion.values.tolist() == [[9, 0], [1, 0]]


def test_done_job_offers_its_exported_models(app, seeded):
    at = _run(app, DONE_ID)
    assert _metrics(at)["Holdout accuracy"] == "90.0%" and _metrics(at)["Epoch"] == "1 / 1"
    choices = at.selectbox(key="model_choice").options
    assert [c.split(" ")[0] for c in choices] == ["latest", "v2"]
    assert len(at.get("download_button")) == 1
    facts = {d.value.iloc[i, 0]: d.value.iloc[i, 1] for d in at.dataframe
             if list(d.value.columns) == ["fact", "value"] for i in range(len(d.value))}
    assert facts["rows"] == "1000" and facts["classes"] == "3" and facts["shards"] == "4"
    assert any("v0–v1" in i.value for i in at.info)


def test_unknown_job_in_the_url_is_reported(app, seeded):
    at = _run(app, "nope-000000000000")
    assert any("nope-000000000000" in text_of(w.value) for w in at.warning)


def test_upload_form_without_a_file_says_so(app):
    at = _run(app)
    at.sidebar.button[0].click().run()
    assert not at.exception
    assert any("Choose a CSV file" in e.value for e in at.sidebar.error)


def test_registry_failure_is_shown_not_raised(app, registry, monkeypatch):
    def broken(*args, **kwargs):
        raise ConnectionError("firestore unavailable")

    monkeypatch.setattr(registry, "list_jobs", broken)
    at = _run(app)
    assert any("firestore unavailable" in w.value for w in at.warning)


def test_empty_registry_renders(app):
    at = _run(app)
    assert any("No jobs yet" in i.value for i in at.info)


# --- cancel ---------------------------------------------------------------------------------------

def test_cancel_button_asks_first_then_cancels_the_job(app, seeded, registry):
    """The job page's "Cancel job" asks for confirmation; confirmed, the core's cancel_job ends
    the job CANCELLED (with the reason typed) and the page shows it."""
    # Prepare
    at = _run(app, RUNNING_ID)
    # Execute: the first click only asks
    at.button(key="cancel_job").click().run()
    # Assert
    assert not at.exception
    assert any(f"Cancel job `{RUNNING_ID}`?" in w.value and "v3, stays downloadable" in w.value
               for w in at.warning)
    assert registry.get_job(RUNNING_ID).status == "RUNNING"
    # Execute: confirm, with a reason
    at.text_input(key="cancel_reason").input("wrong upload")
    at.button(key="cancel_confirm").click().run()
    # Assert
    assert not at.exception, [e.value for e in at.exception]
    job = registry.get_job(RUNNING_ID)
    assert (job.status, job.phase, job.version) == ("CANCELLED", "cancelled", 3)
    assert (job.cancelled_by, job.cancel_reason) == ("the dashboard", "wrong upload")
    assert any(f"job {RUNNING_ID} cancelled" in text_of(s.value) for s in at.success)
    assert ":orange-badge[CANCELLED]" in [m.value for m in at.markdown]
    assert any(text_of(w.value).startswith("Cancelled: cancelled by the dashboard at ")
               and text_of(w.value).endswith(": wrong upload") for w in at.warning)
    assert not [b for b in at.button if b.key in ("cancel_job", "cancel_confirm")]
    assert [b.label for b in at.get("download_button")] == ["Download v3.keras"]
    assert any("cancelled at v3" in i.value for i in at.info)


def test_cancel_can_be_called_off_at_the_confirmation(app, seeded, registry):
    # Prepare
    at = _run(app, RUNNING_ID)
    at.button(key="cancel_job").click().run()
    # Execute
    at.button(key="cancel_keep").click().run()
    # Assert
    assert not at.exception
    assert registry.get_job(RUNNING_ID).status == "RUNNING"
    assert [b.key for b in at.button if b.key and b.key.startswith("cancel")] == ["cancel_job"]


def test_a_job_that_has_ended_has_no_cancel_button(app, seeded):
    for job_id in (DONE_ID, REJECTED_ID):
        at = _run(app, job_id)
        assert not [b for b in at.button if b.key == "cancel_job"], job_id


# --- what users wrote, shown as text --------------------------------------------------------------

LURE = "[Session expired – sign in](https://evil.example/login)"
LURED_ID = "lure-0000000000a1"
LURED_CANCEL_ID = "lure-0000000000a2"


def _markdown_values(at: AppTest) -> list[str]:
    """The body of every element Streamlit renders as Markdown, main area and sidebar, and the
    cells of its static tables (``st.table`` renders them as Markdown too)."""
    kinds = ("error", "warning", "info", "success", "caption", "markdown")
    cells = [str(cell) for table in at.table for cell in table.value.to_numpy().ravel()]
    return [element.value for kind in kinds for element in at.get(kind)] + cells


def test_a_users_strings_render_as_text_not_as_links(app, services, registry):
    """A rejected upload named like a sign-in link, a cancel reason with a link and a ``?job=``
    parameter holding one: every element shows them as the text they are (the link's
    brackets and URL are escaped), and no element renders a link."""
    # Prepare
    now = time.time()
    registry.create_job(Job.from_doc(_job(LURED_ID, f"{LURE}.csv", now - 20)))
    registry.update_job(LURED_ID, {
        "status": "REJECTED", "phase": "rejected", "finished_at": now - 19,
        "error": f"gs://bucketlearn-uploads/{LURE}.csv, row 2, column '{LURE}': "
                 f"expected a number; found: '{LURE}'",
        "error_detail": {"file": f"gs://bucketlearn-uploads/{LURE}.csv", "row": 2,
                         "column": LURE, "expected": "a number", "found": f"'{LURE}'"}})
    registry.create_job(Job.from_doc(_job(LURED_CANCEL_ID, "fine.csv", now - 10)))
    registry.update_job(LURED_CANCEL_ID, {
        "status": "CANCELLED", "phase": "cancelled", "finished_at": now - 9,
        "error": f"cancelled by the dashboard at 2026-11-03 14:05:09 UTC: {LURE}",
        "cancel_reason": LURE})
    # Execute
    shown = [_markdown_values(_run(app_on(services), job))
             for job in (LURED_ID, LURED_CANCEL_ID, LURE)]  # a new session for each
    # Assert
    for values in shown:
        for value in values:
            assert "<a " not in markdown_html(value), value
            assert "https://" not in value, value
    rejected, cancelled, parameter = ([text_of(v) for v in values] for values in shown)
    assert any(f"{LURE}.csv" in t and t.startswith("Rejected: ") for t in rejected), rejected
    assert any(t.startswith(f"gs://bucketlearn-uploads/{LURE}.csv · created ")
               for t in rejected), rejected
    assert any(t.startswith("Cancelled: ") and t.endswith(LURE) for t in cancelled), cancelled
    assert any(f"{LURE} is not a job id" in t for t in parameter), parameter
    assert LURE in rejected and f"'{LURE}'" in rejected  # the details table's cells


def markdown_html(markdown: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(markdown)


# --- the upload form ------------------------------------------------------------------------------

UPLOADED_NAME = re.compile(r"^dashboard/[0-9a-f]{16}/digits\.csv$")


def _upload(at: AppTest, name: str, content: bytes) -> AppTest:
    at.get("file_uploader")[0].set_value((name, content, "text/csv"))
    at.sidebar.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_upload_form_streams_each_file_under_a_name_of_its_own(app, services, monkeypatch):
    """Two users uploading digits.csv: two objects under ``dashboard/<16 hex>/``, neither
    overwritten, each written from Streamlit's file as a stream (a whole copy with
    ``getvalue`` fails here), and the form cleared once it is submitted."""
    # Prepare
    from streamlit.runtime.uploaded_file_manager import UploadedFile

    def no_copy(self):
        raise AssertionError("the upload was copied whole (getvalue)")

    monkeypatch.setattr(UploadedFile, "getvalue", no_copy)
    bucket = services.settings.uploads_bucket
    before = {i.name for i in services.store.list(bucket)}
    first, second = b"a,label\n1,0\n2,1\n", b"a,label\n3,0\n4,1\n5,0\n"
    # Execute
    at = _upload(_run(app), "digits.csv", first)
    said = [text_of(s.value) for s in at.sidebar.success]
    at = _upload(at, "digits.csv", second)
    # Assert
    names = sorted({i.name for i in services.store.list(bucket)} - before)
    assert len(names) == 2 and all(UPLOADED_NAME.match(n) for n in names), names
    assert sorted(services.store.read_bytes(bucket, n) for n in names) == sorted([first, second])
    assert any("Uploaded to gs://" in s and "/digits.csv" in s for s in said), said
    assert at.get("file_uploader")[0].proto.max_upload_size_mb == 100
    assert [form.proto.form.clear_on_submit for form in at.get("form")] == [True]
    at.sidebar.button[0].click().run()  # submitted again: the form no longer holds a file
    assert any("Choose a CSV file" in e.value for e in at.sidebar.error)


def test_the_upload_form_refuses_a_file_over_its_limit(app, services):
    """A file over the form's limit (here the deployment's max_file_bytes, 10) is refused,
    naming the limit and the size; nothing is written."""
    # Prepare
    small = dataclasses.replace(services.settings, limits=Limits(max_file_bytes=10))
    limited = app_on(dataclasses.replace(services, settings=small))
    bucket = services.settings.uploads_bucket
    before = {i.name for i in services.store.list(bucket)}
    # Execute
    at = _upload(_run(limited), "digits.csv", b"a,label\n1,0\n")
    # Assert
    errors = [text_of(e.value) for e in at.sidebar.error]
    assert any("at most 10 bytes here; found 12 bytes" in e for e in errors), errors
    assert {i.name for i in services.store.list(bucket)} == before
    assert at.get("file_uploader")[0].proto.max_upload_size_mb == 1


# --- the job page as a user reads it: the curve, the headline, the form -------------------------

FAST_ID = "fast-0000000000f1"


def test_a_finished_job_evaluated_at_its_end_only_has_its_curve(app, registry):
    """A job that trained faster than its evaluations: no version document has figures, its
    head has the final version's (the export's, on the whole holdout). The Training tab draws
    the curve with the final version on it, instead of saying no version was evaluated."""
    # Prepare
    now = time.time()
    registry.create_job(Job.from_doc(_job(FAST_ID, "fast.csv", now - 100)))
    _train(registry, FAST_ID, now - 90, [0.5, 0.7, 0.8, 0.815], epochs=2, evaluated=False)
    registry.update_job(FAST_ID, {"status": "DONE", "phase": "done", "finished_at": now - 40})
    # Execute
    at = _run(app, FAST_ID)
    # Assert: the holdout curve's points are those the job has: the final version's
    charts = {c.proto.alt: chart_points(c) for c in at.get("vega_lite_chart")}
    accuracy = charts["Accuracy and macro-F1 by version"]
    loss = charts["Loss by version"]
    assert not any("No evaluated version yet" in i.value for i in at.info)
    assert accuracy.values.tolist() == [[4, "Holdout accuracy", 0.815]]
    assert set(loss["figure"]) == {"Holdout loss", "Train loss"}
    assert (loss["figure"] == "Train loss").sum() == 4  # every version folded has its own
    assert any("Holdout figures of 1 of the 5 versions shown" in c.value
               and "v4, the final model, on the whole holdout" in c.value for c in at.caption)


def test_the_curve_has_each_epochs_validation_score(app, registry):
    """A job that selects by validation: each epoch's last version was scored on the validation
    rows; the curve draws those scores beside the holdout's, and the note says what they are."""
    # Prepare: 2 epochs of 2 versions; the epochs' last versions (2, 4) scored on validation
    now = time.time()
    registry.create_job(Job.from_doc(_job(FAST_ID, "fast.csv", now - 100)))
    _train(registry, FAST_ID, now - 90, [0.5, 0.7, 0.8, 0.815], epochs=2, evaluated=False)
    for version, score in ((2, 0.72), (4, 0.83)):
        registry.record_evaluation(FAST_ID, version, {"validation_accuracy": score,
                                                      "validation_loss": 1 - score}, None)
    registry.update_job(FAST_ID, {"status": "DONE", "phase": "done", "finished_at": now - 40})
    # Execute
    at = _run(app, FAST_ID)
    # Assert
    charts = {c.proto.alt: chart_points(c) for c in at.get("vega_lite_chart")}
    accuracy = charts["Accuracy and macro-F1 by version"]
    validation = accuracy[accuracy["figure"] == "Validation accuracy"]
    assert validation[["version", "value"]].values.tolist() == [[2, 0.72], [4, 0.83]]
    assert set(charts["Loss by version"]["figure"]) == {"Validation loss", "Holdout loss",
                                                        "Train loss"}
    assert any("The validation line scores each epoch's last version" in c.value
               for c in at.caption)


def test_the_model_tab_says_which_columns_the_model_relies_on(app, registry):
    """A DONE job's ranking of its columns: a bar each, most important first, and what the
    figure is said under it."""
    # Prepare
    now = time.time()
    registry.create_job(Job.from_doc(_job(FAST_ID, "fast.csv", now - 100)))
    _train(registry, FAST_ID, now - 90, [0.5, 0.7], epochs=1, evaluated=False)
    ranked = {"columns": [{"column": "signal", "importance": 0.46},
                          {"column": "noise", "importance": 0.0}],
              "metric": "accuracy", "baseline": 0.975, "rows": 241, "repeats": 3}
    registry.update_job(FAST_ID, {"status": "DONE", "phase": "done", "finished_at": now - 40,
                                  "feature_importance": ranked})
    # Execute
    at = _run(app, FAST_ID)
    # Assert
    charts = {c.proto.alt: chart_points(c) for c in at.get("vega_lite_chart")}
    bars = charts["What the model looks at"]
    assert bars[["column", "importance"]].values.tolist() == [["signal", 0.46], ["noise", 0.0]]
    assert any("shuffled across 241 holdout rows" in c.value  # (markdown escaped)
               for c in at.caption), [c.value for c in at.caption]


def chart_points(chart) -> pd.DataFrame:
    """The rows a chart of the page draws (its Arrow dataset)."""
    import pyarrow as pa

    (dataset,) = chart.proto.datasets
    return pa.ipc.open_stream(dataset.data.data).read_all().to_pandas()


def test_the_upload_form_asks_the_common_options_first_in_words_with_true_defaults(app):
    """Label column and epochs up front, every other option in "Advanced"; each labelled in
    words with its key in the help, and no field claiming a default the option does not have
    (parallel_tasks' is auto, not 0)."""
    # Execute
    at = _run(app)
    # Assert
    widgets = [*at.sidebar.text_input, *at.sidebar.selectbox]
    options = {w.key.removeprefix("option_"): w for w in widgets if w.key.startswith("option_")}
    (advanced,) = [e for e in at.sidebar.expander if e.label == "Advanced"]
    inside = {w.key for w in [*advanced.text_input, *advanced.selectbox]}
    assert set(options) == set(OPTION_NAMES)
    assert [n for n, w in options.items() if w.key not in inside] == ["label_column", "epochs"]
    assert options["label_column"].label == "Label column"
    assert options["parallel_tasks"].proto.placeholder == "default: auto"
    for name, widget in options.items():
        assert widget.label != name and f"`{name}`" in widget.help, name
        if widget.type == "text_input":
            assert widget.proto.placeholder == f"default: {default_text(name)}", name
        else:
            assert widget.format_func("") == f"default ({default_text(name)})", name


def test_a_searched_job_shows_its_candidates_best_first_and_what_was_selected(app, seeded,
                                                                               registry):
    """The Training tab of a searched job: its leaderboard (finalists first, pruned with the
    rung that pruned them) and a sentence on what was selected and what the search cost."""
    from bucketlearn.aggregation.search_writer import _line_doc
    from bucketlearn.domain.recipe import Score
    from bucketlearn.domain.search import draw_candidates, rungs, search_record

    record = search_record(draw_candidates(6, 0, 64, 0.01), rungs(6, 9))
    for index, value in enumerate([0.9, 0.7, 0.85, 0.6, 0.8, 0.5]):
        meta = {"epoch": 3, "scores": [Score(3, 3, accuracy=value, loss=1 - value).to_dict()]}
        record["lines"][str(index)] = _line_doc({}, meta, 0, f"weights/{DONE_ID}/c{index}")
    record["selected"] = {"candidates": [0, 2, 4, 1], "reason": "the mean of the 4 finalists",
                          "score": {"accuracy": 0.91}, "alone": {"score": {"accuracy": 0.9}}}
    registry.update_job(DONE_ID, {"search": record, "usage": {"worker_seconds": 42.0}})
    # Execute
    at = _run(app, DONE_ID)
    # Assert
    (board,) = [d.value for d in at.dataframe if "configuration" in d.value.columns]
    assert list(board["candidate"]) == [0, 2, 4, 1, 3, 5]
    assert list(board["state"])[-2:] == ["pruned", "pruned"]
    assert board["why"].iloc[-1].startswith("rung 0: not among the best 4 of 6")
    notes = [text_of(c.value) for c in at.caption]
    assert any(n.startswith("Selected: the mean of the 4 finalists; the mean against the best "
                            "candidate alone: +1.00 points") and "42 learner vCPU-seconds" in n
               for n in notes), notes


def test_a_job_with_batch_predictions_lists_them_newest_first(app, seeded, services, registry):
    """The Batch predictions tab of a job that has requests: a row each (when, file, state, rows,
    seconds, rows/s, parts, the output or why it failed) and how many there are; a job without
    requests has no such tab."""
    # Prepare
    def request(n: int, name: str, **fields) -> PredictionRecord:
        object_name = layout.predict_object_name(DONE_ID, name)
        return PredictionRecord(
            layout.prediction_id_for(object_name, 100 + n), DONE_ID, created_at=seeded - 60 + n,
            source={"bucket": "bucketlearn-uploads", "name": object_name,
                    "generation": 100 + n, "size": 10}, **fields)

    registry.create_prediction(request(1, "new.csv", state="DONE", rows=2000, seconds=0.5,
                                       parts=4, output=f"predictions/{DONE_ID}/new.csv"))
    registry.create_prediction(request(2, "bad.csv", state="FAILED", rows=0, seconds=0.1, error=(
        f"gs://bucketlearn-uploads/predict/{DONE_ID}/bad.csv, row 3, column 'petal_width': a "
        "feature value is not a number; expected a number; found: abc")))
    registry.create_prediction(request(3, "big.csv", rows=1200))  # RUNNING
    # Execute
    at = _run(app, DONE_ID)
    # Assert
    assert [t.label for t in at.tabs][-2:] == ["Model", "Batch predictions"]
    (table,) = [d.value for d in at.dataframe if "result" in d.value.columns]
    assert list(table["file"]) == ["big.csv", "bad.csv", "new.csv"]
    assert list(table["state"]) == ["RUNNING", "FAILED", "DONE"]
    assert list(table["rows"]) == [1200, 0, 2000]
    assert table["seconds"].iloc[2] == 0.5 and table["rows_per_s"].iloc[2] == 4000
    assert table["parts"].iloc[2] == 4 and pd.isna(table["parts"].iloc[1])
    assert table["when"].iloc[2] == pd.Timestamp(seeded - 59, unit="s", tz="UTC")
    models = services.settings.models_bucket
    assert list(table["result"]) == [
        "running", "row 3, column 'petal_width': a feature value is not a number; expected a "
        "number; found: abc", f"gs://{models}/predictions/{DONE_ID}/new.csv"]
    assert any(text_of(c.value).startswith("The job's 3 requests. To predict another file: "
                                           f"bucketlearn predict --job {DONE_ID} FILE.csv")
               for c in at.caption), [c.value for c in at.caption]
    at.selectbox(key="job_picker").select(RUNNING_ID).run()
    assert not at.exception and at.query_params["job"] == RUNNING_ID
    assert [t.label for t in at.tabs] == list(headline.JOB_TABS)
    assert not [d for d in at.dataframe if "result" in d.value.columns]
