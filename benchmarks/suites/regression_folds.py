"""Which fold for a numeric target: ``train-local`` against the simulated pipeline
(8 workers, the plan's R for the job as if ``parallel_tasks`` were the classification bound)
with each server learning rate: the sum (η = R, the MLP's fold), the mean (η = 1, FedAvg) and
√R. On the regression tuning sets only (``datasets.REGRESSION_TUNING``), both orders, seeds 0–2.

    python -m benchmarks.suites.regression_folds [--datasets friedman2,friedman3] [--out FILE]

Each cell is (train-local RMSE − pipeline RMSE) / train-local RMSE in percent (negative: the
pipeline is worse). This decided that ``parallel_tasks=auto`` trains a numeric target one task at
a time (docs/REGRESSION.md); the run forces the parallel plan with ``parallel_tasks`` = the R the
classification bound gives.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.harness import datasets
from benchmarks.harness.data import scratch_dir
from benchmarks.harness.figures import gap, mean
from benchmarks.harness.paths import RESULTS
from benchmarks.harness.procs import log
from benchmarks.report.results import machine, now_iso

RULES = {"sum": lambda r: float(r), "mean": lambda r: 1.0, "sqrt": lambda r: math.sqrt(r)}


def measure(name: str, order: str, seed: int, path: Path) -> dict[str, Any]:
    from bucketlearn.bootstrap import memory_services
    from bucketlearn.domain import fold
    from bucketlearn.domain.plan import plan_training
    from bucketlearn.local.simulation import simulate_pipeline
    from bucketlearn.options import JobOptions
    from bucketlearn.usecases.train_local import train_local

    serial = train_local(str(path), JobOptions(seed=seed), svc=memory_services())
    shards = [s.rows for s in serial.manifest.shards]
    resolved = serial.options  # the classification plan's R for the same shards and budget
    parallel = plan_training(shards, resolved.epochs, resolved.batch_size).parallel_tasks
    options = JobOptions(seed=seed, parallel_tasks=parallel)
    row: dict[str, Any] = {"serial_rmse": serial.report["rmse"], "parallel_tasks": parallel}
    original = fold.server_learning_rate
    try:
        for rule, rate in RULES.items():
            fold.server_learning_rate = lambda _kind, r, rate=rate: rate(r)
            job = simulate_pipeline(str(path), options, workers=8,
                                    svc=memory_services())["job"]
            row[rule] = gap(row["serial_rmse"], {"rmse": job.head.holdout_rmse},
                            regression=True)
    finally:
        fold.server_learning_rate = original
    log(f"regression folds: {name}/{order} seed {seed}: {row}")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(datasets.REGRESSION_TUNING))
    parser.add_argument("--out", type=Path, default=RESULTS / "regression_folds.json")
    args = parser.parse_args(argv)
    runs: dict[str, Any] = {}
    with scratch_dir("regression-folds") as tmp:
        for name in args.datasets.split(","):
            for order in datasets.ORDERS:
                path = datasets.write(name, tmp / f"{name}_{order}.csv", order)
                for seed in (0, 1, 2):
                    runs[f"{name}/{order}/{seed}"] = measure(name, order, seed, path)
    summary = {f"{name}:{rule}": {"mean_pct": mean(gaps), "worst_pct": min(gaps)}
               for name in args.datasets.split(",") for rule in RULES
               for gaps in [[r[rule] for k, r in runs.items() if k.startswith(name + "/")]]}
    result = {"benchmark": "regression_folds", "date": now_iso(),
              "machine": machine(), "runs": runs, "summary": summary}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
