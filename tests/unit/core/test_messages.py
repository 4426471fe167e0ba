"""The topics' edge: every field of a task or result message checked before anything acts on it
(``bucketlearn.messages``, ``TaskMessage.from_dict``, ``ResultMessage.from_dict``)."""

from __future__ import annotations

import json
import math

import pytest

from bucketlearn import layout, messages
from bucketlearn.ports import FAILED, NUDGE, RESULT, ResultMessage, TaskMessage
from bucketlearn.prediction_ports import PredictPart

JOB = "digits-3f2a9c1b7e4d"
DIGEST = "sha256:" + "ab" * 32
PATH = layout.delta_path(JOB, 1, 3, "0123456789abcdef")


def result(**fields) -> dict:
    """A result message's body as a learner sends it, with ``fields`` changed."""
    body = ResultMessage(job_id=JOB, kind=RESULT, epoch=1, task_index=3, round=3,
                         base_version=2, base_digest=DIGEST, path=PATH, end_digest=DIGEST,
                         chained=True, worker_id="bl-worker-0", sent_at=1.7e9,
                         stats={"train_seconds": 0.5, "examples": 256, "train_loss": 0.7,
                                "usage": {"storage_class_a": 1, "worker_seconds": 0.6}}
                         ).to_dict()
    body.update(fields)
    return body


def decode_result(body: dict | bytes) -> tuple[ResultMessage | None, str | None]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return messages.decoder(ResultMessage)(raw)


def test_a_learners_result_message_comes_through_unchanged() -> None:
    """What the project sends decodes to the same message (nothing of ours is refused)."""
    # Prepare
    sent = ResultMessage.from_dict(result())
    # Execute
    message, problem = messages.decoder(ResultMessage)(messages.encode(sent))
    # Assert
    assert problem is None and message == sent
    assert message.stats["usage"] == {"storage_class_a": 1.0, "worker_seconds": 0.6}


@pytest.mark.parametrize(("raw", "says"), [
    (b"not json", "body: expected a JSON object"),
    (b"[1, 2]", "body: expected a JSON object"),
    (json.dumps(result(job_id="a/b")).encode(), "job_id: expected a job id"),
    (json.dumps(result(job_id="../../etc-3f2a9c1b7e4d")).encode(), "job_id: expected a job id"),
    (json.dumps(result(job_id=7)).encode(), "job_id: expected a job id"),
    (json.dumps(result(kind="bogus")).encode(), "kind: expected one of result, failed, nudge"),
    (json.dumps(result(epoch=-1)).encode(), "epoch: expected a whole number"),
    (json.dumps(result(epoch=True)).encode(), "epoch: expected a whole number"),
    (json.dumps(result(epoch="1")).encode(), "epoch: expected a whole number"),
    (json.dumps(result(task_index=10**12)).encode(), "task_index: expected a whole number"),
    (json.dumps(result(base_digest="")).encode().replace(b'"base_digest": ""',
                                                         b'"base_digest": 5'),
     "base_digest: expected 'sha256:'"),
    (json.dumps(result(path="notes/readme.txt")).encode(), "path: expected the result object"),
    (json.dumps(result(path=layout.delta_path("other-3f2a9c1b7e4d", 1, 3, "0" * 16))).encode(),
     "path: expected the result object of task 3 of epoch 1 of job digits-3f2a9c1b7e4d"),
    (json.dumps(result(path=layout.delta_path(JOB, 1, 4, "0" * 16))).encode(),
     "path: expected the result object of task 3"),
    (json.dumps(result(path="")).encode(), "path: expected the object of a result message"),
    (json.dumps(result(chained="yes")).encode(), "chained: expected true or false"),
    (json.dumps(result(worker_id="w\n1")).encode(), "worker_id: expected a string"),
    (json.dumps(result(reason="x" * 5000)).encode(), "reason: expected a string of at most"),
    (json.dumps(result(sent_at=1e300)).encode(), "sent_at: expected a finite number"),
    (json.dumps(result()).encode().replace(b"0.7", b"NaN"), "body: expected strict JSON"),
    (json.dumps(result()).encode().replace(b"0.7", b"Infinity"), "body: expected strict JSON"),
    (json.dumps(result(stats=[1])).encode(), "stats: expected an object"),
    (json.dumps(result(stats={"train_seconds": "fast"})).encode(),
     "stats.train_seconds: expected a finite number"),
    (json.dumps(result(stats={"train_seconds": -3})).encode(),
     "stats.train_seconds: expected a finite number"),
    (json.dumps(result(stats={"usage": {"worker_seconds": -1}})).encode(),
     "stats.usage.worker_seconds: expected a finite number from 0"),
    (json.dumps(result(stats={"usage": 12})).encode(), "stats.usage: expected an object"),
    (json.dumps(result(stats={"pad": "x" * 70_000})).encode(), "body: expected at most 65536"),
], ids=["not-json", "a-list", "slash-id", "dotted-id", "number-id", "unknown-kind",
        "negative-epoch", "bool-epoch", "string-epoch", "huge-task", "number-digest",
        "foreign-path", "other-jobs-path", "other-tasks-path", "no-path", "string-flag",
        "control-char-worker", "long-reason", "huge-time", "nan", "infinity", "stats-list",
        "text-seconds", "negative-seconds", "negative-usage", "usage-number", "oversized"])
def test_a_result_message_that_is_not_ours_is_refused_saying_why(raw: bytes, says: str) -> None:
    """Bad ids, not JSON, forged paths, numbers out of range or not finite, oversized bodies:
    refused at the edge with the field, what was expected and what was found."""
    # Execute
    message, problem = decode_result(raw)
    # Assert
    assert message is None
    assert problem is not None and problem.startswith(says), problem


