"""Batch prediction by upload: an object at ``predict/<JOB>/<NAME>.csv`` in the uploads bucket
becomes ``predictions/<JOB>/<NAME>.csv`` in the models bucket, the input's columns and cells as
they were plus ``prediction`` (and ``probability_<class>`` per class for a classification), with
JOB's exported model (``models/<JOB>/latest.keras``).

The upload function hands such an event here instead of to ``usecases.upload`` (no job is made).
The input is streamed: read a block at a time from the pinned generation
(``prediction_rows.predicted_rows``) and written as it is predicted through the store's
``write_stream``, so a file larger than the function's memory works; its time is bounded by
``Limits.max_predict_bytes`` (and the function's timeout). A file larger than
``Limits.predict_part_bytes`` is not predicted here: it is fanned out in parts over the
learners (``usecases.predict_parts``), and the request is ACCEPTED, RUNNING until they end it.

Every request has a status record (``domain.prediction.PredictionRecord``, in the registry
under its job), keyed by the object's name and generation: a re-delivered event finds it and
does nothing (DUPLICATE), unless the invocation that claimed it stopped saying so for longer
than ``Settings.lease_seconds`` (it died), when the event takes the request over. A row that
cannot be read ends the request FAILED, its record naming the first such row and its column
(what was expected, what was found); no output is written then, and no row is ever dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from bucketlearn import layout
from bucketlearn.domain.prediction import (
    PredictionRecord,
    RequestState,
    part_ranges,
    request_refusal,
)
from bucketlearn.errors import (
    InvalidInputError,
    NotFoundError,
    PermanentError,
    TransientError,
    bounded,
)
from bucketlearn.events import Outcome, StorageEvent, display_uri, skipped
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.ports import Services
from bucketlearn.prediction_ports import MAX_PARTS, parts_of
from bucketlearn.usecases.prediction_rows import (
    LoadedModel,
    RowBatch,
    output_batch,
    output_columns,
    predicted_rows,
)

log = logging.getLogger(__name__)

# Loads a job's ``.keras`` bytes (a test hands in its own; None: ``LoadedModel.load``)
ModelLoader = Callable[[bytes], LoadedModel]


class _LostClaim(Exception):
    """Another invocation took the request over (this one was taken for dead)."""


def is_predict_request(event: StorageEvent) -> bool:
    """Whether an uploads-bucket object asks for predictions rather than a job."""
    return event.name.startswith(layout.PREDICT_PREFIX)


def handle_predict(svc: Services, event: StorageEvent, load: ModelLoader | None = None
                   ) -> tuple[Outcome, str | None]:
    """Predict one ``predict/<JOB>/<NAME>.csv`` upload (at most once per generation).

    Returns:
        (outcome, request id). ACCEPTED: the predictions are written (the record DONE);
        FAILED: a row or the model could not be used (the record says which row and column);
        REJECTED: refused before any row was read (the record says why; with no request id
        when the object's name is not ``predict/<JOB>/<NAME>.csv``); DUPLICATE: a re-delivered
        event of a request recorded; IGNORED: not a ``.csv``, or an event too old.

    Raises:
        TransientError: a backend failed; the event should be retried (the claim is let go).
    """
    file, now = display_uri(event.bucket, event.name), svc.clock()
    if (why := skipped(event, now, svc.settings.max_event_age_seconds)) is not None:
        log.info("ignoring %s: %s", file, why)
        return Outcome.IGNORED, None
    parsed = layout.parse_predict_name(event.name)
    if parsed is None:
        log.error("%s: expected predict/<job id>/<name>.csv (a name of letters, digits, '.', "
                  "'_', '-' and spaces); no request is recorded", file)
        return Outcome.REJECTED, None
    job_id, name = parsed
    request = _claimed(svc, event, job_id, now)
    if request is None:
        return Outcome.DUPLICATE, layout.prediction_id_for(event.name, event.generation)
    with _letting_go(svc, request, file):
        refusal = _refusal(svc, event, job_id)
    if isinstance(refusal, str):
        _end(svc, request, RequestState.REJECTED, error=f"{file}: {refusal}")
        return Outcome.REJECTED, request.request_id
    sized = dataclasses.replace(event, size=refusal)
    ranges = part_ranges(refusal, svc.settings.limits.predict_part_bytes, MAX_PARTS)
    if len(ranges) > 1:
        return _fan_out(svc, sized, request, ranges), request.request_id
    return _run(svc, sized, request, layout.predictions_path(job_id, name), load), \
        request.request_id


def _claimed(svc: Services, event: StorageEvent, job_id: str, now: float
             ) -> PredictionRecord | None:
    """The request's record, claimed by this invocation; None when it is recorded and ended, or
    claimed by an invocation that is alive (its claim renewed within the lease)."""
    request_id = layout.prediction_id_for(event.name, event.generation)
    record = PredictionRecord(
        request_id=request_id, job_id=job_id, created_at=now, updated_at=now,
        source={"bucket": event.bucket, "name": event.name, "generation": event.generation,
                "size": event.size},
        claim=layout.new_nonce(), claimed_at=now)
    if svc.registry.create_prediction(record):
        return record
    existing = svc.registry.get_prediction(job_id, request_id)
    if existing is None or existing.ended or existing.parts:
        log.info("prediction %s of job %s: duplicate event ignored", request_id, job_id)
        return None
    if now - existing.claimed_at < svc.settings.lease_seconds:
        log.info("prediction %s of job %s is under way: duplicate event ignored", request_id,
                 job_id)
        return None
    taken = {"claim": record.claim, "claimed_at": now, "updated_at": now, "rows": 0}
    if not svc.registry.update_prediction(job_id, request_id, taken, claim=existing.claim):
        return None
    log.warning("prediction %s of job %s: taking over a request abandoned since %s",
                request_id, job_id, existing.claimed_at)
    return dataclasses.replace(existing, **taken)


def _refusal(svc: Services, event: StorageEvent, job_id: str) -> str | int:
    """Why the request is refused before its rows are read (``request_refusal``), or the
    size of the object's generation when it is not."""
    job = svc.registry.get_job(job_id)
    info = svc.store.stat(event.bucket, event.name, event.generation)
    if info is None:
        return (f"the object was deleted or replaced before it could be read; expected "
                f"generation {event.generation}")
    limits = svc.settings.limits
    refused = request_refusal(job_id, None if job is None else str(job.status),
                              job is not None and job.model_path is not None,
                              svc.registry.count_predictions(job_id),
                              limits.max_predict_requests, info.size, limits.max_predict_bytes)
    return info.size if refused is None else refused


def _fan_out(svc: Services, event: StorageEvent, request: PredictionRecord,
             ranges: list[tuple[int, int]]) -> Outcome:
    """Record the parts (their ranges and the model's generation), then publish a message a
    part (``usecases.predict_parts`` predicts them on the learners): the record stays RUNNING
    until the last part ends it. Should the publish fail, the event's retry finds the parts
    recorded and does nothing more: the watchdog publishes a request's unrecorded parts again
    once it has been still for ``Settings.stall_seconds``."""
    file = display_uri(event.bucket, event.name)
    with _letting_go(svc, request, file):
        model = svc.store.stat(svc.settings.models_bucket, layout.model_path(request.job_id))
        if model is None:
            _end(svc, request, RequestState.FAILED, error=f"{file}: job {request.job_id}: "
                 f"expected its exported model at {layout.model_path(request.job_id)}; "
                 "found none")
            return Outcome.FAILED
        fields = {"parts": len(ranges), "part_ends": [end for _, end in ranges],
                  "model_generation": model.generation, "updated_at": svc.clock()}
        svc.registry.update_prediction(request.job_id, request.request_id, fields)
    parts = parts_of(dataclasses.replace(request, part_ends=tuple(fields["part_ends"]),
                                         model_generation=model.generation))
    try:
        svc.queue.publish(parts)
    except Exception as exc:
        if not svc.transient(exc):
            raise
        raise TransientError(f"{file}: publishing {len(parts)} parts: "
                             f"{type(exc).__name__}: {exc}") from exc
    log.info("prediction %s of job %s: %d bytes in %d parts for the learners",
             request.request_id, request.job_id, event.size, len(parts))
    return Outcome.ACCEPTED


@contextlib.contextmanager
def _letting_go(svc: Services, request: PredictionRecord, file: str) -> Iterator[None]:
    """A backend failing inside: the claim let go, so the event's retry takes the request over
    at once, and a TransientError raised (anything else is raised as it is)."""
    try:
        yield
    except Exception as exc:
        if not svc.transient(exc):
            raise
        try:
            svc.registry.update_prediction(request.job_id, request.request_id,
                                           {"claimed_at": 0.0}, claim=request.claim)
        except Exception:  # noqa: BLE001 - the registry is down too: the lease runs out
            log.warning("prediction %s: could not let its claim go", request.request_id)
        raise TransientError(f"{file}: {type(exc).__name__}: {exc}") from exc


def _run(svc: Services, event: StorageEvent, request: PredictionRecord, output: str,
         load: ModelLoader | None) -> Outcome:
    """Predict the request's rows into ``output``; its record ends DONE or FAILED."""
    file = display_uri(event.bucket, event.name)
    started = svc.clock()
    rows = _Progress(svc, request)
    try:
        with _letting_go(svc, request, file):
            source = SourceFile(display_name=file, size=event.size, opener=lambda: (
                svc.store.open_read(event.bucket, event.name, generation=event.generation)))
            write_predictions(svc, source, _model(svc, request.job_id, load), output,
                              rows.count, metadata={"job_id": request.job_id,
                                                    "request_id": request.request_id})
    except _LostClaim:
        log.warning("prediction %s: taken over by another invocation", request.request_id)
        return Outcome.DUPLICATE
    except TransientError:
        raise
    except Exception as exc:  # noqa: BLE001 - the file, the model or a bug: FAILED
        _end(svc, request, RequestState.FAILED, started, **failure(exc, file))
        return Outcome.FAILED
    _end(svc, request, RequestState.DONE, started, rows=rows.rows, output=output)
    log.info("prediction %s of job %s: %d rows -> %s", request.request_id, request.job_id,
             rows.rows, output)
    return Outcome.ACCEPTED


def _model(svc: Services, job_id: str, load: ModelLoader | None) -> LoadedModel:
    """The job's exported model (``models/<job>/latest.keras``)."""
    try:
        data = svc.store.read_bytes(svc.settings.models_bucket, layout.model_path(job_id))
    except NotFoundError:
        raise PermanentError(f"job {job_id}: expected its exported model at "
                             f"{layout.model_path(job_id)}; found none") from None
    return (load or load_model_bytes)(data)


def write_predictions(svc: Services, source: SourceFile, loaded: LoadedModel, output: str,
                      progress: Callable[[int], None], header: bool = True,
                      metadata: dict[str, str] | None = None) -> None:
    """``source``'s rows predicted by ``loaded`` and streamed into ``output`` in the models
    bucket (``csv_chunks``; without the header line when ``header`` is False), read within
    ``Limits.max_predict_bytes``; ``progress`` is told each batch's rows."""
    limits = dataclasses.replace(svc.settings.limits,
                                 max_file_bytes=svc.settings.limits.max_predict_bytes)
    columns, batches = predicted_rows(source, loaded, limits)
    svc.store.write_stream(svc.settings.models_bucket, output, ChunkStream(csv_chunks(
        loaded, batches, progress, header=header, columns=columns)), "text/csv", metadata)


def failure(exc: Exception, file: str) -> dict[str, Any]:
    """A request's (or a part's) ``error`` (and ``problem``, for a bad row) for ``exc``, which
    is not transient: a bad row named, a permanent error after the file, anything else (a
    bug) with its type."""
    if isinstance(exc, InvalidInputError):
        return {"error": exc.problem.describe(), "problem": exc.problem.to_dict()}
    if isinstance(exc, PermanentError):
        said = str(exc)
        return {"error": said if said.startswith(file) else f"{file}: {said}"}
    log.error("prediction of %s failed", file, exc_info=exc)
    return {"error": f"{file}: {type(exc).__name__}: {bounded(str(exc), 500)}"}


def load_model_bytes(data: bytes) -> LoadedModel:
    """A ``.keras`` model's bytes loaded (through a temporary file, which Keras needs)."""
    handle, path = tempfile.mkstemp(suffix=".keras")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        return LoadedModel.load(path)
    finally:
        os.unlink(path)


def _end(svc: Services, request: PredictionRecord, state: RequestState,
         started: float | None = None, **fields: Any) -> None:
    """The request's record ended in ``state`` (under its claim: a request taken over by
    another invocation is that one's to end)."""
    now = svc.clock()
    update = {"state": str(state), "updated_at": now,
              "seconds": None if started is None else round(now - started, 3), **fields}
    if not svc.registry.update_prediction(request.job_id, request.request_id, update,
                                          claim=request.claim):
        log.warning("prediction %s: not ended as %s: another invocation holds it",
                    request.request_id, state)


class _Progress:
    """Rows predicted so far; the claim renewed (with the rows) every third of the lease."""

    def __init__(self, svc: Services, request: PredictionRecord) -> None:
        self.svc, self.request = svc, request
        self.rows = 0
        self.renewed = svc.clock()

    def count(self, rows: int) -> None:
        self.rows += rows
        now = self.svc.clock()
        if now - self.renewed < self.svc.settings.lease_seconds / 3:
            return
        self.renewed = now
        if not self.svc.registry.update_prediction(
                self.request.job_id, self.request.request_id,
                {"rows": self.rows, "claimed_at": now, "updated_at": now},
                claim=self.request.claim):
            raise _LostClaim


def csv_chunks(loaded: LoadedModel, batches: Iterator[RowBatch],
               progress: Callable[[int], None] | None = None, header: bool = True,
               columns: Sequence[str] = ()) -> Iterator[bytes]:
    """The output CSV's bytes, a batch of rows at a time (the header with the first, unless
    ``header`` is False; with no row, the header alone, of the input's ``columns``): the
    input's cells, then ``prediction_rows.output_columns``. ``progress`` is told each batch's
    rows once they are predicted."""
    for batch in batches:
        out = io.BytesIO()
        pacsv.write_csv(pa.Table.from_batches([output_batch(loaded, batch)]), out,
                        pacsv.WriteOptions(include_header=header))
        header = False
        if progress is not None:
            progress(batch.rows)
        yield out.getvalue()
    if header and columns:
        out = io.BytesIO()
        names = [*columns, *output_columns(loaded)]
        pacsv.write_csv(pa.table({n: pa.array([], pa.string()) for n in names}), out)
        yield out.getvalue()


class ChunkStream(io.RawIOBase):
    """A readable stream of an iterator's byte chunks (``write_stream`` reads it to its end);
    what the iterator raises reaches the reader, so a failed prediction writes no object.

    ``read(n)`` returns ``n`` bytes unless the chunks end first: a resumable upload takes a
    shorter read for the last one (Cloud Storage's client would end the object there).
    """

    def __init__(self, chunks: Iterator[bytes]) -> None:
        super().__init__()
        self._chunks = chunks
        self._pending = memoryview(b"")
        self._position = 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def read(self, size: int = -1) -> bytes:
        parts: list[bytes] = []
        got = 0
        while size is None or size < 0 or got < size:
            if not self._pending:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._pending = memoryview(chunk)
            take = len(self._pending) if size is None or size < 0 else min(
                size - got, len(self._pending))
            parts.append(bytes(self._pending[:take]))
            self._pending = self._pending[take:]
            got += take
        self._position += got
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        self._position += size
        return size
