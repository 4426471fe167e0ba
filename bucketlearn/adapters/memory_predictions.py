"""The in-memory registry's batch prediction records (``prediction_ports.PredictionRecords``),
a part of ``memory.MemoryRegistry``: one record per request under its job, created if absent,
updated under a claim, as the Firestore adapter keeps them."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

from bucketlearn.adapters.firestore_rules import check_document
from bucketlearn.domain.prediction import PredictionRecord

_FIELDS = frozenset(PredictionRecord("r", "j").to_doc())


class MemoryPredictions:
    """``prediction_ports.PredictionRecords`` in memory (the registry's ``predictions`` and
    ``_lock``)."""

    _lock: threading.RLock
    predictions: dict[tuple[str, str], dict[str, Any]]

    def create_prediction(self, record: PredictionRecord) -> bool:
        _document_id(record.job_id)
        _document_id(record.request_id)
        with self._lock:
            key = (record.job_id, record.request_id)
            if key in self.predictions:
                return False
            doc = record.to_doc()
            check_document(_path(*key), doc)
            self.predictions[key] = copy.deepcopy(doc)
            return True

    def _stored(self, job_id: str, request_id: str) -> dict[str, Any] | None:
        """The record's document as held (the caller holds ``_lock``), or None; an id that is
        not a document's refused as Firestore refuses it."""
        _document_id(job_id)
        _document_id(request_id)
        return self.predictions.get((job_id, request_id))

    def update_prediction(self, job_id: str, request_id: str, fields: Mapping[str, Any],
                          claim: str | None = None) -> bool:
        unknown = sorted(set(fields) - _FIELDS)
        if unknown:  # (stricter than Firestore: the suite's typo check)
            raise ValueError(f"{_path(job_id, request_id)}: expected fields of "
                             f"PredictionRecord; found {unknown}")
        with self._lock:
            stored = self._stored(job_id, request_id)
            if stored is None or (claim is not None and stored.get("claim") != claim):
                return False
            check_document(_path(job_id, request_id), {**stored, **fields})
            stored.update(copy.deepcopy(dict(fields)))
            return True

    def get_prediction(self, job_id: str, request_id: str) -> PredictionRecord | None:
        with self._lock:
            return _record(self._stored(job_id, request_id))

    def count_predictions(self, job_id: str) -> int:
        with self._lock:
            return sum(1 for (j, _) in self.predictions if j == job_id)

    def list_predictions(self, job_id: str, limit: int = 20) -> list[PredictionRecord]:
        """Newest first; records created at the same time by id, descending (as Firestore
        orders them: its implicit order on the id follows the last field's direction)."""
        _document_id(job_id)
        with self._lock:
            docs = sorted(((doc.get("created_at") or 0.0, request_id, doc)
                           for (j, request_id), doc in self.predictions.items() if j == job_id),
                          key=lambda found: found[:2], reverse=True)
            return [_record(doc) for _, _, doc in docs[:max(0, limit)]]

    def record_prediction_part(self, job_id: str, request_id: str, part: int,
                               entry: Mapping[str, Any]) -> PredictionRecord | None:
        with self._lock:
            stored = self._stored(job_id, request_id)
            if stored is not None and stored.get("state") == "RUNNING" \
                    and str(part) not in stored.get("part_results", {}):
                results = {**stored.get("part_results", {}), str(part): dict(entry)}
                check_document(_path(job_id, request_id), {**stored, "part_results": results})
                stored["part_results"] = copy.deepcopy(results)
            return _record(stored)

    def count_part_attempt(self, job_id: str, request_id: str, part: int, at: float
                           ) -> PredictionRecord | None:
        with self._lock:
            stored = self._stored(job_id, request_id)
            if stored is not None:
                attempts = stored.setdefault("part_attempts", {})
                attempts[str(part)] = int(attempts.get(str(part), 0)) + 1
                stored["updated_at"] = at
            return _record(stored)

    def running_predictions(self) -> list[PredictionRecord]:
        with self._lock:
            return [_record(doc) for doc in self.predictions.values()
                    if doc.get("state") == "RUNNING"]


def _record(stored: dict[str, Any] | None) -> PredictionRecord | None:
    """A copy of a held document as its record (None for none)."""
    return PredictionRecord.from_doc(copy.deepcopy(stored)) if stored else None


def _path(job_id: str, request_id: str) -> str:
    return f"jobs/{job_id}/predictions/{request_id}"


def _document_id(value: Any) -> None:
    """Refuse, as the Firestore client does (ValueError), an id that is not a document's."""
    if not isinstance(value, str) or "/" in value or value in ("", ".", ".."):
        raise ValueError(f"{value!r} is not a document id (a Firestore path has an even "
                         "number of elements)")
