"""One model trained serially, epoch by epoch, through the tasks a chained plan makes
(``TrainingLine``): ``train-local``'s loop, and each candidate of a search (in one process, or
a segment at a time on a learner)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from bucketlearn.config import Limits
from bucketlearn.domain.plan import class_weights, epoch_tasks, step_rates
from bucketlearn.domain.recipe import Score, Selection, advance
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ingest.parts import load_parts
from bucketlearn.ml.model import build_model
from bucketlearn.ml.training import optimizer_state, train_task
from bucketlearn.options import JobOptions
from bucketlearn.ports import Services
from bucketlearn.services.caches import read_validation_sample
from bucketlearn.services.evaluate import validation_score
from bucketlearn.services.planning import chained_plan


class TrainingLine:
    """One model trained serially, epoch by epoch, through the tasks the pipeline's chained
    plan makes for ``options`` (its seed orders the rows), each epoch's last state scored on
    the validation rows (``_Checkpoints``). ``sample``: the validation rows, when the caller
    has read them already (a search's candidates share them); ``rows``: how a task's shard
    parts are read (``load_parts`` from the work bucket when None; a learner's part cache)."""

    def __init__(self, svc: Services, manifest: Manifest, options: JobOptions, spec: Any,
                 limits: Limits, started: float, *,
                 on_epoch: Callable[[int, float, list[Any]], None] | None = None,
                 sample: tuple[Any, Any] | None = None,
                 rows: Callable[[list[str]], tuple[Any, Any]] | None = None) -> None:
        self.svc, self.manifest, self.options, self.spec = svc, manifest, options, spec
        self.rows = rows or (lambda parts: load_parts(svc.store, svc.settings.work_bucket,
                                                      parts))
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
            x, y = self.rows(parts)
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

    def saved(self) -> tuple[dict[str, list[Any]], dict[str, Any]]:
        """Where the line stands, to go on elsewhere (``resume``): its weights (``w``),
        optimizer state (``o``) and best weights by validation (``b``), and its epochs,
        scores and last training loss."""
        loss = float(self.train_loss)
        return ({"w": self.weights, "o": self.optimizer,
                 "b": self.checkpoints.best_weights or []},
                {"epoch": self.epoch, "finished": self.finished,
                 "tasks_per_epoch": self.tasks_per_epoch,
                 "train_loss": loss if math.isfinite(loss) else None,
                 "scores": [s.to_dict() for s in self.checkpoints.scores]})

    def resume(self, arrays: Mapping[str, list[Any]], meta: Mapping[str, Any]) -> None:
        """Go on from what ``saved`` returned: the same steps as the line that saved it."""
        self.weights, self.optimizer = list(arrays["w"]), list(arrays["o"])
        self.epoch, self.finished = int(meta["epoch"]), bool(meta["finished"])
        self.tasks_per_epoch = int(meta.get("tasks_per_epoch") or 0)
        loss = meta.get("train_loss")
        self.train_loss = float(loss) if loss is not None else float("nan")
        self.checkpoints.resume([Score.from_dict(s) for s in meta.get("scores") or []],
                                list(arrays["b"]) or None)


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

    def resume(self, scores: list[Score], best_weights: list[Any] | None) -> None:
        """Take up ``scores`` scored elsewhere, in epoch order, and their best weights: the
        selection they make is advanced through them as ``done`` would have."""
        self.scores, self.best_weights, self.selection = scores, best_weights, None
        for score in scores:
            self.selection = advance(self.selection or Selection(), {score.epoch: score},
                                     self.options.patience, self.options.epochs)

    def summary(self) -> dict[str, Any]:
        """What ``train-local`` selected: the selection, every score, when the best was made."""
        if self.selection is None:
            return {}
        return {**self.selection.to_dict(self.options.patience),
                "scores": [s.to_dict() for s in self.scores],
                "best_seconds": self.best_seconds}
