"""Batch prediction by upload on the in-memory ports: ``predict/<JOB>/<NAME>.csv`` in the uploads
bucket becomes ``predictions/<JOB>/<NAME>.csv`` in the models bucket, predicted as
``bucketlearn predict`` predicts, with a status record per request; a bad row is named, a job
that cannot predict is refused, a re-delivered event does the work once."""

from __future__ import annotations

import csv
import dataclasses
import io
import json

import numpy as np
import pytest
from cloudevents.http import from_http

from bucketlearn import layout
from bucketlearn.bootstrap import memory_services
from bucketlearn.config import Limits
from bucketlearn.domain.prediction import PredictionRecord
from bucketlearn.entrypoints import functions as entrypoints
from bucketlearn.events import Outcome, StorageEvent
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.local.relay import cloudevent_for
from bucketlearn.local.simulation import simulate_pipeline
from bucketlearn.options import JobOptions
from bucketlearn.usecases import batch_predict
from bucketlearn.usecases.model_files import model_bytes, predict_file
from bucketlearn.usecases.prediction_rows import READ_BLOCK_BYTES, predicted_rows
from tests.unit.helpers import REPO_DIR, csv_bytes
from tests.unit.steps import start_job

PENGUINS = REPO_DIR / "data" / "penguins.csv"
PENGUINS_NEW = REPO_DIR / "data" / "penguins_new.csv"


def target_rows(n: int, seed: int = 0) -> list[list[str]]:
    """y = 30 a - 20 b + 1000 + noise."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(size=n)
    y = 30 * a - 20 * b + 1000 + rng.normal(scale=2.0, size=n)
    return [[f"{a[i]:.5f}", f"{b[i]:.5f}", f"{y[i]:.3f}"] for i in range(n)]


@pytest.fixture(scope="module")
def penguins_job(tmp_path_factory):
    """A DONE classification job (text columns, NA cells) and its model as a file."""
    run = simulate_pipeline(str(PENGUINS), JobOptions(label_column="species", epochs=2),
                            svc=memory_services())
    svc, job = run["svc"], run["job"]
    assert job.status == "DONE"
    model = tmp_path_factory.mktemp("penguins") / "model.keras"
    model.write_bytes(model_bytes(svc, job.job_id, None)[0])
    return svc, job.job_id, model


@pytest.fixture(scope="module")
def target_job(tmp_path_factory):
    """A DONE regression job (y from a and b) and its model as a file."""
    path = tmp_path_factory.mktemp("target") / "target.csv"
    path.write_bytes(csv_bytes(["a", "b", "y"], target_rows(300)))
    run = simulate_pipeline(str(path), JobOptions(epochs=2, rows_per_shard=64),
                            svc=memory_services())
    svc, job = run["svc"], run["job"]
    assert job.status == "DONE"
    model = path.parent / "model.keras"
    model.write_bytes(model_bytes(svc, job.job_id, None)[0])
    return svc, job.job_id, model


def request(svc, job_id: str, name: str, data: bytes, load=None):
    """Upload ``data`` to predict/<job>/<name> and hand its event to the use case: (outcome,
    request id, the event)."""
    info = svc.store.write_bytes(svc.settings.uploads_bucket,
                                 layout.predict_object_name(job_id, name), data, "text/csv")
    event = StorageEvent(info.bucket, info.name, info.generation, info.size)
    outcome, request_id = batch_predict.handle_predict(svc, event, load)
    return outcome, request_id, event


def output_rows(svc, job_id: str, name: str) -> list[dict[str, str]]:
    data = svc.store.read_bytes(svc.settings.models_bucket,
                                layout.predictions_path(job_id, name.removesuffix(".csv")))
    return list(csv.DictReader(io.StringIO(data.decode())))


def test_a_classification_file_without_its_label_is_predicted_as_predict_does(penguins_job,
                                                                              tmp_path):
    """The input's columns and cells as they were, then the prediction and a probability per
    class (summing to 1); the predictions are ``bucketlearn predict``'s on the same rows."""
    svc, job_id, model = penguins_job
    data = PENGUINS.read_bytes()
    lines = data.decode().splitlines()
    unlabeled = "\n".join(",".join(line.split(",")[1:]) for line in lines) + "\n"
    # Execute
    outcome, request_id, _ = request(svc, job_id, "unlabeled.csv", unlabeled.encode())
    # Assert
    assert outcome is Outcome.ACCEPTED
    record = svc.registry.get_prediction(job_id, request_id)
    assert record.state == "DONE" and record.rows == len(lines) - 1
    assert record.output == f"predictions/{job_id}/unlabeled.csv" and record.error is None
    assert record.seconds is not None and record.seconds >= 0
    rows = output_rows(svc, job_id, "unlabeled.csv")
    (tmp_path / "unlabeled.csv").write_text(unlabeled)
    expected = predict_file(str(model), str(tmp_path / "unlabeled.csv"), None)["predictions"]
    assert [r["prediction"] for r in rows] == expected
    classes = ["Adelie", "Chinstrap", "Gentoo"]
    assert list(rows[0]) == [*lines[0].split(",")[1:], "prediction",
                             *(f"probability_{c}" for c in classes)]
    assert rows[3]["bill_length_mm"] == "NA" and rows[0]["sex"] == "male"  # as they were
    sums = [sum(float(r[f"probability_{c}"]) for c in classes) for r in rows]
    np.testing.assert_allclose(sums, 1.0, atol=1e-5)
    assert all(r["prediction"] == max(classes, key=lambda c: float(r[f"probability_{c}"]))
               for r in rows)


