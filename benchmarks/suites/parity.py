"""Benchmark 2 — accuracy parity: ``train-local`` (serial) against the pipeline, same options.

Datasets (``benchmarks/harness/datasets.py``): ten sets none of which serial training learns perfectly
(serial accuracy between about 0.80 and 0.98), four image-shaped (28×28×3 → the CNN, 5 epochs)
and six tables (the MLP, the default 10 epochs), each **shuffled and sorted by label**.
``datasets.TUNING`` are the ones the method and its bound were chosen on
(``benchmarks/suites/methods.py``); ``datasets.HELD_OUT`` were run only here, once the code was final,
and are reported in a table of their own.

The baseline is ``bucketlearn.usecases.train_local.train_local`` in this process (the same split and holdout,
the same tasks one after another). Beside it, as a reference that serial training through tasks
is ordinary serial training, ``fit`` is Keras ``model.fit`` over the same training rows in one
shuffled stream with the same learning-rate schedule. The pipeline is measured
  * on the **real local stack** (emulators, both functions, the relay, worker processes) with 1,
    2 and 4 workers, each job run ``repeats`` times (the stack is made of separate processes:
    nothing forces them to agree to the last bit);
  * with ``bucketlearn.usecases.train_local.simulate_pipeline`` — the real upload, learner and aggregator code
    on the in-memory ports — with 8 and 16 workers whose tasks overlap in time.
Serial training, the simulation and the stack's learners all run TensorFlow on one thread
(``benchmarks.run.ONE_THREAD``): with R = 1 the pipeline then takes serial training's steps to the
bit, so what a cell shows is the method, not the rounding of another thread count.
Every cell runs with seeds 0, 1 and 2 (split, initial weights, shuffling), serial and pipeline
alike. A cell's figure is the mean over its runs of (pipeline − serial) in points of holdout
accuracy; its worst run is shown beside it.
Goals: every cell's mean within 1 point, no run more than 2 points below, for the tuning and the
held-out datasets alike.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import datasets
from benchmarks.harness.data import scratch_dir
from benchmarks.harness.figures import gap, mean, timed
from benchmarks.harness.procs import log
from benchmarks.harness.stack import emulators, local_stack, submit, wait_ended
from benchmarks.report.results import goal, jsonable, new_result
from bucketlearn.domain.job import Job
from bucketlearn.domain.target import CLASSIFICATION, REGRESSION

IMAGE_OPTIONS = {"epochs": 5}
FULL = {
    "datasets": {name: {"options": IMAGE_OPTIONS if name in datasets.IMAGE else {}}
                 for name in (*datasets.TUNING, *datasets.HELD_OUT, *datasets.MIXED,
                              *datasets.REGRESSION)},
    "held_out": [*datasets.HELD_OUT, *datasets.MIXED, *datasets.REGRESSION],
    "orders": ["shuffled", "sorted"],
    "sim_workers": [8, 16],
    "stack": {"workers": [1, 2, 4], "repeats": 2, "concurrent_jobs": 3},
    "seeds": [0, 1, 2],
    "fit_reference": True,
}
# the tables and goals: (label, held out, task); a numeric target's gap is in % of RMSE
GROUPS = (("tuning", False, CLASSIFICATION), ("held-out", True, CLASSIFICATION),
          ("numeric-target", True, REGRESSION))
UNITS = {CLASSIFICATION: "points", REGRESSION: "% of RMSE"}
TABLE_TITLES = {"tuning": "Tuning datasets",
                "held-out": "Held-out datasets (run once, at the end)",
                "numeric-target": "Numeric targets (held out; train-local's RMSE, and each gap "
                                  "in % of it: positive is a lower RMSE than train-local's)"}
SMOKE = {
    "datasets": {"digits": {"options": {"epochs": 1}}},
    "held_out": [],
    "orders": ["shuffled"],
    "sim_workers": [2],
    "stack": None,
    "seeds": [0],
    "fit_reference": True,
}
MEAN_PP, WORST_PP = 1.0, 2.0


def fit_reference(path: Path, options: Any) -> float:
    """Keras ``fit`` on the same split's training rows (one shuffled stream, the same cosine or
    constant schedule stepped per batch), evaluated on the same holdout: its accuracy (a numeric
    target: its RMSE)."""
    import keras

    from bucketlearn.bootstrap import memory_services
    from bucketlearn.config import Limits
    from bucketlearn.domain.plan import learning_rate
    from bucketlearn.ingest.parts import load_parts
    from bucketlearn.ingest.split import split_upload
    from bucketlearn.ml.model import build_model, spec_for
    from bucketlearn.ml.recipe import one_hot_classes
    from bucketlearn.ml.training import evaluate_detail
    from bucketlearn.usecases.train_local import local_source
    from bucketlearn.usecases.upload import budgeted, outline_of

    svc = memory_services()
    manifest = split_upload(local_source(str(path)), svc.store, svc.settings.work_bucket, "fit",
                            options, Limits())
    options, _ = budgeted(options, outline_of(manifest), path.name)
    spec = spec_for(manifest, options, path.name)
    model = build_model(spec, manifest.mean, manifest.variance, manifest.schema,
                        manifest.preprocessing)
    x, y = load_parts(svc.store, svc.settings.work_bucket,
                      [p for s in manifest.shards for p in s.parts])
    steps = math.ceil(len(y) / options.batch_size) * options.epochs

    class Schedule(keras.callbacks.Callback):
        step = 0

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            model.optimizer.learning_rate.assign(learning_rate(
                options.learning_rate, options.lr_schedule, self.step / steps))
            self.step += 1

    order = np.random.default_rng([options.seed, 3]).permutation(len(y))
    classes = one_hot_classes(model)  # a recipe-2 classifier learns from one-hot targets
    targets = y if classes is None else np.eye(classes, dtype=np.float32)[y.astype(np.int64)]
    model.fit(x[order], targets[order], batch_size=options.batch_size, epochs=options.epochs,
              shuffle=True, verbose=0, callbacks=[Schedule()])
    hold = load_parts(svc.store, svc.settings.work_bucket, manifest.holdout_parts)
    found = evaluate_detail(model, None, *hold, spec.task)
    return found.report["rmse"] if spec.regression else found.accuracy


def job_figures(job: Job, seconds: float, **extra: Any) -> dict[str, Any]:
    """A pipeline run's figures from its final job document."""
    head = job.head
    return {"status": job.status, "accuracy": head.holdout_accuracy if head else None,
            "rmse": head.holdout_rmse if head else None,
            "versions": int(job.version) + 1, "parallel_tasks": job.plan.parallel_tasks,
            "tasks_applied": job.tasks_applied, "seconds": seconds,
            "error": job.error, **extra}


