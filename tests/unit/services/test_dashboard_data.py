"""The dashboard's read side on hand-built documents (no Streamlit, no backend)."""

from __future__ import annotations

import ast
import dataclasses
import io
import math
import re
from collections import Counter
from html import unescape

import numpy as np
import pandas as pd
import pytest

from bucketlearn import layout
from bucketlearn.adapters.memory import MemoryRegistry
from bucketlearn.bootstrap import memory_services
from bucketlearn.config import Limits, Settings
from bucketlearn.domain.job import Job
from bucketlearn.domain.metrics import classification_report, holdout_fields
from bucketlearn.domain.task import TaskRecord
from bucketlearn.domain.version import Evaluation, Version
from bucketlearn.errors import ConfigError
from bucketlearn.options import (
    OPTION_NAMES,
    OPTION_SPECS,
    JobOptions,
    parse_option,
    resolve_options,
)
from bucketlearn.ports import VersionCommit
from bucketlearn.views import (
    actions,
    costs,
    downloads,
    formats,
    headline,
    jobs_list,
    options_data,
    reads,
    throughput,
    training_figures,
    workers_tasks,
)
from tests.unit.helpers import REPO_DIR

T0 = 1_700_000_000.0


def a_job(job_id: str = "digits-0123456789ab", **fields) -> Job:
    """A running job as the registry reads it back, with ``fields`` (document keys) changed."""
    doc = {
        "job_id": job_id, "status": "RUNNING", "phase": "training",
        "source": {"bucket": "up", "name": "digits.csv", "generation": 7, "size": 100},
        "file": "gs://up/digits.csv", "created_at": T0, "updated_at": T0 + 100,
        "version": 3, "epoch": 2, "tasks_applied": 6, "tasks_failed": 0, "tasks_planned": 20,
        "tasks_per_epoch": 4, "samples_seen": 1500,
        "options": {"epochs": 5, "batch_size": 32, "seed": 0},
        "dataset": {"rows": 1000, "train_rows": 800, "holdout_rows": 200, "features": 64,
                    "label_column": "label", "classes": ["0", "1", "2"], "shards": 4},
        "head": {"version": 3, "weights_path": "digits/w3", "checksum": "c3",
                 "holdout_accuracy": 0.875, "holdout_loss": 0.41, "train_loss": 0.52},
        "error": None,
    }
    doc.update(fields)
    return Job.from_doc(doc)


def version(n: int, at: float, samples: int = 0, tasks: int = 0, acc=None, loss=None,
            train=None, failed: int = 0) -> Version:
    """A version as the registry reads it back (``version_doc``'s document)."""
    return Version.from_doc(version_doc(n, at, samples, tasks, acc, loss, train, failed))


def version_doc(n: int, at: float, samples: int = 0, tasks: int = 0, acc=None, loss=None,
                train=None, failed: int = 0) -> dict:
    return {"version": n, "weights_path": f"w{n}", "epoch": 1, "created_at": at, "samples": samples,
            "tasks_applied": [f"j:e0001:t{i:05d}" for i in range(tasks)],
            "tasks_failed": [f"j:e0001:t{i:05d}" for i in range(failed)],
            "holdout_accuracy": acc, "holdout_loss": loss, "train_loss": train}


VERSIONS = [
    Version.from_doc({**version_doc(0, T0), "tasks_failed": None}),  # as split.py wrote it
    version(1, T0 + 10, samples=400, tasks=2, acc=0.5, loss=1.2, train=1.5),
    version(2, T0 + 20, samples=400, tasks=2, acc=0.75, loss=0.8, train=1.0),
    version(3, T0 + 30, samples=400, tasks=2, acc=0.875, loss=0.41, train=0.52),
]


# --- formatting ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("seconds", "text"), [
    (None, "—"), (float("nan"), "—"), (0, "0s"), (45.4, "45s"), (200, "3m 20s"),
    (7500, "2h 05m"), (97200, "1d 3h"), (-3, "0s"),
])
def test_format_duration(seconds, text):
    assert formats.format_duration(seconds) == text


def test_format_percent_and_number():
    assert formats.format_percent(0.875) == "87.5%"
    assert formats.format_percent(None) == "—"
    assert formats.format_number(0.41) == "0.4100"
    assert formats.format_number("x") == "—"


def test_source_file_falls_back_to_the_source_map():
    assert jobs_list.source_file(a_job()) == "gs://up/digits.csv"
    assert jobs_list.source_file(a_job(file=None)) == "gs://up/digits.csv"
    assert jobs_list.source_file(Job("x")) == ""


# --- rates and ETA -------------------------------------------------------------------------------

def test_current_rate_counts_the_last_minute_only():
    versions = [version(0, T0), version(1, T0 + 10, 100, 1),
                version(2, T0 + 100, 600, 3), version(3, T0 + 130, 600, 3)]
    rate = throughput.current_rate(versions, now=T0 + 140, window=60)
    assert rate["samples_per_s"] == pytest.approx(1200 / 60)
    assert rate["tasks_per_min"] == pytest.approx(6.0)


def test_current_rate_does_not_dilute_a_young_job_over_the_whole_window():
    rate = throughput.current_rate(VERSIONS, now=T0 + 30, window=60)
    assert rate["samples_per_s"] == pytest.approx(1200 / 30)
    assert rate["tasks_per_min"] == pytest.approx(6 * 60 / 30)


def test_current_rate_counts_failed_tasks_and_is_zero_without_versions():
    rate = throughput.current_rate([version(0, T0), version(1, T0 + 10, 0, 0, failed=2)], T0 + 20, 60)
    assert rate["tasks_per_min"] == pytest.approx(2 * 60 / 20)
    assert throughput.current_rate([], T0) == {"samples_per_s": 0.0, "tasks_per_min": 0.0}
    assert throughput.current_rate([version(0, T0)], T0) == {"samples_per_s": 0.0, "tasks_per_min": 0.0}


def test_eta_extrapolates_the_recent_task_rate():
    # 6 tasks in 30 s -> 12 tasks/min; 14 remaining -> 70 s.
    assert throughput.eta_seconds(a_job(), VERSIONS, now=T0 + 30) == pytest.approx(70.0)


def test_eta_is_unknown_when_stalled_or_not_split_and_none_for_terminal_jobs():
    assert throughput.eta_seconds(a_job(), VERSIONS, now=T0 + 1000) is None  # nothing in 2 minutes
    assert throughput.eta_seconds(a_job(tasks_planned=None), VERSIONS, T0 + 30) is None
    assert throughput.eta_seconds(a_job(status="DONE"), VERSIONS, T0 + 30) is None
    assert throughput.eta_seconds(a_job(tasks_applied=19, tasks_failed=1), VERSIONS, T0 + 30) == 0.0


def test_progress():
    assert throughput.progress(a_job()) == pytest.approx(0.3)
    assert throughput.progress(a_job(tasks_planned=0)) is None
    assert throughput.progress(a_job(tasks_applied=25)) == 1.0


# --- overview ------------------------------------------------------------------------------------

