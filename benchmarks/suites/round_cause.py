"""Why a parallel round loses to serial training: the same table, trained five ways.

``python -m benchmarks.suites.round_cause`` trains the diamonds table (53,940 rows as plotnine
ships it, label ``cut``, 5 classes, 10 epochs, the defaults otherwise) in process, on the
pipeline's split, tasks and learning-rate schedule, with the round's fold done here so that it
can be varied:

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

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.experiment import Experiment, gradient_fold
from benchmarks.harness.paths import CACHE, RESULTS
from benchmarks.harness.procs import log
from benchmarks.harness.public import DIAMONDS_MEMBER, DIAMONDS_WHEEL, diamonds
from benchmarks.report.results import new_result, write_result

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
    result = new_result("round_cause", False, {"cases": CASES, "epochs": epochs,
                                               "dataset": f"{DIAMONDS_WHEEL}: {DIAMONDS_MEMBER}"})
    path = diamonds(CACHE / "plotnine")
    for name, case in CASES.items():
        log(f"round_cause: {name}")
        result.setdefault("figures", {})[name] = run_case(path, case, epochs)
        log(f"round_cause: {name}: {result['figures'][name]['accuracy']:.4f}")
    write_result(RESULTS, "round_cause", result)


if __name__ == "__main__":
    main()