def test_unknown_stats_and_usage_keys_are_dropped_not_stored() -> None:
    """A key this code does not know (a newer learner's, or anyone's) never reaches the job
    document: only the known stats and the usage quantities the cost estimate prices stay."""
    # Prepare
    body = result(stats={"train_seconds": 1.5, "shell": "rm -rf", "usage": {
        "worker_seconds": 2.0, "bitcoin_mined": 1e9, "firestore_reads": 3}})
    # Execute
    message, problem = decode_result(body)
    # Assert
    assert problem is None
    assert message.stats == {"train_seconds": 1.5,
                             "usage": {"worker_seconds": 2.0, "firestore_reads": 3.0}}


def test_a_diverged_loss_is_sent_as_not_measured() -> None:
    """A learner whose loss went to NaN still announces its result (as strict JSON, the loss as
    null): the fold's own checks judge the result, not the message's parser."""
    # Prepare
    sent = ResultMessage.from_dict(result())
    sent = ResultMessage(**{**sent.__dict__, "stats": {"train_loss": math.nan,
                                                       "train_seconds": 0.2}})
    # Execute
    raw = messages.encode(sent)
    message, problem = messages.decoder(ResultMessage)(raw)
    # Assert
    assert b"NaN" not in raw and problem is None
    assert message.stats == {"train_seconds": 0.2}


@pytest.mark.parametrize("kind", [NUDGE, FAILED])
def test_nudges_and_failures_come_through(kind: str) -> None:
    """A nudge names no object; a failure names its failure marker."""
    # Prepare
    path = layout.failure_marker_path(JOB, 2, 0, "f" * 16) if kind == FAILED else ""
    sent = ResultMessage(job_id=JOB, kind=kind, epoch=2 if path else 0,
                         task_index=0 if path else -1, path=path, reason="why")
    # Execute
    message, problem = messages.decoder(ResultMessage)(messages.encode(sent))
    # Assert
    assert problem is None and message == sent


def task(**fields) -> bytes:
    body = TaskMessage(job_id=JOB, epoch=1, task_index=2, parts=(
        f"jobs/{JOB}/shards/pack-00000.bin#0:4096",), rows=64, round=2, base_version=1,
        weights_path=f"weights/{JOB}/v000001-0123456789abcdef.safetensors",
        span=(0.1, 0.2), base_digest=DIGEST).to_dict()
    body.update(fields)
    return json.dumps(body).encode()


def test_a_task_message_comes_through_unchanged() -> None:
    # Execute
    message, problem = messages.decoder(TaskMessage)(task())
    # Assert
    assert problem is None and message.parts == (f"jobs/{JOB}/shards/pack-00000.bin#0:4096",)
    assert message.span == (0.1, 0.2) and message.base_digest == DIGEST


@pytest.mark.parametrize(("raw", "says"), [
    (task(job_id="a/b"), "job_id: expected a job id"),
    (task(parts=["jobs/other-3f2a9c1b7e4d/shards/pack-00000.bin#0:1"]),
     f"parts: expected names under jobs/{JOB}/"),
    (task(parts="jobs/"), "parts: expected a list"),
    (task(weights_path="weights/other-3f2a9c1b7e4d/v000001-0.safetensors"),
     f"weights_path: expected a name under weights/{JOB}/"),
    (task(span=[0.5, 0.1]), "span: expected start <= end"),
    (task(span=[0, 2]), "span: expected a finite number from 0 to 1"),
    (task(rows=-4), "rows: expected a whole number"),
], ids=["slash-id", "other-jobs-part", "parts-string", "other-jobs-weights", "span-backwards",
        "span-past-end", "negative-rows"])
def test_a_task_message_reaching_outside_its_job_is_refused(raw: bytes, says: str) -> None:
    """A task names only its own job's parts and weights: a forged one cannot make a learner
    read another job's rows."""
    # Execute
    message, problem = messages.decoder(TaskMessage)(raw)
    # Assert
    assert message is None and problem is not None and problem.startswith(says), problem


def predict_part(**fields) -> bytes:
    """A batch prediction part's body as the upload function sends it, ``fields`` changed."""
    body = PredictPart(job_id=JOB, request_id="rows-17-0a1b2c3d", part=1, parts=3,
                       bucket="bl-uploads", name=f"predict/{JOB}/rows.csv", generation=17,
                       start=100, end=200).to_dict()
    body.update(fields)
    return json.dumps(body).encode()


def test_a_prediction_part_comes_through_the_tasks_topic_unchanged() -> None:
    message, problem = messages.decoder(TaskMessage)(predict_part())
    assert problem is None and isinstance(message, PredictPart)
    assert (message.part, message.parts, message.start, message.end) == (1, 3, 100, 200)
    assert message.task_id == f"{JOB}:predict-rows-17-0a1b2c3d-1"


@pytest.mark.parametrize(("raw", "says"), [
    (predict_part(name="predict/other-3f2a9c1b7e4d/rows.csv"),
     f"name: expected an object predict/{JOB}/<name>.csv"),
    (predict_part(name="uploads/rows.csv"), "name: expected an object predict/"),
    (predict_part(part=3), "part: expected a whole number from 0 to 2"),
    (predict_part(parts=33), "parts: expected a whole number from 1 to 32"),
    (predict_part(end=100), "end: expected a whole number from 101"),
    (predict_part(request_id="../x"), "request_id: expected a request id"),
], ids=["other-jobs-file", "not-a-request", "part-past-parts", "too-many-parts",
        "empty-range", "path-in-id"])
def test_a_prediction_part_reaching_outside_its_request_is_refused(raw: bytes, says: str
                                                                  ) -> None:
    message, problem = messages.decoder(TaskMessage)(raw)
    assert message is None and problem is not None and problem.startswith(says), problem
