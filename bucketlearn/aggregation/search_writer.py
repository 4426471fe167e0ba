"""A searched job (option ``search`` N) on the learner pool: its candidates trained side by
side, the rungs settled by the job's one writer, the mean of the finalists exported.

The search is ``train-local --search``'s (``usecases.local_search``, ``domain.search``), cut into
segments: a segment is one candidate trained through one rung, by whichever learner pulls it
(``loops.segment``). The job's record (``Job.search``: ``domain.search.search_record``)
holds the candidates, the rungs, the segments published and each candidate's line as its
last recorded segment left it.

The writer (``SearchWriter``, run by the job's ``JobAggregator``, the holder of its lease)
records each segment once: the state it ended with is copied to the models bucket as the
line's version for that rung, the line written into the record by a conditional write on the
job's fence; a result for a segment already recorded, or never published, is dropped. Then
``domain.search.settle`` decides the rungs from the scores alone, ``domain.search.due`` names
the segments to publish (each recorded as published after its message went out: a writer
that dies in between publishes it again, and the second result is dropped), and once the
last rung is decided the mean of the finalists' best weights is evaluated on the holdout and
exported. The selected model therefore depends on the scores alone: the same whatever the
number of learners and their timing, and the same as ``train-local --search``'s.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from bucketlearn import codec, layout
from bucketlearn.codec import CorruptObjectError
from bucketlearn.domain.head import Head
from bucketlearn.domain.job import Job, ending_fields, fail_fields
from bucketlearn.domain.lifecycle import DONE, RUNNING
from bucketlearn.domain.recipe import Score
from bucketlearn.domain.search import (
    Candidate,
    best_through,
    due,
    lines_of,
    pair,
    plan_of,
    recorded_rung,
    settle,
    standings,
)
from bucketlearn.domain.usage import added
from bucketlearn.errors import TransientError
from bucketlearn.ml.model import build_model, export_keras
from bucketlearn.ml.training import evaluate_parts
from bucketlearn.ports import Received, ResultMessage, Services
from bucketlearn.services.caches import JobRuntime, job_runtime
from bucketlearn.services.candidates import candidate_spec, mean_of
from bucketlearn.services.endings import end_job
from bucketlearn.services.evaluate import headline, holdout_figures
from bucketlearn.services.export import (
    column_importance,
    degenerate,
    model_sidecar,
    write_model,
)
from bucketlearn.usecases.search_publish import publish_due, search_fence, write_search

log = logging.getLogger(__name__)


@dataclass
class _Heard:
    candidate: int
    rung: int
    path: str
    message: ResultMessage | None = None
    received: Received | None = None


class SearchWriter:
    """A searched job's writer: its segments' results recorded, its rungs settled, its model
    exported (see the module docstring). Driven by the job's ``JobAggregator``."""

    def __init__(self, svc: Services, job_id: str) -> None:
        self.svc, self.job_id = svc, job_id
        self.heard: dict[str, _Heard] = {}

    def hear(self, message: ResultMessage, received: Received | None = None) -> None:
        earlier = self.heard.get(message.path)
        if earlier is not None and earlier.received is not None and received is not None:
            earlier.received.ack()
        self.heard[message.path] = _Heard(message.task_index, message.epoch, message.path,
                                          message, received)

    def listen(self) -> None:
        """The backstop: every segment result in the deltas bucket (a lost message, a
        takeover)."""
        for info in self.svc.store.list(self.svc.settings.deltas_bucket,
                                        layout.segment_prefix(self.job_id)):
            parsed = layout.parse_segment_path(info.name)
            if parsed is not None and parsed[0] == self.job_id:
                self.heard.setdefault(info.name, _Heard(parsed[1], parsed[2], info.name))

    def settle_all(self) -> None:
        """The job has ended: acknowledge every message heard."""
        for heard in self.heard.values():
            if heard.received is not None:
                heard.received.ack()
        self.heard.clear()

    def step(self, job: Job) -> tuple[bool, Job]:
        """Record what was heard, publish what is due, export once the search is decided;
        (whether it did something, the job as it then stands)."""
        did = False
        for heard in sorted(self.heard.values(), key=lambda h: (h.rung, h.candidate)):
            job, recorded = self._record(job, heard)
            did = did or recorded
        record = job.search or {}
        plan = plan_of(record)
        verdicts = settle(plan, lines_of(record))
        pairs = due(record, verdicts)
        if pairs:
            return True, publish_due(self.svc, job, pairs)
        if len(verdicts) == len(plan):
            export_search(self.svc, job, list(verdicts[-1].kept))
            return False, self.svc.registry.get_job(self.job_id) or job
        return did, job

    def _record(self, job: Job, heard: _Heard) -> tuple[Job, bool]:
        """Record one segment's result in its candidate's line (once); drop what is not due."""
        svc, record = self.svc, dict(job.search or {})
        lines = dict(record.get("lines") or {})
        doc = lines.get(str(heard.candidate))
        if pair(heard.candidate, heard.rung) not in (record.get("published") or []):
            # its publish is not recorded yet (the upload's write may still be on its way):
            # kept while it is due, dropped when it was never asked for
            if (heard.candidate, heard.rung) not in due(record, settle(plan_of(record),
                                                                       lines_of(record))):
                self._drop(heard)
            return job, False
        if recorded_rung(record, heard.candidate) >= heard.rung:
            self._drop(heard)  # recorded already
            return job, False
        state, meta = self._read(heard)
        weights_path = (doc or {}).get("weights_path", "")
        if state:  # the line's version for this rung, where its next segment starts
            weights_path = f"weights/{self.job_id}/search/c{heard.candidate:03d}-" \
                           f"r{heard.rung:02d}-{layout.new_nonce()}.state"
            svc.store.write_bytes(svc.settings.models_bucket, weights_path, state,
                                  "application/octet-stream")
        lines[str(heard.candidate)] = _line_doc(doc or {}, meta, heard.rung, weights_path)
        record["lines"] = lines
        used = dict((heard.message.stats or {}).get("usage") or {}) if heard.message else {}
        fields = {"search": record, "usage": added(job.usage, used), "status": RUNNING,
                  "updated_at": svc.clock()}
        if not write_search(svc, job, fields):
            current = svc.registry.get_job(self.job_id)
            if current is None or current.is_terminal:
                return current or job, False
            raise TransientError(f"job {self.job_id}: its search record changed under its "
                                 "writer; read again")
        log.info("job %s: candidate %d, rung %d: %s", self.job_id, heard.candidate,
                 heard.rung, meta.get("state"))
        self._drop(heard)
        return job.updated(fields), True

    def _read(self, heard: _Heard) -> tuple[bytes, dict[str, Any]]:
        """A segment result's bytes (empty when it holds no state: given up on, or unreadable)
        and metadata; one that cannot be read drops its candidate with the reason."""
        raw = self.svc.store.read_bytes(self.svc.settings.deltas_bucket, heard.path)
        try:
            arrays, meta = codec.decode_segment(raw, heard.path)
        except CorruptObjectError as exc:
            return b"", {"state": "dropped", "reason": f"its result could not be read: {exc}"}
        if (meta.get("candidate"), meta.get("rung")) != (heard.candidate, heard.rung):
            return b"", {"state": "dropped", "reason": "its result names another segment"}
        return (raw if arrays["w"] else b""), meta

    def _drop(self, heard: _Heard) -> None:
        if heard.received is not None:
            heard.received.ack()
        self.heard.pop(heard.path, None)
        try:
            self.svc.store.delete(self.svc.settings.deltas_bucket, heard.path)
        except Exception:  # noqa: BLE001 - left for the job's wind-up
            log.debug("could not delete %s", heard.path, exc_info=True)


