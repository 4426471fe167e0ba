"""A large batch prediction request fanned out over the learners: each part is the rows whose
lines start in a byte range of the input (``domain.prediction.part_ranges``), predicted by
whichever learner pulls its message (``prediction_ports.PredictPart``) into an object of its
own (``layout.prediction_part_path``); the part that finds every part recorded composes them
into the output and ends the request (``finish``).

What makes it safe under faults: a part's output is the same whoever predicts it (a part
predicted twice, by a duplicated message or after a learner died mid-part, writes the same
object and the same entry); the request's record keeps one entry a part
(``Registry.record_prediction_part``), so its rows are counted once; a message is acknowledged
only once its part is recorded and, if it was the last, the request ended, so a learner killed
anywhere leaves a message that comes back; composing again writes the same bytes; every part
predicts with the model generation the request recorded. Attempts at a part are counted on the
record (``Registry.count_part_attempt``): one begun more than ``Settings.max_task_attempts``
times (its learner dies each time) is recorded as failed, and the request ends FAILED naming
it; a backend outage is retried by the learner while it keeps the message. A part's message
that is lost (or dead-lettered) is published again, then given up, by the watchdog
(``sweep_predictions``, ``give_up_part``). A bad row ends the request FAILED naming the row
counted from the file's first data row, as the function's own reading would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import IO, Any

from bucketlearn import layout
from bucketlearn.domain.prediction import PredictionRecord, RequestState, parts_outcome
from bucketlearn.errors import (
    NotFoundError,
    ObjectChangedError,
    PermanentError,
    TransientError,
)
from bucketlearn.events import display_uri
from bucketlearn.faults import crash_point
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.ports import Services
from bucketlearn.prediction_ports import PredictPart, parts_of
from bucketlearn.usecases.batch_predict import (
    ChunkStream,
    failure,
    load_model_bytes,
    write_predictions,
)
from bucketlearn.usecases.prediction_rows import LoadedModel

log = logging.getLogger(__name__)

READ_BYTES = 1 << 20  # how much of the input a part reads at a time
MAX_MODELS_KEPT = 2  # exported models a learner keeps loaded to predict with
MAX_REPUBLISHES = 3  # times the watchdog publishes a still request's parts again
GIVE_UP_SECONDS = 86_400.0  # still this long after its republishes: its parts are given up


# runs a call, retrying it through a backend outage (the learner's ``_with_retries``)
Retry = Callable[[Callable[[], Any]], Any]


def predict_part(svc: Services, task: PredictPart, delivery_attempt: int | None,
                 worker_id: str, retry: Retry = lambda call: call()) -> bool:
    """Count an attempt at one part, predict it (unless it is recorded, or its attempts are
    spent) and, when every part is recorded, end the request.

    Returns:
        True when the message is done with (acknowledge it); False to have it back (a backend
        failed for longer than ``retry`` retries).
    """
    try:  # counted once a delivery (a retried increment could count twice)
        record = svc.registry.count_part_attempt(task.job_id, task.request_id, task.part,
                                                 svc.clock())
        if record is None or record.ended:
            log.info("prediction %s part %d: the request is %s; nothing to do", task.request_id,
                     task.part, "unknown" if record is None else record.state)
            if record is not None:
                _delete(svc, [_part_path(task)])  # a late duplicate's part, if it wrote one
            return True
        if str(task.part) not in record.part_results:
            attempts = max(record.part_attempts.get(str(task.part), 0), delivery_attempt or 0)
            entry = _given_up(svc, task, attempts) or retry(
                lambda: _predict(svc, task, worker_id))
            crash_point(svc.settings, "predict.before_record")
            record = retry(lambda: svc.registry.record_prediction_part(
                task.job_id, task.request_id, task.part, {**entry, "at": svc.clock()}))
            if record is None:
                return True
        retry(lambda: finish(svc, task, record))
        crash_point(svc.settings, "predict.before_ack")
    except Exception:  # noqa: BLE001 - a backend still down: the part comes back
        log.warning("prediction %s part %d: a backend failed; the part comes back",
                    task.request_id, task.part, exc_info=True)
        return False
    return True


def _given_up(svc: Services, task: PredictPart, attempts: int) -> dict[str, Any] | None:
    """The entry of a part begun more times than tasks are tried (its learner died each
    time), or None."""
    allowed = svc.settings.max_task_attempts
    if attempts <= allowed:
        return None
    log.error("prediction %s part %d: begun %d times; given up", task.request_id, task.part,
              attempts)
    return {"rows": 0, "error": f"{_where(task)} was not predicted after {allowed} attempts: "
            "expected a learner to finish it; found none did"}


def _where(task: PredictPart) -> str:
    return (f"{display_uri(task.bucket, task.name)}: part {task.part + 1} of {task.parts} "
            f"(bytes {task.start} to {task.end})")


def _predict(svc: Services, task: PredictPart, worker_id: str) -> dict[str, Any]:
    """Predict the part's rows into its object: its entry (rows, or why it could not be).

    Raises:
        TransientError: a backend failed (the call is retried; the part is not recorded).
    """
    started, rows = svc.clock(), [0]
    file = display_uri(task.bucket, task.name)

    def predicted(count: int) -> None:
        rows[0] += count
        crash_point(svc.settings, "predict.mid_part")

    try:
        reader = PartReader(svc, task)
        write_predictions(svc, SourceFile(display_name=file, size=task.end - task.start,
                                          opener=lambda: ChunkStream(reader.chunks())),
                          loaded_model(svc, task.job_id, task.model_generation),
                          _part_path(task), predicted, header=task.part == 0)
    except Exception as exc:  # noqa: BLE001 - transient: retried; else recorded
        if svc.transient(exc):
            raise TransientError(f"{file}: {type(exc).__name__}: {exc}") from exc
        return {"rows": rows[0], **failure(exc, file)}
    return {"rows": rows[0], "seconds": round(svc.clock() - started, 3), "worker": worker_id}


class PartReader:
    """The part read as a file of its own, as often as it is opened (``chunks``): the input's
    header line (read once), then the lines that start in [``task.start``, ``task.end``), each
    whole; part 0 is the file's first bytes, its header included."""

    def __init__(self, svc: Services, task: PredictPart, read_bytes: int = READ_BYTES) -> None:
        self.store, self.task, self.read_bytes = svc.store, task, read_bytes
        self.max_line = svc.settings.limits.max_line_bytes
        self._header: bytes | None = None

    def _open(self, start: int = 0) -> IO[bytes]:
        task = self.task
        return self.store.open_read(task.bucket, task.name, task.generation, start=start)

    def header(self) -> bytes:
        if self._header is None:
            with self._open() as stream:
                self._header, _ = _first_line(stream, self.max_line, self.task.name,
                                              self.read_bytes)
        return self._header

    def chunks(self) -> Iterator[bytes]:
        task = self.task
        if task.start == 0:
            yield from _lines_until(self._open(), 0, b"", task.end, self.read_bytes)
            return
        yield self.header()
        stream = self._open(task.start - 1)  # a line starts at ``start`` when this is a newline
        skipped, rest = _first_line(stream, self.max_line, task.name, self.read_bytes)
        yield from _lines_until(stream, task.start - 1 + len(skipped), rest, task.end,
                                self.read_bytes)