def stack_runs(todo: list[tuple[str, str, int, Path, Any]], workers: int, repeats: int,
               concurrent: int, tmp: Path, done: dict[str, dict[str, Any]] | None = None,
               on_result: Any = None) -> dict[tuple[str, str, int, int], dict[str, Any]]:
    """Every (dataset, order, seed) file ``repeats`` times through one LocalStack with
    ``workers`` workers, ``concurrent`` jobs at a time (training in rounds makes a job's result
    independent of what else runs). Runs already in ``done`` (``run_key``: figures; from a
    checkpoint) are not run again; ``on_result(key, figures)`` is called after each job."""
    done = done or {}
    results = {key: done[run_key(*key)] for key in
               [(name, order, seed, r) for r in range(repeats) for name, order, seed, *_ in todo]
               if run_key(*key) in done}
    runs = [(item, r) for r in range(repeats) for item in todo
            if (item[0], item[1], item[2], r) not in results]
    if not runs:
        return results
    with (emulators(tmp) as emus,
          local_stack(tmp / f"stack-{workers}", workers, emus, "parity") as (_, svc)):
        for start in range(0, len(runs), concurrent):
            batch = runs[start:start + concurrent]
            submitted = []
            for (name, order, seed, path, options), repeat in batch:
                log(f"parity: stack W={workers} {name}/{order} seed {seed} run {repeat + 1}")
                job_id, t0 = submit(svc, path, options,
                                    name=f"{name}-{order}-s{seed}-r{repeat}.csv")
                submitted.append(((name, order, seed, repeat), job_id, t0))
            for key, job_id, t0 in submitted:
                job = wait_ended(svc, job_id, timeout=3600)
                results[key] = job_figures(job, float(job.finished_at or time.time()) - t0,
                                           job_id=job_id)
                if on_result is not None:
                    on_result(key, results[key])
    return results


