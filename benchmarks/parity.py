"""Benchmark 2 — accuracy parity: ``train-local`` (serial) against the pipeline, same options.

Datasets, each shuffled (a seeded row permutation) and sorted by label (the worst case for naive
sharding):
  * digits — data/digits.csv (1,797 rows, 64 features, 10 classes), default options (10 epochs,
    batch 32, Adam 1e-3, 256 rows per shard, K=2, holdout 0.2 -> 360 holdout rows);
  * hmnist — 3,000 synthetic 28x28x3 rows (data/make_hmnist.py, 7 classes), model auto (-> CNN),
    3 epochs, otherwise default options (600 holdout rows).

The baseline is ``bucketlearn.serial.train_local`` in this process. The pipeline is measured
  * for W = 1, 2, 4 with ``bucketlearn.serial.simulate_pipeline`` — the real split, learner and
    aggregator code on the in-memory ports, W workers whose tasks overlap (each starts from the head
    it saw when it pulled), so staleness and buffering behave as in the deployed pipeline minus the
    network and the process boundaries; and
  * on the real local stack (emulators, functions, relay, worker processes) for the datasets and
    worker counts in ``params["stack"]``.
Accuracy is the holdout accuracy of the final model on the whole holdout (the same rows for
serial and pipeline: the split is deterministic). Every cell runs with each seed in
``params["seeds"]`` (split, initial weights, shuffling), serial and pipeline alike; its figure is
the mean over seeds of (pipeline - serial), because one seed moves a 360-row holdout by a row or
two, serial training included. Each seed's difference is kept beside the mean.
Goal: |mean(pipeline - serial)| <= 1 point in every cell.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common
from benchmarks.common import goal, log

FULL = {
    "datasets": {"digits": {"source": "data/digits.csv", "options": {}},
                 "hmnist": {"source": "make_hmnist rows=3000", "rows": 3000,
                            "options": {"epochs": 3}}},
    "orders": ["shuffled", "sorted"],
    "sim_workers": [1, 2, 4],
    "stack": {"datasets": ["digits", "hmnist"], "orders": ["shuffled", "sorted"],
              "workers": [1, 2, 4]},
    "seeds": [0, 1, 2],
}
SMOKE = {
    "datasets": {"digits": {"source": "data/digits.csv", "options": {"epochs": 1}}},
    "orders": ["shuffled"],
    "sim_workers": [1, 2],
    "stack": None,
    "seeds": [0],
}
TOLERANCE_PP = 1.0


def dataset_file(name: str, spec: dict[str, Any], order: str, tmp: Path) -> Path:
    path = tmp / f"{name}_{order}.csv"
    if name != "digits":
        common.write_hmnist(path, count=int(spec["rows"]), sorted_by_label=order == "sorted")
    elif order == "sorted":
        common.sorted_copy(common.DIGITS, path)
    else:
        header, *rows = common.DIGITS.read_text().splitlines()
        rows = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]
        path.write_text("\n".join([header, *rows]) + "\n")
    return path


def job_cell(job: dict[str, Any], seconds: float, **extra: Any) -> dict[str, Any]:
    """A pipeline run's figures from its final job document."""
    return {"status": job["status"], "accuracy": job["head"]["holdout_accuracy"],
            "versions": int(job["version"]) + 1, "tasks_applied": job.get("tasks_applied"),
            "holdout_rows": job.get("final_holdout_rows"), "seconds": seconds, **extra}


def sim_cell(path: Path, options: Any, workers: int) -> dict[str, Any]:
    from bucketlearn.serial import simulate_pipeline

    out, seconds = common.timed(simulate_pipeline, str(path), options, workers=workers)
    return job_cell(out["job"], seconds)


