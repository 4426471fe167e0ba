"""A job's batch prediction requests listed where a user looks: ``bucketlearn status`` (the
``predictions`` of the status object, and its text) and the dashboard's Batch predictions tab
(its read model), on the in-memory services with records as the upload function writes them."""

from __future__ import annotations

import dataclasses
import json
import math

import pandas as pd
import pytest

from bucketlearn import layout
from bucketlearn.adapters.metered import Meter, MeteredRegistry
from bucketlearn.bootstrap import memory_services
from bucketlearn.domain.job import Job
from bucketlearn.domain.prediction import PredictionRecord, error_text, rows_per_second
from bucketlearn.entrypoints.cli.printing import prediction_line, prediction_lines
from bucketlearn.usecases.status import RECENT_PREDICTIONS, prediction_summary
from bucketlearn.views import headline, predictions, reads

T0 = 1_700_000_000.0
JOB = "penguins-0123456789ab"
UPLOADS = "bucketlearn-uploads"


def a_done_job(job_id: str = JOB) -> Job:
    return Job.from_doc({
        "job_id": job_id, "status": "DONE", "phase": "done", "created_at": T0 - 600,
        "updated_at": T0 - 500, "finished_at": T0 - 500, "version": 2, "epoch": 2,
        "source": {"bucket": UPLOADS, "name": "penguins.csv", "generation": 1, "size": 10},
        "model_path": layout.model_path(job_id), "tasks_applied": 2, "tasks_planned": 2})


def a_request(n: int, name: str, state: str = "DONE", job_id: str = JOB, **fields
              ) -> PredictionRecord:
    """Request ``n`` (made at T0 + n) of ``predict/<job>/<name>``, as the use case ends it."""
    object_name = layout.predict_object_name(job_id, name)
    done = {"rows": 100 * n, "seconds": 0.5 * n,
            "output": layout.predictions_path(job_id, name.removesuffix(".csv"))}
    return PredictionRecord(
        layout.prediction_id_for(object_name, 1000 + n), job_id,
        source={"bucket": UPLOADS, "name": object_name, "generation": 1000 + n, "size": 99},
        state=state, created_at=T0 + n, updated_at=T0 + n + 1, claim="c",
        **{**(done if state == "DONE" else {}), **fields})


FIVE_PARTS = {str(k): {"rows": 8_000, "seconds": 1.0} for k in range(5)}  # of 8: 40,000 rows


def bad_row(job_id: str, name: str) -> str:
    """A bad row's error as the use case words it (the input's address first)."""
    return (f"gs://{UPLOADS}/{layout.predict_object_name(job_id, name)}, row 5, column "
            "'bill_length_mm': a feature value is not a number; expected a number; found: abc")


@pytest.fixture
def svc():
    """In-memory services whose registry counts what it reads (``adapters.metered``), with a
    DONE job that has had seven requests and a job that has had none."""
    services, meter = memory_services(), Meter(record=True)
    services = dataclasses.replace(services, meter=meter,
                                   registry=MeteredRegistry(services.registry, meter))
    registry = services.registry
    registry.create_job(a_done_job())
    registry.create_job(a_done_job("digits-0123456789ab"))
    for n, name in enumerate(["a.csv", "b.csv", "c.csv", "d.csv", "e.csv"], start=1):
        assert registry.create_prediction(a_request(n, name))
    assert registry.create_prediction(a_request(
        6, "bad rows.csv", "FAILED", rows=4, seconds=0.3, error=bad_row(JOB, "bad rows.csv")))
    assert registry.create_prediction(a_request(7, "big.csv", "RUNNING", parts=8, part_results=FIVE_PARTS))
    registry.create_prediction(a_request(9, "other.csv", job_id="digits-0123456789ab"))
    registry.create_prediction(a_request(8, "x.csv", job_id="digits-0123456789ab"))
    meter.counts.clear()  # (the seeding's writes)
    meter.calls.clear()
    return services


# --- the registry read --------------------------------------------------------------------------

def test_a_jobs_requests_are_listed_newest_first_up_to_the_limit_and_metered(svc):
    # Execute
    newest = svc.registry.list_predictions(JOB, 3)
    every = svc.registry.list_predictions(JOB)
    # Assert
    assert [r.source["name"].rsplit("/", 1)[1] for r in newest] == ["big.csv", "bad rows.csv",
                                                                     "e.csv"]
    assert newest[2] == a_request(5, "e.csv")
    assert [r.created_at - T0 for r in every] == [7, 6, 5, 4, 3, 2, 1]
    assert svc.registry.list_predictions("nope-000000000000") == []
    assert svc.usage(JOB) == {"firestore_reads": 3 + 7}  # a read a record returned
    assert svc.usage("nope-000000000000") == {"firestore_reads": 1}  # (an empty query: one)