def measured_with(params: dict[str, Any]) -> dict[str, Any]:
    """What a seed's or a stack run's figures depend on: the datasets and their options, the
    simulated worker counts, whether the fit reference runs (not which seeds, orders or stack
    sizes a command asks for, nor which datasets count as held out)."""
    return {"datasets": params.get("datasets"), "sim_workers": params.get("sim_workers"),
            "fit_reference": bool(params.get("fit_reference"))}


def run_key(name: str, order: str, seed: int, repeat: int) -> str:
    return f"{name}/{order}/{seed}/{repeat}"


class Checkpoint:
    """What a run has measured so far, in ``<out>/parity.partial.json``, rewritten after every
    seed and every stack job: a run stopped part-way (a crash, the OOM killer, a reboot) is taken
    up again by a command with the same datasets and options (``measured_with``), which skips the
    seeds and stack runs the file holds; seeds, orders, worker counts and repeats may differ.
    A file measured otherwise is kept aside (``.stale-N``), never overwritten. The file is
    removed once the result is written."""

    def __init__(self, out: Path, params: dict[str, Any]) -> None:
        self.path = out / "parity.partial.json"
        self.params = json.loads(json.dumps(params, default=str))
        self.seeds: dict[str, dict[str, Any]] = {}  # "name/order/seed": that seed's figures
        self.stack: dict[str, dict[str, dict[str, Any]]] = {}  # workers: run_key: figures
        if not self.path.exists():
            return
        saved = json.loads(self.path.read_text())
        if measured_with(saved.get("params", {})) == measured_with(self.params):
            self.seeds, self.stack = saved["seeds"], saved["stack"]
            log(f"parity: taking up {self.path} ({len(self.seeds)} seeds, "
                f"{sum(len(v) for v in self.stack.values())} stack runs done)")
            return
        aside = next(path for n in itertools.count()
                     if not (path := self.path.with_name(f"{self.path.name}.stale-{n}")).exists())
        self.path.rename(aside)
        log(f"parity: {self.path} was measured with other datasets or options; kept as {aside}")

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"params": self.params, "seeds": self.seeds,
                                   "stack": self.stack}, default=jsonable))
        tmp.replace(self.path)

    def seed_done(self, key: str, figures: dict[str, Any]) -> None:
        self.seeds[key] = figures
        self.save()

    def stack_done(self, workers: int, key: tuple[str, str, int, int],
                   figures: dict[str, Any]) -> None:
        self.stack.setdefault(str(workers), {})[run_key(*key)] = figures
        self.save()

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)


def summarize(cell: dict[str, Any]) -> None:
    """Per run name: mean figure, mean and worst gap (``gap``) over seeds and repeats."""
    seeds = cell["seeds"]
    regression = any(s.get("task") == REGRESSION for s in seeds.values())
    cell["task"] = REGRESSION if regression else CLASSIFICATION
    cell["serial"] = mean([s["serial"] for s in seeds.values()])
    cell["fit"] = mean([s["fit"] for s in seeds.values() if s.get("fit") is not None])
    names = sorted({n for s in seeds.values() for n in s["pipeline"]},
                   key=lambda n: (n.split("-")[0] != "stack", int(n.split("-")[1])))
    cell["pipeline"] = {}
    for name in names:
        runs = [(s["serial"], run) for s in seeds.values() for run in s["pipeline"].get(name, [])]
        done = [(serial, run) for serial, run in runs if run["status"] == "DONE"]
        gaps = [gap(serial, run, regression) for serial, run in done]
        figure = "rmse" if regression else "accuracy"
        cell["pipeline"][name] = {
            "runs": len(runs), "failed": len(runs) - len(done),
            figure: mean([run[figure] for _, run in done]),
            "mean_gap_pp": mean(gaps), "worst_gap_pp": min(gaps) if gaps else None,
            "gaps_pp": gaps, "parallel_tasks": sorted({run["parallel_tasks"] for _, run in runs}),
        }