def test_overview_rows_show_every_job_newest_first():
    running = a_job("run-000000000001", created_at=T0, started_at=T0)
    done = a_job("done-000000000002", status="DONE", phase="done", created_at=T0 + 5,
                   tasks_applied=20)
    rejected = a_job("bad-000000000003", status="REJECTED", phase="rejected",
                       created_at=T0 + 9, version=None, head=None, tasks_planned=None,
                       dataset=None, error="gs://up/bad.csv, row 3, column 'x': not a number")
    rows = jobs_list.overview_rows([running, done, rejected], T0 + 30)
    assert [r["job_id"] for r in rows] == ["bad-000000000003", "done-000000000002",
                                           "run-000000000001"]
    bad, fin, run = rows
    assert bad["status"] == "REJECTED"
    assert bad["reason"] == "gs://up/bad.csv, row 3, column 'x': not a number"
    assert bad["progress"] is None and bad["tasks"] == "" and bad["eta"] == ""
    assert fin["eta"] == "finished" and fin["reason"] == ""
    assert run["link"] == "?job=run-000000000001"
    assert run["source"] == "gs://up/digits.csv"
    assert run["created"] == pd.Timestamp(T0, unit="s", tz="UTC")
    assert run["version"] == 3 and run["accuracy"] == 0.875
    assert run["tasks"] == "6/20" and run["progress"] == pytest.approx(0.3)
    assert run["eta"] == "1m 10s"  # 6 tasks in 30 s since it started, 14 to go


def test_the_overviews_eta_comes_from_the_jobs_own_counters():
    """No version is read for the overview: a job's ETA is its remaining tasks at its average
    rate since training started; unknown before a task is done or before it started."""
    assert throughput.average_eta_seconds(a_job(started_at=T0), T0 + 30) == pytest.approx(70.0)
    assert throughput.average_eta_seconds(a_job(started_at=None), T0 + 30) is None
    assert throughput.average_eta_seconds(a_job(started_at=T0, tasks_applied=0), T0 + 30) is None
    assert throughput.average_eta_seconds(a_job(started_at=T0, status="DONE"), T0 + 30) is None
    assert throughput.average_eta_seconds(a_job(started_at=T0, tasks_applied=20), T0 + 30) == 0.0


def test_reason_is_only_shown_for_jobs_that_ended_badly():
    assert jobs_list.reason(a_job(error="leftover")) == ""
    assert jobs_list.reason(a_job(status="FAILED", error="3 task(s) failed")) == "3 task(s) failed"


def test_rejection_details_lists_the_known_fields_in_order():
    job = a_job(status="REJECTED", error_detail={"file": "gs://up/x.csv", "row": 3,
                                                   "column": "a", "message": "bad",
                                                   "expected": "a number", "found": "'x'"})
    assert [d["field"] for d in jobs_list.rejection_details(job)] == [
        "file", "row", "column", "message", "expected", "found"]
    assert jobs_list.rejection_details(a_job()) == []


def test_overview_bundle_reads_the_job_documents_only():
    """The overview reads one document a job, whatever versions the training jobs have (it read
    up to 50 versions of each of 100 jobs every 10 s)."""
    reg = CountingRegistry()
    reg.create_job(a_job("a-000000000001"))
    reg.create_job(a_job("b-000000000002", status="DONE", phase="done"))
    bundle = reads.overview_bundle(reg)
    assert {j.job_id for j in bundle["jobs"]} == {"a-000000000001", "b-000000000002"}
    assert list(bundle) == ["jobs"] and reg.reads == {}


def test_the_job_page_reads_the_workers_seen_lately_only():
    """Heartbeat documents of workers gone for long (their TTL deletes them after a day) are
    not read by every refresh of a job's page."""
    reg = MemoryRegistry()
    reg.create_job(a_job("a-000000000001"))
    reg.heartbeat("w-old", {"last_seen": T0 - 2 * reads.WORKERS_SEEN_SECONDS})
    reg.heartbeat("w-new", {"last_seen": T0 - 5})
    bundle = reads.job_bundle(reg, "a-000000000001", T0)
    assert [w["worker_id"] for w in bundle["workers"]] == ["w-new"]


# --- one job -------------------------------------------------------------------------------------

def test_job_summary_has_the_headline_numbers():
    summary = headline.job_summary(a_job(), VERSIONS, T0 + 30)
    assert summary["version"] == 3 and summary["epoch"] == 2 and summary["epochs"] == 5
    assert summary["accuracy"] == 0.875 and summary["loss"] == 0.41
    assert summary["train_loss"] == 0.52
    assert summary["remaining"] == 14 and summary["eta_seconds"] == pytest.approx(70.0)


def test_a_continued_job_names_its_parent_and_both_models_on_its_holdout():
    parent = {"job_id": "penguins-a-6aaf0b02c5d9", "version": 9}
    running = headline.job_summary(a_job(continued_from=parent), VERSIONS, T0 + 30)
    done = headline.job_summary(a_job(continued_from={**parent, "parent_holdout": {
        "accuracy": 0.8, "loss": 0.5, "rows": 35}}), VERSIONS, T0 + 30)
    assert headline.lineage_text(headline.job_summary(a_job(), VERSIONS, T0)) is None
    assert headline.lineage_text(running) == (
        "Continued from [penguins-a-6aaf0b02c5d9](?job=penguins-a-6aaf0b02c5d9) v9")
    assert headline.lineage_text(done) == (
        "Continued from [penguins-a-6aaf0b02c5d9](?job=penguins-a-6aaf0b02c5d9) v9: on this "
        "job's holdout its model's accuracy 80.0%, this job's 87.5%")


def test_what_a_job_used_and_cost_is_shown_beside_its_accuracy():
    """The job's counted usage, its estimated cost by item and in total, and the
    date of the prices, from the same status object ``status --json`` prints."""
    usage = {"firestore_writes": 300, "firestore_reads": 1200, "worker_seconds": 12.25,
             "storage_class_a": 40, "pubsub_messages": 200, "something_new": 3}
    summary = headline.job_summary(a_job(usage=usage), VERSIONS, T0 + 30)
    metrics = dict(headline_figures(summary))
    total = summary["cost_usd"]["total"]
    assert total > 0 and metrics["Est. cost"] == formats.format_cost_short(total)
    rows = costs.usage_rows(summary)
    assert rows[0] == {"used": "Learner seconds (on its tasks)", "amount": "12.2"}
    assert {"used": "Firestore writes", "amount": "300"} in rows
    assert rows[-1] == {"used": "something_new", "amount": "3"}  # unknown keys still shown
    by_item = {r["item"]: r["usd"] for r in costs.cost_rows(summary)}
    assert by_item["Total"] == formats.format_cost(total)
    assert by_item["Firestore"] == formats.format_cost(summary["cost_usd"]["firestore"])
    assert summary["prices_as_of"] in costs.cost_note(summary)
    assert costs.usage_rows(headline.job_summary(a_job(), VERSIONS, T0)) == []


@pytest.mark.parametrize(("usd", "shown"), [
    (None, "—"), (0, "$0"), (0.0000004, "< $0.000001"), (0.00123, "$0.00123"),
    (0.5, "$0.5"), (12.345, "$12.35")])
