"""A large batch prediction request fanned out over the learners: each part is the rows whose
lines start in a byte range of the input (``domain.prediction.part_ranges``), predicted by
whichever learner pulls its message (``prediction_messages.PredictPart``) into an object of its
own (``layout.prediction_part_path``); the part that finds every part recorded composes them
into the output and ends the request (``finish``).

What makes it safe under faults: a part's output is the same whoever predicts it (a part
predicted twice, by a duplicated message or after a learner died mid-part, writes the same
object and the same entry); the request's record keeps one entry a part
(``Registry.record_prediction_part``), so its rows are counted once; a message is acknowledged
only once its part is recorded and, if it was the last, the request ended, so a learner killed
anywhere leaves a message that comes back; composing again writes the same bytes. A part whose
delivery is tried more than ``Settings.max_task_attempts`` times (its learner dies each time)
is recorded as failed, and the request ends FAILED naming it. A bad row ends the request FAILED
naming the row counted from the file's first data row, as the function's own reading would.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import IO, Any

from bucketlearn import layout
from bucketlearn.domain.prediction import PredictionRecord, RequestState, parts_outcome
from bucketlearn.errors import InvalidInputError, NotFoundError, PermanentError, TransientError
from bucketlearn.events import display_uri
from bucketlearn.faults import crash_point
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.ports import Services
from bucketlearn.prediction_messages import PredictPart
from bucketlearn.usecases.batch_predict import ChunkStream, csv_chunks, load_model_bytes
from bucketlearn.usecases.prediction_rows import LoadedModel, predicted_rows

log = logging.getLogger(__name__)

READ_BYTES = 1 << 20  # how much of the input a part reads at a time
MAX_MODELS_KEPT = 2  # exported models a learner keeps loaded to predict with


def predict_part(svc: Services, task: PredictPart, delivery_attempt: int | None,
                 worker_id: str) -> bool:
    """Predict one part (unless it is recorded) and, when every part is, end the request.

    Returns:
        True when the message is done with (acknowledge it); False to have it back (a backend
        failed).
    """
    try:
        record = svc.registry.get_prediction(task.job_id, task.request_id)
        if record is None or record.ended:
            log.info("prediction %s part %d: the request is %s; nothing to do", task.request_id,
                     task.part, "unknown" if record is None else record.state)
            return True
        if str(task.part) not in record.part_results:
            entry = _given_up(svc, task, delivery_attempt) or _predict(svc, task, worker_id)
            crash_point(svc.settings, "predict.before_record")
            record = svc.registry.record_prediction_part(task.job_id, task.request_id,
                                                         task.part, entry)
            if record is None:
                return True
        finish(svc, task, record)
        crash_point(svc.settings, "predict.before_ack")
    except TransientError:
        log.warning("prediction %s part %d: a backend failed; the part comes back",
                    task.request_id, task.part, exc_info=True)
        return False
    return True


def _given_up(svc: Services, task: PredictPart, delivery_attempt: int | None
              ) -> dict[str, Any] | None:
    """The entry of a part delivered more times than tasks are tried (its learner died each
    time), or None."""
    allowed = svc.settings.max_task_attempts
    if delivery_attempt is None or delivery_attempt <= allowed:
        return None
    log.error("prediction %s part %d: delivered %d times; given up", task.request_id,
              task.part, delivery_attempt)
    return {"rows": 0, "error": f"{display_uri(task.bucket, task.name)}: part {task.part + 1} "
            f"of {task.parts} (bytes {task.start} to {task.end}) was not predicted after "
            f"{allowed} attempts: expected a learner to finish it; found none did"}


def _predict(svc: Services, task: PredictPart, worker_id: str) -> dict[str, Any]:
    """Predict the part's rows into its object: its entry (rows, or why it could not be)."""
    started, rows = svc.clock(), [0]
    file = display_uri(task.bucket, task.name)
    try:
        loaded = loaded_model(svc, task.job_id)
        reader = PartReader(svc, task)
        source = SourceFile(display_name=file, size=task.end - task.start,
                            opener=lambda: ChunkStream(reader.chunks()))
        limits = dataclasses.replace(svc.settings.limits,
                                     max_file_bytes=svc.settings.limits.max_predict_bytes)
        _, batches = predicted_rows(source, loaded, limits)
        def predicted(count: int) -> None:
            rows[0] += count
            crash_point(svc.settings, "predict.mid_part")

        chunks = csv_chunks(loaded, batches, predicted, header=task.part == 0)
        svc.store.write_stream(svc.settings.models_bucket, _part_path(task),
                               ChunkStream(chunks), "text/csv")
    except InvalidInputError as exc:
        return {"rows": rows[0], "error": exc.problem.describe(),
                "problem": exc.problem.to_dict()}
    except PermanentError as exc:
        return {"rows": rows[0], "error": f"{file}: {exc}"}
    except Exception as exc:  # noqa: BLE001 - transient: the part comes back; else recorded
        if svc.transient(exc):
            raise TransientError(f"{file}: {type(exc).__name__}: {exc}") from exc
        log.error("prediction %s part %d failed", task.request_id, task.part, exc_info=exc)
        return {"rows": rows[0], "error": f"{file}: {type(exc).__name__}: {exc}"[:1000]}
    return {"rows": rows[0], "seconds": round(svc.clock() - started, 3), "worker": worker_id}


