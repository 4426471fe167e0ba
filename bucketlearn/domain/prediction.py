"""A batch prediction request: an object at ``predict/<JOB>/<NAME>.csv`` in the uploads bucket,
predicted with JOB's exported model into ``predictions/<JOB>/<NAME>.csv`` in the models bucket.

Pure: the request's record (``PredictionRecord``, its document built by ``to_doc`` and read by
``from_doc``), its states, and the rules that refuse a request before any row is read
(``request_refusal``). The use case that does the I/O is ``usecases.batch_predict``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from bucketlearn.domain.lifecycle import CANCELLED, DONE
from bucketlearn.errors import InputProblem


class RequestState(StrEnum):
    """A request's state (stored as its value: ``"DONE"``): RUNNING until it ends; DONE (the
    output is written), FAILED (a row or the model could not be used: the error names the row
    and column), REJECTED (refused before any row was read: the job, the bounds, the name)."""

    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"
    REJECTED = "REJECTED"


ENDED = (RequestState.DONE, RequestState.FAILED, RequestState.REJECTED)
# the statuses of a job whose exported model may predict (a CANCELLED one only once its head
# was exported: the use case finds out by reading it)
PREDICTING_STATUSES = (DONE, CANCELLED)


@dataclass(frozen=True)
class PredictionRecord:
    """One request's status record (``jobs/<job>/predictions/<request_id>``).

    Attributes:
        request_id: ``layout.prediction_id_for`` of the object's name and generation: a
            re-delivered event finds the same record, a re-upload (a new generation) makes a new
            one.
        job_id: the job whose model predicts.
        source: the input object (``bucket``, ``name``, ``generation``, ``size``).
        state: RUNNING, DONE, FAILED or REJECTED.
        rows: data rows predicted so far (all of them once DONE).
        seconds: from the claim to the end (the output written).
        error: why it FAILED or was REJECTED (row and column for a bad row).
        problem: a bad row's ``errors.InputProblem.to_dict()`` (row, column, expected, found).
        output: the predictions object in the models bucket, once DONE.
        claim, claimed_at: the invocation working on it and when it last said so (a retried
            event takes a claim over once it is older than the lease).
        parts: how many parts the request was fanned out in over the learners (0: predicted
            by the function that heard the upload).
        part_ends: where each part's byte range ends (a part starts where the one before
            ends), so the parts can be published again (``prediction_ports.parts_of``).
        model_generation: the generation of the job's exported model every part predicts with.
        part_results: what each part came to, by its number as a string: ``rows`` and
            ``seconds`` (and ``worker``, ``at``); a part that could not be predicted
            ``error``, and ``problem`` for a bad row (its row counted within the part).
        part_attempts: deliveries of each part that began predicting it, by its number.
        republished: how many times the watchdog published the unrecorded parts again.
    """

    request_id: str
    job_id: str
    source: Mapping[str, Any] = field(default_factory=dict)
    state: str = RequestState.RUNNING
    rows: int = 0
    seconds: float | None = None
    error: str | None = None
    problem: Mapping[str, Any] | None = None
    output: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    claim: str = ""
    claimed_at: float = 0.0
    parts: int = 0
    part_ends: tuple[int, ...] = ()
    model_generation: int = 0
    part_results: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    part_attempts: Mapping[str, int] = field(default_factory=dict)
    republished: int = 0

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def to_doc(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "job_id": self.job_id,
                "source": dict(self.source), "state": str(self.state), "rows": self.rows,
                "seconds": self.seconds, "error": self.error,
                "problem": dict(self.problem) if self.problem is not None else None,
                "output": self.output, "created_at": self.created_at,
                "updated_at": self.updated_at, "claim": self.claim,
                "claimed_at": self.claimed_at, "parts": self.parts,
                "part_ends": list(self.part_ends), "model_generation": self.model_generation,
                "part_results": {k: dict(v) for k, v in self.part_results.items()},
                "part_attempts": dict(self.part_attempts), "republished": self.republished}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> PredictionRecord:
        seconds = doc.get("seconds")
        return cls(request_id=str(doc["request_id"]), job_id=str(doc["job_id"]),
                   source=dict(doc.get("source") or {}),
                   state=str(doc.get("state", RequestState.RUNNING)),
                   rows=int(doc.get("rows") or 0),
                   seconds=float(seconds) if seconds is not None else None,
                   error=doc.get("error"), problem=doc.get("problem"),
                   output=doc.get("output"), created_at=float(doc.get("created_at") or 0.0),
                   updated_at=float(doc.get("updated_at") or 0.0),
                   claim=str(doc.get("claim") or ""),
                   claimed_at=float(doc.get("claimed_at") or 0.0),
                   parts=int(doc.get("parts") or 0),
                   part_ends=tuple(int(e) for e in doc.get("part_ends") or ()),
                   model_generation=int(doc.get("model_generation") or 0),
                   part_results={str(k): dict(v) for k, v in
                                 (doc.get("part_results") or {}).items()},
                   part_attempts={str(k): int(v) for k, v in
                                  (doc.get("part_attempts") or {}).items()},
                   republished=int(doc.get("republished") or 0))

    def status(self) -> dict[str, Any]:
        """What a client shows: the record without its claim."""
        return {**{k: v for k, v in self.to_doc().items() if k not in (
            "claim", "claimed_at", "part_ends", "part_results", "part_attempts")},
            "rows": self.rows_so_far}

    @property
    def rows_so_far(self) -> int:
        """``rows``; while a fanned-out request runs, its recorded parts' rows."""
        if self.parts and not self.ended:
            return sum(int(e.get("rows") or 0) for e in self.part_results.values()
                       if e.get("error") is None)
        return self.rows

    def unrecorded_parts(self) -> list[int]:
        """The parts not recorded yet (none for a request the function predicts itself)."""
        return [k for k in range(self.parts) if str(k) not in self.part_results]

    def last_activity(self) -> float:
        """When the request was last updated or a part of it last recorded."""
        return max([self.updated_at, self.created_at, *(
            float(entry.get("at") or 0.0) for entry in self.part_results.values())])


