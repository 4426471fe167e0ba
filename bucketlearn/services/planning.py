"""A job's plan and budget as the split decides them: what the upload, ``train-local`` and a
search's learners each need, in one place that reaches no other service."""

from __future__ import annotations

import dataclasses

from bucketlearn.config import Limits
from bucketlearn.domain.columns import is_matrix, matrix_width
from bucketlearn.domain.plan import OverLimit, TrainingPlan, plan_training
from bucketlearn.domain.recipe import Budget, resolve_budget
from bucketlearn.domain.search import auto_search, candidate_epochs, rungs
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ingest.split import Outline
from bucketlearn.ml.model import model_kind
from bucketlearn.options import NONE, SEARCH_AUTO, JobOptions


def outline_of(manifest: Manifest) -> Outline:
    """A split's outline (``ingest.split.Outline``) as its manifest records it."""
    return Outline([s.rows for s in manifest.shards], manifest.schema,
                   manifest.target is not None)


def budgeted(options: JobOptions, outline: Outline, file: str) -> tuple[JobOptions, Budget]:
    """``options`` with each automatic epochs, batch size, learning rate and patience resolved
    for the rows the job trains on and its model (``domain.recipe.resolve_budget``), and
    ``search=auto`` (``domain.search.auto_search``), and the budget that says what each became
    and why."""
    image = model_kind(options.model, matrix_width(outline.schema), is_matrix(outline.schema),
                       file) == "cnn"
    budget = resolve_budget(sum(outline.shard_rows), image, options.epochs or None,
                            options.batch_size or None, options.learning_rate or None,
                            options.patience or None, continued=options.parent is not None)
    search = options.search
    if search == SEARCH_AUTO:
        search, why = auto_search(sum(outline.shard_rows), options.validation_fraction != NONE)
        budget = dataclasses.replace(budget, reasons={**budget.reasons, "search": why})
    return dataclasses.replace(options, epochs=budget.epochs, batch_size=budget.batch_size,
                               learning_rate=budget.learning_rate, patience=budget.patience,
                               search=search), budget


def plan_for(outline: Outline, options: JobOptions, limits: Limits,
             requested: int | None) -> TrainingPlan:
    """``plan_training`` for a split upload: its shards, epochs and batch size, its target, and
    the bytes a task may hold (``limits.max_shard_bytes``). ``requested``: R, or None for auto."""
    return plan_training(outline.shard_rows, options.epochs, options.batch_size, requested,
                         regression=outline.regression,
                         shard_cells=matrix_width(outline.schema),
                         max_task_bytes=limits.max_shard_bytes)


def chained_plan(manifest: Manifest, options: JobOptions, limits: Limits) -> TrainingPlan:
    """The job's plan one task at a time: what ``automatic_layout`` may choose instead, and
    what ``train-local`` trains (so both group shards into tasks the same way)."""
    return plan_for(outline_of(manifest), options, limits, 1)


def search_refusal(manifest: Manifest, options: JobOptions) -> OverLimit | None:
    """Why a searched job cannot be trained (None when it can): it holds no validation rows
    to select its candidates on."""
    if not options.search or manifest.validation_rows:
        return None
    return OverLimit("a search selects its candidates on the validation rows, and this job "
                     "holds none",
                     "validation rows: at least 100 training rows and validation_fraction "
                     "not none (or search off)",
                     f"{manifest.train_rows} training rows, none held out for validation")


def searched_over(over: OverLimit | None, plan: TrainingPlan, options: JobOptions
                  ) -> OverLimit | None:
    """A limit ``searched_plan`` is over, saying that its epochs are a search's."""
    if over is None or not options.search:
        return over
    return dataclasses.replace(
        over, expected=f"{over.expected}; or fewer candidates (search)",
        found=f"{over.found} (a search of {options.search} candidates: "
              f"{searched_plan(plan, options).epochs} candidate-epochs for {plan.epochs} "
              "epochs of one model)")


def auto_search_off(options: JobOptions, budget: Budget, over: OverLimit
                    ) -> tuple[JobOptions, Budget]:
    """``search=auto`` turned off because the search it chose is ``over`` one of the
    deployment's limits (a search the user asked for is refused instead): the options and the
    budget saying why."""
    why = f"off: {options.search} candidates would be over a limit ({over.found})"
    return (dataclasses.replace(options, search=0),
            dataclasses.replace(budget, reasons={**budget.reasons, "search": why}))


def searched_plan(plan: TrainingPlan, options: JobOptions) -> TrainingPlan:
    """The work a job does in all, which the deployment's limits bound: a searched job's plan
    with every candidate's epochs summed (``domain.search.candidate_epochs``)."""
    if not options.search:
        return plan
    return dataclasses.replace(plan, epochs=candidate_epochs(rungs(options.search,
                                                                   plan.epochs)))
