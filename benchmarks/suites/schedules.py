"""Benchmark 6 — which learning-rate schedule: ``train-local`` with each, on the tuning datasets.

The schedule is the same for serial training and the pipeline (``domain.plan.learning_rate``),
so this compares serial training with itself: which schedule gives the better final model, and
how much the final model depends on the seed. Every tuning dataset (``datasets.TUNING``),
shuffled, seeds 0-2; holdout accuracy of the final model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.harness import datasets
from benchmarks.harness.data import scratch_dir
from benchmarks.harness.experiment import EPOCHS
from benchmarks.harness.figures import mean
from benchmarks.harness.procs import log
from benchmarks.report.results import goal, new_result

FULL = {"datasets": list(datasets.TUNING), "schedules": ["wsd", "constant", "cosine"],
        "seeds": [0, 1, 2]}
SMOKE = {"datasets": ["digits"], "schedules": ["wsd", "constant"], "seeds": [0], "epochs": 1}


def run(out: Path, smoke: bool = False, params: dict[str, Any] | None = None) -> dict[str, Any]:
    from bucketlearn.bootstrap import memory_services
    from bucketlearn.options import JobOptions
    from bucketlearn.usecases.train_local import train_local

    params = params or (SMOKE if smoke else FULL)
    result = new_result("schedules", smoke, params)
    started = time.monotonic()
    cells: dict[str, Any] = {}
    with scratch_dir("schedules") as tmp:
        for name in params["datasets"]:
            path = datasets.write(name, tmp / f"{name}.csv", "shuffled")
            epochs = params.get("epochs", EPOCHS.get(name, 10))
            for schedule in params["schedules"]:
                accuracies = []
                for seed in params["seeds"]:
                    log(f"schedules: {name} {schedule} seed {seed}")
                    options = JobOptions(seed=seed, epochs=epochs, lr_schedule=schedule)
                    accuracies.append(train_local(str(path), options,
                                                  svc=memory_services()).accuracy)
                cells[f"{name}/{schedule}"] = {
                    "dataset": name, "schedule": schedule, "epochs": epochs,
                    "accuracies": accuracies, "mean": mean(accuracies),
                    "spread_pp": (max(accuracies) - min(accuracies)) * 100}
    result["figures"] = cells
    best: dict[str, str] = {}
    for name in params["datasets"]:
        mine = {c["schedule"]: c["mean"] for c in cells.values() if c["dataset"] == name}
        best[name] = max(mine, key=lambda k: mine[k])
    result["ratios"] = {f"{k}:mean": c["mean"] for k, c in cells.items()}
    wins = sum(1 for b in best.values() if b == params["schedules"][0])
    goal(result, f"datasets where {params['schedules'][0]} gives the best mean (no goal)", wins,
         "report", None)
    result["notes"].append("each figure is train-local's holdout accuracy with that schedule "
                           "(the pipeline uses the same one); spread = best seed - worst seed")
    result["seconds"] = time.monotonic() - started
    return result


TABLE_HEADER = ["dataset", "schedule", "epochs", "mean accuracy", "seeds 0 / 1 / 2",
                "spread (points)"]


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    return [[c["dataset"], c["schedule"], str(c["epochs"]), f"{c['mean']:.4f}",
             " / ".join(f"{a:.4f}" for a in c["accuracies"]), f"{c['spread_pp']:.2f}"]
            for c in result["figures"].values()]