def met(cell: dict[str, Any]) -> bool:
    return all(f["failed"] == 0 and f["mean_gap_pp"] is not None
               and abs(f["mean_gap_pp"]) <= MEAN_PP + 1e-9 and f["worst_gap_pp"] >= -WORST_PP - 1e-9
               for f in cell["pipeline"].values())


def in_fresh_process(function: Any, *args: Any) -> Any:
    """``function(*args)`` in a process of its own. TensorFlow keeps memory for every model a
    process trains until it exits (``bucketlearn.entrypoints.worker``), and a seed of a cell
    trains one model per simulated worker and more: the full matrix in one process grew past
    4 GB."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(function, *args).result(timeout=6 * 3600)


def one_seed(name: str, order: str, seed: int, path: Path, options: Any,
             params: dict[str, Any]) -> dict[str, Any]:
    """One seed of a cell: serial training, the fit reference and the simulations."""
    from bucketlearn.bootstrap import memory_services
    from bucketlearn.local.simulation import simulate_pipeline
    from bucketlearn.usecases.train_local import train_local

    log(f"parity: serial {name}/{order} seed {seed}")
    serial = train_local(str(path), options, svc=memory_services())
    task = serial.manifest.task
    one: dict[str, Any] = {"serial": serial.report["rmse"] if task == REGRESSION
                           else serial.accuracy,
                           "task": task,
                           "pipeline": {},
                           "fit": (fit_reference(path, options)
                                   if params.get("fit_reference") else None),
                           "rows": serial.manifest.rows,
                           "holdout_rows": serial.manifest.holdout_rows,
                           "model": serial.model.name.removeprefix("bucketlearn_")}
    for workers in params["sim_workers"]:
        log(f"parity: simulation W={workers} {name}/{order} seed {seed}")
        figures, seconds = timed(simulate_pipeline, str(path), options, workers=workers,
                                 svc=memory_services())
        one["pipeline"][f"sim-{workers}"] = [job_figures(figures["job"], seconds)]
    return one


def assemble(params: dict[str, Any], seeds: dict[str, dict[str, Any]],
             stack: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The cells of a run from what its checkpoint holds (``Checkpoint``: each seed's serial
    and simulated figures, each stack run by worker count); a seed not measured is left out,
    and a cell with no seed. So a run stopped part-way can be reported as far as it got."""
    cells: dict[str, dict[str, Any]] = {}
    for name in params["datasets"]:
        for order in params["orders"]:
            cell: dict[str, Any] = {"dataset": name, "order": order, "seeds": {},
                                    "held_out": name in params["held_out"]}
            for seed in params["seeds"]:
                found = seeds.get(f"{name}/{order}/{seed}")
                if found is None:
                    continue
                one = copy.deepcopy(found)
                for field in ("rows", "holdout_rows", "model"):
                    cell[field] = one.pop(field, None) or cell.get(field)
                for workers, runs in stack.items():
                    mine = sorted((key, figures) for key, figures in runs.items()
                                  if key.startswith(f"{name}/{order}/{seed}/"))
                    if mine:
                        one["pipeline"][f"stack-{workers}"] = [figures for _, figures in mine]
                cell["seeds"][str(seed)] = one
            if cell["seeds"]:
                cells[f"{name}/{order}"] = cell
    return cells


def conclude(result: dict[str, Any], cells: dict[str, dict[str, Any]]) -> None:
    """Summarize every cell and set the result's figures, goals and ratios (a run's cells, or
    the cells of several runs merged: ``benchmarks.tools.merge_parity``)."""
    result["goals"] = []
    for cell in cells.values():
        summarize(cell)
        cell["one_row_pp"] = 100 / cell["holdout_rows"]
        cell["met"] = met(cell)
    for label, held, task in GROUPS:
        chosen = [c for c in cells.values() if c["held_out"] == held and c["task"] == task]
        if not chosen:
            continue
        figures = [f for c in chosen for f in c["pipeline"].values() if f["mean_gap_pp"] is not None]
        worst_mean = max((abs(f["mean_gap_pp"]) for f in figures), default=None)
        worst_run = min((f["worst_gap_pp"] for f in figures), default=None)
        failed = sum(f["failed"] for c in chosen for f in c["pipeline"].values())
        unit = UNITS[task]
        goal(result, f"{label} datasets: largest |mean gap| of a cell ({unit})", worst_mean,
             f"<= {MEAN_PP:g}", worst_mean is not None and worst_mean <= MEAN_PP + 1e-9)
        goal(result, f"{label} datasets: worst single run ({unit})", worst_run,
             f">= -{WORST_PP:g}", worst_run is not None and worst_run >= -WORST_PP - 1e-9)
        goal(result, f"{label} datasets: runs that did not end DONE", failed, "0", failed == 0)
    result["figures"] = cells
    result["ratios"] = {f"{k}:{name}:mean_gap_pp": f["mean_gap_pp"]
                        for k, c in cells.items() for name, f in c["pipeline"].items()
                        if f["mean_gap_pp"] is not None}