def test_rows_with_unseen_and_missing_cells_are_predicted(penguins_job):
    svc, job_id, _ = penguins_job
    outcome, _, _ = request(svc, job_id, "new.csv", PENGUINS_NEW.read_bytes())
    assert outcome is Outcome.ACCEPTED
    rows = output_rows(svc, job_id, "new.csv")
    assert [r["island"] for r in rows] == ["Biscoe", "Dream", "Torgersen", "Atlantis"]
    assert all(r["prediction"] in ("Adelie", "Chinstrap", "Gentoo") for r in rows)


def test_a_regression_file_with_its_label_is_predicted_as_predict_does(target_job, tmp_path):
    svc, job_id, model = target_job
    data = csv_bytes(["a", "b", "y"], target_rows(50, seed=3))
    # Execute
    outcome, request_id, _ = request(svc, job_id, "more.csv", data)
    # Assert
    assert outcome is Outcome.ACCEPTED
    rows = output_rows(svc, job_id, "more.csv")
    assert list(rows[0]) == ["a", "b", "y", "prediction"]
    (tmp_path / "more.csv").write_bytes(data)
    expected = predict_file(str(model), str(tmp_path / "more.csv"), None)["predictions"]
    np.testing.assert_allclose([float(r["prediction"]) for r in rows], expected, rtol=1e-6)
    assert svc.registry.get_prediction(job_id, request_id).rows == 50


def test_a_bad_cell_fails_the_request_naming_its_row_and_column(target_job):
    """Row 4's ``b`` is text: FAILED, the record names row 4 and column 'b', expected and
    found; nothing is written."""
    svc, job_id, _ = target_job
    rows = target_rows(6, seed=4)
    rows[3][1] = "oops"
    # Execute
    outcome, request_id, _ = request(svc, job_id, "bad.csv", csv_bytes(["a", "b", "y"], rows))
    # Assert
    assert outcome is Outcome.FAILED
    record = svc.registry.get_prediction(job_id, request_id)
    assert record.state == "FAILED" and record.output is None
    assert record.problem["row"] == 4 and record.problem["column"] == "b"
    assert record.problem["found"] == "oops" and "a number" in record.problem["expected"]
    assert "row 4, column 'b'" in record.error
    assert svc.store.stat(svc.settings.models_bucket,
                          layout.predictions_path(job_id, "bad")) is None


