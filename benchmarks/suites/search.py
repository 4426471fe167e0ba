"""Benchmark 9 — a job's search (``train-local --search N``) against the default model and HGB.

    python -m benchmarks.suites.search [--tables a,b] [--search 8] [--out FILE]

On public tables (``harness.tables``: the recipe's tables, which the search was tuned on, and
``SEARCH_HELD_OUT``, kept out of every decision about it and run once, at the end), side by side
on the same kept-back rows:

* **HGB** — scikit-learn's HistGradientBoosting with its defaults (``harness.baseline.hgb``);
* **default** — ``train-local`` with today's defaults (one model);
* **search** — ``train-local --search N`` (N candidates, successive halving on validation).

Both ``train-local`` runs go in a child process each on one TensorFlow thread, as a learner
runs. The search's wall on W learners is projected from its candidates' measured time per rung
(``domain.search.projected_wall``), each task priced at ``HOP_SECONDS`` more: a chained task's
round through storage, Pub/Sub and Firestore in the cloud (benchmark 5's 0.37 s); the split and
the final holdout evaluation are added once. Writes ``benchmarks/results/search.json`` and
prints the goals.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import tables
from benchmarks.harness.baseline import against_hgb, gap, hgb, source
from benchmarks.harness.paths import CACHE, RESULTS
from benchmarks.harness.procs import log
from benchmarks.harness.serial import serial_seconds
from benchmarks.report.results import goal, new_result, print_goals
from bucketlearn.domain.search import projected_wall

HOP_SECONDS = 0.37  # a chained task's round in the cloud (benchmark 5)
WORKERS = (1, 2, 8, 32)
DEFAULT_TABLES = ("diamonds-cut", "health-insurance", "arrests", "computers", "wage", "email",
                  "penguins", *tables.SEARCH_HELD_OUT)


def projection(run: dict[str, Any], hop: float) -> dict[str, float]:
    """The search's wall on each of ``WORKERS`` learners: its rungs scheduled from the
    candidates' measured seconds (each task ``hop`` seconds more), plus what is not candidate
    training (the split, the validation read, the selection and the holdout evaluation)."""
    candidates = sorted(run["candidates"], key=lambda c: c["index"])
    depth = max(len(c["rung_seconds"]) for c in candidates)
    rungs = [[c["rung_seconds"][r] + hop * c["rung_tasks"][r] for c in candidates
              if len(c["rung_seconds"]) > r] for r in range(depth)]
    training = sum(sum(c["rung_seconds"]) for c in candidates)
    rest = max(0.0, run["seconds"] - training)
    return {str(w): rest + projected_wall(rungs, w) for w in WORKERS}


def measure(name: str, cache: Path, seed: int, count: int) -> dict[str, Any]:
    """One table: HGB, the default model and the search, on the same kept-back rows."""
    path, given = source(name, cache)
    log(f"search: {name}: HGB")
    base = hgb(path, given, seed)
    cell: dict[str, Any] = {"table": name, "held_out": name in tables.SEARCH_HELD_OUT,
                            "hgb": base}
    for label, options in (("default", {}), ("search", {"search": count})):
        log(f"search: {name}: {label}")
        run = serial_seconds(path, {**given, **options, "seed": seed}, repeats=1)
        cell[label] = {k: v for k, v in run.items() if k not in ("sample", "all_seconds")}
    regression = base["regression"]
    for label in ("default", "search"):
        cell[f"{label}_vs_hgb"] = gap(cell[label], base, regression)
    cell["search_vs_default"] = gap(cell["search"], cell["default"], regression)
    cell["projected"] = projection(cell["search"], HOP_SECONDS)
    cell["projected_on_stack_hops"] = projection(cell["search"], 0.0)
    # the default job's wall as the search's is priced: its tasks' hops added
    default_wall = cell["default"]["seconds"] + HOP_SECONDS * cell["default"]["tasks"]
    cell["default_priced_seconds"] = default_wall
    cell["search_wall_ratio"] = {w: s / default_wall for w, s in cell["projected"].items()}
    cell["speedup"] = {w: cell["projected"]["1"] / s for w, s in cell["projected"].items()}
    return cell


def judge(result: dict[str, Any]) -> None:
    """The goals over every measured table."""
    cells = list(result["figures"].values())
    at_least = [c for c in cells if c["search_vs_default"] >= 0]
    goal(result, "tables where the searched model is at least the default", len(at_least),
         f"all {len(cells)}", len(at_least) == len(cells))
    against_hgb(result, cells, "search_vs_hgb", strictly_above=True)
    for c in cells:
        two = c["projected"]["1"] and c["projected"]["2"] / c["projected"]["1"]
        goal(result, f"{c['table']}: projected wall on 2 learners / 1", two, "<= 0.7",
             two is not None and two <= 0.7)
        goal(result, f"{c['table']}: projected speed-up on 8 learners", c["speedup"]["8"],
             ">= 5", c["speedup"]["8"] >= 5)
        goal(result, f"{c['table']}: searched wall on 8 learners / the default's",
             c["search_wall_ratio"]["8"], "<= 1.5", c["search_wall_ratio"]["8"] <= 1.5)
        result["ratios"][f"{c['table']}:search_vs_hgb"] = c["search_vs_hgb"]


def run(tables_: list[str], seed: int, count: int, cache: Path) -> dict[str, Any]:
    params = {"tables": tables_, "seed": seed, "search": count, "hop_seconds": HOP_SECONDS,
              "workers": list(WORKERS)}
    result = new_result("search", False, params)
    started = time.monotonic()
    for name in tables_:
        result["figures"][name] = measure(name, cache, seed, count)
        log(json.dumps({k: v for k, v in result["figures"][name].items()
                        if k not in ("search",)}))
    judge(result)
    result["notes"].append("accuracy (R² for a numeric target) on the split's kept-back rows; "
                           "train-local runs on one TensorFlow thread; learners projected")
    result["seconds"] = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default=",".join(DEFAULT_TABLES))
    parser.add_argument("--search", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "search.json")
    args = parser.parse_args(argv)
    CACHE.mkdir(exist_ok=True)
    result = run([t for t in args.tables.split(",") if t], args.seed, args.search, CACHE)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_goals(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
