"""Run the benchmarks, write ``<out>/<name>.json``, print markdown tables, refresh the doc.

    python -m benchmarks.run [--only ingest,parity,roundtrip,scale] [--smoke] [--out DIR] [--no-doc]

``--smoke`` runs tiny sizes (well under a minute; what CI runs through tests/test_bench_smoke.py).
Without ``--smoke`` and with the default ``--out``, the generated section of docs/BENCHMARKS.md
(between the ``bench:generated`` markers) is rebuilt from every JSON in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import log
from bucketlearn.config import SINGLE_THREADED_TF

NAMES = ("ingest", "parity", "roundtrip", "scale", "methods", "schedules", "speedup")
TITLES = {"ingest": "1. Ingestion", "parity": "2. Accuracy parity",
          "roundtrip": "3. The round trip and the pipeline's overhead",
          "scale": "4. Control-plane scale",
          "methods": "5. Choosing the aggregation (tuning datasets only)",
          "schedules": "6. Choosing the learning-rate schedule (tuning datasets only)",
          "speedup": "7. Time to an accurate model with more workers"}
# Parity compares serial training with the pipeline's learners, which on the local stack run
# TensorFlow on one thread (``config.SINGLE_THREADED_TF``). Another thread count sums in another
# order, and CNN training can turn that rounding into points of accuracy; so parity runs serial
# training and the simulation on one thread too, in a process of its own when needed (TensorFlow
# fixes its threads when it starts).
ONE_THREAD = {"parity": SINGLE_THREADED_TF}
DOC = common.REPO / "docs" / "BENCHMARKS.md"
START, END = "<!-- bench:generated:start -->", "<!-- bench:generated:end -->"


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_line(machine: dict[str, Any]) -> str:
    packages = machine.get("packages", {})
    tf = packages.get("tensorflow-cpu") or packages.get("tensorflow") or "?"
    return (f"{machine.get('nproc')} cores ({machine.get('cpu_model')}), "
            f"{machine.get('ram_gib')} GiB RAM, Python {machine.get('python')}, TensorFlow {tf}, "
            f"pyarrow {packages.get('pyarrow', '?')}, pandas {packages.get('pandas', '?')}; "
            f"load average {_loads(machine.get('load_average_at_start'))} at start, "
            f"{_loads(machine.get('load_average_at_end'))} at end")


def _loads(values: list[float] | None) -> str:
    return "/".join(f"{x:.1f}" for x in values) if values else "?"


def render(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: the goals table, then one table per benchmark, each with its date and machine."""
    parts = []
    goal_rows = []
    for name in NAMES:
        result = results.get(name)
        if not result:
            continue
        for g in result.get("goals", []):
            goal_rows.append([TITLES[name], g["name"], _fmt(g["value"]), g["target"],
                              _fmt(g["met"]), result["date"][:10] + (" (smoke)" if result.get("smoke") else "")])
    if goal_rows:
        parts.append("#### Goals\n\n" + md_table(["benchmark", "figure", "value", "goal", "met",
                                                  "measured"], goal_rows))
    for name in NAMES:
        result = results.get(name)
        if not result:
            continue
        module = importlib.import_module(f"benchmarks.{name}")
        seconds = result.get("seconds")
        wall = f"; benchmark wall time {seconds:.0f} s" if seconds is not None else ""
        header = (f"#### {TITLES[name]}\n\n"
                  f"Measured {result['date']} on {machine_line(result['machine'])}"
                  f"{' — SMOKE sizes' if result.get('smoke') else ''}{wall}."
                  + (f" **Reduced run:** {', '.join(result['reduced'])}." if result.get("reduced")
                     else ""))
        if hasattr(module, "tables"):
            body = "\n\n".join(f"{title}:\n\n{md_table(columns, rows)}"
                               for title, columns, rows in module.tables(result))
        else:
            body = md_table(module.TABLE_HEADER, module.table_rows(result))
        parts.append(header + "\n\n" + body)
        extra = getattr(module, "extra_tables", None)
        if extra is not None:
            parts.extend(extra(result))
    return "\n\n".join(parts) + "\n"


def load_results(directory: Path) -> dict[str, dict[str, Any]]:
    results = {}
    for name in NAMES:
        path = directory / f"{name}.json"
        if path.exists():
            results[name] = json.loads(path.read_text())
    return results


def refresh_doc(results: dict[str, dict[str, Any]], doc: Path = DOC) -> None:
    text = doc.read_text() if doc.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        text = text.rstrip() + f"\n\n{START}\n{END}\n"
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    note = ("<!-- generated by `python -m benchmarks.run` from benchmarks/results/*.json; "
            "edits between the markers are overwritten -->\n\n")
    doc.write_text(head + START + "\n" + note + render(results) + "\n" + END + tail)