def test_a_row_of_the_wrong_width_fails_the_request_naming_its_row(target_job):
    svc, job_id, _ = target_job
    data = csv_bytes(["a", "b", "y"], target_rows(3)) + b"1.0,2.0\n"
    outcome, request_id, _ = request(svc, job_id, "short.csv", data)
    assert outcome is Outcome.FAILED
    record = svc.registry.get_prediction(job_id, request_id)
    assert record.problem["row"] == 4 and "3 fields" in record.problem["expected"]


def test_missing_feature_columns_are_named(target_job):
    svc, job_id, _ = target_job
    outcome, request_id, _ = request(svc, job_id, "nob.csv", b"a,y\n1.0,2.0\n")
    assert outcome is Outcome.FAILED
    record = svc.registry.get_prediction(job_id, request_id)
    assert "lacks feature columns" in record.error and "no column 'b'" in record.error


def test_a_job_that_is_not_done_is_refused_naming_it_and_its_status(tmp_path):
    svc, job_id = start_job(tmp_path)  # split, its first round published: QUEUED
    outcome, request_id, _ = request(svc, job_id, "early.csv", b"f0,f1,f2,f3\n1,2,3,4\n")
    assert outcome is Outcome.REJECTED
    record = svc.registry.get_prediction(job_id, request_id)
    assert record.state == "REJECTED"
    assert f"job {job_id} is QUEUED: expected a job that is DONE" in record.error
    unknown = "nosuchjob-000000000000"
    outcome, request_id, _ = request(svc, unknown, "x.csv", b"f0\n1\n")
    assert outcome is Outcome.REJECTED
    assert f"job {unknown}: no such job" in svc.registry.get_prediction(
        unknown, request_id).error


def test_a_duplicate_event_does_the_work_once(target_job):
    svc, job_id, _ = target_job
    loads = []

    def load(data: bytes):
        loads.append(len(data))
        return batch_predict.load_model_bytes(data)

    outcome, request_id, event = request(svc, job_id, "twice.csv",
                                         csv_bytes(["a", "b"], [[1, 2]]), load)
    before = svc.registry.get_prediction(job_id, request_id)
    # Execute
    again = batch_predict.handle_predict(svc, event, load)
    # Assert
    assert outcome is Outcome.ACCEPTED and again == (Outcome.DUPLICATE, request_id)
    assert len(loads) == 1 and svc.registry.get_prediction(job_id, request_id) == before


def test_a_request_abandoned_by_a_dead_invocation_is_taken_over(target_job):
    """A RUNNING record whose claim is older than the lease: the retried event predicts."""
    svc, job_id, _ = target_job
    info = svc.store.write_bytes(svc.settings.uploads_bucket,
                                 layout.predict_object_name(job_id, "stale.csv"),
                                 csv_bytes(["a", "b"], [[1, 2], [3, 4]]), "text/csv")
    request_id = layout.prediction_id_for(info.name, info.generation)
    svc.registry.create_prediction(PredictionRecord(request_id, job_id, claim="dead",
                                                    claimed_at=svc.clock() - 3600))
    outcome, _ = batch_predict.handle_predict(
        svc, StorageEvent(info.bucket, info.name, info.generation, info.size))
    record = svc.registry.get_prediction(job_id, request_id)
    assert outcome is Outcome.ACCEPTED and record.state == "DONE" and record.rows == 2


def test_a_file_over_the_size_bound_is_refused(target_job):
    svc, job_id, _ = target_job
    small = dataclasses.replace(svc, settings=dataclasses.replace(
        svc.settings, limits=Limits(max_predict_bytes=100)))
    outcome, request_id, _ = request(small, job_id, "big.csv",
                                     csv_bytes(["a", "b"], target_rows(20)))
    assert outcome is Outcome.REJECTED
    error = svc.registry.get_prediction(job_id, request_id).error
    assert "expected a file of at most 100 bytes" in error and "BUCKETLEARN_MAX_PREDICT_BYTES" in error