class PartReader:
    """The part read as a file of its own, as often as it is opened (``chunks``): the input's
    header line (read once), then the lines that start in [``task.start``, ``task.end``), each
    whole; part 0 is the file's first bytes, its header included."""

    def __init__(self, svc: Services, task: PredictPart) -> None:
        self.store, self.task = svc.store, task
        self.max_line = svc.settings.limits.max_line_bytes
        self._header: bytes | None = None

    def _open(self, start: int = 0) -> IO[bytes]:
        task = self.task
        return self.store.open_read(task.bucket, task.name, task.generation, start=start)

    def header(self) -> bytes:
        if self._header is None:
            with self._open() as stream:
                self._header, _ = _first_line(stream, self.max_line, self.task.name)
        return self._header

    def chunks(self) -> Iterator[bytes]:
        task = self.task
        if task.start == 0:
            yield from _lines_until(self._open(), 0, b"", task.end)
            return
        yield self.header()
        stream = self._open(task.start - 1)  # a line starts at ``start`` when this is a newline
        skipped, rest = _first_line(stream, self.max_line, task.name)
        yield from _lines_until(stream, task.start - 1 + len(skipped), rest, task.end)


def _first_line(stream: IO[bytes], limit: int, name: str) -> tuple[bytes, bytes]:
    """The stream's bytes through its first newline (all of them if it has none), and those
    read past it."""
    line = bytearray()
    while b"\n" not in line:
        chunk = stream.read(64 * 1024)
        if not chunk:
            return bytes(line), b""
        line += chunk
        if len(line) > limit + 64 * 1024 and b"\n" not in line:
            raise PermanentError(f"{name}: expected lines of at most {limit} bytes "
                                 "(BUCKETLEARN_MAX_LINE_BYTES); found a longer one")
    end = line.index(b"\n") + 1
    return bytes(line[:end]), bytes(line[end:])


def _lines_until(stream: IO[bytes], position: int, chunk: bytes, end: int) -> Iterator[bytes]:
    """From ``position`` on (``chunk``: bytes there already read): the bytes before ``end``,
    then through the newline that ends the line under way at ``end`` (nothing more when
    ``end`` starts a line). Closes the stream."""
    try:
        last = b"\n"
        while position < end:
            if not chunk:
                chunk = stream.read(READ_BYTES)
                if not chunk:
                    return
            last = chunk[:end - position]
            yield last
            position += len(last)
            chunk = chunk[len(last):]
        while not last.endswith(b"\n"):
            if not chunk:
                chunk = stream.read(READ_BYTES)
                if not chunk:
                    return
            newline = chunk.find(b"\n")
            last = chunk if newline < 0 else chunk[:newline + 1]
            yield last
            chunk = b""
    finally:
        stream.close()


def loaded_model(svc: Services, job_id: str) -> LoadedModel:
    """The job's exported model, loaded once per process while it is not replaced (kept by the
    generation of ``models/<job>/latest.keras``)."""
    bucket, path = svc.settings.models_bucket, layout.model_path(job_id)
    info = svc.store.stat(bucket, path)
    if info is None:
        raise PermanentError(f"job {job_id}: expected its exported model at {path}; found none")
    kept = svc.cache.predictors
    key = f"{job_id}@{info.generation}"
    if key not in kept:
        kept[key] = load_model_bytes(svc.store.read_bytes(bucket, path))
        while len(kept) > MAX_MODELS_KEPT:
            kept.popitem(last=False)
    kept.move_to_end(key)
    return kept[key]


def finish(svc: Services, task: PredictPart, record: PredictionRecord) -> None:
    """End the request once every part is recorded: DONE with the parts composed into the
    output, or FAILED naming the first part's error; then delete the parts' objects."""
    outcome = parts_outcome(record.part_results, task.parts)
    if outcome is None or record.ended:
        return
    bucket = svc.settings.models_bucket
    parts = [_part_path(dataclasses.replace(task, part=k)) for k in range(task.parts)]
    fields: dict[str, Any] = {"rows": outcome.rows, "parts": task.parts,
                              "updated_at": svc.clock(),
                              "seconds": round(svc.clock() - record.created_at, 3)}
    if outcome.error is not None:
        fields.update(state=str(RequestState.FAILED), error=outcome.error,
                      problem=None if outcome.problem is None else dict(outcome.problem))
    else:
        output = layout.predictions_path(task.job_id, layout.parse_predict_name(task.name)[1])
        try:
            svc.store.compose(bucket, output, parts, "text/csv",
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
    for part in parts:
        try:
            svc.store.delete(bucket, part)
        except Exception:  # noqa: BLE001 - a part left behind costs storage only
            log.warning("could not delete %s", part, exc_info=True)


def _part_path(task: PredictPart) -> str:
    return layout.prediction_part_path(task.job_id, task.request_id, task.part)
