"""A searched job on the learner pool (``usecases.search_publish``, ``loops.segment``): the real upload,
learner and aggregator code on the in-memory ports. The model it selects is
``train-local --search``'s to the bit whatever the number of learners; a duplicated result, a
writer that died before publishing, a segment that fails every attempt and a cancel each do
what they should."""

from __future__ import annotations

import dataclasses

import pytest

from bucketlearn import layout
from bucketlearn.aggregation.evaluators import InlineEvaluator
from bucketlearn.aggregation.search_writer import _line_doc
from bucketlearn.aggregation.writer import JobAggregator, aggregate_job
from bucketlearn.bootstrap import memory_services
from bucketlearn.config import Limits, Settings
from bucketlearn.domain.lifecycle import CANCELLED, DONE, QUEUED, REJECTED, RUNNING, TRAINING
from bucketlearn.domain.recipe import Score
from bucketlearn.domain.search import (
    draw_candidates,
    due,
    lines_of,
    pair,
    rungs,
    search_record,
    settle,
    standings,
)
from bucketlearn.errors import TransientError
from bucketlearn.local.simulation import simulate_pipeline
from bucketlearn.loops.learner import Learner
from bucketlearn.loops.watchdog import watchdog_pass
from bucketlearn.ml.model import export_keras, load_model
from bucketlearn.options import NONE, SEARCH_AUTO
from bucketlearn.ports import SEGMENT, ResultMessage
from bucketlearn.usecases.cancel import cancel_job
from bucketlearn.usecases.local_search import search_local
from bucketlearn.usecases.status import status_object
from bucketlearn.usecases.upload import StorageEvent, handle_upload
from bucketlearn.views.leaderboard import leaderboard
from tests.unit.helpers import SEARCH_OPTIONS as OPTIONS
from tests.unit.helpers import write_search_table as write_table

SEARCHED = dataclasses.replace(OPTIONS, search=6)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return write_table(tmp_path_factory.mktemp("pool") / "t.csv")


@pytest.fixture(scope="module")
def local(table):
    return search_local(str(table), OPTIONS, 6, svc=memory_services())


def _weights(path):
    model, _ = load_model(str(path))
    return [w.tobytes() for w in model.get_weights()]


def _exported(out, tmp_path, name):
    svc, job = out["svc"], out["job"]
    path = tmp_path / name
    path.write_bytes(svc.store.read_bytes(svc.settings.models_bucket, job.model_path))
    return path


@pytest.mark.parametrize("workers", [1, 3])
def test_the_pool_selects_train_local_searchs_model_to_the_bit(table, local, tmp_path,
                                                                workers):
    # Execute
    out = simulate_pipeline(str(table), SEARCHED, workers, svc=memory_services())
    # Assert: the same candidates kept, the same mean, the same holdout accuracy
    job = out["job"]
    assert job.status == DONE, job.error
    assert job.search["selected"]["candidates"] == local.selected["candidates"]
    assert job.search["selected"]["score"] == local.selected["score"]
    assert job.head.holdout_accuracy == local.accuracy
    mine = tmp_path / "local.keras"
    mine.write_bytes(export_keras(local.model, {"format": 1}))
    assert _weights(_exported(out, tmp_path, "pool.keras")) == _weights(mine)
    # every candidate's standing, as status shows it, is train-local --search's
    shown = status_object(job)
    assert [(c["index"], c["state"], c["epochs"]) for c in shown["candidates"]] == sorted(
        [(c["index"], c["state"], c["epochs"]) for c in local.candidates],
        key=lambda c: [r["index"] for r in shown["candidates"]].index(c[0]))
    assert {c["index"]: c["best"] for c in shown["candidates"]} == {
        c["index"]: c["best"] for c in local.candidates}
    assert shown["selected"]["candidates"] == local.selected["candidates"]
    assert shown["search"]["outstanding"] == 0
    assert job.version == 1 and job.head.version == 1
    # the dashboard's leaderboard: finalists first, what was selected, what it cost
    board, note = leaderboard(job)
    assert list(board["state"]) == ["finalist"] * 4 + ["pruned"] * 2
    assert list(board["candidate"][:4]) == local.selected["candidates"]
    assert note.startswith("Selected: the mean of the 4 finalists") and "vCPU-seconds" in note


def _start(table, svc, options=SEARCHED, name="t.csv"):
    with open(table, "rb") as handle:
        info = svc.store.write_bytes(svc.settings.uploads_bucket, name, handle.read(),
                                     "text/csv", options.to_metadata())
    _, job_id = handle_upload(svc, StorageEvent(info.bucket, info.name, info.generation,
                                                info.size))
    return job_id


