"""Why a parallel round loses to serial training (issue #25): the same table, trained five ways.

``python -m benchmarks.round_cause`` trains the diamonds table (53,940 rows as plotnine ships it,
label ``cut``, 5 classes, 10 epochs, the defaults otherwise) in process, on the pipeline's split,
tasks and learning-rate schedule, with the round's fold done here so that it can be varied:

* ``serial``: one task at a time, batch 32 (what ``train-local`` does);
* ``round-5``: rounds of 5 one-shard tasks (256 rows, H = 8 Adam steps each) from the same
  version, the mean of their deltas and of their optimizer states (today's fold with η = 1);
* ``serial-160``: one task at a time, batch 160 (the round's 5 × 32 rows in one step);
* ``round-5-h1``: rounds of 5 one-step tasks (32-row shards: H = 1), the same mean fold;
* ``round-5-h1-gradients``: the same rounds, folded as one Adam step on the mean of the tasks'
  *gradients* (recovered from each task's momentum: ``m_i = β1·m + (1-β1)·g_i``), which is what
  one process taking the round's 160 rows as one batch does;
* ``round-5-scaled``: rounds of 5 one-shard tasks, each at 5 times the job's learning rate, the
  mean fold: the rule the pipeline uses since (``TrainingPlan.task_rate_scale``).

With H = 1 a task takes no step from its own result, so nothing drifts: what differs between
``round-5-h1`` and ``round-5-h1-gradients`` is only how the tasks' Adam updates are combined.
The dataset is fetched once from the plotnine wheel on PyPI (``pip download``; no install).
"""

from __future__ import annotations

import math
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common
from benchmarks.common import log
from benchmarks.methods import Experiment

WHEEL = "plotnine==0.15.9"
MEMBER = "plotnine/data/diamonds.csv"
CASES: dict[str, dict[str, Any]] = {
    "serial": {"parallel": 1, "rows_per_shard": 256, "batch": 32, "fold": "mean"},
    "round-5": {"parallel": 5, "rows_per_shard": 256, "batch": 32, "fold": "mean"},
    "serial-160": {"parallel": 1, "rows_per_shard": 256, "batch": 160, "fold": "mean"},
    "round-5-h1": {"parallel": 5, "rows_per_shard": 32, "batch": 32, "fold": "mean"},
    "round-5-h1-gradients": {"parallel": 5, "rows_per_shard": 32, "batch": 32,
                             "fold": "gradients"},
    "round-5-scaled": {"parallel": 5, "rows_per_shard": 256, "batch": 32, "fold": "mean",
                       "rate_scale": 5.0},
}
BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-7  # Keras's Adam defaults, which the model compiles


def diamonds(cache: Path) -> Path:
    """plotnine's diamonds.csv, read out of its wheel (downloaded once into ``cache``)."""
    target = cache / "diamonds.csv"
    if not target.exists():
        with zipfile.ZipFile(common.pip_download(WHEEL, cache)) as archive:
            target.write_bytes(archive.read(MEMBER))
    return target


def mean_fold(base: tuple[list[Any], list[Any]], results: list[Any]
              ) -> tuple[list[Any], list[Any]]:
    """Today's fold with η = 1 (``domain.fold.fold_round``): mean weights and mean state."""
    from bucketlearn.domain.fold import TaskResult, fold_round

    tasks = [TaskResult(i, [np.asarray(a, np.float64) - b for a, b in zip(r.weights, base[0],
                                                                          strict=True)],
                        r.optimizer, r.examples) for i, r in enumerate(results)]
    folded = fold_round(base[0], base[1], tasks, 1.0)
    assert folded is not None
    return folded


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


def run_case(path: Path, case: dict[str, Any], epochs: int) -> dict[str, Any]:
    """Train one case to the end; its holdout accuracy and seconds."""
    from bucketlearn.domain.plan import learning_rate

    exp = Experiment("diamonds", path, 0, epochs, label_column="cut",
                     rows_per_shard=case["rows_per_shard"], batch_size=case["batch"])
    state = exp.initial
    started = time.perf_counter()
    for epoch, _round, members, span in exp.rounds(case["parallel"]):
        results = [exp.task(*state, shards, epoch, t, span, case.get("rate_scale", 1.0))
                   for t, shards in members]
        if case["fold"] == "gradients":
            rate = learning_rate(exp.options.learning_rate, exp.options.lr_schedule, span[0])
            state = gradient_fold(exp.model, state, results, rate)
        else:
            state = mean_fold(state, results)
    return {**case, "accuracy": exp.accuracy(state[0]),
            "seconds": time.perf_counter() - started}


def main() -> None:
    epochs = 10
    result = common.new_result("round_cause", False, {"cases": CASES, "epochs": epochs,
                                                      "dataset": f"{WHEEL}: {MEMBER}"})
    path = diamonds(common.REPO / ".cache" / "plotnine")
    for name, case in CASES.items():
        log(f"round_cause: {name}")
        result.setdefault("figures", {})[name] = run_case(path, case, epochs)
        log(f"round_cause: {name}: {result['figures'][name]['accuracy']:.4f}")
    common.write_result(common.RESULTS, "round_cause", result)


if __name__ == "__main__":
    main()