def _first_line(stream: IO[bytes], limit: int, name: str, read_bytes: int
                ) -> tuple[bytes, bytes]:
    """The stream's bytes through its first newline (all of them if it has none), and those
    read past it."""
    line = bytearray()
    while b"\n" not in line:
        chunk = stream.read(min(read_bytes, 64 * 1024))
        if not chunk:
            return bytes(line), b""
        line += chunk
        if len(line) > limit + read_bytes and b"\n" not in line:
            raise PermanentError(f"{name}: expected lines of at most {limit} bytes "
                                 "(BUCKETLEARN_MAX_LINE_BYTES); found a longer one")
    end = line.index(b"\n") + 1
    return bytes(line[:end]), bytes(line[end:])


def _lines_until(stream: IO[bytes], position: int, chunk: bytes, end: int, read_bytes: int
                 ) -> Iterator[bytes]:
    """From ``position`` on (``chunk``: bytes there already read): the bytes before ``end``,
    then through the newline that ends the line under way at ``end`` (nothing more when
    ``end`` starts a line). Closes the stream."""
    try:
        last = b"\n"
        while position < end:
            if not chunk:
                chunk = stream.read(read_bytes)
                if not chunk:
                    return
            last = chunk[:end - position]
            yield last
            position += len(last)
            chunk = chunk[len(last):]
        while not last.endswith(b"\n"):
            if not chunk:
                chunk = stream.read(read_bytes)
                if not chunk:
                    return
            newline = chunk.find(b"\n")
            last = chunk if newline < 0 else chunk[:newline + 1]
            yield last
            chunk = b""
    finally:
        stream.close()