def _train_all(svc, learner, limit=100):
    """Every segment on the queue trained by ``learner``; returns the messages handled."""
    handled = 0
    while handled < limit:
        received = svc.queue.pull(0)
        if received is None:
            return handled
        decision = learner.handle(received)
        received.ack() if decision.value == "ack" else received.nack()
        handled += 1
    return handled


def _searched_to_the_end(table, fault):
    """A searched job of ``table`` trained by one learner to its end, each segment's training
    first handed to ``fault(task)`` (which may raise); the job as it ended."""
    from bucketlearn.loops.segment import train_segment

    def faulty(svc, job, task):
        fault(task)
        return train_segment(svc, job, task)

    svc = memory_services()
    job_id = _start(table, svc)
    learner = Learner(svc, "w-0", segment_trainer=faulty)
    for _ in range(20):
        _train_all(svc, learner)
        aggregate_job(svc, job_id)
        if svc.registry.get_job(job_id).is_terminal:
            break
    return svc.registry.get_job(job_id)


def test_a_duplicated_result_and_a_lost_publish_change_nothing(table, local):
    # Prepare: the first rung trained and recorded
    svc = memory_services()
    job_id = _start(table, svc)
    learner = Learner(svc, "w-0")
    assert _train_all(svc, learner) == 6
    messages = []
    while (received := svc.results.pull(0)) is not None:
        messages.append(received.message)
        received.ack()
    aggregate_job(svc, job_id)
    job = svc.registry.get_job(job_id)
    assert sorted(job.search["lines"]) == [str(i) for i in range(6)]
    assert job.status == RUNNING
    # Execute: one result announced again (its object written again under a new name)
    again = messages[0]
    data = svc.store.read_bytes(svc.settings.models_bucket,
                                job.search["lines"][str(again.task_index)]["weights_path"])
    path = again.path.replace(".safetensors", "x.safetensors")
    svc.store.write_bytes(svc.settings.deltas_bucket, path, data, "application/octet-stream")
    svc.results.publish([ResultMessage(job_id=job_id, kind=SEGMENT, epoch=0,
                                       task_index=again.task_index, path=path)])
    # and the writer died after recording rung 0, before publishing rung 1
    record = dict(job.search)
    record["published"] = [p for p in record["published"] if p.endswith(":0")]
    svc.registry.update_job(job_id, {"search": record})
    while (received := svc.queue.pull(0)) is not None:
        received.ack()  # rung 1's messages lost with it
    aggregate_job(svc, job_id)
    # Assert: the duplicate was dropped (its line is as recorded), rung 1 published again
    after = svc.registry.get_job(job_id)
    assert after.search["lines"][str(again.task_index)] == job.search["lines"][
        str(again.task_index)]
    assert sorted(p for p in after.search["published"] if p.endswith(":1")) == sorted(
        pair(i, 1) for i in local.selected["candidates"])
    # and the job ends with train-local --search's model
    _train_all(svc, learner)
    aggregate_job(svc, job_id)
    done = svc.registry.get_job(job_id)
    assert done.status == DONE, done.error
    assert done.head.holdout_accuracy == local.accuracy


def test_a_segment_that_always_fails_drops_its_candidate_and_the_job_goes_on(table):
    # Prepare: candidate 3's training raises, every time
    def failing(task):
        if task.task_index == 3:
            raise RuntimeError("out of memory (injected)")

    # Execute
    job = _searched_to_the_end(table, failing)
    # Assert
    assert job.status == DONE, job.error
    dropped = next(c for c in status_object(job)["candidates"] if c["index"] == 3)
    assert dropped["state"] == "dropped"
    assert "failed after 5 attempts" in dropped["reason"]
    assert "out of memory (injected)" in dropped["reason"]
    assert 3 not in job.search["selected"]["candidates"]


def test_cancel_stops_every_candidate(table):
    # Prepare
    svc = memory_services()
    job_id = _start(table, svc)
    learner = Learner(svc, "w-0")
    received = svc.queue.pull(0)
    learner.handle(received)
    received.ack()
    # Execute
    cancel_job(svc, job_id, "test")
    handled = _train_all(svc, learner)
    aggregate_job(svc, job_id)
    # Assert: the other five segments were skipped, nothing was recorded after the cancel
    job = svc.registry.get_job(job_id)
    assert handled == 5
    assert job.status == CANCELLED
    assert sorted(job.search["lines"]) == []
    assert job.model_path is None


