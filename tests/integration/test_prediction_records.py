"""Batch prediction's ports, run against the in-memory implementations *and* the emulators: the
request records (created once, updated under a claim, counted and listed per job), the streamed
write of the output, and a request routed by the upload function end to end on the Google
adapters."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from cloudevents.http import from_http

from bucketlearn import layout
from bucketlearn.domain.job import Job
from bucketlearn.domain.prediction import PredictionRecord
from bucketlearn.entrypoints.functions import handle_upload_event
from bucketlearn.local.relay import cloudevent_for
from bucketlearn.usecases.batch_predict import ChunkStream

pytestmark = pytest.mark.integration


@pytest.fixture(params=["memory", "emulator"])
def backend(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        from bucketlearn.bootstrap import memory_services

        return memory_services()
    return request.getfixturevalue("cloud")


def job_id() -> str:
    return f"job-{uuid.uuid4().hex[:12]}"


def test_a_request_is_recorded_once_updated_under_its_claim_and_counted(backend: Any) -> None:
    registry, job = backend.registry, job_id()
    record = PredictionRecord("rows-1001-abcdef01", job, source={"name": "predict/x.csv"},
                              claim="c1", claimed_at=1.5, created_at=1.0)
    # Execute / Assert
    assert registry.create_prediction(record) is True
    assert registry.create_prediction(record) is False  # a re-delivered event's
    assert registry.get_prediction(job, record.request_id) == record
    assert registry.update_prediction(job, record.request_id, {"rows": 5}, claim="other") is False
    assert registry.update_prediction(job, record.request_id,
                                      {"rows": 7, "state": "DONE", "seconds": 0.25,
                                       "problem": {"row": 3, "column": "b"}}, claim="c1") is True
    read = registry.get_prediction(job, record.request_id)
    assert (read.rows, read.state, read.seconds, read.problem["row"]) == (7, "DONE", 0.25, 3)
    assert registry.update_prediction(job, "no-such-request", {"rows": 1}, claim="c1") is False
    assert registry.get_prediction(job, "no-such-request") is None
    registry.create_prediction(PredictionRecord("rows-1002-abcdef02", job))
    registry.create_prediction(PredictionRecord("rows-1003-abcdef03", job_id()))
    assert registry.count_predictions(job) == 2


def test_a_jobs_requests_are_listed_newest_first_up_to_a_limit(backend: Any) -> None:
    """Ordered by ``created_at``, newest first (two made at the same time: by id, descending),
    at most ``limit``, only the job's own; each record read back whole."""
    registry, job, other = backend.registry, job_id(), job_id()
    made = {"rows-1001-aaaaaaaa": 1.0, "rows-1003-cccccccc": 3.0, "rows-1002-bbbbbbbb": 2.0,
            "rows-1004-dddddddd": 2.0}
    records = {request_id: PredictionRecord(
        request_id, job, source={"bucket": "up", "name": f"predict/{job}/{request_id}.csv",
                                 "generation": 7, "size": 10},
        state="DONE", rows=int(at * 10), seconds=at / 4, output=f"predictions/{job}/x.csv",
        created_at=at, updated_at=at + 1, parts=2,
        part_results={"0": {"rows": 1}, "1": {"rows": 2}}) for request_id, at in made.items()}
    for record in records.values():
        assert registry.create_prediction(record)
    registry.create_prediction(PredictionRecord("rows-1005-eeeeeeee", other, created_at=9.0))
    # Execute
    newest = registry.list_predictions(job, 2)
    every = registry.list_predictions(job)
    # Assert
    assert [r.request_id for r in newest] == ["rows-1003-cccccccc", "rows-1004-dddddddd"]
    assert [r.request_id for r in every] == ["rows-1003-cccccccc", "rows-1004-dddddddd",
                                             "rows-1002-bbbbbbbb", "rows-1001-aaaaaaaa"]
    assert every == [records[r.request_id] for r in every]
    assert [r.job_id for r in registry.list_predictions(other)] == [other]
    assert registry.list_predictions(job_id()) == []
    assert registry.list_predictions(job, 0) == []


def test_a_generator_is_written_as_one_object_and_a_failing_one_writes_none(backend: Any
                                                                           ) -> None:
    """The output's bytes, streamed (20 MiB: more than one of the adapter's 16 MiB chunks);
    when the generator raises, the error reaches the writer and no object is made."""
    store, bucket = backend.store, backend.settings.models_bucket
    block = b"0123456789abcdef" * 65536  # 1 MiB

    def chunks(count: int, fail: bool = False) -> Any:
        for _ in range(count):
            yield block
        if fail:
            raise ValueError("row 7: not a number")

    info = store.write_stream(bucket, "predictions/j/out.csv", ChunkStream(chunks(20)),
                              "text/csv")
    assert info.size == 20 * len(block)
    assert store.read_range(bucket, "predictions/j/out.csv", 19 * len(block), 16) == block[:16]
    with pytest.raises(ValueError, match="row 7"):
        store.write_stream(bucket, "predictions/j/failed.csv", ChunkStream(chunks(2, True)),
                           "text/csv")
    assert store.stat(bucket, "predictions/j/failed.csv") is None


