"""Batch prediction's ports: the registry's records of a job's requests (``PredictionRecords``,
a part of ``ports.Registry``), and the task message of one part of a request fanned out over the
learners (``PredictPart``, ``usecases.predict_parts``), which travels on the tasks topic beside
the training tasks (``ports.TaskMessage.from_dict`` hands a body of kind ``predict`` to
``PredictPart.from_dict``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from bucketlearn import layout, messages
from bucketlearn.domain.prediction import PredictionRecord

PREDICT_KIND = "predict"
MAX_PARTS = 32  # Cloud Storage composes at most 32 objects into one
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}$")


@dataclass(frozen=True)
class PredictPart:
    """Part ``part`` of ``parts`` of request ``request_id``: the rows of the input object's
    generation whose lines start in bytes [``start``, ``end``) (a line that starts before
    ``end`` is read to its end; the header line is never a row).

    Every part of a request names the same object, generation and ``parts``; the part that
    finds every part recorded writes the output (``usecases.predict_parts.finish``).
    """

    job_id: str
    request_id: str
    part: int
    parts: int
    bucket: str
    name: str
    generation: int
    start: int
    end: int
    model_generation: int = 0  # the exported model's generation (0: whatever is latest)

    @property
    def task_id(self) -> str:
        return f"{self.job_id}:predict-{self.request_id}-{self.part}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": PREDICT_KIND, "job_id": self.job_id, "request_id": self.request_id,
                "part": self.part, "parts": self.parts, "bucket": self.bucket,
                "name": self.name, "generation": self.generation, "start": self.start,
                "end": self.end, "model_generation": self.model_generation}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PredictPart:
        """A part message as published, every field checked: the object one of this job's
        ``predict/`` requests, the part within the parts, the range within a file.

        Raises:
            MessageError: a field is missing or holds what it cannot.
        """
        job_id = messages.job_id(data.get("job_id"))
        name = messages.text(data.get("name"), "name", 1024)
        parsed = layout.parse_predict_name(name)
        if parsed is None or parsed[0] != job_id:
            raise messages.MessageError("name", f"an object predict/{job_id}/<name>.csv", name)
        parts = messages.integer(data.get("parts"), "parts", 1, MAX_PARTS)
        start = messages.integer(data.get("start"), "start", 0, 2**50)
        end = messages.integer(data.get("end"), "end", start + 1, 2**50)
        request_id = data.get("request_id")
        if not isinstance(request_id, str) or not _REQUEST_ID.match(request_id):
            raise messages.MessageError("request_id", "a request id (letters, digits, '._-')",
                                        request_id)
        bucket = data.get("bucket")
        if not isinstance(bucket, str) or not _BUCKET.match(bucket):
            raise messages.MessageError("bucket", "a bucket name", bucket)
        return cls(job_id=job_id, request_id=request_id,
                   part=messages.integer(data.get("part"), "part", 0, parts - 1), parts=parts,
                   bucket=bucket, name=name,
                   generation=messages.integer(data.get("generation"), "generation", 0, 2**62),
                   start=start, end=end, model_generation=messages.integer(
                       messages.get(data, "model_generation", 0), "model_generation", 0, 2**62))


def parts_of(record: PredictionRecord, which: list[int] | None = None) -> list[PredictPart]:
    """The messages of a fanned-out request's parts (of ``which`` only, when given), as its
    record describes them (``part_ends``, ``source``, ``model_generation``)."""
    source, ends = record.source, list(record.part_ends)
    starts = [0, *ends[:-1]]
    return [PredictPart(job_id=record.job_id, request_id=record.request_id, part=k,
                        parts=len(ends), bucket=str(source["bucket"]), name=str(source["name"]),
                        generation=int(source["generation"]), start=starts[k], end=ends[k],
                        model_generation=record.model_generation)
            for k in (range(len(ends)) if which is None else which)]


class PredictionRecords(Protocol):
    """A job's batch prediction requests, a status record each (``jobs/<job>/predictions/*``)."""

    def create_prediction(self, record: PredictionRecord) -> bool:
        """Create the record if no record of its id exists under its job: True when created
        (False: a re-delivered event's request, already recorded)."""
        ...

    def update_prediction(self, job_id: str, request_id: str, fields: Mapping[str, Any],
                          claim: str | None = None) -> bool:
        """Update fields of a record (``PredictionRecord``'s attributes); with ``claim``, only
        while the record's claim is that one. False when it is not (or there is no record)."""
        ...

    def get_prediction(self, job_id: str, request_id: str) -> PredictionRecord | None: ...

    def count_predictions(self, job_id: str) -> int:
        """How many requests the job has had (every state)."""
        ...

    def list_predictions(self, job_id: str, limit: int = 20) -> list[PredictionRecord]:
        """The job's newest ``limit`` records, newest first (by ``created_at``)."""

    def record_prediction_part(self, job_id: str, request_id: str, part: int,
                               entry: Mapping[str, Any]) -> PredictionRecord | None:
        """Record what part ``part`` of a fanned-out request came to (``part_results``), only
        while the request is RUNNING and the part has no entry: an entry, once recorded, never
        changes, so whoever finishes the request finds the same outcome. Returns the record
        after (None: no record)."""
        ...

    def count_part_attempt(self, job_id: str, request_id: str, part: int, at: float
                           ) -> PredictionRecord | None:
        """Count one attempt at part ``part`` (``part_attempts``), ``at`` the request's
        ``updated_at`` (its parts are under way); the record after (None: no record)."""
        ...

    def running_predictions(self) -> list[PredictionRecord]:
        """Every job's requests that are RUNNING (the autoscaler counts their parts)."""
        ...