def test_a_searched_upload_records_its_candidates_and_publishes_the_first_rung(table):
    # Execute
    svc = memory_services()
    job_id = _start(table, svc, dataclasses.replace(OPTIONS, search=8))
    # Assert
    job = svc.registry.get_job(job_id)
    assert job.status == QUEUED and job.phase == TRAINING and job.is_published
    assert job.search["count"] == 8 and [r["count"] for r in job.search["rungs"]] == [8, 4]
    assert job.search["published"] == [pair(i, 0) for i in range(8)]
    shown = status_object(job)
    assert shown["search"]["outstanding"] == 8
    assert [c["state"] for c in shown["candidates"]] == ["training"] * 8
    tasks = []
    while (received := svc.queue.pull(0)) is not None:
        tasks.append(received.message)
        received.ack()
    assert sorted((t.task_index, t.epoch, t.segment, t.weights_path) for t in tasks) == [
        (i, 0, True, "") for i in range(8)]


def test_a_candidate_given_up_on_later_keeps_the_rungs_it_passed():
    # Prepare: six candidates; rung 0 (3 epochs) recorded for all, candidate 2 kept
    plan = rungs(6, 9)
    record = search_record(draw_candidates(6, 0, 64, 0.01), plan)
    accuracy = {0: 0.9, 1: 0.7, 2: 0.85, 3: 0.6, 4: 0.8, 5: 0.5}
    for index, value in accuracy.items():
        meta = {"candidate": index, "rung": 0, "epoch": 3, "finished": False,
                "scores": [Score(3, 3, accuracy=value, loss=1 - value).to_dict()]}
        record["lines"][str(index)] = _line_doc({}, meta, 0, f"weights/j/c{index}")
    before = settle(plan, lines_of(record))
    assert before[0].kept == (0, 2, 4, 1)
    # Execute: candidate 2's rung-1 segment fails every attempt (a result with no state)
    given_up = {"candidate": 2, "rung": 1, "state": "dropped", "reason": "failed after 5 "
                "attempts: out of memory", "epoch": 0, "scores": []}
    record["lines"]["2"] = _line_doc(record["lines"]["2"], given_up, 1, "weights/j/c2")
    # Assert: rung 0 decided as before; candidate 2 dropped after its 3 epochs; no segment of
    # a pruned candidate becomes due
    after = settle(plan, lines_of(record))
    assert after[0] == before[0]
    assert record["lines"]["2"]["dropped_at"] == 4 and record["lines"]["2"]["epochs"] == 3
    assert record["lines"]["2"]["weights_path"] == "weights/j/c2"
    record["published"] = [pair(i, 0) for i in range(6)] + [pair(i, 1) for i in (0, 2, 4, 1)]
    assert due(record, after) == []
    dropped = next(r for r in standings(record) if r["index"] == 2)
    assert dropped["state"] == "dropped" and "out of memory" in dropped["reason"]


def test_an_ordinary_result_under_a_searched_job_is_not_taken_for_a_segment(table):
    # Prepare: a searched job, and a round task's result object written under it (a takeover
    # that once republished round tasks, a forged write)
    svc = memory_services()
    job_id = _start(table, svc)
    svc.store.write_bytes(svc.settings.deltas_bucket,
                          layout.delta_path(job_id, 1, 0, "0123456789abcdef"), b"x",
                          "application/octet-stream")
    # Execute
    aggregate_job(svc, job_id)
    # Assert: nothing recorded, nothing failed
    job = svc.registry.get_job(job_id)
    assert job.search["lines"] == {} and not job.is_terminal


def test_an_outage_does_not_spend_a_segments_attempts(table):
    # Prepare: candidate 1's first seven trainings meet a backend outage
    outages = {"left": 7}

    def flaky(task):
        if task.task_index == 1 and outages["left"]:
            outages["left"] -= 1
            raise TransientError("storage unreachable (injected)")

    # Execute
    job = _searched_to_the_end(table, flaky)
    # Assert: more failures than attempts allowed, and candidate 1 trained all the same
    assert job.status == DONE, job.error
    assert outages["left"] == 0
    assert next(c for c in status_object(job)["candidates"] if c["index"] == 1)[
        "state"] != "dropped"


def test_a_searched_upload_without_validation_rows_is_rejected_naming_why(table):
    # Execute
    svc = memory_services()
    job_id = _start(table, svc, dataclasses.replace(SEARCHED, validation_fraction=NONE))
    # Assert
    job = svc.registry.get_job(job_id)
    assert job.status == REJECTED
    assert "selects its candidates on the validation rows" in job.error
    assert "none held out for validation" in job.error