def test_the_upload_function_predicts_a_predict_object_with_a_done_jobs_model(
        backend: Any, tmp_path: Any) -> None:
    """A DONE job's exported model in the models bucket; an object under predict/<job>/ in the
    uploads bucket, its event as the relay sends it: the predictions are in the models bucket,
    the record DONE, no job made; the same event again is a duplicate."""
    from bucketlearn.bootstrap import memory_services
    from bucketlearn.local.simulation import simulate_pipeline
    from bucketlearn.options import JobOptions
    from bucketlearn.usecases.model_files import model_bytes
    from tests.unit.helpers import write_blobs_csv

    svc = backend
    run = simulate_pipeline(str(write_blobs_csv(tmp_path / "blobs.csv", n_rows=300)),
                            JobOptions(epochs=1, rows_per_shard=64), svc=memory_services())
    job = run["job"]
    svc.store.write_bytes(svc.settings.models_bucket, layout.model_path(job.job_id),
                          model_bytes(run["svc"], job.job_id, None)[0], "application/zip")
    assert svc.registry.create_job(Job.from_doc({**job.to_doc(), "created_at": time.time()}))
    info = svc.store.write_bytes(svc.settings.uploads_bucket,
                                 layout.predict_object_name(job.job_id, "rows.csv"),
                                 b"f0,f1,f2,f3\n0.1,0.2,0.3,0.4\n1,2,3,4\n", "text/csv")
    headers, body = cloudevent_for(info)
    event = from_http(headers, json.dumps(body))
    jobs = len(svc.registry.list_jobs())
    # Execute
    answer = handle_upload_event(event, svc)
    # Assert
    assert answer == "accepted" and len(svc.registry.list_jobs()) == jobs
    request_id = layout.prediction_id_for(info.name, info.generation)
    record = svc.registry.get_prediction(job.job_id, request_id)
    assert record.state == "DONE" and record.rows == 2
    text = svc.store.read_bytes(svc.settings.models_bucket, record.output).decode()
    assert text.splitlines()[0].startswith('"f0","f1","f2","f3","prediction","probability_0"')
    assert handle_upload_event(event, svc) == "duplicate"


def test_parts_are_recorded_one_entry_each_and_running_requests_are_listed(backend: Any
                                                                           ) -> None:
    registry, job = backend.registry, job_id()
    record = PredictionRecord("rows-2001-abcdef01", job, claim="c1")
    assert registry.create_prediction(record)
    registry.update_prediction(job, record.request_id, {"parts": 3})
    # Execute / Assert
    after = registry.record_prediction_part(job, record.request_id, 2,
                                            {"rows": 10, "seconds": 0.5, "worker": "w"})
    assert after.parts == 3 and after.part_results == {
        "2": {"rows": 10, "seconds": 0.5, "worker": "w"}}
    after = registry.record_prediction_part(job, record.request_id, 0, {
        "rows": 4, "error": "bad", "problem": {"row": 3, "column": "b"}})
    assert sorted(after.part_results) == ["0", "2"]
    assert after.part_results["0"]["problem"]["row"] == 3
    assert after.claim == "c1" and after.state == "RUNNING"  # the rest of the record kept
    assert registry.record_prediction_part(job, "no-such-request", 0, {"rows": 1}) is None
    registry.count_part_attempt(job, record.request_id, 1, 5.0)
    counted = registry.count_part_attempt(job, record.request_id, 1, 6.0)
    assert counted.part_attempts == {"1": 2} and sorted(counted.part_results) == ["0", "2"]
    assert counted.updated_at == 6.0
    assert registry.count_part_attempt(job, "no-such-request", 0, 7.0) is None
    again = registry.record_prediction_part(job, record.request_id, 2, {"rows": 0, "error": "x"})
    assert again.part_results["2"] == {"rows": 10, "seconds": 0.5, "worker": "w"}  # it stands
    running = [r.request_id for r in registry.running_predictions() if r.job_id == job]
    assert running == [record.request_id]
    registry.update_prediction(job, record.request_id, {"state": "DONE"})
    assert [r for r in registry.running_predictions() if r.job_id == job] == []


def test_objects_are_composed_and_a_pinned_stream_starts_at_an_offset(backend: Any) -> None:
    store, bucket = backend.store, backend.settings.models_bucket
    folder = f"predictions/{job_id()}"
    names = [f"{folder}/.parts/r/{k:03d}.csv" for k in range(3)]
    pieces = [f"part {k}\n".encode() * (1000 * (k + 1)) for k in range(3)]
    for name, piece in zip(names, pieces, strict=True):
        store.write_bytes(bucket, name, piece, "text/csv")
    # Execute
    info = store.compose(bucket, f"{folder}/all.csv", names, "text/csv", {"request_id": "r"})
    # Assert
    assert store.read_bytes(bucket, f"{folder}/all.csv") == b"".join(pieces)
    assert info.size == sum(map(len, pieces))
    stat = store.stat(bucket, f"{folder}/all.csv")
    assert stat.metadata.get("request_id") == "r" and stat.content_type == "text/csv"
    uploads = backend.settings.uploads_bucket
    data = b"".join(pieces)
    up = store.write_bytes(uploads, f"predict/{folder}.csv", data, "text/csv")
    with store.open_read(uploads, up.name, up.generation, start=12345) as stream:
        assert stream.read() == data[12345:]