def reduced_params(name: str, module: Any, args: argparse.Namespace
                   ) -> tuple[dict[str, Any] | None, list[str]]:
    """The module's parameters with the command line's reductions applied (None: its defaults)."""
    params = copy.deepcopy(module.SMOKE if args.smoke else module.FULL)
    reduced = []
    if name == "ingest" and args.sizes:
        params["sizes_mb"] = [int(x) for x in args.sizes.split(",")]
        reduced.append(f"sizes_mb={params['sizes_mb']}")
    if name in ("parity", "roundtrip", "methods", "schedules", "speedup") and args.datasets:
        keep = args.datasets.split(",")
        if isinstance(params["datasets"], dict):
            params["datasets"] = {k: v for k, v in params["datasets"].items() if k in keep}
        else:
            params["datasets"] = [k for k in params["datasets"] if k in keep]
        reduced.append(f"datasets={list(params['datasets'])}")
    if name in ("parity", "methods", "schedules") and args.seeds:
        params["seeds"] = [int(x) for x in args.seeds.split(",")]
        reduced.append(f"seeds={params['seeds']}")
    if name == "parity":
        if args.orders:
            params["orders"] = args.orders.split(",")
            reduced.append(f"orders={params['orders']}")
        if args.sim_workers is not None:
            params["sim_workers"] = [int(x) for x in args.sim_workers.split(",") if x]
            reduced.append(f"sim_workers={params['sim_workers']}")
        if args.stack_workers is not None and params.get("stack"):
            params["stack"]["workers"] = [int(x) for x in args.stack_workers.split(",") if x]
            reduced.append(f"stack workers={params['stack']['workers']}")
        if args.repeats and params.get("stack"):
            params["stack"]["repeats"] = args.repeats
            reduced.append(f"stack repeats={args.repeats}")
        if args.no_fit:
            params["fit_reference"] = False
            reduced.append("no fit reference")
    added = False  # a baseline run beside the full one adds to it: not a reduction
    if name == "roundtrip" and args.baseline:
        params["baseline"] = str(args.baseline)
        added = True
    if name in ("scale", "speedup") and args.workers:
        params["workers"] = [int(x) for x in args.workers.split(",")]
        reduced.append(f"workers={params['workers']}")
    return (params if reduced or added else None), reduced


def _child_argv(argv: list[str], name: str) -> list[str]:
    """``argv`` with ``--only`` set to ``name`` and the doc left alone (the parent refreshes it)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--only":
            skip = True
        elif not arg.startswith("--only=") and arg != "--no-doc":
            kept.append(arg)
    return [*kept, "--only", name, "--no-doc"]


def _run_in_child(name: str, argv: list[str], out: Path) -> dict[str, Any]:
    """Run one benchmark in a fresh process with ``ONE_THREAD[name]`` in its environment."""
    env = {**os.environ, **ONE_THREAD[name]}
    done = subprocess.run([sys.executable, "-m", "benchmarks.run", *_child_argv(argv, name)],
                          env=env, cwd=common.REPO, check=False, timeout=24 * 3600)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark {name} exited with {done.returncode}")
    return json.loads((out / f"{name}.json").read_text())


def _needs_child(name: str) -> bool:
    pinned = ONE_THREAD.get(name)
    return bool(pinned) and any(os.environ.get(k) != v for k, v in pinned.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(NAMES),
                        help="comma-separated subset of " + ",".join(NAMES))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--out", type=Path, default=common.RESULTS)
    parser.add_argument("--no-doc", action="store_true", help="do not refresh docs/BENCHMARKS.md")
    parser.add_argument("--sizes", help="ingest: file sizes in MB, e.g. 50 (reduced run)")
    parser.add_argument("--datasets", help="parity/roundtrip/methods/schedules/speedup: datasets, "
                        "e.g. digits (reduced run)")
    parser.add_argument("--seeds", help="parity: seeds, e.g. 0 (reduced run)")
    parser.add_argument("--workers", help="scale, speedup: worker counts, e.g. 1,2,4 (reduced run)")
    parser.add_argument("--orders", help="parity: row orders, e.g. sorted (reduced run)")
    parser.add_argument("--sim-workers", help="parity: simulated worker counts, e.g. 8")
    parser.add_argument("--stack-workers", help="parity: local-stack worker counts, e.g. 4")
    parser.add_argument("--repeats", type=int, help="parity: runs of each job on the stack")
    parser.add_argument("--no-fit", action="store_true", help="parity: skip the Keras fit reference")
    parser.add_argument("--baseline", type=Path,
                        help="roundtrip: a worktree of older code whose overhead benchmark runs "
                             "in the same session, for the before/after table")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    failed = []
    fresh: dict[str, dict[str, Any]] = {}
    for name in names:
        module = importlib.import_module(f"benchmarks.{name}")
        log(f"{name}: start ({'smoke' if args.smoke else 'full'})")
        started = time.monotonic()
        if _needs_child(name):
            try:
                fresh[name] = _run_in_child(name, sys.argv[1:] if argv is None else argv,
                                            args.out)
            except Exception:  # noqa: BLE001 - reported with the others at the end
                traceback.print_exc()
                failed.append(name)
            continue
        params, reduced = reduced_params(name, module, args)
        try:
            result = module.run(args.out, smoke=args.smoke, params=params)
            if reduced:
                result["reduced"] = reduced
        except Exception:
            traceback.print_exc()
            failed.append(name)
            continue
        if result.get("seconds") is None:
            result["seconds"] = time.monotonic() - started
        result["machine"]["load_average_at_end"] = list(os.getloadavg())
        path = common.write_result(args.out, name, result)
        fresh[name] = result
        log(f"{name}: done in {time.monotonic() - started:.0f} s -> {path}")
    print(render(fresh))
    if not args.smoke and not args.no_doc and args.out.resolve() == common.RESULTS.resolve():
        refresh_doc(load_results(args.out))
        log(f"refreshed {DOC}")
    if failed:
        log(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