def _line_doc(before: dict[str, Any], meta: dict[str, Any], rung: int,
              weights_path: str) -> dict[str, Any]:
    """A candidate's line after segment ``rung`` (its best score through the rung appended)."""
    scores = [Score.from_dict(s) for s in meta.get("scores") or []]
    # a segment with no state (given up on, unreadable) leaves the line where it was: it is
    # dropped after the epochs it had, and keeps its standing at the rungs it passed
    epochs = int(meta.get("epoch") or before.get("epochs") or 0)
    best = best_through(scores, epochs)
    finite = best is not None and best.is_finite()
    dropped = meta.get("state") == "dropped" or (best is not None and not finite)
    return {"rung": rung, "epochs": epochs, "finished": bool(meta.get("finished")),
            "state": "dropped" if dropped else "training", "reason": meta.get("reason") or "",
            "dropped_at": (meta.get("dropped_at") or epochs + (0 if scores else 1))
            if dropped else None,
            "bests": list(before.get("bests") or []) + [best.to_dict() if finite else None],
            "weights_path": weights_path,
            "seconds": list(before.get("seconds") or []) + [float(meta.get("seconds") or 0)],
            "tasks": list(before.get("tasks") or []) + [int(meta.get("tasks") or 0)]}


def export_search(svc: Services, job: Job, finalists: list[int]) -> None:
    """End a decided search: the mean of the finalists' best weights evaluated on the whole
    holdout and exported as ``models/<job>/latest.keras`` (and ``v1.keras``), the job DONE
    at version 1 with ``search.selected``; FAILED when every candidate was dropped or the
    model is degenerate (``domain.health``)."""
    started, now = time.perf_counter(), svc.clock()
    record = dict(job.search or {})
    if not finalists:
        reasons = "; ".join(f"candidate {r['index']}: {r['reason']}" for r in standings(record))
        _end(svc, job, fail_fields(now, f"search: expected a candidate that trains; found "
                                        f"every one dropped ({reasons})"[:1900]))
        return
    runtime = job_runtime(svc, job)
    with runtime.lock:
        model, selected = _mean_model(svc, runtime, record, finalists)
        found = evaluate_parts(model, None, runtime.holdout_parts(), runtime.spec.task)
        figures = holdout_figures(found, runtime.spec.regression)
        sidecar = {**model_sidecar(job, runtime.manifest, found.accuracy, figures, 1),
                   "search": selected}
        data = export_keras(model, sidecar)
        ranked = column_importance(job, runtime, model.get_weights(), model)
    problem = degenerate(job, runtime, found)
    if problem is not None:
        _end(svc, job, fail_fields(now, problem))
        return
    write_model(svc, job.job_id, 1, data)
    head = Head(1, "", "").evaluated(found.accuracy, found.loss, figures)
    record["selected"] = selected
    used = {**svc.usage(job.job_id), "aggregator_seconds": round(time.perf_counter() - started,
                                                                 6)}
    if _end(svc, job, ending_fields(
            DONE, now, model_path=layout.model_path(job.job_id), head=head.to_doc(), version=1,
            final_holdout_rows=found.rows, usage=added(job.usage, used), search=record,
            feature_importance=ranked)):
        log.info("job %s: DONE, the mean of candidates %s, holdout %s", job.job_id,
                 finalists, headline(found))


