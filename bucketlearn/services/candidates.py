"""A search's candidate as it trains (``domain.search``): its options and model, its line
(``line.TrainingLine``) and how far a rung takes it, where it stands. The same in one process
(``usecases.local_search``) and a segment at a time on a learner (``loops.segment``)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bucketlearn.config import Limits
from bucketlearn.domain.recipe import Score
from bucketlearn.domain.search import Candidate, Rung, best_through
from bucketlearn.ml.model import ensemble_model
from bucketlearn.options import JobOptions
from bucketlearn.ports import Services
from bucketlearn.services.evaluate import validation_score
from bucketlearn.services.line import TrainingLine


@dataclass
class Standing:
    """One candidate's place in the search: the last rung it trained in, its best validation
    score, where it stands (``training``, ``pruned``, ``finalist``, ``dropped``) and why."""

    candidate: Candidate
    rung: int = 0
    epochs: int = 0
    best: Score | None = None
    state: str = "training"
    reason: str = ""
    dropped_at: int | None = None  # the epoch it diverged in
    # each rung's training and scoring seconds and tasks (versions), in rung order
    rung_seconds: list[float] = field(default_factory=list)
    rung_tasks: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**self.candidate.to_dict(), "configuration": self.candidate.describe(),
                "rung": self.rung, "epochs": self.epochs,
                "best": self.best.to_dict() if self.best else None, "state": self.state,
                "reason": self.reason, "seconds": round(sum(self.rung_seconds), 3),
                "rung_seconds": [round(t, 3) for t in self.rung_seconds],
                "rung_tasks": list(self.rung_tasks)}


def candidate_options(options: JobOptions, candidate: Candidate) -> JobOptions:
    """The job's options with the candidate's seed, rate and batch."""
    return dataclasses.replace(options, seed=candidate.seed, batch_size=candidate.batch_size,
                               learning_rate=candidate.learning_rate)


def candidate_spec(spec: Any, candidate: Candidate) -> Any:
    """The job's model spec with the candidate's seed, rate and shape."""
    return dataclasses.replace(spec, seed=candidate.seed,
                               learning_rate=candidate.learning_rate, **candidate.shaped())


def candidate_line(svc: Services, manifest: Any, options: JobOptions, spec: Any,
                   limits: Limits, sample: tuple[Any, Any], candidate: Candidate,
                   rows: Callable[[list[str]], tuple[Any, Any]] | None = None
                   ) -> TrainingLine:
    """The candidate's training line: the job's options and spec with its seed, rate, batch
    and shape (candidate 0's are the job's own); the same on a learner as in one process
    (``rows``: how it reads shard parts, ``TrainingLine``'s)."""
    return TrainingLine(svc, manifest, candidate_options(options, candidate),
                        candidate_spec(spec, candidate), limits, time.perf_counter(),
                        sample=sample, rows=rows)


def train_to(line: TrainingLine, rung: Rung, standing: Standing) -> None:
    """Train ``line`` up to the rung's epochs (or until it stops or diverges)."""
    began, epochs = time.perf_counter(), line.epoch
    while not line.finished and line.epoch < rung.epochs and standing.state != "dropped":
        line.train_epoch()
        if not math.isfinite(line.train_loss):
            standing.state, standing.dropped_at = "dropped", line.epoch
            standing.reason = f"diverged: training loss {line.train_loss} in epoch {line.epoch}"
    standing.rung, standing.epochs = rung.index, line.epoch
    standing.best = best_through(line.checkpoints.scores, rung.epochs)
    if standing.best is not None and not standing.best.is_finite():
        standing.state, standing.dropped_at = "dropped", line.epoch
        standing.reason = "diverged: its validation score is not a number"
    standing.rung_seconds.append(time.perf_counter() - began)
    standing.rung_tasks.append((line.epoch - epochs) * line.tasks_per_epoch)


def mean_of(members: list[Any], finalists: list[int], single: Score,
            sample: tuple[Any, Any], spec: Any) -> tuple[Any, dict[str, Any]]:
    """The model a search selects, from its finalists' models holding their best weights (in
    the order ``finalists`` ranks them; ``single``: the first's best validation score): their
    mean (one finalist: itself), and what was selected: the candidates, the mean's validation
    score on ``sample`` beside the best finalist's alone, and why."""
    if len(members) == 1:
        return members[0], {"candidates": list(finalists), "score": single.to_dict(),
                            "reason": f"candidate {finalists[0]}, the only finalist "
                                      f"({single.figure()} on the validation rows)"}
    mean = ensemble_model(members)
    together = validation_score(mean, None, *sample, spec, single.epoch, single.version)
    return mean, {
        "candidates": list(finalists),
        "score": {k: v for k, v in together.to_dict().items() if k not in ("epoch", "version")},
        "alone": {"candidate": finalists[0], "score": single.to_dict()},
        "reason": (f"the mean of the {len(finalists)} finalists (candidates "
                   f"{', '.join(map(str, finalists))}): {together.figure()} on the validation "
                   f"rows; the best of them alone, candidate {finalists[0]}: {single.figure()}")}