def test_format_cost(usd, shown):
    assert formats.format_cost(usd) == shown


def headline_figures(summary: dict) -> list[tuple[str, str]]:
    """Every (label, value) of the job page's headline, row after row."""
    return [figure for row in headline.headline_rows(summary) for figure in row]


def test_headline_rows_and_progress_text():
    summary = headline.job_summary(a_job(), VERSIONS, T0 + 30)
    assert headline.headline_rows(summary) == [
        [("Version", "3"), ("Epoch", "2 / 5"), ("Train loss", "0.5200"), ("Est. cost", "$0")],
        [("Holdout accuracy", "87.5%"), ("Holdout macro-F1", "—"), ("Holdout loss", "0.4100")]]
    assert headline.status_badge(summary) == ("RUNNING", "blue")
    assert headline.progress_text(summary) == "6 of 20 tasks applied · training · ETA 1m 10s"
    queued = headline.job_summary(a_job(status="QUEUED", phase="splitting", version=None, head=None,
                                    tasks_planned=None, options=None), [], T0)
    assert dict(headline_figures(queued))["Version"] == "—"
    assert dict(headline_figures(queued))["Holdout accuracy"] == "—"
    done = headline.job_summary(a_job(status="DONE", tasks_applied=20), VERSIONS, T0 + 30)
    assert headline.progress_text(done) == "20 of 20 tasks applied · finished"


def test_a_job_that_stopped_early_shows_its_model_version_and_why_it_ended_sooner():
    # Prepare: DONE after epoch 3 of 5 (12 of 20 tasks, the chain already in epoch 4); the best
    # by validation was version 2
    selection = {"best": {"epoch": 1, "version": 2, "accuracy": 0.9}, "stop_epoch": 3,
                 "scored_through": 3, "patience": 2}
    job = a_job(status="DONE", phase="done", epoch=4, version=6, tasks_applied=12,
                selection=selection,
                head={"version": 2, "weights_path": "digits/w2", "holdout_accuracy": 0.875,
                      "holdout_loss": 0.41, "train_loss": 0.52})
    # Execute
    summary = headline.job_summary(job, VERSIONS, T0 + 30)
    # Assert
    assert dict(headline_figures(summary))["Model version"] == "2 of 6"
    assert dict(headline_figures(summary))["Epoch"] == "3 / 5"
    assert summary["train_loss"] == 0.52  # the head's
    exported = a_job(status="DONE", phase="done", version=6, selection=selection,
                     head={"version": 2, "weights_path": "digits/w2", "holdout_accuracy": 0.8})
    assert headline.job_summary(exported, VERSIONS, T0 + 30)["train_loss"] == 1.0  # v2's
    assert summary["progress"] == 1.0
    assert headline.progress_text(summary) == (
        "12 of 20 tasks applied · finished: stopped after epoch 3 of 5, validation stopped "
        "improving")
    assert jobs_list.overview_rows([job], T0 + 30)[0]["version"] == 2  # the model's


def test_job_bundle_reads_everything_or_none():
    svc = memory_services()
    assert reads.job_bundle(svc.registry, "nope-000000000000", T0) is None
    svc.registry.create_job(a_job("a-000000000001", epoch=0))
    bundle = reads.job_bundle(svc.registry, "a-000000000001", T0)
    assert bundle["job"].job_id == "a-000000000001"
    assert bundle["versions"] == [] and bundle["tasks"] == []


PLAN = {"parallel_tasks": 2, "shards_per_task": 1, "tasks_per_epoch": 4, "epochs": 5,
        "serial_steps": 100, "decided": "test"}


class CountingRegistry(MemoryRegistry):
    """The in-memory registry, counting the version and task documents its queries return
    (what Firestore bills: one read per document)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()

    def list_versions(self, job_id: str, last: int | None = None) -> list[Version]:
        found = super().list_versions(job_id, last=last)
        self.reads["versions"] += len(found)
        return found

    def list_tasks(self, job_id: str, epoch: int | None = None) -> list[TaskRecord]:
        found = super().list_tasks(job_id, epoch=epoch)
        self.reads["tasks"] += len(found)
        return found


def a_long_job(registry: MemoryRegistry, job_id: str, versions: int,
               tasks_per_epoch: int = 100) -> None:
    """A RUNNING job that has committed ``versions`` versions after version 0, one task a round
    (``tasks_per_epoch`` rounds an epoch), each task's document written as its learner does;
    version n carries version n - 1's figures."""
    plan = {"parallel_tasks": 1, "shards_per_task": 1, "tasks_per_epoch": tasks_per_epoch,
            "epochs": 10, "serial_steps": 100, "decided": "test"}
    registry.create_job(a_job(job_id, version=0, epoch=1, round=0, plan=plan, tasks_applied=0,
                              tasks_per_epoch=tasks_per_epoch,
                              tasks_planned=10 * tasks_per_epoch))
    registry.versions[(job_id, 0)] = Version(0, "w0", created_at=T0).to_doc()
    for n in range(1, versions + 1):
        epoch, index = 1 + (n - 1) // tasks_per_epoch, (n - 1) % tasks_per_epoch
        task_id = layout.task_id_for(job_id, epoch, index)
        last = index == tasks_per_epoch - 1
        carried = Evaluation(n - 1, {"holdout_accuracy": 0.5}, T0 + n) if n > 1 else None
        assert registry.commit_version(VersionCommit(
            job_id, n - 1, Version(n, f"w{n}", parent=n - 1, epoch=epoch, round=index,
                                   tasks_applied=(task_id,), samples=10, created_at=T0 + n,
                                   evaluation=carried),
            epoch, index, {"version": n, "tasks_applied": n,
                           **({"epoch": epoch + 1, "round": 0} if last else {"round": index + 1})}))
        registry.record_attempt(job_id, task_id.split(":", 1)[1], {
            "task_id": task_id, "epoch": epoch, "task_index": index, "state": "RUNNING",
            "started_at": T0 + n - 1}, attempt_key=f"k{n}")


def test_the_job_page_reads_the_newest_versions_and_the_current_epochs_tasks_only():
    """A job of 250 versions over 3 epochs (100 tasks each) reads its newest
    VERSIONS_SHOWN versions and its 50 task documents of epoch 3, not 251 versions and 250
    tasks, and its counts still cover the whole job; the overview reads none."""
    # Prepare
    registry = CountingRegistry()
    a_long_job(registry, "long-000000000001", versions=250)
    registry.reads.clear()
    # Execute
    bundle = reads.job_bundle(registry, "long-000000000001", T0)
    page_reads = dict(registry.reads)
    registry.reads.clear()
    overview = reads.overview_bundle(registry)
    # Assert
    job, versions, tasks = bundle["job"], bundle["versions"], bundle["tasks"]
    assert page_reads == {"versions": reads.VERSIONS_SHOWN, "tasks": 50}
    assert [v.version for v in versions] == list(range(251 - reads.VERSIONS_SHOWN, 251))
    assert {t.epoch for t in tasks} == {3}
    assert versions[-2].figure("holdout_accuracy") == 0.5  # carried by the newest, read
    counts = workers_tasks.task_state_counts(job, tasks)
    assert counts["done"] == 250 and counts["queued"] == 750 and counts["running"] == 0
    assert workers_tasks.epoch_progress(job, versions, tasks) == {"epoch": 3, "planned": 100,
                                                       "applied": 50, "failed": 0}
    note = headline.versions_note(job, versions)
    assert f"newest {reads.VERSIONS_SHOWN} of the job's 251 versions (v51–v250)" in note
    assert registry.reads == {} and [j.job_id for j in overview["jobs"]] == ["long-000000000001"]