def _end(svc: Services, job: Job, fields: dict[str, Any]) -> bool:
    """End the job as its writer, fenced; False when it has ended meanwhile.

    Raises:
        TransientError: it changed otherwise (read it again and decide again).
    """
    ended, current = end_job(svc.registry, job.job_id, fields, expect=search_fence(job))
    if ended:
        return True
    if current is None or current.is_terminal:
        return False
    raise TransientError(f"job {job.job_id}: changed under its writer before it could end")


def _mean_model(svc: Services, runtime: JobRuntime, record: dict[str, Any],
                finalists: list[int]) -> tuple[Any, dict[str, Any]]:
    """The finalists' models with their best weights, as recorded, and their mean
    (``candidates.mean_of``)."""
    manifest, members = runtime.manifest, []
    for index in finalists:
        candidate = Candidate.from_dict(record["candidates"][index])
        member = build_model(candidate_spec(runtime.spec, candidate), manifest.mean,
                             manifest.variance, manifest.schema, manifest.preprocessing)
        path = record["lines"][str(index)]["weights_path"]
        raw = svc.store.read_bytes(svc.settings.models_bucket, path)
        arrays, _ = codec.decode_segment(raw, path)
        member.set_weights(arrays["b"] or arrays["w"])
        members.append(member)
    bests = [b for b in record["lines"][str(finalists[0])]["bests"] if b is not None]
    single = max((Score.from_dict(b) for b in bests), key=Score.key)
    return mean_of(members, finalists, single, runtime.validation(), runtime.spec)
