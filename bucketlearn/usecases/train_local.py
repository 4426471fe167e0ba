"""The serial baseline (``bucketlearn train-local``).

``train_local`` runs the *same* split (same options, same seed, hence the same holdout), builds
the same model with the same initial weights and optimizer, and trains it in one process through
the same tasks one after another: the plan the pipeline makes with ``parallel_tasks=1``, the same
row order in every task and the same learning rate at every step. So the only difference between
``train-local`` and a pipeline job is the pipeline's parallel rounds; with ``parallel_tasks=1``
the pipeline takes exactly these steps, to the bit (the aggregator takes each delta exactly:
``domain.fold``), on the same machine and TensorFlow thread settings.

It is handed its ``Services`` (``svc``) by the caller, as every service is: the CLI, the
tests and the benchmarks pass fresh in-memory ones (``bootstrap.memory_services()``), which the
split, the results and the versions fill.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bucketlearn.config import Limits
from bucketlearn.domain.recipe import RECIPE
from bucketlearn.errors import ConfigError
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ingest.parts import load_parts
from bucketlearn.ingest.split import split_upload
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.ml.model import spec_for
from bucketlearn.ml.training import evaluate_detail
from bucketlearn.options import JobOptions
from bucketlearn.ports import Services
from bucketlearn.services.caches import read_holdout_sample
from bucketlearn.services.line import TrainingLine
from bucketlearn.services.planning import budgeted, outline_of


@dataclass
class SerialResult:
    accuracy: float | None  # None for a regression (its figures are in ``report``)
    loss: float
    seconds: float
    manifest: Manifest
    model: Any
    weights: list[Any]
    # classification_report, or a regression's RMSE, MAE and R² (RegressionTally.report)
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    spec: Any = None  # the model's ModelSpec (its task and seed)
    selection: dict[str, Any] = dataclasses.field(default_factory=dict)  # _Checkpoints.summary
    epochs: int = 0  # the epochs trained (fewer than the options' when training stopped early)
    options: JobOptions | None = None  # as the budget resolved them
    tasks: int = 0  # the tasks trained (a chained job's versions)


def local_source(path: str) -> SourceFile:
    return SourceFile(display_name=os.path.basename(path), size=os.path.getsize(path),
                      opener=lambda: open(path, "rb"))


def train_local(path: str, options: JobOptions, limits: Limits | None = None, *,
                svc: Services, recipe: int = RECIPE,
                on_epoch: Callable[[int, float, list[Any]], None] | None = None,
                split: tuple[Manifest, JobOptions] | None = None) -> SerialResult:
    """Train serially on the same split and tasks the pipeline would use, scoring each epoch's
    last state on the validation rows and stopping where the pipeline would
    (``domain.recipe.select``); evaluate the best on the same holdout. The split is written to
    ``svc``'s work bucket (in-memory services: nothing else is read or written). ``recipe``:
    the model's (1: the one before recipe 2, for benchmarks that compare the two).
    ``on_epoch(epoch, seconds, weights)`` is called with each epoch's last state before it is
    scored (a benchmark's trace; its time counts). ``split``: ``split_locally``'s answer for
    ``path``, made already on ``svc``."""
    started = time.perf_counter()
    limits = limits or Limits()
    manifest, options = split or split_locally(path, options, limits, svc)
    spec = spec_for(manifest, options, local_source(path).display_name, recipe)
    line = TrainingLine(svc, manifest, options, spec, limits, started, on_epoch=on_epoch)
    while not line.train_epoch():
        pass
    found = evaluate_holdout(svc, manifest, line.model, line.final_weights, spec.task)
    return SerialResult(found.accuracy, found.loss, time.perf_counter() - started, manifest,
                        line.model, list(line.final_weights), found.report, spec,
                        line.checkpoints.summary(), line.epoch, options,
                        line.epoch * line.tasks_per_epoch)


def evaluate_holdout(svc: Services, manifest: Manifest, model: Any,
                     weights: list[Any] | None, task: str) -> Any:
    """``weights`` (the model's own when None) on the split's whole holdout
    (``ml.training.Evaluation``)."""
    x, y = load_parts(svc.store, svc.settings.work_bucket, manifest.holdout_parts)
    return evaluate_detail(model, weights, x, y, task)


def split_locally(path: str, options: JobOptions, limits: Limits,
                  svc: Services) -> tuple[Manifest, JobOptions]:
    """The split the pipeline would make of ``path`` (written to ``svc``'s work bucket), and
    the options with their budget resolved for it.

    Raises:
        ConfigError: ``continue_from`` is set (a job continues another through the buckets;
            ``train-local`` trains a new model).
    """
    if options.parent is not None:
        raise ConfigError("continue_from", "a job submitted through the buckets (train-local "
                          "trains a new model, in one process)",
                          f"continue_from={options.continue_from}")
    source = local_source(path)
    manifest = split_upload(source, svc.store, svc.settings.work_bucket, "local", options, limits)
    options, _ = budgeted(options, outline_of(manifest), source.display_name)
    return manifest, options


def sample_figures(result: SerialResult, svc: Services, max_rows: int) -> dict[str, Any]:
    """``train_local``'s final model measured on the evaluation sample a pipeline job's
    versions are measured on (``caches.read_holdout_sample``: the same ``max_rows``, the same
    seed, hence the same rows), so a version's figure and ``train-local``'s compare like for
    like: accuracy, loss, and a numeric target's RMSE (None for classes), and the rows."""
    x, y = read_holdout_sample(svc, result.manifest, list(result.manifest.holdout_part_rows),
                               result.spec, max_rows)
    found = evaluate_detail(result.model, result.weights, x, y, result.spec.task)
    return {"accuracy": found.accuracy, "loss": found.loss, "rmse": found.report.get("rmse"),
            "rows": len(y)}