def test_the_deployments_limits_count_every_candidates_epochs(table):
    # Prepare: a limit of twice one model's tasks; a search of 8 trains 48 candidate-epochs
    # against one model's 9
    svc = memory_services()
    tasks = svc.registry.get_job(_start(table, svc, OPTIONS)).plan.total_tasks
    svc = memory_services(Settings(limits=Limits(max_total_tasks=2 * tasks)))
    # Execute
    plain = _start(table, svc, OPTIONS)
    searched = _start(table, svc, dataclasses.replace(SEARCHED, search=8), name="s.csv")
    # Assert
    assert svc.registry.get_job(plain).status != REJECTED
    job = svc.registry.get_job(searched)
    assert job.status == REJECTED and f"{2 * tasks}" in job.error


def test_search_auto_stays_off_on_a_small_table_and_says_why(table):
    # Execute
    svc = memory_services()
    job = svc.registry.get_job(_start(table, svc, dataclasses.replace(OPTIONS,
                                                                      search=SEARCH_AUTO)))
    # Assert: trained as the default job, the reason recorded with the job's budget
    assert job.status == QUEUED and job.phase == TRAINING and not job.search
    assert job.options["search"] == 0
    assert job.budget["reasons"]["search"].startswith("off: ") and "below 20,000" in \
        job.budget["reasons"]["search"]


def test_search_auto_searches_a_large_table_within_the_deployments_limits(tmp_path):
    # Prepare: 30,000 rows, about 24,000 of them to train on
    big = write_table(tmp_path / "big.csv", n=30_000)
    options = dataclasses.replace(OPTIONS, search=SEARCH_AUTO, rows_per_shard=4096)
    svc = memory_services()
    # Execute
    job = svc.registry.get_job(_start(big, svc, options))
    tasks = svc.registry.get_job(_start(big, svc, dataclasses.replace(options, search=0),
                                        name="plain.csv")).plan.total_tasks
    limited = memory_services(Settings(limits=Limits(max_total_tasks=2 * tasks)))
    fitted = limited.registry.get_job(_start(big, limited, options))
    # Assert: 8 candidates where they pay; off (not REJECTED) where they would be over a limit
    assert job.options["search"] == 8 and job.search["count"] == 8
    assert job.budget["reasons"]["search"].startswith("8 candidates: ")
    assert fitted.status == QUEUED and fitted.options["search"] == 0 and not fitted.search
    assert "would be over a limit" in fitted.budget["reasons"]["search"]


def test_the_watchdog_publishes_again_the_segments_a_stalled_search_waits_for(table):
    # Prepare: the first rung's messages lost for good
    svc = memory_services()
    _start(table, svc)
    while (received := svc.queue.pull(0)) is not None:
        received.ack()
    # Execute: too soon, then past the stall time
    soon = watchdog_pass(svc, now=svc.clock() + 10)
    late = watchdog_pass(svc, now=svc.clock() + svc.settings.stall_seconds + 10)
    # Assert
    assert soon == []
    assert [a["action"] for a in late] == ["republish"]
    assert "search: 6 segment(s) without a result" in late[0]["reason"]
    again = []
    while (received := svc.queue.pull(0)) is not None:
        again.append(received.message)
        received.ack()
    assert sorted((t.task_index, t.epoch) for t in again if t is not None and t.segment) == [
        (i, 0) for i in range(6)]


def test_the_writer_winds_up_a_search_it_exported(table):
    # Prepare: every segment trained
    svc = memory_services()
    job_id = _start(table, svc)
    learner = Learner(svc, "w-0")
    aggregator = JobAggregator(svc, job_id, InlineEvaluator(), holder="writer-1")
    aggregator.take_on()
    # Execute: the long-running writer's steps (never reading the job again by itself)
    for _ in range(10):
        _train_all(svc, learner)
        while (received := svc.results.pull(0)) is not None:
            aggregator.hear(received.message, received)
        while aggregator.step():
            pass
        if aggregator.job.is_terminal:
            break
    # Assert: it knows the job ended, and wound it up once (the work prefix deleted)
    assert aggregator.job.status == DONE
    assert aggregator.wound_up
    assert not list(svc.store.list(svc.settings.work_bucket, layout.job_prefix(job_id)))
    assert not aggregator.step()  # nothing more to do: no second export