def source_file(source: Mapping[str, Any]) -> str:
    """The file name of a request's ``source`` (the last segment of its object's name)."""
    return str(source.get("name") or "").rsplit("/", 1)[-1]


def error_text(error: str, source: Mapping[str, Any]) -> str:
    """A request's ``error`` without the input's ``gs://`` address it starts with, for a list
    that names the file beside it ("row 5, column 'b': …"; any other error as it is)."""
    uri = f"gs://{source.get('bucket')}/{source.get('name')}"
    return error[len(uri):].lstrip(",: ") if error.startswith(uri) else error


def rows_per_second(rows: Any, seconds: Any) -> float | None:
    """``rows`` over ``seconds`` (None without seconds, or with none elapsed)."""
    if seconds is None or float(seconds) <= 0:
        return None
    return int(rows or 0) / float(seconds)


def part_ranges(size: int, part_bytes: int, max_parts: int) -> list[tuple[int, int]]:
    """Byte ranges [start, end) that split a file of ``size`` bytes into parts of about
    ``part_bytes`` (at most ``max_parts``, as even as can be): one range when ``part_bytes`` is
    0 or the file fits in one part."""
    if part_bytes <= 0 or size <= part_bytes:
        return [(0, size)]
    count = min(max_parts, math.ceil(size / part_bytes))
    bounds = [size * i // count for i in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


@dataclass(frozen=True)
class PartsOutcome:
    """What a fanned-out request came to once every part is recorded: its rows, and, when a
    part could not be predicted, the first such part's error (a bad row's counted from the
    file's first data row)."""

    rows: int
    error: str | None = None
    problem: Mapping[str, Any] | None = None


def parts_outcome(results: Mapping[str, Mapping[str, Any]], parts: int) -> PartsOutcome | None:
    """The outcome of a request of ``parts`` parts whose recorded ``part_results`` are
    ``results``, or None while a part is not recorded."""
    if parts < 1 or any(str(k) not in results for k in range(parts)):
        return None
    rows = 0
    for k in range(parts):
        entry = results[str(k)]
        if entry.get("error") is None:
            rows += int(entry.get("rows") or 0)
            continue
        problem = entry.get("problem")
        if problem is None:
            return PartsOutcome(rows, str(entry["error"]))
        found = dict(problem)
        if found.get("row") is not None:
            found["row"] = rows + int(found["row"])
        described = InputProblem(**{key: found.get(key) for key in (
            "file", "message", "row", "column", "expected", "found")}).describe()
        return PartsOutcome(rows, described, found)
    return PartsOutcome(rows)


def request_refusal(job_id: str, status: str | None, exported: bool, requests: int,
                    max_requests: int, size: int, max_bytes: int) -> str | None:
    """Why a request for ``job_id`` is refused before its rows are read, or None.

    Args:
        status: the job's status (None: no such job).
        exported: whether the job has an exported model (``Job.model_path``; a CANCELLED job
            has one once its head was exported).
        requests: the job's requests so far, this one included.
        size: the input's bytes.
    """
    if status is None:
        return f"job {job_id}: no such job"
    if status not in PREDICTING_STATUSES:
        return (f"job {job_id} is {status}: expected a job that is DONE (or CANCELLED with an "
                "exported model) to predict with")
    if not exported:
        return (f"job {job_id} is {status} and has no exported model: expected a job that is "
                "DONE (or CANCELLED with an exported model) to predict with")
    if requests > max_requests:
        return (f"job {job_id}: expected at most {max_requests} prediction requests a job "
                f"(BUCKETLEARN_MAX_PREDICT_REQUESTS); found {requests}")
    if size > max_bytes:
        return (f"expected a file of at most {max_bytes} bytes (BUCKETLEARN_MAX_PREDICT_BYTES); "
                f"found {size} bytes")
    return None