def _constant(node: ast.expr, names: dict[str, ast.expr]) -> float:
    """The number an expression of the dashboard page stands for: a literal, a module-level
    name of the page, or an attribute of ``reads`` (the core's read and refresh periods)."""
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return _constant(names[node.id], names)
    assert isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name), ast.dump(node)
    assert node.value.id == "reads", ast.dump(node)
    return float(getattr(reads, node.attr))


def test_the_dashboards_cache_outlives_its_refresh():
    """Every cached query of the dashboard page (``bucketlearn.entrypoints.dashboard``) lives
    longer than the fragments' refresh, so a refresh reads the cache (shared by every session),
    not Firestore."""
    # Prepare
    page = REPO_DIR / "bucketlearn" / "entrypoints" / "dashboard.py"
    tree = ast.parse(page.read_text(encoding="utf-8"))
    names = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name)}
    # Execute
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr in ("cache_data",
                                                                             "fragment")]
    found = {(call.func.attr, kw.arg): _constant(kw.value, names) for call in calls
             for kw in call.keywords if kw.arg in ("ttl", "run_every")}
    ttls = [_constant(kw.value, names) for call in calls if call.func.attr == "cache_data"
            for kw in call.keywords if kw.arg == "ttl"]
    refreshes = [_constant(kw.value, names) for call in calls if call.func.attr == "fragment"
                 for kw in call.keywords if kw.arg == "run_every"]
    # Assert
    assert len(ttls) == 3 and len(refreshes) == 2, found
    assert min(ttls) > max(refreshes), found


def test_epoch_progress_comes_from_the_jobs_position_and_its_versions():
    """The rounds before the current one are done; the versions say which tasks failed."""
    job = a_job(epoch=2, round=1, plan=PLAN)
    versions = [Version(5, "w5", epoch=2, round=0, tasks_applied=("a:e0002:t00000",),
                        tasks_failed=("a:e0002:t00001",)),
                Version(4, "w4", epoch=1, tasks_failed=("a:e0001:t00003",))]
    assert workers_tasks.epoch_progress(a_job(epoch=0), []) is None
    assert workers_tasks.epoch_progress(job, versions) == {"epoch": 2, "planned": 4, "applied": 1,
                                                "failed": 1}
    assert workers_tasks.epoch_progress(a_job(epoch=5, round=0, plan=PLAN, status="DONE"), []) == {
        "epoch": 5, "planned": 4, "applied": 4, "failed": 0}


def test_version_frame_by_version_and_time():
    frame = training_figures.version_frame(list(reversed(VERSIONS)))
    assert list(frame["version"]) == [0, 1, 2, 3]
    assert math.isnan(frame["holdout_accuracy"][0])
    assert list(frame["holdout_accuracy"][1:]) == [0.5, 0.75, 0.875]
    assert list(frame["train_loss"][1:]) == [1.5, 1.0, 0.52]
    assert list(frame["tasks"]) == [0, 2, 2, 2]
    assert frame["time"][3] == pd.Timestamp(T0 + 30, unit="s", tz="UTC")
    empty = training_figures.version_frame([])
    assert empty.empty and list(empty.columns) == list(training_figures.VERSION_COLUMNS)


def test_throughput_frame_bins_and_keeps_empty_bins():
    versions = [version(0, T0), version(1, T0 + 3, 100, 1), version(2, T0 + 8, 300, 2),
                version(3, T0 + 27, 50, 1)]
    frame = throughput.throughput_frame(versions, now=T0 + 29, bin_seconds=10)
    assert list(frame.columns) == list(throughput.THROUGHPUT_COLUMNS)
    assert list(frame["samples_per_s"]) == [40.0, 0.0, 5.0]
    assert list(frame["tasks_per_min"]) == [18.0, 0.0, 6.0]
    assert frame["time"][1] == pd.Timestamp(T0 + 10, unit="s", tz="UTC")
    # up to now: a stall shows as trailing zero bins
    assert list(throughput.throughput_frame(versions, now=T0 + 45, bin_seconds=10)["samples_per_s"]) == [
        40.0, 0.0, 5.0, 0.0, 0.0]
    assert throughput.throughput_frame([], now=T0).empty


def test_choose_bin_seconds_is_round():
    assert throughput.choose_bin_seconds(0) == 5
    assert throughput.choose_bin_seconds(600) == 15
    assert throughput.choose_bin_seconds(3600) == 120
    assert throughput.choose_bin_seconds(10**9) == 86400


# --- workers and tasks ---------------------------------------------------------------------------

WORKERS = [
    {"worker_id": "w-idle", "state": "idle", "last_seen": T0 + 95, "job_id": None,
     "task_id": None, "tasks_done": 4},
    {"worker_id": "w-busy", "state": "busy", "last_seen": T0 + 99, "job_id": "a-000000000001",
     "task_id": "a-000000000001:e0001:t00002", "tasks_done": 7},
    {"worker_id": "w-gone", "state": "busy", "last_seen": T0 + 60, "job_id": "a-000000000001",
     "task_id": "a-000000000001:e0001:t00001", "tasks_done": 1},
    {"worker_id": "w-stop", "state": "stopped", "last_seen": T0 + 99, "tasks_done": 2},
]


def test_workers_alive_means_a_heartbeat_within_30_seconds():
    assert workers_tasks.alive_count(WORKERS, now=T0 + 100) == 2
    assert workers_tasks.is_alive(WORKERS[0], now=T0 + 125)
    assert not workers_tasks.is_alive(WORKERS[0], now=T0 + 125.5)
    assert not workers_tasks.is_alive({"worker_id": "x"}, now=T0)


def test_worker_rows_say_what_each_is_doing():
    rows = workers_tasks.worker_rows(WORKERS, now=T0 + 100, job_id="a-000000000001")
    assert [r["worker_id"] for r in rows] == ["w-busy", "w-idle", "w-gone", "w-stop"]
    by_id = {r["worker_id"]: r for r in rows}
    assert by_id["w-busy"]["doing"] == "training a-000000000001:e0001:t00002"
    assert by_id["w-busy"]["this_job"] is True
    assert by_id["w-idle"]["doing"] == "idle" and by_id["w-idle"]["last_seen_ago"] == "5s"
    assert by_id["w-gone"]["doing"] == "gone (no heartbeat)"
    assert by_id["w-gone"]["job_id"] is None and by_id["w-gone"]["this_job"] is False
    assert by_id["w-stop"]["doing"] == "stopped"


