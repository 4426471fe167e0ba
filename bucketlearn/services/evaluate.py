"""Evaluating a job's committed versions on its holdout, off the fold's critical path.

``evaluate_version`` measures one version on the job's fixed evaluation sample;
``record_evaluation`` writes the figures on the version's document (and on the job's head while
the head is that version); ``record_late_evaluation`` on the version's document only, for an
evaluation that arrives once its job's aggregation has ended. What the measuring is made of is a
``Scoring`` (the defaults here, or a test's own); where an aggregation evaluates is its
``aggregation.evaluators.Evaluator``'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bucketlearn.domain.job import Job
from bucketlearn.domain.metrics import holdout_fields, regression_fields, regression_headline
from bucketlearn.domain.recipe import Score
from bucketlearn.domain.version import Evaluation
from bucketlearn.ml.training import evaluate_detail, evaluate_parts
from bucketlearn.ports import Services
from bucketlearn.services.caches import job_runtime

log = logging.getLogger(__name__)


def evaluate_version(svc: Services, job: Job, weights: list[Any], version: int
                     ) -> tuple[Evaluation, float] | None:
    """One version's holdout figures on the job's fixed evaluation sample (None if it could not
    be evaluated: an unevaluated version is still a good version)."""
    started = time.perf_counter()
    try:
        runtime = job_runtime(svc, job)
        x_eval, y_eval = runtime.holdout(svc.settings.eval_max_rows)
        with runtime.lock:
            found = evaluate_detail(runtime.model, weights, x_eval, y_eval, runtime.spec.task)
    except Exception:  # noqa: BLE001 - training goes on; the export evaluates the final model
        log.warning("job %s: could not evaluate v%d", job.job_id, version, exc_info=True)
        return None
    figures = {"holdout_accuracy": found.accuracy, "holdout_loss": found.loss,
               **holdout_figures(found, runtime.spec.regression)}
    evaluation = Evaluation(version, {k: v for k, v in figures.items() if v is not None},
                            svc.clock(), round(time.perf_counter() - started, 6))
    log.info("job %s: v%d holdout %s", job.job_id, version, headline(found))
    return evaluation, found.loss


def checkpoint_score(svc: Services, job: Job, epoch: int, version: int,
                     weights: list[Any]) -> Score:
    """A job's checkpoint scored on its validation sample (``validation_score``)."""
    runtime = job_runtime(svc, job)
    with runtime.lock:
        return validation_score(runtime.model, weights, *runtime.validation(), runtime.spec,
                                epoch, version)


@dataclass(frozen=True)
class Scoring:
    """What an aggregation measures models with, named so that a test hands in its own (to
    slow one down, fail one, or act in the middle of one) instead of patching this module.

    Each field keeps its default's signature and contract: ``evaluate_version`` a committed
    version's holdout figures (None: not evaluated), ``checkpoint_score`` a checkpoint's
    validation score (raises when it cannot score it), ``evaluate_parts`` the export's
    evaluation of the final model on the whole holdout (``ml.training.evaluate_parts``).
    Taken by ``evaluators.InlineEvaluator``, ``writer.aggregate_job`` and
    ``process.AggregatorService`` (``bucketlearn.aggregation``); the defaults are production's.
    """

    evaluate_version: Callable[[Services, Job, list[Any], int],
                               tuple[Evaluation, float] | None] = evaluate_version
    checkpoint_score: Callable[[Services, Job, int, int, list[Any]], Score] = checkpoint_score
    evaluate_parts: Callable[..., Any] = evaluate_parts


def validation_score(model: Any, weights: list[Any], x: np.ndarray, y: np.ndarray,
                     spec: Any, epoch: int, version: int) -> Score:
    """A checkpoint's validation figures (``domain.recipe.Score``): what selection compares.
    ``train-local`` and the aggregator score the same weights on the same rows the same way."""
    found = evaluate_detail(model, weights, x, y, spec.task)
    if spec.regression:
        return Score(epoch, version, rmse=float(found.report["rmse"]), loss=float(found.loss))
    return Score(epoch, version, accuracy=float(found.accuracy), loss=float(found.loss))


def record_evaluation(svc: Services, job: Job, evaluation: Evaluation) -> Job:
    """Write one version's figures on its own document, and on the job's head while the head
    is that version; return the job as it then stands."""
    assert job.head is not None
    head = job.head.with_evaluation(evaluation)
    if svc.registry.record_evaluation(job.job_id, evaluation.version,
                                      version_fields(evaluation), head):
        return job.updated({"head": head.to_doc()})
    return job


def record_late_evaluation(svc: Services, job_id: str, evaluation: Evaluation) -> None:
    """Write one version's figures on its own document only, once its job's aggregation has
    ended (the job finished while the version was being evaluated, or its lease was let go):
    the head is left as it is (a finished job's are its export's, on the whole holdout)."""
    svc.registry.record_evaluation(job_id, evaluation.version, version_fields(evaluation), None)


def version_fields(evaluation: Evaluation) -> dict[str, Any]:
    """What an evaluation writes on its version's document."""
    return {**evaluation.figures, "evaluated_at": evaluation.evaluated_at,
            "eval_seconds": evaluation.seconds}


def holdout_figures(found: Any, regression: bool) -> dict[str, Any]:
    """A version's holdout figures as its document stores them (classes or a numeric target)."""
    return regression_fields(found.report) if regression else holdout_fields(found.report)


def headline(found: Any) -> str:
    """The holdout figures of a log line: accuracy, or a regression's RMSE, MAE and R²."""
    if found.accuracy is not None:
        return f"accuracy {found.accuracy:.4f}"
    report = found.report
    return regression_headline(report.get("rmse"), report.get("mae"), report.get("r2"))