def test_requests_a_job_are_bounded(target_job):
    """Past ``max_predict_requests`` requests a job, a request is refused (every state counts)."""
    svc, job_id, _ = target_job
    so_far = svc.registry.count_predictions(job_id)
    bounded = dataclasses.replace(svc, settings=dataclasses.replace(
        svc.settings, limits=Limits(max_predict_requests=so_far + 1)))
    assert request(bounded, job_id, "last.csv", b"a,b\n1,2\n")[0] is Outcome.ACCEPTED
    outcome, request_id, _ = request(bounded, job_id, "over.csv", b"a,b\n1,2\n")
    assert outcome is Outcome.REJECTED
    assert f"expected at most {so_far + 1} prediction requests a job" in \
        svc.registry.get_prediction(job_id, request_id).error


def test_the_upload_function_routes_predict_objects_and_makes_no_job(target_job):
    svc, job_id, _ = target_job
    jobs = len(svc.registry.list_jobs())
    info = svc.store.write_bytes(svc.settings.uploads_bucket,
                                 layout.predict_object_name(job_id, "routed.csv"),
                                 csv_bytes(["a", "b"], [[1, 2]]), "text/csv")
    headers, body = cloudevent_for(info)
    # Execute
    answer = entrypoints.handle_upload_event(from_http(headers, json.dumps(body)), svc)
    # Assert
    assert answer == "accepted" and len(svc.registry.list_jobs()) == jobs
    assert output_rows(svc, job_id, "routed.csv")[0]["a"] == "1"
    bad_name = svc.store.write_bytes(svc.settings.uploads_bucket, "predict/not-a-job/x.csv",
                                     b"a\n1\n", "text/csv")
    headers, body = cloudevent_for(bad_name)
    assert entrypoints.handle_upload_event(from_http(headers, json.dumps(body)),
                                           svc) == "rejected"


def test_the_output_is_streamed_a_batch_at_a_time(target_job):
    """A file of several read blocks: several output chunks, one header, every row once."""
    svc, job_id, _ = target_job
    rows = [[f"{i % 97 / 10:.6f}", f"{i % 89 / 10:.6f}", "0"] for i in range(600_000)]
    data = csv_bytes(["a", "b", "y"], rows)
    assert len(data) > 2 * READ_BLOCK_BYTES
    loaded = batch_predict.load_model_bytes(model_bytes(svc, job_id, None)[0])
    source = SourceFile("big.csv", len(data), lambda: io.BytesIO(data))
    _, batches = predicted_rows(source, loaded, Limits())
    chunks = list(batch_predict.csv_chunks(loaded, batches))
    assert len(chunks) >= 3
    text = b"".join(chunks).decode()
    assert text.count("prediction") == 1 and text.count("\n") == len(rows) + 1


def test_an_empty_cell_for_a_model_of_complete_numbers_names_its_row_and_column(target_job):
    """The model trained on complete numeric rows (a matrix model) cannot take a missing cell:
    the request FAILS naming row 3's ``a``, as an input problem (so a fanned-out request counts
    its row from the file's start)."""
    svc, job_id, _ = target_job
    rows = target_rows(5, seed=5)
    rows[2][0] = ""
    # Execute
    outcome, request_id, _ = request(svc, job_id, "hole.csv", csv_bytes(["a", "b", "y"], rows))
    # Assert
    record = svc.registry.get_prediction(job_id, request_id)
    assert outcome is Outcome.FAILED and record.state == "FAILED"
    assert (record.problem["row"], record.problem["column"]) == (3, "a")
    assert "a finite number" in record.problem["expected"]
    assert record.problem["found"] == "an empty cell or a missing-value marker"
