"""A large batch prediction fanned out over the learners, on the in-memory ports: the upload
function publishes a part a byte range, learners predict the parts, the last part composes them
into the output; the output is the function's own, whatever the boundaries, duplicates and
deaths; a bad row is named by its row in the file."""

from __future__ import annotations

import csv
import dataclasses
import io
import threading

import numpy as np
import pytest

from bucketlearn import layout
from bucketlearn.adapters.memory import MemoryBlobStore, MemoryQueue
from bucketlearn.bootstrap import memory_services
from bucketlearn.domain.prediction import PredictionRecord
from bucketlearn.errors import TransientError
from bucketlearn.events import Outcome, StorageEvent
from bucketlearn.faults import inject
from bucketlearn.local.simulation import simulate_pipeline
from bucketlearn.loops.autoscale import outstanding_parts
from bucketlearn.loops.heartbeat import LearnerTuning
from bucketlearn.loops.learner import Learner
from bucketlearn.loops.watchdog import drain_dead_letters, watchdog_pass
from bucketlearn.options import JobOptions
from bucketlearn.ports import RuntimeCache, TaskMessage
from bucketlearn.prediction_ports import PredictPart, parts_of
from bucketlearn.usecases import batch_predict, predict_parts
from tests.unit.helpers import REPO_DIR

PENGUINS = REPO_DIR / "data" / "penguins.csv"


@pytest.fixture(scope="module")
def penguins_job():
    """A DONE classification job (text columns, NA cells) and a file of its rows without the
    label, 6 copies (2,064 rows)."""
    run = simulate_pipeline(str(PENGUINS), JobOptions(label_column="species", epochs=2),
                            svc=memory_services())
    assert run["job"].status == "DONE"
    lines = PENGUINS.read_text().splitlines()
    header = ",".join(lines[0].split(",")[1:])
    body = [",".join(line.split(",")[1:]) for line in lines[1:]] * 6
    return run["svc"], run["job"].job_id, (header + "\n" + "\n".join(body) + "\n").encode()


def with_part_bytes(svc, part_bytes: int):
    limits = dataclasses.replace(svc.settings.limits, predict_part_bytes=part_bytes)
    return dataclasses.replace(svc, settings=dataclasses.replace(svc.settings, limits=limits))


def upload(svc, job_id: str, name: str, data: bytes):
    info = svc.store.write_bytes(svc.settings.uploads_bucket,
                                 layout.predict_object_name(job_id, name), data, "text/csv")
    event = StorageEvent(info.bucket, info.name, info.generation, info.size)
    outcome, request_id = batch_predict.handle_predict(svc, event)
    return outcome, request_id, event


def run_learner(svc, messages: int) -> int:
    """A learner on ``svc`` handling up to ``messages`` messages (it stops at an empty queue)."""
    return Learner(svc).run(threading.Event(), max_tasks=messages, pull_timeout=0.05)


def output(svc, job_id: str, name: str) -> list[dict[str, str]]:
    data = svc.store.read_bytes(svc.settings.models_bucket,
                                layout.predictions_path(job_id, name))
    return list(csv.DictReader(io.StringIO(data.decode())))


def parts_left(svc, job_id: str, request_id: str) -> list[str]:
    prefix = f"{layout.PREDICTION_PARTS_PREFIX}{job_id}/{request_id}/"
    return [b.name for b in svc.store.list(svc.settings.models_bucket, prefix)]