TASKS = [TaskRecord.from_doc(doc) for doc in [
    {"task_id": "a:e0001:t00000", "epoch": 1, "task_index": 0, "state": "TRAINED",
     "attempts": 1, "worker_id": "w1", "started_at": T0, "finished_at": T0 + 4,
     "fetch_seconds": 1.0, "train_seconds": 2.5, "write_seconds": 0.5, "rows": 200},
    {"task_id": "a:e0001:t00001", "epoch": 1, "task_index": 1, "state": "TRAINED",
     "attempts": 2, "worker_id": "w2", "started_at": T0 + 1, "finished_at": T0 + 5,
     "fetch_seconds": 3.0, "train_seconds": 0.5, "write_seconds": 0.5, "rows": 200},
    {"task_id": "a:e0001:t00002", "epoch": 1, "task_index": 2, "state": "RUNNING",
     "attempts": 1, "worker_id": "w1", "started_at": T0 + 6, "rows": 200},
    {"task_id": "a:e0001:t00003", "epoch": 1, "task_index": 3, "state": "RETRYING",
     "attempts": 1, "worker_id": "w2", "started_at": T0 + 2, "finished_at": T0 + 3,
     "error": "TransientError: boom"},
    {"task_id": "a:e0002:t00000", "epoch": 2, "task_index": 0, "state": "FAILED",
     "attempts": 5, "worker_id": "w2", "started_at": T0 + 7, "finished_at": T0 + 8,
     "error": "PermanentError: bad shard"},
]]


AT_ROUND_1 = {"epoch": 1, "round": 1, "plan": PLAN}  # epoch 1's tasks 0 and 1 are folded


def test_task_state_counts_come_from_the_jobs_counters_and_its_epochs_open_rounds():
    """Folded tasks are the job's counters (6 applied); the current epoch's documents of rounds
    not folded yet add one running and one retrying; an earlier epoch's document (the FAILED
    one of epoch 2 does not count at epoch 1) adds nothing; queued is what is left."""
    counts = workers_tasks.task_state_counts(a_job(tasks_planned=20, **AT_ROUND_1), TASKS)
    assert counts == {"queued": 12, "running": 1, "retrying": 1, "done": 6, "failed": 0}
    failed = workers_tasks.task_state_counts(a_job(tasks_planned=20, tasks_applied=4, tasks_failed=1,
                                        epoch=2, round=0, plan=PLAN), TASKS)
    assert failed == {"queued": 14, "running": 0, "retrying": 0, "done": 4, "failed": 2}
    assert workers_tasks.task_state_counts(a_job(tasks_planned=None), [])["queued"] == 0


def test_a_task_of_a_folded_round_shows_applied_whatever_its_document_last_said():
    """A learner writes its task's document once, when the attempt starts: the round's fold,
    not the document, says the task is done."""
    running = TaskRecord.from_doc({"task_id": "a:e0001:t00000", "epoch": 1, "task_index": 0,
                                   "state": "RUNNING"})
    assert workers_tasks.shown_state(a_job(**AT_ROUND_1), running) == "APPLIED"
    assert workers_tasks.shown_state(a_job(epoch=1, round=0, plan=PLAN), running) == "RUNNING"
    assert workers_tasks.shown_state(a_job(epoch=2, round=0, plan=PLAN), running) == "APPLIED"


def test_task_frame_has_timings_newest_first():
    frame = workers_tasks.task_frame(a_job(**AT_ROUND_1), TASKS, [], now=T0 + 10)
    assert list(frame["task_id"]) == ["a:e0002:t00000", "a:e0001:t00002", "a:e0001:t00003",
                                      "a:e0001:t00001", "a:e0001:t00000"]
    row = frame.set_index("task_id").loc["a:e0001:t00000"]
    assert row["seconds"] == 4.0 and row["train_seconds"] == 2.5 and row["attempts"] == 1
    running = frame.set_index("task_id").loc["a:e0001:t00002"]
    assert running["seconds"] == 4.0 and math.isnan(running["train_seconds"])
    assert frame.set_index("task_id").loc["a:e0002:t00000"]["error"] == "PermanentError: bad shard"
    assert workers_tasks.task_frame(a_job(), [], [], now=T0).empty


STATS = {"a:e0001:t00000": {"fetch_seconds": 1.0, "train_seconds": 2.5, "write_seconds": 0.5},
         "a:e0001:t00001": {"fetch_seconds": 3.0, "train_seconds": 0.5, "write_seconds": 0.5}}


def test_task_timings_come_from_the_version_that_folded_the_task():
    """A folded task's phase timings are those its learner sent with its result, which the
    version records (its document has none)."""
    started = TaskRecord.from_doc({"task_id": "a:e0001:t00001", "epoch": 1, "task_index": 1,
                                   "state": "RUNNING", "started_at": T0})
    frame = workers_tasks.task_frame(a_job(**AT_ROUND_1), [started], [Version(1, "w1", task_stats=STATS)],
                          now=T0 + 10).set_index("task_id")
    assert frame.loc["a:e0001:t00001", "fetch_seconds"] == 3.0
    assert frame.loc["a:e0001:t00001", "state"] == "APPLIED"


def test_timing_summary_over_folded_tasks():
    summary = workers_tasks.timing_summary([Version(1, "w1", task_stats=STATS)]).set_index("phase")
    assert summary.loc["fetch", "tasks"] == 2
    assert summary.loc["fetch", "median_s"] == 2.0 and summary.loc["fetch", "max_s"] == 3.0
    assert summary.loc["train", "median_s"] == 1.5
    assert workers_tasks.timing_summary([]).empty


# --- options, dataset ----------------------------------------------------------------------------

def test_option_rows_cover_every_option_and_mark_changes():
    rows = {r["option"]: r for r in options_data.option_rows(a_job(budget={"reasons": {
        "batch_size": "256: ...", "learning_rate": "0.002: ..."}}))}
    assert tuple(rows) == OPTION_NAMES
    assert rows["epochs"]["value"] == "5" and rows["epochs"]["changed"] == "yes"
    assert rows["batch_size"]["changed"] == "" and rows["batch_size"]["value"] == "32 (auto)"
    assert rows["label_column"]["value"] == "" and rows["learning_rate"]["value"] == "auto"
    assert rows["seed"]["changed"] == "" and rows["lr_schedule"]["changed"] == ""


def test_dataset_facts():
    facts = options_data.dataset_facts(a_job())
    assert facts["rows"] == 1000 and facts["columns"] == 65 and facts["feature columns"] == 64
    assert facts["classes"] == 3 and facts["class names"] == "0, 1, 2"
    assert facts["shards"] == 4 and facts["tasks per epoch"] == 4
    assert options_data.dataset_facts(a_job(dataset=None)) == {}
    many = options_data.dataset_facts(a_job(dataset={"classes": [str(i) for i in range(30)]}))
    assert many["class names"].endswith("…")


# --- model downloads ------------------------------------------------------------------------------