# --- bucketlearn status ------------------------------------------------------------------------

def test_the_status_lists_the_newest_requests_with_a_count_in_two_reads(svc):
    # Execute
    summary = prediction_summary(svc.registry, JOB, "bucketlearn-models")
    # Assert
    assert summary["count"] == 7
    recent = summary["recent"]
    assert len(recent) == RECENT_PREDICTIONS == 5
    assert [r["state"] for r in recent] == ["RUNNING", "FAILED", "DONE", "DONE", "DONE"]
    expected = a_request(5, "e.csv").status()
    assert recent[2] == {**expected, "output_uri":
                         f"gs://bucketlearn-models/predictions/{JOB}/e.csv"}
    assert "claim" not in recent[0] and "output_uri" not in recent[1]
    assert svc.usage(JOB) == {"firestore_reads": 1 + 5}  # the count, then one limited query


def test_a_job_without_requests_has_a_count_of_0_read_once(svc):
    job = "iris-00000000000d"
    assert prediction_summary(svc.registry, job) == {"count": 0, "recent": []}
    assert svc.usage(job) == {"firestore_reads": 1}  # the count only


def test_status_prints_a_line_a_request_under_a_heading(svc, run_cli, capsys):
    # Execute
    code = run_cli(svc, "status", JOB)
    # Assert
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    start = lines.index("predictions: 7 requests, the newest 5")
    models = svc.settings.models_bucket
    assert lines[start + 1:] == [
        "  RUNNING  big.csv: 40,000 rows so far, 8 parts",
        "  FAILED   bad rows.csv: 4 rows in 0.3 s: row 5, column 'bill_length_mm': a feature "
        "value is not a number; expected a number; found: abc",
        f"  DONE     e.csv: 500 rows in 2.5 s -> gs://{models}/predictions/{JOB}/e.csv",
        f"  DONE     d.csv: 400 rows in 2.0 s -> gs://{models}/predictions/{JOB}/d.csv",
        f"  DONE     c.csv: 300 rows in 1.5 s -> gs://{models}/predictions/{JOB}/c.csv",
    ]


def test_status_json_has_the_count_and_the_newest_records(svc, run_cli, capsys):
    code = run_cli(svc, "status", JOB, "--json")
    status = json.loads(capsys.readouterr().out)
    assert code == 0 and status["job_id"] == JOB
    assert status["predictions"]["count"] == 7
    assert [r["request_id"] for r in status["predictions"]["recent"]] == [
        r.request_id for r in svc.registry.list_predictions(JOB, 5)]
    assert status["predictions"]["recent"][1]["error"] == bad_row(JOB, "bad rows.csv")
    assert status["predictions"]["recent"][0]["parts"] == 8


def test_status_of_a_job_without_requests_prints_no_heading(svc, run_cli, capsys):
    svc.registry.create_job(a_done_job("iris-00000000000d"))
    assert run_cli(svc, "status", "iris-00000000000d") == 0
    out = capsys.readouterr().out
    assert "model:" in out and "predictions" not in out
    assert run_cli(svc, "status", "iris-00000000000d", "--json") == 0
    assert json.loads(capsys.readouterr().out)["predictions"] == {"count": 0, "recent": []}


def test_a_rejected_request_says_why_without_rows_and_one_of_all_says_so():
    # Prepare
    rejected = a_request(1, "late.csv", "REJECTED", error=(
        f"gs://{UPLOADS}/{layout.predict_object_name(JOB, 'late.csv')}: job {JOB} is RUNNING: "
        "expected a job that is DONE"))
    # Execute
    line = prediction_line(rejected.status())
    lines = prediction_lines({"count": 1, "recent": [rejected.status()]})
    # Assert
    assert line == f"REJECTED late.csv: job {JOB} is RUNNING: expected a job that is DONE"
    assert lines == ["predictions: 1 request", f"  {line}"]
    assert prediction_lines({"count": 0, "recent": []}) == prediction_lines(None) == []