def stack_cells(cells: list[tuple[str, str, int, Path, Any]], workers: int,
                tmp: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Each (dataset, order, seed) file through one real LocalStack with ``workers`` workers."""
    results = {}
    with (common.emulators(tmp) as emus,
          common.local_stack(tmp / "stack", workers, emus, "parity") as (_, svc)):
        for name, order, seed, path, options in cells:
            log(f"parity: stack W={workers} {name}/{order} seed {seed}")
            job_id, t0 = common.submit(svc, path, options)
            job = common.wait_terminal(svc, job_id, timeout=1800)
            results[(name, order, seed)] = job_cell(job, float(job["finished_at"]) - t0,
                                                    job_id=job_id)
    return results


def summarize(cell: dict[str, Any]) -> None:
    """Per run name: the mean over seeds of accuracy and of (pipeline - serial), and the worst
    single seed. A cell's figure is the mean: one seed moves a 360-row holdout by a row or
    two, serial training included."""
    seeds = cell["seeds"]
    cell["serial"] = {"accuracy": common.mean([s["serial"]["accuracy"] for s in seeds.values()]),
                      "seconds": common.mean([s["serial"]["seconds"] for s in seeds.values()])}
    names = list(next(iter(seeds.values()))["pipeline"])
    cell["pipeline"] = {}
    for name in names:
        runs = [(s["serial"]["accuracy"], s["pipeline"][name]) for s in seeds.values()]
        done = all(f["status"] == "DONE" for _, f in runs)
        diffs = [(f["accuracy"] - serial) * 100 for serial, f in runs] if done else []
        cell["pipeline"][name] = {
            "status": "DONE" if done else "FAILED",
            "accuracy": common.mean([f["accuracy"] for _, f in runs]) if done else None,
            "diff_pp": common.mean(diffs) if done else None,
            "seed_diffs_pp": diffs,
            "worst_seed_diff_pp": max(diffs, key=abs) if diffs else None,
            "seconds": common.mean([f["seconds"] for _, f in runs]),
        }


def run(out: Path, smoke: bool = False, params: dict[str, Any] | None = None) -> dict[str, Any]:
    from bucketlearn.config import JobOptions
    from bucketlearn.serial import train_local

    params = params or (SMOKE if smoke else FULL)
    result = common.new_result("parity", smoke, params)
    started = time.monotonic()
    cells: dict[str, dict[str, Any]] = {}
    stack = params.get("stack")
    stack_todo = []
    with common.scratch_dir("parity") as tmp:
        for name, spec in params["datasets"].items():
            for order in params["orders"]:
                path = dataset_file(name, spec, order, tmp)
                cell: dict[str, Any] = {"seeds": {}}
                for seed in params["seeds"]:
                    options = JobOptions(**{**spec["options"], "seed": seed})
                    log(f"parity: serial {name}/{order} seed {seed}")
                    serial, serial_seconds = common.timed(train_local, str(path), options)
                    cell.update(options=options.to_dict(), rows=serial.manifest.rows,
                                holdout_rows=serial.manifest.holdout_rows)
                    one: dict[str, Any] = {
                        "serial": {"accuracy": serial.accuracy, "seconds": serial_seconds},
                        "pipeline": {}}
                    for workers in params["sim_workers"]:
                        log(f"parity: simulation W={workers} {name}/{order} seed {seed}")
                        one["pipeline"][f"sim-{workers}"] = sim_cell(path, options, workers)
                    if stack and name in stack["datasets"] and order in stack["orders"]:
                        stack_todo.append((name, order, seed, path, options))
                    cell["seeds"][str(seed)] = one
                cells[f"{name}/{order}"] = cell
        for workers in stack["workers"] if stack_todo else []:  # one stack per worker count
            for (name, order, seed), figures in stack_cells(stack_todo, int(workers),
                                                            tmp).items():
                cells[f"{name}/{order}"]["seeds"][str(seed)]["pipeline"][f"stack-{workers}"] = \
                    figures
    ratios: dict[str, Any] = {}
    worst_overall = 0.0
    for key, cell in cells.items():
        summarize(cell)
        worst = 0.0
        for run_name, figures in cell["pipeline"].items():
            diff = figures["diff_pp"]
            ratios[f"{key}:{run_name}:accuracy_ratio"] = (
                figures["accuracy"] / cell["serial"]["accuracy"]
                if diff is not None and cell["serial"]["accuracy"] else None)
            worst = max(worst, abs(diff) if diff is not None else float("inf"))
        cell["max_abs_diff_pp"] = worst
        cell["worst_seed_abs_diff_pp"] = max(
            (abs(f["worst_seed_diff_pp"]) for f in cell["pipeline"].values()
             if f["worst_seed_diff_pp"] is not None), default=None)
        cell["one_row_pp"] = 100 / cell["holdout_rows"]
        worst_overall = max(worst_overall, worst)
        goal(result, f"max abs(pipeline - serial) accuracy, {key}, mean over "
             f"{len(params['seeds'])} seed(s) (points)", worst,
             f"<= {TOLERANCE_PP:g}", worst <= TOLERANCE_PP + 1e-9)
    ratios["max_abs_diff_pp"] = worst_overall
    result["figures"] = cells
    result["ratios"] = ratios
    result["notes"].append(
        "sim-W = bucketlearn.serial.simulate_pipeline with W overlapping workers (in-process, "
        "in-memory ports); stack-W = the real local stack on the emulators with W worker processes")
    result["notes"].append(
        f"every cell is run with seeds {params['seeds']} (split, initial weights, shuffling) for "
        "serial and pipeline alike; a cell's figure is the mean of the per-seed differences, and "
        "each seed's difference is kept (seed_diffs_pp)")
    result["notes"].append(
        "one holdout row is 100/holdout_rows points (digits: 0.28, hmnist-3000: 0.17); TensorFlow "
        "on CPU is not bit-reproducible across thread counts, so a cell can move by a row or two "
        "between runs")
    result["seconds"] = time.monotonic() - started
    return result


TABLE_HEADER = ["dataset / order", "serial (mean)", "pipeline runs: mean accuracy (mean Δ points; "
                "Δ per seed)", "max abs mean Δ", "worst seed", "1 row", "≤ 1 point"]


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for key, cell in result["figures"].items():
        runs = "; ".join(
            f"{name}: {f['accuracy']:.4f} ({f['diff_pp']:+.2f}; "
            + "/".join(f"{d:+.2f}" for d in f["seed_diffs_pp"]) + ")"
            if f.get("diff_pp") is not None else f"{name}: {f['status']}"
            for name, f in cell["pipeline"].items())
        worst_seed = cell.get("worst_seed_abs_diff_pp")
        rows.append([key, f"{cell['serial']['accuracy']:.4f}", runs,
                     f"{cell['max_abs_diff_pp']:.2f}",
                     f"{worst_seed:.2f}" if worst_seed is not None else "—",
                     f"{cell['one_row_pp']:.2f}",
                     "yes" if cell["max_abs_diff_pp"] <= TOLERANCE_PP + 1e-9 else "**no**"])
    return rows