def test_model_files_lists_latest_first_and_ignores_other_objects():
    svc = memory_services()
    store, bucket, job = svc.store, svc.settings.models_bucket, "a-000000000001"
    store.write_bytes(bucket, layout.model_path(job, 12), b"v12", "application/octet-stream")
    store.write_bytes(bucket, layout.model_path(job), b"latest!", "application/octet-stream")
    store.write_bytes(bucket, layout.model_path(job, 3), b"v3", "application/octet-stream")
    store.write_bytes(bucket, layout.weights_path(job, 3, "ab"), b"w", "application/octet-stream")
    store.write_bytes(bucket, f"models/{job}/notes.txt", b"x", "text/plain")
    store.write_bytes(bucket, layout.model_path("a-000000000002"), b"o", "x")
    files = downloads.model_files(store, bucket, job)
    assert [f.label for f in files] == ["latest", "v12", "v3"]
    assert files[0].size == 7 and files[0].path == f"models/{job}/latest.keras"
    assert files[0].file_name == f"{job}-latest.keras"
    assert downloads.model_files(store, bucket, "none-000000000000") == []


def test_download_note_says_which_versions_cannot_be_downloaded():
    job = a_job("a-000000000001", status="DONE", version=3)
    latest = downloads.ModelFile("models/a-000000000001/latest.keras", None, 1)
    v3 = downloads.ModelFile("models/a-000000000001/v000003.keras", 3, 1)
    note = downloads.download_note(job, VERSIONS, [latest, v3])
    assert "v0–v2" in note and "latest" in note
    assert "v0–v2" in downloads.download_note(job, VERSIONS[3:], [latest, v3])  # versions are dense
    every = [downloads.ModelFile(f"models/a-000000000001/v{n:06d}.keras", n, 1) for n in range(4)]
    assert downloads.download_note(job, VERSIONS[3:], [latest, *every]) == ""
    assert "No model exported yet" in downloads.download_note(a_job(), VERSIONS, [])
    assert "without a model" in downloads.download_note(a_job(status="REJECTED"), [], [])


# --- cancel ---------------------------------------------------------------------------------------

CANCELLED = {"status": "CANCELLED", "phase": "cancelled",
             "error": "cancelled by ana@example.com (dashboard) at 2026-11-03 14:05:09 UTC"}


def test_a_cancelled_job_shows_who_cancelled_it_and_no_eta():
    job = a_job("c-000000000001", **CANCELLED)
    row = jobs_list.overview_rows([job], T0 + 30)[0]
    assert row["status"] == "CANCELLED" and row["eta"] == ""
    assert row["reason"] == CANCELLED["error"] == jobs_list.reason(job)
    summary = headline.job_summary(job, VERSIONS, T0 + 30)
    assert summary["eta_seconds"] is None
    assert headline.progress_text(summary) == "6 of 20 tasks applied · cancelled"


def test_download_note_of_a_cancelled_job_offers_its_last_version():
    note = downloads.download_note(a_job("c-000000000001", **CANCELLED), VERSIONS, [])
    assert "cancelled at v3" in note and "bucketlearn download c-000000000001" in note
    early = a_job("c-000000000001", **CANCELLED, version=None)
    assert "cancelled before its first version" in downloads.download_note(early, [], [])


@pytest.mark.parametrize(("headers", "who"), [
    ({"X-Goog-Authenticated-User-Email": "accounts.google.com:ana@example.com"},
     "ana@example.com (dashboard)"),
    ({"x-goog-authenticated-user-email": "ana@example.com"}, "ana@example.com (dashboard)"),
    ({"X-Goog-Authenticated-User-Email": "accounts.google.com:a\nb@x"}, "ab@x (dashboard)"),
    ({}, "the dashboard"), (None, "the dashboard"),
])
def test_canceller_is_the_iap_user_when_there_is_one(headers, who):
    assert actions.canceller(headers) == who


def test_cancel_prompt_says_what_stays():
    assert "its last version, v3, stays downloadable" in actions.cancel_prompt(a_job())
    queued = actions.cancel_prompt(a_job(status="QUEUED", phase="splitting", version=None))
    assert "no model version yet" in queued


# --- upload ---------------------------------------------------------------------------------------

def test_option_metadata_leaves_blanks_out_and_parses_the_rest():
    metadata = actions.option_metadata({"epochs": " 3 ", "batch_size": "", "model": "MLP",
                                   "label_column": None, "learning_rate": "0.01"})
    assert metadata == {"epochs": "3", "model": "mlp", "learning_rate": "0.01"}
    assert resolve_options(metadata=metadata, environ={}).epochs == 3


def test_option_metadata_rejects_bad_values_naming_the_option():
    with pytest.raises(ConfigError) as err:
        actions.option_metadata({"epochs": "0"})
    assert "epochs" in str(err.value)
    with pytest.raises(ConfigError):
        actions.option_metadata({"model": "transformer"})


@pytest.mark.parametrize(("given", "name"), [
    ("digits.csv", "digits.csv"), ("C:\\data\\iris.CSV", "iris.CSV"), ("a/b/c.csv", "c.csv"),
    ("noext", "noext.csv"), ("", "upload.csv"), ("x\x00y.csv", "xy.csv"),
])
def test_upload_object_name(given, name):
    assert actions.upload_object_name(given) == name


class OneCopy(io.BytesIO):
    """An uploaded file as Streamlit hands it over, whose whole-file copy is refused: the
    upload must be read as a stream."""

    def getvalue(self) -> bytes:
        raise AssertionError("the upload was copied whole (getvalue)")


UPLOADED = re.compile(r"^dashboard/[0-9a-f]{16}/digits\.csv$")


def test_upload_csv_streams_the_file_under_a_name_of_its_own():
    """The file is written from its stream, with its options, under
    ``dashboard/<16 hex>/<name>``, so two uploads of one name are two objects, two jobs."""
    # Prepare
    svc = memory_services()
    bucket = svc.settings.uploads_bucket
    first, second = b"a,label\n1,0\n", b"a,label\n2,1\n3,0\n"
    # Execute
    job_1, uri_1 = actions.upload_csv(svc, "digits.csv", OneCopy(first), len(first), {"epochs": "3"})
    job_2, uri_2 = actions.upload_csv(svc, "digits.csv", OneCopy(second), len(second), {})
    # Assert
    names = [info.name for info in svc.store.list(bucket)]
    assert len(names) == 2 and all(UPLOADED.match(n) for n in names), names
    assert {uri_1, uri_2} == {f"gs://{bucket}/{n}" for n in names} and job_1 != job_2
    name_1 = uri_1.removeprefix(f"gs://{bucket}/")
    info = svc.store.stat(bucket, name_1)
    assert info.metadata == {"epochs": "3"} and info.content_type == "text/csv"
    assert svc.store.read_bytes(bucket, name_1) == first
    assert svc.store.read_bytes(bucket, uri_2.removeprefix(f"gs://{bucket}/")) == second
    assert job_1 == layout.job_id_for(bucket, name_1, info.generation)
    assert layout.is_job_id(job_1) and job_1.startswith("digits-")


