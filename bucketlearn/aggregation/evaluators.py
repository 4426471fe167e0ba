"""Where an aggregation evaluates its committed versions: an ``Evaluator`` is handed a version
(or a checkpoint) and the callback that takes its figures (``JobAggregator.evaluated``, or
``validated`` for a checkpoint's validation score), and measures it with its ``scoring``.

``InlineEvaluator`` measures at once and calls back before ``submit`` returns (the synchronous
pass, ``writer.aggregate_job``); the long-running process measures on a thread of its own and
calls back on the job's own thread (``process``). An evaluator never writes the aggregator's
state: what the figures change is the callback's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from bucketlearn.domain.job import Job
from bucketlearn.domain.recipe import Score
from bucketlearn.domain.version import Evaluation
from bucketlearn.ports import Services
from bucketlearn.services.evaluate import Scoring

Evaluated = Callable[[Evaluation, float], object]  # a version's figures and holdout loss
Validated = Callable[[Score], object]  # a checkpoint's validation score


class Evaluator(Protocol):
    """Where a committed version's holdout evaluation happens (an evaluator may skip a version
    when a newer one of the same job is waiting), and a checkpoint's validation score (never
    skipped), measured with its ``scoring`` (which the job's export measures the final model
    with too)."""

    scoring: Scoring

    def submit(self, svc: Services, job: Job, version: int, weights: list[Any],
               done: Evaluated) -> None: ...

    def score_checkpoint(self, svc: Services, job: Job, epoch: int, version: int,
                         weights: list[Any], done: Validated) -> None: ...


class InlineEvaluator:
    """Measure each committed version and checkpoint at once, on the caller's thread, with
    ``scoring`` (None: the production ``Scoring``); ``done`` is called before returning (not
    at all for a version that could not be evaluated)."""

    def __init__(self, scoring: Scoring | None = None) -> None:
        self.scoring = scoring or Scoring()

    def submit(self, svc: Services, job: Job, version: int, weights: list[Any],
               done: Evaluated) -> None:
        found = self.scoring.evaluate_version(svc, job, weights, version)
        if found is not None:
            done(*found)

    def score_checkpoint(self, svc: Services, job: Job, epoch: int, version: int,
                         weights: list[Any], done: Validated) -> None:
        done(self.scoring.checkpoint_score(svc, job, epoch, version, weights))
