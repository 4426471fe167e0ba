"""The in-process training loop the aggregation studies vary (``suites/methods.py``,
``rate_rule.py``, ``round_cause.py``): the pipeline's real split, tasks, learning-rate schedule
and local step on the in-memory ports, with the round's fold left to the caller; and one fold
they share, one Adam step on the mean of one-step tasks' gradients."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import datasets

# epochs a dataset trains for in these studies: image sets (and their sized variants, such as
# hmnist4-48k) 5; tables the default 10
EPOCHS = {name: 5 for name in datasets.WRITERS if name.split("-")[0] in datasets.IMAGE}
BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-7  # Keras's Adam defaults, which the model compiles


class Experiment:
    """One dataset, order, seed: its split, tasks, model, and the candidates' training loops."""

    def __init__(self, name: str, path: Path, seed: int, epochs: int, **options: Any) -> None:
        """``options``: other job options (``JobOptions`` fields), e.g. a label column."""
        from bucketlearn.bootstrap import memory_services
        from bucketlearn.config import Limits
        from bucketlearn.ingest.parts import load_parts
        from bucketlearn.ingest.split import split_upload
        from bucketlearn.ml.model import build_model, spec_for
        from bucketlearn.ml.training import optimizer_state
        from bucketlearn.options import JobOptions
        from bucketlearn.usecases.train_local import local_source
        from bucketlearn.usecases.upload import budgeted, outline_of

        self.options = JobOptions(seed=seed, epochs=epochs, **options)
        svc = memory_services()
        manifest = split_upload(local_source(str(path)), svc.store, svc.settings.work_bucket,
                                "bench", self.options, Limits())
        self.options, _ = budgeted(self.options, outline_of(manifest), path.name)
        self.spec = spec_for(manifest, self.options, path.name)
        self.shards = [load_parts(svc.store, svc.settings.work_bucket, list(s.parts))
                       for s in manifest.shards]
        self.holdout = load_parts(svc.store, svc.settings.work_bucket, manifest.holdout_parts)
        self.model = build_model(self.spec, manifest.mean, manifest.variance, manifest.schema,
                                 manifest.preprocessing)
        self.initial = ([np.asarray(w) for w in self.model.get_weights()],
                        optimizer_state(self.model))
        self.name, self.seed, self.epochs = name, seed, epochs

    def plan(self, parallel: int) -> Any:
        from bucketlearn.domain.plan import plan_training

        return plan_training([len(y) for _, y in self.shards], self.epochs,
                             self.options.batch_size, requested=parallel)

    def task(self, weights: list[np.ndarray], optimizer: list[np.ndarray], shards: list[int],
             epoch: int, index: int, span: tuple[float, float], rate_scale: float = 1.0) -> Any:
        """One task's result; ``rate_scale``: the factor on the job's learning rate."""
        from bucketlearn.domain.plan import step_rates
        from bucketlearn.ml.training import train_task

        x = np.concatenate([self.shards[i][0] for i in shards])
        y = np.concatenate([self.shards[i][1] for i in shards])
        rates = step_rates(self.options.learning_rate * rate_scale, self.options.lr_schedule, span,
                           math.ceil(len(y) / self.options.batch_size))
        return train_task(self.model, weights, optimizer, x, y, self.options.batch_size, rates,
                          self.seed, epoch, index)

    def accuracy(self, weights: list[np.ndarray]) -> float:
        from bucketlearn.ml.training import evaluate

        return evaluate(self.model, weights, *self.holdout)[0]

    def rounds(self, parallel: int) -> Any:
        """(epoch, round index, [(task index, shard indices)], progress span) of the plan."""
        from bucketlearn.domain.plan import epoch_tasks

        plan = self.plan(parallel)
        for epoch in range(1, self.epochs + 1):
            tasks = epoch_tasks(plan, len(self.shards), self.seed, epoch)
            for r in range(plan.rounds_per_epoch):
                yield epoch, r, [(t, tasks[t]) for t in plan.round_range(r)], plan.span(epoch, r)


def gradient_fold(model: Any, base: tuple[list[Any], list[Any]], results: list[Any],
                  rate: float) -> tuple[list[Any], list[Any]]:
    """One Adam step (Keras's update) on the mean of one-step tasks' gradients, each recovered
    from its momentum; the state is that step's (mean momentum, velocity of the mean). The
    optimizer's moments come in pairs, one per trainable variable, in that order."""
    paths = [w.path for w in model.weights]
    trainable = [paths.index(v.path) for v in model.trainable_variables]
    weights = [np.asarray(w, np.float64).copy() for w in base[0]]
    iteration = np.asarray(base[1][0])
    step = float(iteration) + 1
    alpha = rate * math.sqrt(1 - BETA_2 ** step) / (1 - BETA_1 ** step)
    state: list[Any] = [iteration + 1]
    for j, index in enumerate(trainable):
        m0, v0 = (np.asarray(base[1][1 + 2 * j + k], np.float64) for k in (0, 1))
        momentum = np.mean([np.asarray(r.optimizer[1 + 2 * j], np.float64) for r in results],
                           axis=0)
        gradient = (momentum - BETA_1 * m0) / (1 - BETA_1)
        velocity = v0 + (gradient * gradient - v0) * (1 - BETA_2)
        weights[index] -= alpha * momentum / (np.sqrt(velocity) + EPSILON)
        state += [momentum.astype(np.float32), velocity.astype(np.float32)]
    return [w.astype(np.float32) for w in weights], state