def test_upload_csv_refuses_a_file_over_the_forms_limit():
    """The form takes at most the deployment's max_file_bytes, and never more than
    UPLOAD_MAX_BYTES (Streamlit holds the file in memory); a larger file is refused before
    anything is read or written, naming the limit and the size."""
    # Prepare
    small = dataclasses.replace(Settings(), limits=Limits(max_file_bytes=10))
    svc = memory_services(small)
    # Execute
    with pytest.raises(ValueError, match=r"at most 10 bytes here; found 11 bytes") as refused:
        actions.upload_csv(svc, "digits.csv", OneCopy(b"x" * 11), 11, {})
    # Assert
    assert "bucketlearn submit" in str(refused.value)
    assert list(svc.store.list(svc.settings.uploads_bucket)) == []
    assert actions.upload_limit_bytes(Settings()) == actions.UPLOAD_MAX_BYTES == 100 * 2**20
    assert actions.upload_limit_mb(Settings()) == 100 and actions.upload_limit_mb(small) == 1
    assert actions.upload_size_problem(Settings(), actions.UPLOAD_MAX_BYTES) is None


def rendered(markdown: str) -> str:
    """What CommonMark (with GFM tables and strikethrough) makes of ``markdown``, as HTML."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(markdown)


@pytest.mark.parametrize("text", [
    "[Session expired – sign in](https://evil.example/login).csv",
    "![x](https://evil.example/p.png) <https://evil.example> <b>bold</b> *em* _em_ `code`",
    "a\n# heading\n- item\n> quote\n| a | b |\n|---|---|\n~~x~~ :red[x] $x$ &amp; \\[x](y)",
    "www.evil.example https://evil.example ana@example.com",
])
def test_a_user_string_renders_as_the_text_it_is(text):
    """``plain`` escapes what Markdown would act on, so a user's string
    renders as its own text (line breaks as spaces), with no link, image, tag or block."""
    html = rendered(formats.plain(text))
    assert "<a " not in html and "<img" not in html and "<b>" not in html
    assert html.count("<p>") == 1 and "<h1>" not in html and "<li>" not in html
    assert "https://" not in formats.plain(text) and "www." not in formats.plain(text)
    shown = unescape(re.sub(r"<[^>]+>", "", html)).strip()
    assert shown == re.sub(r"\s*\n\s*", " ", text)


def test_a_job_parameter_that_is_no_job_id_is_said_as_text():
    assert jobs_list.wanted_job(None) == (None, None)
    assert jobs_list.wanted_job("digits-0123456789ab") == ("digits-0123456789ab", None)
    job_id, said = jobs_list.wanted_job("[sign in](https://evil.example)")
    assert job_id is None and "<a " not in rendered(said) and "is not a job id" in said


# --- figures beyond accuracy ---------------------------------------------------------------------

def _evaluated(n: int, confusion, **fields):
    """A version document as the aggregator writes it since it records the report."""
    report = classification_report(np.array(confusion), loss=0.3)
    return Version.from_doc({**version_doc(n, T0 + 10 * n, samples=400, tasks=2,
                                           acc=report["accuracy"], loss=0.3, train=0.4),
                             **holdout_fields(report, **fields)})


def test_a_version_written_before_the_report_still_renders_with_dashes():
    """An old version document (no macro-F1, no report): every new figure is a dash, the tables
    are empty with a note saying why, no warning; its macro-F1 column is NaN."""
    # Execute
    shown = training_figures.version_report(VERSIONS[3], ["0", "1", "2"])
    frame = training_figures.version_frame(VERSIONS)
    # Assert
    assert dict(shown["metrics"]) == {"Accuracy": "87.5%", "Macro-F1": "—",
                                      "Majority baseline": "—"}
    assert shown["per_class"].empty and shown["confusion"].empty
    assert shown["warning"] is None and "before they were recorded" in shown["note"]
    assert frame["holdout_macro_f1"].isna().all()
    assert training_figures.version_report(None, [])["per_class"].empty
    assert training_figures.evaluated_versions(VERSIONS) == [3, 2, 1]


def test_a_versions_report_gives_per_class_tables_and_the_majority_warning():
    """A binary version that answers 'cat' for every row: precision/recall per class, the
    confusion matrix named by class, ROC AUC among the figures and the warning that accuracy is
    not above always answering 'cat'."""
    # Prepare
    doc = _evaluated(4, [[9, 0], [1, 0]])
    # Execute
    shown = training_figures.version_report(doc, ["cat", "dog"])
    # Assert
    metrics = dict(shown["metrics"])
    assert metrics["Accuracy"] == "90.0%" and metrics["Majority baseline"] == "90.0%"
    assert metrics["ROC AUC"] == "—"  # no scores in a report made from a matrix alone
    assert list(shown["per_class"]["class"]) == ["cat", "dog"]
    assert list(shown["per_class"]["recall"]) == [1.0, 0.0]
    assert list(shown["per_class"]["holdout rows"]) == [9, 1]
    assert shown["confusion"].loc["dog", "cat"] == 1 and shown["confusion"].loc["cat", "dog"] == 0
    assert shown["warning"].startswith("accuracy 90.00% is not above the 90.00% of always "
                                       "answering 'cat'")


def test_a_truncated_report_says_what_it_leaves_out():
    """Beyond the cap the tables keep the largest classes, named, and a note says so."""
    # Prepare
    doc = _evaluated(2, np.diag([3, 1, 2]).tolist(), max_classes=2)
    # Execute
    shown = training_figures.version_report(doc, ["a", "b", "c"])
    # Assert
    assert list(shown["per_class"]["class"]) == ["a", "c"]
    assert list(shown["confusion"].columns) == ["a", "c"]
    assert "2 classes with the most holdout rows, of 3" in shown["note"]
    assert shown["warning"] is None


def test_the_job_summary_warns_and_shows_roc_auc_for_a_binary_head():
    """The head's figures reach the headline: macro-F1, ROC AUC for two classes, the warning."""
    # Prepare
    head = {"version": 3, "holdout_accuracy": 0.9, "holdout_loss": 0.3, "train_loss": 0.3,
            "holdout_macro_f1": 0.47, "holdout_majority_accuracy": 0.9, "holdout_roc_auc": 0.61,
            "holdout_report": {"majority_class": 1}}
    job = a_job(head=head, dataset={"classes": ["no", "yes"]})
    # Execute
    summary = headline.job_summary(job, VERSIONS, T0 + 30)
    # Assert
    metrics = dict(headline_figures(summary))
    assert metrics["Holdout macro-F1"] == "0.4700" and metrics["Holdout ROC AUC"] == "0.6100"
    assert "always answering 'yes'" in summary["warning"]


# --- the job page as a user reads it: the curve, the headline, the form, the words ---------------