def run(out: Path, smoke: bool = False, params: dict[str, Any] | None = None) -> dict[str, Any]:
    from bucketlearn.options import JobOptions

    params = params or (SMOKE if smoke else FULL)
    result = new_result("parity", smoke, params)
    started = time.monotonic()
    stack = params.get("stack")
    todo = []
    checkpoint = Checkpoint(out, params)
    with scratch_dir("parity") as tmp:
        for name, spec in params["datasets"].items():
            for order in params["orders"]:
                path = datasets.write(name, tmp / f"{name}_{order}.csv", order)
                for seed in params["seeds"]:
                    options = JobOptions(**{**spec["options"], "seed": seed})
                    key = f"{name}/{order}/{seed}"
                    if key not in checkpoint.seeds:
                        checkpoint.seed_done(key, in_fresh_process(
                            one_seed, name, order, seed, path, options, params))
                    if stack:
                        todo.append((name, order, seed, path, options))
        for workers in stack["workers"] if stack else []:
            stack_runs(todo, int(workers), int(stack["repeats"]),
                       int(stack.get("concurrent_jobs", 1)), tmp,
                       done=checkpoint.stack.get(str(workers)),
                       on_result=lambda k, f, w=workers: checkpoint.stack_done(w, k, f))
    cells = assemble(params, checkpoint.seeds, checkpoint.stack)
    conclude(result, cells)
    result["notes"].append(
        "sim-W = bucketlearn.usecases.train_local.simulate_pipeline with W workers (in-process, in-memory "
        "ports); stack-W = the real local stack on the emulators with W worker processes, each "
        "job run `repeats` times; fit = Keras fit on the same rows and holdout (a reference)")
    result["notes"].append(
        f"seeds {params['seeds']} (split, initial weights, shuffling), serial and pipeline alike; "
        "a cell's mean and worst are over its seeds and repeats")
    result["seconds"] = time.monotonic() - started
    checkpoint.finish()
    return result


def tables(result: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The tuning, held-out and numeric-target tables: serial, fit, then each run's mean gap
    (worst)."""
    cells = result["figures"]
    names = list(dict.fromkeys(n for c in cells.values() for n in c["pipeline"]))
    out = []
    for label, held, task in GROUPS:
        figure = "RMSE" if task == REGRESSION else "accuracy"
        header = (["dataset / order", "model", "holdout rows", "R", f"train-local {figure}",
                   f"fit {figure}"] + [f"{n} mean (worst)" for n in names] + ["met"])
        rows = []
        for key, cell in cells.items():
            if cell["held_out"] != held or cell.get("task", CLASSIFICATION) != task:
                continue
            parallel = sorted({r for f in cell["pipeline"].values() for r in f["parallel_tasks"]})
            row = [key, cell.get("model", "?"), str(cell["holdout_rows"]),
                   "/".join(map(str, parallel)), f"{cell['serial']:.4g}" if task == REGRESSION
                   else f"{cell['serial']:.4f}",
                   f"{cell['fit']:.4g}" if cell.get("fit") is not None else "–"]
            for name in names:
                f = cell["pipeline"].get(name)
                row.append("–" if not f or f["mean_gap_pp"] is None else
                           f"{f['mean_gap_pp']:+.2f} ({f['worst_gap_pp']:+.2f})"
                           + (f" {f['failed']} not DONE" if f["failed"] else ""))
            row.append("yes" if cell["met"] else "**no**")
            rows.append(row)
        if rows:
            out.append((TABLE_TITLES[label], header, rows))
    return out
