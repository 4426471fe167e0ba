"""The serial baseline (``bucketlearn train-local``) and an in-process pipeline simulation.

``train_local`` runs the *same* split (same options, same seed, hence the same holdout), builds
the same model with the same initial weights and optimizer, and trains it in one process through
the same tasks one after another: the plan the pipeline makes with ``parallel_tasks=1``, the same
row order in every task and the same learning rate at every step. So the only difference between
``train-local`` and a pipeline job is the pipeline's parallel rounds; with ``parallel_tasks=1``
the pipeline takes exactly these steps, to the bit (the aggregator takes each delta exactly:
``domain.fold``), on the same machine and TensorFlow thread settings.

``simulate_pipeline`` runs the real upload, learner and aggregator code on the in-memory ports
with W workers whose tasks overlap in time (each trains the round's task it pulled). Training in
synchronous rounds makes the result independent of W: it only changes how long a round takes.

Both are handed their ``Services`` (``svc``) by the caller, as every service is: the CLI, the
tests and the benchmarks pass fresh in-memory ones (``bootstrap.memory_services()``), which the
split, the results and the versions fill.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bucketlearn.config import Limits
from bucketlearn.domain.plan import class_weights, epoch_tasks, step_rates
from bucketlearn.domain.recipe import RECIPE, Score, Selection, advance
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ingest.parts import load_parts
from bucketlearn.ingest.split import split_upload
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.ml.model import build_model, spec_for
from bucketlearn.ml.training import evaluate_detail, optimizer_state, train_task
from bucketlearn.options import JobOptions
from bucketlearn.ports import RuntimeCache, Services
from bucketlearn.services.evaluate import validation_score
from bucketlearn.services.runtime import read_holdout_sample, read_validation_sample
from bucketlearn.services.upload import budgeted, chained_plan, outline_of


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
                on_epoch: Callable[[int, float, list[Any]], None] | None = None) -> SerialResult:
    """Train serially on the same split and tasks the pipeline would use, scoring each epoch's
    last state on the validation rows and stopping where the pipeline would
    (``domain.recipe.select``); evaluate the best on the same holdout. The split is written to
    ``svc``'s work bucket (in-memory services: nothing else is read or written). ``recipe``:
    the model's (1: the one before recipe 2, for benchmarks that compare the two).
    ``on_epoch(epoch, seconds, weights)`` is called with each epoch's last state before it is
    scored (a benchmark's trace; its time counts)."""
    started = time.perf_counter()
    limits = limits or Limits()
    manifest, options = split_locally(path, options, limits, svc)
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
    the options with their budget resolved for it."""
    source = local_source(path)
    manifest = split_upload(source, svc.store, svc.settings.work_bucket, "local", options, limits)
    options, _ = budgeted(options, outline_of(manifest), source.display_name)
    return manifest, options


class TrainingLine:
    """One model trained serially, epoch by epoch, through the tasks the pipeline's chained
    plan makes for ``options`` (its seed orders the rows), each epoch's last state scored on
    the validation rows (``_Checkpoints``). ``sample``: the validation rows, when the caller
    has read them already (a search's candidates share them)."""

    def __init__(self, svc: Services, manifest: Manifest, options: JobOptions, spec: Any,
                 limits: Limits, started: float, *,
                 on_epoch: Callable[[int, float, list[Any]], None] | None = None,
                 sample: tuple[Any, Any] | None = None) -> None:
        self.svc, self.manifest, self.options, self.spec = svc, manifest, options, spec
        self.started, self.on_epoch = started, on_epoch
        self.model = build_model(spec, manifest.mean, manifest.variance, manifest.schema,
                                 manifest.preprocessing)
        self.plan = chained_plan(manifest, options, limits)
        self.weights, self.optimizer = self.model.get_weights(), optimizer_state(self.model)
        self.balance = class_weights(options.class_weight, manifest.train_counts)
        self.checkpoints = _Checkpoints(svc, manifest, spec, options, self.model, sample)
        self.epoch = 0
        self.finished = False
        self.train_loss = 0.0  # the last task's mean training loss
        self.tasks_per_epoch = 0

    @property
    def final_weights(self) -> list[Any]:
        """The best weights by validation (the last, with no validation rows)."""
        return self.checkpoints.best_weights or self.weights

    def train_epoch(self) -> bool:
        """Train the next epoch and score its last state; True once training is over (stopped
        by validation, or the last epoch trained)."""
        options, manifest = self.options, self.manifest
        self.epoch += 1
        tasks = epoch_tasks(self.plan, len(manifest.shards), options.seed, self.epoch)
        self.tasks_per_epoch = len(tasks)
        for task_index, members in enumerate(tasks):
            parts = [p for i in members for p in manifest.shards[i].parts]
            x, y = load_parts(self.svc.store, self.svc.settings.work_bucket, parts)
            rates = step_rates(options.learning_rate, options.lr_schedule,
                               self.plan.span(self.epoch, task_index),
                               math.ceil(len(y) / options.batch_size))
            result = train_task(self.model, self.weights, self.optimizer, x, y,
                                options.batch_size, rates, options.seed, self.epoch,
                                task_index, self.balance)
            self.weights, self.optimizer = result.weights, result.optimizer
            self.train_loss = result.train_loss
        seconds = time.perf_counter() - self.started
        if self.on_epoch is not None:
            self.on_epoch(self.epoch, seconds, list(self.weights))
        stopped = self.checkpoints.done(self.epoch, self.epoch * len(tasks), self.weights,
                                        time.perf_counter() - self.started)
        self.finished = stopped or self.epoch >= options.epochs
        return self.finished


class _Checkpoints:
    """``train-local``'s selection: each epoch's last weights scored on the validation sample
    (as the aggregator scores the pipeline's checkpoints), the best kept, the stop decided by
    ``domain.recipe.select``."""

    def __init__(self, svc: Services, manifest: Manifest, spec: Any, options: JobOptions,
                 model: Any, sample: tuple[Any, Any] | None = None) -> None:
        self.model, self.spec, self.options = model, spec, options
        self.sample = sample or (read_validation_sample(svc, manifest, spec)
                                 if manifest.validation_rows else None)
        self.scores: list[Score] = []
        self.best_weights: list[Any] | None = None
        self.selection: Selection | None = None
        self.best_seconds: float | None = None

    def done(self, epoch: int, version: int, weights: list[Any], seconds: float) -> bool:
        """Score epoch ``epoch``'s last state (version ``version`` in a chained job); True
        once training stops there."""
        if self.sample is None:
            return False
        score = validation_score(self.model, weights, *self.sample, self.spec, epoch, version)
        self.scores.append(score)
        self.selection = advance(self.selection or Selection(), {epoch: score},
                                 self.options.patience, self.options.epochs)
        if self.selection.best == score:
            self.best_weights, self.best_seconds = list(weights), seconds
        return self.selection.stop_epoch is not None

    def summary(self) -> dict[str, Any]:
        """What ``train-local`` selected: the selection, every score, when the best was made."""
        if self.selection is None:
            return {}
        return {**self.selection.to_dict(self.options.patience),
                "scores": [s.to_dict() for s in self.scores],
                "best_seconds": self.best_seconds}


def sample_figures(result: SerialResult, svc: Services, max_rows: int) -> dict[str, Any]:
    """``train_local``'s final model measured on the evaluation sample a pipeline job's
    versions are measured on (``runtime.read_holdout_sample``: the same ``max_rows``, the same
    seed, hence the same rows), so a version's figure and ``train-local``'s compare like for
    like: accuracy, loss, and a numeric target's RMSE (None for classes), and the rows."""
    x, y = read_holdout_sample(svc, result.manifest, list(result.manifest.holdout_part_rows),
                               result.spec, max_rows)
    found = evaluate_detail(result.model, result.weights, x, y, result.spec.task)
    return {"accuracy": found.accuracy, "loss": found.loss, "rmse": found.report.get("rmse"),
            "rows": len(y)}


def simulate_pipeline(path: str, options: JobOptions, workers: int = 2, *,
                      svc: Services) -> dict[str, Any]:
    """Run upload -> learners -> aggregator in-process with ``workers`` overlapping tasks, on
    ``svc`` (in-memory services of the run's own: the upload, the job and its versions stay
    there and are returned as ``"svc"``)."""
    from bucketlearn.services.aggregate import aggregate_job  # noqa: PLC0415
    from bucketlearn.services.learn import Learner  # noqa: PLC0415
    from bucketlearn.services.upload import StorageEvent, handle_upload  # noqa: PLC0415

    with open(path, "rb") as handle:
        info = svc.store.write_bytes(svc.settings.uploads_bucket, os.path.basename(path),
                                     handle.read(), "text/csv", options.to_metadata())
    _, job_id = handle_upload(svc, StorageEvent(info.bucket, info.name, info.generation, info.size))
    assert job_id is not None
    # one model (and optimizer) per worker, as in separate processes: each its own runtime cache
    learners = [Learner(dataclasses.replace(svc, cache=RuntimeCache()), f"sim-{i}")
                for i in range(workers)]
    in_flight: deque[tuple[Any, Learner]] = deque()
    pulled = 0
    started = time.perf_counter()
    for _ in range(1_000_000):
        job = svc.registry.get_job(job_id)
        assert job is not None
        if job.is_terminal:
            break
        while len(in_flight) < workers:
            received = svc.queue.pull(0)
            if received is None:
                break
            in_flight.append((received, learners[pulled % workers]))
            pulled += 1
        if not in_flight:
            aggregate_job(svc, job_id)
            continue
        received, learner = in_flight.popleft()
        decision = learner.handle(received)
        received.ack() if decision.value == "ack" else received.nack()
        aggregate_job(svc, job_id)
    job = svc.registry.get_job(job_id)
    assert job is not None
    return {"job": job, "seconds": time.perf_counter() - started,
            "versions": svc.registry.list_versions(job_id), "svc": svc}
