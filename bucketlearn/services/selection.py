"""A job's selection in the pipeline: which version it exports, and when its training stops.

The last version of each epoch is a checkpoint. Each is scored on the job's validation sample
(``evaluate.validation_score``: the rows, the weights and the arithmetic ``train-local`` uses)
as the aggregator commits it, off the critical path, and the scores advance the job's
selection in epoch order (``domain.recipe.advance``). The selection rides on the next version's
commit (``Selector.fields``); once it says stop, the job goes straight to its export, where the
best checkpoint is exported (``complete``: any checkpoint not scored yet is scored then, so the
export never depends on how far scoring had come). A learner that trains past the stop (the
chain runs ahead of its commits) only makes versions nothing exports. So the exported model is
``train-local``'s, whatever the learners' number and timing.
"""

from __future__ import annotations

import logging
from typing import Any

from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import EXPORTING, RUNNING, TRAINING
from bucketlearn.domain.recipe import Score, Selection, advance
from bucketlearn.domain.version import Version
from bucketlearn.ports import Services
from bucketlearn.services.caches import job_runtime
from bucketlearn.services.evaluate import checkpoint_score

log = logging.getLogger(__name__)


def selecting(job: Job) -> bool:
    """Whether ``job`` picks its export by validation (its split held validation rows)."""
    return bool((job.dataset or {}).get("validation_rows"))


def checkpoint_epoch(job: Job, fields: dict[str, Any]) -> int | None:
    """The epoch a commit of ``job``'s current round closes (its ``fields``, the commit's job
    fields, open the next epoch or the export), or None mid-epoch."""
    if fields.get("epoch", job.epoch) != job.epoch or fields.get("phase") == EXPORTING:
        return job.epoch
    return None


class Selector:
    """What one job's aggregator knows of its selection: the state, scores that came ahead of
    the epochs before them, and whether the state changed since it was last written."""

    def __init__(self, svc: Services, job_id: str) -> None:
        self.svc, self.job_id = svc, job_id
        self.state = Selection()
        self.waiting: dict[int, Score] = {}
        self.changed = False

    def load(self, job: Job | None) -> None:
        """Take the state the job document records (after a takeover, a restart)."""
        if job is not None and not self.changed:
            recorded = Selection.from_dict(job.selection)
            if recorded.scored_through >= self.state.scored_through:
                self.state = recorded

    def scored(self, job: Job, score: Score) -> Selection:
        """A checkpoint's score is in: record it on its version, advance the state. Scores
        come in epoch order, so a gap before it is a score lost (a takeover, a failure): those
        checkpoints are scored now from their stored weights."""
        self._record(score)
        if score.epoch > self.state.scored_through:
            self.waiting[score.epoch] = score
        gap = [e for e in range(self.state.scored_through + 1, score.epoch)
               if e not in self.waiting]
        for found in self._stored_scores(job, gap).values() if gap else ():
            self._record(found)
            self.waiting[found.epoch] = found
        before = self.state
        self.state = advance(self.state, self.waiting, int(job.options.get("patience") or 1),
                             int(job.options["epochs"]))
        self.waiting = {e: s for e, s in self.waiting.items() if e > self.state.scored_through}
        self.changed = self.changed or self.state != before
        return self.state

    def _record(self, score: Score) -> None:
        self.svc.registry.record_evaluation(self.job_id, score.version, {
            f"validation_{k}": v for k, v in score.to_dict().items() if k in
            ("accuracy", "loss", "rmse")}, None)

    def _stored_scores(self, job: Job, epochs: list[int]) -> dict[int, Score]:
        """The scores of ``epochs``' checkpoints from their stored weights (those found; none
        when they cannot be read: the export scores them)."""
        try:
            return stored_scores(self.svc, job, epochs)
        except Exception:  # noqa: BLE001 - the export scores every checkpoint it lacks
            log.warning("job %s: could not score the checkpoints of epochs %s", self.job_id,
                        epochs, exc_info=True)
            return {}

    def fields(self, job: Job) -> dict[str, Any]:
        """The job fields that carry a changed state (with the next commit); {} if unchanged."""
        if not self.changed:
            return {}
        self.changed = False
        return {"selection": self.state.to_dict(int(job.options.get("patience") or 0))}

    def stop_if_due(self, job: Job, holder: str) -> bool:
        """End the job's training once the state says stop: straight to its export, on
        condition that it is still training and still this holder's. True when it did."""
        if self.state.stop_epoch is None or job.phase != TRAINING or job.is_terminal:
            return False
        fields = {"phase": EXPORTING, "updated_at": self.svc.clock(), **self.fields(job)}
        expect = {"status": RUNNING, "phase": TRAINING, "aggregated_by": job.aggregated_by}
        if not self.svc.registry.update_job_if(self.job_id, expect, fields):
            self.changed = True  # written with the next commit, or at the next look
            return False
        best = self.state.best
        log.info("job %s: validation stopped improving (best: epoch %s, v%s): training stops "
                 "after epoch %d", self.job_id, best.epoch if best else None,
                 best.version if best else None, self.state.stop_epoch)
        return True


def checkpoints(svc: Services, job: Job) -> dict[int, Version]:
    """The job's checkpoints committed so far (each epoch's last version), by epoch."""
    assert job.plan is not None
    last_round = job.plan.rounds_per_epoch - 1
    return {v.epoch: v for v in svc.registry.list_versions(job.job_id)
            if v.round == last_round and v.epoch >= 1}


def stored_score(svc: Services, job: Job, epoch: int, version: Version) -> Score:
    """A checkpoint's validation score from its stored weights (``checkpoint_score``)."""
    weights = job_runtime(svc, job).state(version.weights_path, version.digest)[0]
    return checkpoint_score(svc, job, epoch, version.version, weights)


def stored_scores(svc: Services, job: Job, epochs: list[int]) -> dict[int, Score]:
    """Validation scores of the checkpoints of ``epochs``, from their stored weights; an
    epoch with no checkpoint committed is left out."""
    if job.plan is None:
        return {}
    found = checkpoints(svc, job)
    return {e: stored_score(svc, job, e, found[e]) for e in sorted(epochs) if e in found}


def complete(svc: Services, job: Job, state: Selection) -> tuple[Selection, Version | None]:
    """The final selection of a job about to be exported, and its best checkpoint's version:
    every checkpoint up to where training stopped (or its last epoch) scored, those not scored
    yet scored now from their stored weights. (None: the job selects nothing.)"""
    if not selecting(job) or job.plan is None:
        return state, None
    epochs, patience = int(job.options["epochs"]), int(job.options.get("patience") or 1)
    found = checkpoints(svc, job)
    scores: dict[int, Score] = {}
    while state.stop_epoch is None and state.scored_through + 1 in found:
        epoch = state.scored_through + 1
        scores[epoch] = stored_score(svc, job, epoch, found[epoch])
        state = advance(state, scores, patience, epochs)
    best = state.best
    return state, (found.get(best.epoch) if best is not None else None)