def loaded_model(svc: Services, job_id: str, generation: int = 0) -> LoadedModel:
    """The job's exported model (``models/<job>/latest.keras``; of ``generation``, when not 0),
    loaded once per process and kept by generation; a load counts as a model built (a learner
    hands over to a fresh process past ``max_models``)."""
    bucket, path = svc.settings.models_bucket, layout.model_path(job_id)
    if not generation:
        info = svc.store.stat(bucket, path)
        if info is None:
            raise PermanentError(f"job {job_id}: expected its exported model at {path}; "
                                 "found none")
        generation = info.generation
    kept = svc.cache.predictors
    key = f"{job_id}@{generation}"
    if key not in kept:
        try:
            with svc.store.open_read(bucket, path, generation) as stream:
                data = stream.read()
        except (NotFoundError, ObjectChangedError):
            raise PermanentError(f"job {job_id}: expected its exported model at {path}, "
                                 f"generation {generation}; found none") from None
        kept[key] = load_model_bytes(data)
        svc.cache.models_built += 1
        while len(kept) > MAX_MODELS_KEPT:
            kept.popitem(last=False)
    kept.move_to_end(key)
    return kept[key]


def finish(svc: Services, task: PredictPart, record: PredictionRecord) -> None:
    """End the request once every part is recorded: DONE with the parts composed into the
    output, or FAILED naming the first part's error (or a newer upload of the same name, whose
    request owns the output); then delete the parts' objects."""
    outcome = parts_outcome(record.part_results, task.parts)
    if outcome is None:
        return
    parts = [layout.prediction_part_path(task.job_id, task.request_id, k)
             for k in range(task.parts)]
    if record.ended:
        _delete(svc, parts)  # a finisher died while deleting them
        return
    fields: dict[str, Any] = {"rows": outcome.rows, "updated_at": svc.clock(),
                              "seconds": round(svc.clock() - record.created_at, 3)}
    newer = _newer_upload(svc, task)
    if outcome.error is None and newer is not None:
        fields.update(state=str(RequestState.FAILED), error=(
            f"{display_uri(task.bucket, task.name)}: a newer upload of the same name "
            f"(generation {newer}) owns the output; expected this request's to be the latest; "
            "its predictions were not written"))
    elif outcome.error is not None:
        fields.update(state=str(RequestState.FAILED), error=outcome.error,
                      problem=None if outcome.problem is None else dict(outcome.problem))
    else:
        output = layout.predictions_path(task.job_id, layout.parse_predict_name(task.name)[1])
        try:
            svc.store.compose(svc.settings.models_bucket, output, parts, "text/csv",
                              {"job_id": task.job_id, "request_id": task.request_id})
        except NotFoundError:  # another delivery of a last part ended it and deleted them
            again = svc.registry.get_prediction(task.job_id, task.request_id)
            if again is not None and again.ended:
                return
            raise
        fields.update(state=str(RequestState.DONE), output=output)
    svc.registry.update_prediction(task.job_id, task.request_id, fields)
    log.info("prediction %s of job %s: %s, %d rows in %d parts", task.request_id, task.job_id,
             fields["state"], outcome.rows, task.parts)
    _delete(svc, parts)