def test_a_fanned_out_file_is_predicted_as_the_function_predicts_it(penguins_job):
    """Three parts on the learners: the output has the function's rows, cells and predictions
    (the probabilities to float32's precision), in order; the record is DONE with every row
    once, and the parts' objects are gone."""
    svc, job_id, data = penguins_job
    inline = upload(with_part_bytes(svc, 0), job_id, "whole.csv", data)
    assert inline[0] is Outcome.ACCEPTED
    fanned = with_part_bytes(svc, len(data) // 3 + 1)
    before = outstanding_parts(svc.registry)
    # Execute
    outcome, request_id, _ = upload(fanned, job_id, "parts.csv", data)
    published = [m for m in svc.queue.published if isinstance(m, PredictPart)
                 and m.request_id == request_id]
    assert outcome is Outcome.ACCEPTED and len(published) == 3
    assert svc.registry.get_prediction(job_id, request_id).state == "RUNNING"
    assert outstanding_parts(svc.registry) == before + 3
    run_learner(fanned, 3)
    # Assert
    record = svc.registry.get_prediction(job_id, request_id)
    assert record.state == "DONE" and record.parts == 3 and record.rows == 2064
    assert record.output == f"predictions/{job_id}/parts.csv"
    assert outstanding_parts(svc.registry) == before
    expected, got = output(svc, job_id, "whole"), output(svc, job_id, "parts")
    assert len(got) == 2064 and list(got[0]) == list(expected[0])
    assert [r["prediction"] for r in got] == [r["prediction"] for r in expected]
    assert [r["island"] for r in got] == [r["island"] for r in expected]
    probabilities = [c for c in expected[0] if c.startswith("probability_")]
    np.testing.assert_allclose([[float(r[c]) for c in probabilities] for r in got],
                               [[float(r[c]) for c in probabilities] for r in expected],
                               rtol=1e-5, atol=1e-6)
    assert parts_left(svc, job_id, request_id) == []


@pytest.mark.parametrize(("crlf", "read_bytes"), [(False, 1 << 20), (True, 1 << 20),
                                                 (False, 3), (True, 7)])
def test_every_line_is_in_exactly_one_part_wherever_the_boundaries_fall(crlf, read_bytes):
    """The parts' rows, read as files of their own, are the file's rows once each, in order,
    for every place two boundaries can fall (a boundary on a newline, just after it, inside a
    line; the last line without its newline), whatever the reads' size."""
    end = b"\r\n" if crlf else b"\n"
    rows = [f"{i},{'x' * (i % 5)}".encode() for i in range(12)]
    data = b"a,b" + end + end.join(rows)  # no newline after the last row
    svc = memory_services()
    info = svc.store.write_bytes("in", "predict/job-0123456789ab/f.csv", data, "text/csv")
    for first in range(1, len(data)):
        for second in range(first + 1, len(data), 3):
            bounds = [0, first, second, len(data)]
            got = []
            for k in range(3):
                task = PredictPart("job-0123456789ab", "r", k, 3, "in", info.name,
                                   info.generation, bounds[k], bounds[k + 1])
                text = b"".join(predict_parts.PartReader(svc, task, read_bytes).chunks())
                lines = text.split(end)
                assert lines[0] == b"a,b", (bounds, k)
                got.extend(line for line in lines[1:] if line)
            assert got == rows, bounds


def test_a_duplicated_part_and_a_learner_dead_mid_part_apply_once(penguins_job):
    """Part 2 predicted by a learner that died before recording it (its object written), then
    delivered twice more: the output and the rows are those of one clean run."""
    svc, job_id, data = penguins_job
    fanned = with_part_bytes(svc, len(data) // 3 + 1)
    outcome, request_id, _ = upload(fanned, job_id, "dup.csv", data)
    assert outcome is Outcome.ACCEPTED
    part = next(m for m in svc.queue.published if isinstance(m, PredictPart)
                and m.request_id == request_id and m.part == 2)
    predict_parts._predict(fanned, part, "dead-learner")  # wrote its object, then died
    svc.queue.publish([part])  # and a duplicate
    # Execute
    run_learner(fanned, 4)
    # Assert
    record = svc.registry.get_prediction(job_id, request_id)
    assert record.state == "DONE" and record.rows == 2064
    got, given = output(svc, job_id, "dup"), list(csv.DictReader(io.StringIO(data.decode())))
    assert [{c: r[c] for c in given[0]} for r in got] == given


def test_a_bad_row_in_a_later_part_fails_the_request_naming_its_row(penguins_job):
    svc, job_id, data = penguins_job
    lines = data.decode().splitlines()
    bad_row = 1900  # a data row (from 1) in the last part
    cells = lines[bad_row].split(",")
    cells[1] = "long"  # bill_length_mm, a number column
    lines[bad_row] = ",".join(cells)
    bad = ("\n".join(lines) + "\n").encode()
    fanned = with_part_bytes(svc, len(bad) // 3 + 1)
    # Execute
    outcome, request_id, _ = upload(fanned, job_id, "bad.csv", bad)
    run_learner(fanned, 3)
    # Assert
    record = svc.registry.get_prediction(job_id, request_id)
    assert outcome is Outcome.ACCEPTED and record.state == "FAILED"
    assert record.problem["row"] == bad_row and record.problem["column"] == "bill_length_mm"
    assert f"row {bad_row}" in record.error and "found: long" in record.error
    assert record.output is None and parts_left(svc, job_id, request_id) == []
    with pytest.raises(Exception, match="no such object"):
        svc.store.read_bytes(svc.settings.models_bucket, layout.predictions_path(job_id, "bad"))


@pytest.mark.parametrize("counted", ["by Pub/Sub", "on the record"])
def test_a_part_that_kills_its_learner_every_time_fails_the_request_naming_it(penguins_job,
                                                                            counted):
    """Its attempts counted by Pub/Sub's delivery attempt, or, where there is none (the
    emulator, no dead-letter policy), on the record by each delivery that began it."""
    svc, job_id, data = penguins_job
    fanned = with_part_bytes(svc, len(data) // 2 + 1)
    outcome, request_id, _ = upload(fanned, job_id, f"poison-{counted[:2]}.csv", data)
    part = next(m for m in svc.queue.published if isinstance(m, PredictPart)
                and m.request_id == request_id and m.part == 1)
    attempts = fanned.settings.max_task_attempts
    # Execute: part 0 predicted; part 1's last delivery comes after every attempt was spent
    if counted == "by Pub/Sub":
        assert predict_parts.predict_part(fanned, part, attempts + 1, "w") is True
    else:
        for _ in range(attempts):  # learners that died before recording it
            svc.registry.count_part_attempt(job_id, request_id, 1, svc.clock())
        assert predict_parts.predict_part(fanned, part, None, "w") is True
    run_learner(fanned, 2)
    # Assert
    record = svc.registry.get_prediction(job_id, request_id)
    assert outcome is Outcome.ACCEPTED and record.state == "FAILED"
    assert "part 2 of 2" in record.error and f"after {attempts} attempts" in record.error


def test_a_duplicate_upload_event_after_the_fan_out_publishes_nothing(penguins_job):
    svc, job_id, data = penguins_job
    fanned = with_part_bytes(svc, len(data) // 2 + 1)
    outcome, request_id, event = upload(fanned, job_id, "twice.csv", data)
    published = len(svc.queue.published)
    # Execute
    again, same = batch_predict.handle_predict(fanned, event)
    # Assert
    assert outcome is Outcome.ACCEPTED and again is Outcome.DUPLICATE and same == request_id
    assert len(svc.queue.published) == published
    run_learner(fanned, 2)
    assert svc.registry.get_prediction(job_id, request_id).rows == 2064


def test_a_lost_part_is_published_again_by_the_watchdog_then_given_up(penguins_job):
    """Part 1's message lost: once the request has been still for the stall time the watchdog
    publishes it again (and the request ends DONE); a part still unrecorded after every
    republish, and a day more, is given up, and the request ends FAILED naming it."""
    svc, job_id, data = penguins_job
    stall = svc.settings.stall_seconds
    fanned = with_part_bytes(svc, len(data) // 3 + 1)
    outcome, request_id, _ = upload(fanned, job_id, "lost.csv", data)
    lost = [m for m in svc.queue.published if isinstance(m, PredictPart)
            and m.request_id == request_id and m.part == 1]
    pulled = [svc.queue.pull(0.1) for _ in range(3)]
    for received in pulled:  # part 1 dropped, the others handed back
        received.ack() if received.message == lost[0] else received.nack()
    run_learner(fanned, 2)
    assert svc.registry.get_prediction(job_id, request_id).unrecorded_parts() == [1]
    now = svc.clock()
    assert [a for a in watchdog_pass(fanned, now + stall / 2)
            if a.get("request_id") == request_id] == []  # not still for long enough
    # Execute
    actions = [a for a in watchdog_pass(fanned, now + stall + 1)
               if a.get("request_id") == request_id]
    run_learner(fanned, 1)
    # Assert
    assert actions == [{"request_id": request_id, "action": "republish", "parts": [1]}]
    record = svc.registry.get_prediction(job_id, request_id)
    assert record.state == "DONE" and record.rows == 2064 and record.republished == 1
    # and once every republish is spent
    outcome, request_id, _ = upload(fanned, job_id, "lost-for-good.csv", data)
    while (received := svc.queue.pull(0.1)) is not None:
        received.ack()  # every part lost
    svc.registry.update_prediction(job_id, request_id,
                                   {"republished": predict_parts.MAX_REPUBLISHES})
    now = svc.clock()
    waiting = [a for a in watchdog_pass(fanned, now + stall + 1)
               if a.get("request_id") == request_id]
    actions = [a for a in watchdog_pass(fanned, now + predict_parts.GIVE_UP_SECONDS + 1)
               if a.get("request_id") == request_id]
    record = svc.registry.get_prediction(job_id, request_id)
    assert waiting == [] and actions[0]["action"] == "give up" and record.state == "FAILED"
    assert "part 1 of 3" in record.error and "no learner recorded it" in record.error


def test_a_recorded_part_stands_whoever_records_it_after(penguins_job):
    """A part recorded, then given up by the watchdog (or a late success after a give-up): the
    first entry stands, so the request keeps the outcome it ended with, and its output."""
    svc, job_id, data = penguins_job
    fanned = with_part_bytes(svc, len(data) // 2 + 1)
    outcome, request_id, _ = upload(fanned, job_id, "raced.csv", data)
    run_learner(fanned, 2)
    part = parts_of(svc.registry.get_prediction(job_id, request_id), [1])[0]
    # Execute
    predict_parts.give_up_part(fanned, part, "the watchdog's give-up, too late")
    # Assert
    record = svc.registry.get_prediction(job_id, request_id)
    assert record.state == "DONE" and record.error is None and record.rows == 2064
    assert "error" not in record.part_results["1"]
    outcome, failed_id, _ = upload(fanned, job_id, "raced-2.csv", data)
    part = parts_of(svc.registry.get_prediction(job_id, failed_id), [1])[0]
    predict_parts.give_up_part(fanned, part, "given up first")
    run_learner(fanned, 2)  # the success comes late
    record = svc.registry.get_prediction(job_id, failed_id)
    assert record.state == "FAILED" and "given up first" in record.error
    assert "error" in record.part_results["1"] and record.output is None


def test_a_backend_failing_at_the_fan_out_lets_the_claim_go_for_the_retry(penguins_job):
    svc, job_id, data = penguins_job
    failures = [1]

    def down_once(real, *args, **kwargs):
        if failures[0] and "parts" in args[2]:
            failures[0] -= 1
            raise TransientError("firestore is unavailable")
        return real(*args, **kwargs)

    flaky = inject(with_part_bytes(svc, len(data) // 2 + 1), "registry",
                   update_prediction=down_once)
    info = svc.store.write_bytes(svc.settings.uploads_bucket,
                                 layout.predict_object_name(job_id, "flaky.csv"), data,
                                 "text/csv")
    event = StorageEvent(info.bucket, info.name, info.generation, info.size)
    # Execute
    with pytest.raises(TransientError):
        batch_predict.handle_predict(flaky, event)
    request_id = layout.prediction_id_for(info.name, info.generation)
    let_go = svc.registry.get_prediction(job_id, request_id)
    again, _ = batch_predict.handle_predict(flaky, event)  # the event's retry, at once
    run_learner(flaky, 2)
    # Assert
    assert let_go.claimed_at == 0.0 and let_go.parts == 0
    assert again is Outcome.ACCEPTED
    assert svc.registry.get_prediction(job_id, request_id).state == "DONE"


def test_a_request_whose_function_died_unretried_is_ended_by_the_watchdog(penguins_job):
    svc, job_id, _ = penguins_job
    record = PredictionRecord("stuck-1-0a0b0c0d", job_id, source={"name": "predict/x.csv"},
                              created_at=100.0, updated_at=100.0, claim="c", claimed_at=100.0)
    svc.registry.create_prediction(record)
    # Execute
    actions = [a for a in watchdog_pass(svc, 100.0 + svc.settings.stall_seconds + 1)
               if a.get("request_id") == record.request_id]
    # Assert
    ended = svc.registry.get_prediction(job_id, record.request_id)
    assert actions == [{"request_id": record.request_id, "action": "fail"}]
    assert ended.state == "FAILED" and "upload the file again" in ended.error


def test_a_dead_lettered_part_fails_its_request_and_the_drain_goes_on(penguins_job):
    """Part 1 dead-lettered (Pub/Sub gave up on it) beside a letter that is not ours: the drain
    records part 1 given up, the request ends FAILED naming it, both letters are acknowledged;
    a dead letter of a part already recorded changes nothing."""
    svc, job_id, data = penguins_job
    fanned = with_part_bytes(svc, len(data) // 2 + 1)
    outcome, request_id, _ = upload(fanned, job_id, "dead.csv", data)
    pulled = [svc.queue.pull(0.1) for _ in range(2)]
    doomed = next(r for r in pulled if r.message.part == 1)
    doomed.ack()  # it went to the dead-letter sink instead
    next(r for r in pulled if r.message.part == 0).nack()
    run_learner(fanned, 1)
    sink = MemoryQueue(TaskMessage)
    sink.publish_raw(b"not json")
    sink.publish([doomed.message])
    # Execute
    drained = drain_dead_letters(fanned, sink)
    # Assert
    assert drained == 1 and len(sink.acked) == 2  # both acknowledged
    record = svc.registry.get_prediction(job_id, request_id)
    assert record.state == "FAILED" and "part 2 of 2" in record.error
    assert "Pub/Sub gave up delivering it" in record.error
    assert parts_left(svc, job_id, request_id) == []
    outcome, done_id, _ = upload(fanned, job_id, "dead-but-done.csv", data)
    late = [m for m in svc.queue.published if isinstance(m, PredictPart)
            and m.request_id == done_id and m.part == 1]
    run_learner(fanned, 2)
    sink.publish(late)
    drain_dead_letters(fanned, sink)
    assert svc.registry.get_prediction(job_id, done_id).state == "DONE"


def test_a_backend_outage_mid_part_is_retried_by_the_learner_and_counted_once(penguins_job):
    svc, job_id, data = penguins_job
    fanned = with_part_bytes(svc, len(data) // 2 + 1)
    failures = [2]

    def flaky(real, *args, **kwargs):
        if failures[0]:
            failures[0] -= 1
            raise TransientError("storage is unavailable")
        return real(*args, **kwargs)

    outcome, request_id, _ = upload(fanned, job_id, "outage.csv", data)
    learner = Learner(inject(fanned, "store", write_stream=flaky),
                      tuning=LearnerTuning(transient_backoff_seconds=0.01))
    # Execute
    learner.run(threading.Event(), max_tasks=2, pull_timeout=0.05)
    # Assert
    record = svc.registry.get_prediction(job_id, request_id)
    assert failures == [0] and record.state == "DONE" and record.rows == 2064
    assert record.part_attempts == {"0": 1, "1": 1}


def test_rows_of_parts_without_rows_and_a_part_zero_without_rows_keep_the_header(penguins_job):
    """Parts of 40 bytes: part 0 is the header alone, many parts have no line start; the
    output is still the function's, header first."""
    svc, job_id, data = penguins_job
    small = b"\n".join(data.split(b"\n")[:6]) + b"\n"  # the header and 5 rows
    upload(with_part_bytes(svc, 0), job_id, "small-whole.csv", small)
    fanned = with_part_bytes(svc, 40)
    # Execute
    outcome, request_id, _ = upload(fanned, job_id, "small-parts.csv", small)
    parts = svc.registry.get_prediction(job_id, request_id).parts
    run_learner(fanned, parts)
    # Assert
    assert parts > 5 and svc.registry.get_prediction(job_id, request_id).state == "DONE"
    expected = svc.store.read_bytes(svc.settings.models_bucket,
                                    layout.predictions_path(job_id, "small-whole"))
    got = svc.store.read_bytes(svc.settings.models_bucket,
                               layout.predictions_path(job_id, "small-parts"))
    assert got.split(b"\n")[0] == expected.split(b"\n")[0]
    assert [r["prediction"] for r in output(svc, job_id, "small-parts")] == [
        r["prediction"] for r in output(svc, job_id, "small-whole")]


def test_every_part_predicts_with_the_model_the_request_recorded(penguins_job):
    """The job's model exported again while the parts wait: they predict with the generation
    recorded at the fan-out (read from the versioned models bucket), not the new one."""
    svc, job_id, data = penguins_job
    models = svc.settings.models_bucket
    store = MemoryBlobStore((svc.settings.uploads_bucket, models))
    path = layout.model_path(job_id)
    store.write_bytes(models, path, svc.store.read_bytes(models, path), "application/zip")
    versioned = dataclasses.replace(with_part_bytes(svc, len(data) // 2 + 1), store=store,
                                    cache=RuntimeCache())
    outcome, request_id, _ = upload(versioned, job_id, "pinned.csv", data)
    recorded = svc.registry.get_prediction(job_id, request_id).model_generation
    store.write_bytes(models, path, b"not a model", "application/zip")  # exported again
    # Execute
    run_learner(versioned, 2)
    # Assert
    record = svc.registry.get_prediction(job_id, request_id)
    assert recorded > 0 and record.state == "DONE", record.error
    assert list(versioned.cache.predictors) == [f"{job_id}@{recorded}"]
    assert versioned.cache.models_built == 1


def test_an_older_request_finishing_late_leaves_a_newer_uploads_output_alone(penguins_job):
    """The same name uploaded again while the first request's parts wait: the newer request
    writes the output; the older one, finishing after, ends FAILED saying so and writes
    nothing over it."""
    svc, job_id, data = penguins_job
    fanned = with_part_bytes(svc, len(data) // 2 + 1)
    outcome, older, _ = upload(fanned, job_id, "same.csv", data)
    waiting = [svc.queue.pull(0.1) for _ in range(2)]  # the older request's parts, held
    newer_rows = b"\n".join(data.split(b"\n")[:11]) + b"\n"  # 10 rows: predicted inline
    outcome, newer, _ = upload(fanned, job_id, "same.csv", newer_rows)
    for received in waiting:
        received.nack()
    # Execute
    run_learner(fanned, 2)
    # Assert
    assert svc.registry.get_prediction(job_id, newer).state == "DONE"
    record = svc.registry.get_prediction(job_id, older)
    assert record.state == "FAILED" and "a newer upload of the same name" in record.error
    assert len(output(svc, job_id, "same")) == 10
    assert parts_left(svc, job_id, older) == []