def test_a_finished_jobs_versions_carry_its_final_figures_from_its_head():
    """A job that trained faster than its evaluator: no version document has figures, and the
    export wrote the final version's (whole holdout) on the head only. The page reads them on
    the final version, so the curve has it; a version's own figures give way to the head's
    (what the headline shows)."""
    # Prepare
    svc = memory_services()
    head = {"version": 3, "weights_path": "w3", "checksum": "c3", "holdout_accuracy": 0.815,
            "holdout_loss": 0.6, "train_loss": 0.5, "evaluated_version": 3,
            "holdout_macro_f1": 0.8}
    job = a_job("fast-000000000001", status="DONE", phase="done", head=head)
    svc.registry.create_job(job)
    for doc in (version_doc(0, T0), version_doc(1, T0 + 1, acc=0.4, loss=1.1, train=1.2),
                version_doc(2, T0 + 2, train=0.9), version_doc(3, T0 + 3, acc=0.79, train=0.5)):
        svc.registry.versions[(job.job_id, doc["version"])] = doc
    # Execute
    versions = reads.job_bundle(svc.registry, job.job_id, T0 + 10)["versions"]
    frame = training_figures.version_frame(versions)
    # Assert
    accuracy = frame["holdout_accuracy"]
    assert accuracy.isna().tolist() == [True, False, True, False]
    assert accuracy[1] == 0.4 and accuracy[3] == 0.815  # the head's, over the version's 0.79
    assert versions[3].figure("holdout_macro_f1") == 0.8
    assert training_figures.evaluated_versions(versions) == [3, 1]


def test_a_sparse_curve_is_a_line_through_the_versions_evaluated():
    """Holdout figures on versions 1 and 3 only, train loss on every folded version: each
    figure's points are its own versions' (a chart draws no line broken at every gap)."""
    # Prepare
    frame = training_figures.version_frame([
        version(0, T0), version(1, T0 + 1, acc=0.5, loss=1.0, train=1.2),
        version(2, T0 + 2, train=1.0), version(3, T0 + 3, acc=0.8, loss=0.5, train=0.6)])
    # Execute
    accuracy = training_figures.curve(frame, ["holdout_accuracy", "holdout_macro_f1"])
    loss = training_figures.curve(frame, ["holdout_loss", "train_loss"], x="version")
    # Assert
    assert accuracy.values.tolist() == [[1, "Holdout accuracy", 0.5], [3, "Holdout accuracy", 0.8]]
    assert loss.groupby("figure")["version"].apply(list).to_dict() == {
        "Holdout loss": [1, 3], "Train loss": [1, 2, 3]}
    assert "2 of the 4 versions shown" in training_figures.curve_note(frame, "holdout_accuracy", True)
    assert "v3, the final model, on the whole holdout" in training_figures.curve_note(
        frame, "holdout_accuracy", True)
    assert "final model" not in training_figures.curve_note(frame, "holdout_accuracy", False)
    assert "v1, the final model" in training_figures.curve_note(frame, "holdout_accuracy", True, 1)
    every = training_figures.version_frame(VERSIONS[1:])
    assert training_figures.curve_note(every, "holdout_accuracy", True) == ""


@pytest.mark.parametrize("binary", [False, True])
def test_the_headline_keeps_to_rows_of_four_short_values(binary):
    """No headline row holds more than four figures (each a quarter of the page: whole at a
    laptop's 1280 px), and the cost is two significant digits, not six decimals."""
    # Prepare
    head = {"version": 50, "holdout_accuracy": 0.815, "holdout_loss": 0.51, "train_loss": 0.4,
            "holdout_macro_f1": 0.8, "holdout_roc_auc": 0.9}
    job = a_job(status="DONE", version=50, epoch=10, head=head,
                usage={"worker_seconds": 40.0, "firestore_writes": 900},
                dataset={"classes": ["a", "b"] if binary else ["a", "b", "c"]})
    # Execute
    rows = headline.headline_rows(headline.job_summary(job, VERSIONS, T0 + 30))
    # Assert
    figures = dict(f for row in rows for f in row)
    assert all(len(row) <= headline.ROW_FIGURES == 4 for row in rows), rows
    assert figures["Holdout accuracy"] == "81.5%" and figures["Version"] == "50"
    assert re.fullmatch(r"\$0\.\d{1,4}", figures["Est. cost"]), figures["Est. cost"]
    assert ("Holdout ROC AUC" in figures) == binary
    assert "Status" not in figures  # the header's badge


@pytest.mark.parametrize(("usd", "shown"), [
    (None, "—"), (0, "$0"), (0.00004, "< $0.0001"), (0.001242, "$0.0012"), (0.05, "$0.05"),
    (9.99, "$10"), (1234.5, "$1,234")])
def test_format_cost_short(usd, shown):
    assert formats.format_cost_short(usd) == shown


def test_every_counted_quantity_has_a_label_in_words():
    """The usage table names every key the job's processes count (``USAGE_KEYS``) in words:
    none shows as its raw key."""
    # Prepare
    from bucketlearn.domain.usage import USAGE_KEYS

    summary = headline.job_summary(a_job(usage=dict.fromkeys(USAGE_KEYS, 1)), VERSIONS, T0)
    # Execute
    shown = [row["used"] for row in costs.usage_rows(summary)]
    # Assert
    assert set(costs.USAGE_LABELS) == USAGE_KEYS
    assert len(shown) == len(USAGE_KEYS) and not set(shown) & USAGE_KEYS, shown
    assert not any("_" in label for label in shown), shown


@pytest.mark.parametrize("spec", OPTION_SPECS, ids=lambda spec: spec.name)
def test_the_upload_form_shows_each_options_true_default(spec):
    """What the form shows as an option's default is the default a job gets when the field is
    left blank: typed back, it parses to the same value (parallel_tasks: auto, not 0); an
    option whose default is no value (no label column given) says so in words."""
    # Prepare
    fields = {field.name: field for field in options_data.form_fields()}
    real = JobOptions().to_dict()[spec.name]
    # Execute
    field = fields[spec.name]
    # Assert
    assert field.placeholder == f"default: {field.default}"
    assert field.label != spec.name and f"`{spec.name}`" in field.help
    if real is None or real == "":
        assert field.default == spec.default_words and field.default
    else:
        assert parse_option(spec.name, field.default, "the form") == real


def test_the_upload_form_asks_label_column_and_epochs_first():
    fields = options_data.form_fields()
    assert [f.name for f in fields if f.front] == ["label_column", "epochs"]
    assert [f.name for f in fields[:2]] == ["label_column", "epochs"]
    assert sorted(f.name for f in fields) == sorted(OPTION_NAMES)
    rows = {row["option"]: row for row in options_data.option_rows(a_job())}
    assert rows["parallel_tasks"]["default"] == "auto" and rows["parallel_tasks"]["value"] == "auto"


def test_the_column_ranking_is_drawn_or_says_why_not():
    # Prepare
    from bucketlearn.views import importance

    ranked = {"columns": [{"column": "a", "importance": 0.2}], "metric": "r2", "baseline": 0.8,
              "rows": 50, "repeats": 3}
    # Execute
    frame, note = importance.importance_view(a_job(status="DONE", feature_importance=ranked))
    none, unsaid = importance.importance_view(a_job())
    skipped, why = importance.importance_view(a_job(feature_importance={"skipped": "not x"}))
    # Assert
    assert frame.values.tolist() == [["a", 0.2]] and "holdout R² falls" in note
    assert none.empty and unsaid == ""
    assert skipped.empty and why == "Column ranking not x."