def _newer_upload(svc: Services, task: PredictPart) -> int | None:
    """The generation of a newer upload of the request's name (its request writes the same
    output, so this older one must not overwrite it), or None."""
    current = svc.store.stat(task.bucket, task.name)
    return current.generation if current is not None and \
        current.generation > task.generation else None


def give_up_part(svc: Services, task: PredictPart, reason: str) -> None:
    """Record a part that will not be predicted (unless it is recorded) and end the request
    if it was the last: Pub/Sub gave up delivering it, or the watchdog republishing it."""
    record = svc.registry.get_prediction(task.job_id, task.request_id)
    if record is None or record.ended:
        return
    if str(task.part) not in record.part_results:
        log.error("prediction %s part %d: %s", task.request_id, task.part, reason)
        record = svc.registry.record_prediction_part(task.job_id, task.request_id, task.part, {
            "rows": 0, "error": f"{_where(task)} was not predicted: {reason}",
            "at": svc.clock()})
    if record is not None:
        finish(svc, task, record)


def sweep_predictions(svc: Services, now: float) -> list[dict[str, Any]]:
    """Look after requests still for ``Settings.stall_seconds``: a fanned-out one gets its
    unrecorded parts published again (a part predicted twice is recorded once; its messages
    may be lost, or never published), up to ``MAX_REPUBLISHES`` times, and once still for
    ``GIVE_UP_SECONDS`` more they are given up (the request ends FAILED naming them); one the
    upload function predicts, whose claim is that old, ends FAILED (its invocation died and
    its event was not retried). Returns what was done."""
    done = []
    for record in svc.registry.running_predictions():
        try:
            action = _sweep(svc, record, now)
        except Exception:  # noqa: BLE001 - one request's trouble must not stop the others'
            log.exception("prediction %s: could not look after it", record.request_id)
            continue
        if action is not None:
            done.append({"request_id": record.request_id, **action})
            log.warning("prediction %s of job %s: still since %.0f: %s", record.request_id,
                        record.job_id, record.last_activity(), action)
    return done


def _sweep(svc: Services, record: PredictionRecord, now: float) -> dict[str, Any] | None:
    still = now - max(record.last_activity(), record.claimed_at)
    if still < svc.settings.stall_seconds:
        return None
    if not record.part_ends:
        svc.registry.update_prediction(record.job_id, record.request_id, {
            "state": str(RequestState.FAILED), "updated_at": now, "error": (
                f"the invocation predicting it stopped {still:.0f} s ago and its event was not "
                "retried: expected it to end; upload the file again")}, claim=record.claim)
        return {"action": "fail"}
    missing = record.unrecorded_parts()
    if not missing:  # every part recorded, the finisher gone: finish it
        finish(svc, parts_of(record, [0])[0], record)
        return {"action": "finish"}
    if record.republished < MAX_REPUBLISHES:
        svc.queue.publish(parts_of(record, missing))
        svc.registry.update_prediction(record.job_id, record.request_id, {
            "republished": record.republished + 1, "updated_at": now})
        return {"action": "republish", "parts": missing}
    if still < GIVE_UP_SECONDS:
        return None
    for task in parts_of(record, missing):
        give_up_part(svc, task, f"its message was published {record.republished + 1} times "
                     f"and no learner recorded it in {still:.0f} s")
    return {"action": "give up", "parts": missing}


def _delete(svc: Services, paths: list[str]) -> None:
    for path in paths:
        try:
            svc.store.delete(svc.settings.models_bucket, path)
        except Exception:  # noqa: BLE001 - a part left behind: the bucket's rule deletes it
            log.warning("could not delete %s", path, exc_info=True)


def _part_path(task: PredictPart) -> str:
    return layout.prediction_part_path(task.job_id, task.request_id, task.part)
