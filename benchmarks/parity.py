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
serial and pipeline: the split is deterministic). Goal: |pipeline - serial| <= 1 point in every cell.
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
    "stack": {"datasets": ["digits", "hmnist"], "orders": ["shuffled", "sorted"], "workers": 2},
}
SMOKE = {
    "datasets": {"digits": {"source": "data/digits.csv", "options": {"epochs": 1}}},
    "orders": ["shuffled"],
    "sim_workers": [1, 2],
    "stack": None,
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


def stack_cells(cells: list[tuple[str, str, Path, Any]], workers: int,
                tmp: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Each (dataset, order) file through one real LocalStack with ``workers`` worker processes."""
    results = {}
    with (common.emulators(tmp) as emus,
          common.local_stack(tmp / "stack", workers, emus, "parity") as (_, svc)):
        for name, order, path, options in cells:
            log(f"parity: stack W={workers} {name}/{order}")
            job_id, t0 = common.submit(svc, path, options)
            job = common.wait_terminal(svc, job_id, timeout=1800)
            results[(name, order)] = job_cell(job, float(job["finished_at"]) - t0, job_id=job_id)
    return results


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
            options = JobOptions(**spec["options"])
            for order in params["orders"]:
                path = dataset_file(name, spec, order, tmp)
                log(f"parity: serial {name}/{order}")
                serial, serial_seconds = common.timed(train_local, str(path), options)
                cell: dict[str, Any] = {
                    "options": options.to_dict(), "rows": serial.manifest.rows,
                    "holdout_rows": serial.manifest.holdout_rows,
                    "serial": {"accuracy": serial.accuracy, "seconds": serial_seconds},
                    "pipeline": {}}
                for workers in params["sim_workers"]:
                    log(f"parity: simulation W={workers} {name}/{order}")
                    cell["pipeline"][f"sim-{workers}"] = sim_cell(path, options, workers)
                if stack and name in stack["datasets"] and order in stack["orders"]:
                    stack_todo.append((name, order, path, options))
                cells[f"{name}/{order}"] = cell
        if stack_todo:
            workers = int(stack["workers"])
            for (name, order), figures in stack_cells(stack_todo, workers, tmp).items():
                cells[f"{name}/{order}"]["pipeline"][f"stack-{workers}"] = figures
    ratios: dict[str, Any] = {}
    worst_overall = 0.0
    for key, cell in cells.items():
        serial_acc = cell["serial"]["accuracy"]
        worst = 0.0
        for run_name, figures in cell["pipeline"].items():
            diff = (figures["accuracy"] - serial_acc) * 100 if figures["status"] == "DONE" else None
            figures["diff_pp"] = diff
            ratios[f"{key}:{run_name}:accuracy_ratio"] = (figures["accuracy"] / serial_acc
                                                           if serial_acc else None)
            worst = max(worst, abs(diff) if diff is not None else float("inf"))
        cell["max_abs_diff_pp"] = worst
        cell["one_row_pp"] = 100 / cell["holdout_rows"]
        worst_overall = max(worst_overall, worst)
        goal(result, f"max abs(pipeline - serial) accuracy, {key} (points)", worst,
             f"<= {TOLERANCE_PP:g}", worst <= TOLERANCE_PP + 1e-9)
    ratios["max_abs_diff_pp"] = worst_overall
    result["figures"] = cells
    result["ratios"] = ratios
    result["notes"].append(
        "sim-W = bucketlearn.serial.simulate_pipeline with W overlapping workers (in-process, "
        "in-memory ports); stack-W = the real local stack on the emulators with W worker processes")
    result["notes"].append(
        "one holdout row is 100/holdout_rows points (digits: 0.28, hmnist-3000: 0.17); TensorFlow "
        "on CPU is not bit-reproducible across thread counts, so a cell can move by a row or two "
        "between runs")
    result["seconds"] = time.monotonic() - started
    return result


TABLE_HEADER = ["dataset / order", "serial", "pipeline runs (accuracy, Δ points)", "max abs Δ",
                "1 row", "≤ 1 point"]


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for key, cell in result["figures"].items():
        runs = "; ".join(f"{name}: {f['accuracy']:.4f} ({f['diff_pp']:+.2f})"
                         if f.get("diff_pp") is not None else f"{name}: {f['status']}"
                         for name, f in cell["pipeline"].items())
        rows.append([key, f"{cell['serial']['accuracy']:.4f}", runs,
                     f"{cell['max_abs_diff_pp']:.2f}", f"{cell['one_row_pp']:.2f}",
                     "yes" if cell["max_abs_diff_pp"] <= TOLERANCE_PP + 1e-9 else "**no**"])
    return rows