def test_an_error_not_naming_the_input_is_shown_whole():
    source = {"bucket": UPLOADS, "name": "predict/j/a.csv"}
    assert error_text("part 2 of 2: gave up after 5 attempts", source) == (
        "part 2 of 2: gave up after 5 attempts")
    assert error_text(f"gs://{UPLOADS}/predict/j/a.csv: the file lacks feature columns",
                      source) == "the file lacks feature columns"
    assert rows_per_second(100, 0.5) == 200.0
    assert rows_per_second(100, None) is None and rows_per_second(0, 0) is None


# --- the dashboard ------------------------------------------------------------------------------

def test_the_table_has_a_row_a_request_newest_first():
    # Prepare
    records = [a_request(7, "big.csv", "RUNNING", parts=8, part_results=FIVE_PARTS),
               a_request(6, "bad rows.csv", "FAILED", rows=4, seconds=0.25,
                         error=bad_row(JOB, "bad rows.csv")),
               a_request(5, "e.csv", parts=3)]
    # Execute
    frame = predictions.prediction_frame(records, "models")
    # Assert
    assert list(frame.columns) == ["when", "file", "state", "rows", "seconds", "rows_per_s",
                                   "parts", "result"]
    assert list(frame["file"]) == ["big.csv", "bad rows.csv", "e.csv"]
    assert list(frame["state"]) == ["RUNNING", "FAILED", "DONE"]
    assert list(frame["rows"]) == [40_000, 4, 500]
    assert frame["when"].iloc[2] == pd.Timestamp(T0 + 5, unit="s", tz="UTC")
    assert math.isnan(frame["seconds"].iloc[0]) and frame["seconds"].iloc[2] == 2.5
    assert math.isnan(frame["rows_per_s"].iloc[1]) and frame["rows_per_s"].iloc[2] == 200.0
    assert frame["parts"].iloc[0] == 8 and math.isnan(frame["parts"].iloc[1])
    assert list(frame["result"]) == [
        "running", "row 5, column 'bill_length_mm': a feature value is not a number; "
        "expected a number; found: abc", f"gs://models/predictions/{JOB}/e.csv"]
    assert predictions.prediction_frame([]).empty


def test_the_note_says_how_many_are_shown_and_how_to_predict_another():
    note = predictions.prediction_note(20, 57, JOB)
    assert note.startswith("The newest 20 of the job's 57 requests. To predict another file: "
                           f"bucketlearn predict --job {JOB} FILE.csv")
    assert predictions.prediction_note(1, 1, JOB).startswith("The job's 1 request. ")


def test_the_job_page_reads_its_newest_requests_and_counts_only_when_there_may_be_more(svc):
    """Fewer requests than the page shows: their count is the list's, no count query; as many
    or more: one count query besides."""
    # Prepare
    many = memory_services()
    many = dataclasses.replace(many, registry=MeteredRegistry(many.registry, svc.meter))
    many.registry.create_job(a_done_job("many-0123456789ab"))
    for n in range(reads.PREDICTIONS_SHOWN + 3):
        many.registry.create_prediction(a_request(n + 1, f"f{n:02d}.csv",
                                                  job_id="many-0123456789ab"))
    svc.meter.calls.clear()
    # Execute
    bundle = reads.job_bundle(svc.registry, JOB, T0)
    few_calls = [c.kind for c in svc.meter.calls]
    svc.meter.calls.clear()
    full = reads.job_bundle(many.registry, "many-0123456789ab", T0)
    full_calls = [c.kind for c in svc.meter.calls]
    # Assert
    assert bundle["prediction_count"] == 7
    assert [r.created_at - T0 for r in bundle["predictions"]] == [7, 6, 5, 4, 3, 2, 1]
    assert few_calls.count("firestore.list_predictions") == 1
    assert "firestore.count_predictions" not in few_calls
    assert len(full["predictions"]) == reads.PREDICTIONS_SHOWN
    assert full["predictions"][0].created_at == T0 + reads.PREDICTIONS_SHOWN + 3
    assert full["prediction_count"] == reads.PREDICTIONS_SHOWN + 3
    assert full_calls.count("firestore.count_predictions") == 1
    assert reads.job_bundle(svc.registry, "digits-0123456789ab", T0)["prediction_count"] == 2


def test_the_batch_predictions_tab_is_shown_for_a_job_that_has_requests_only():
    job = a_done_job()
    assert headline.job_tabs(job) == list(headline.JOB_TABS)
    assert headline.job_tabs(job, 3) == [*headline.JOB_TABS, "Batch predictions"]
