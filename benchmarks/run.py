"""Run the benchmarks, write ``<out>/<name>.json``, print markdown tables, refresh the doc.

    python -m benchmarks.run [--only ingest,parity,roundtrip,scale] [--smoke] [--out DIR] [--no-doc]

``--smoke`` runs tiny sizes (well under a minute; what CI runs through tests/test_bench_smoke.py).
Without ``--smoke`` and with the default ``--out``, the generated section of docs/BENCHMARKS.md
(between the ``bench:generated`` markers) is rebuilt from every JSON in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import REPO, RESULTS
from benchmarks.harness.procs import log
from benchmarks.report.doc import DOC, refresh_doc
from benchmarks.report.markdown import render
from benchmarks.report.results import load_results, write_result
from benchmarks.suites import NAMES, load
from bucketlearn.config import SINGLE_THREADED_TF

# Parity compares serial training with the pipeline's learners, which on the local stack run
# TensorFlow on one thread (``config.SINGLE_THREADED_TF``). Another thread count sums in another
# order, and CNN training can turn that rounding into points of accuracy; so parity runs serial
# training and the simulation on one thread too, in a process of its own when needed (TensorFlow
# fixes its threads when it starts).
ONE_THREAD = {"parity": SINGLE_THREADED_TF}


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
        reduced += _reduced_parity(params, args)
    added = False  # a baseline run beside the full one adds to it: not a reduction
    if name == "roundtrip" and args.baseline:
        params["baseline"] = str(args.baseline)
        added = True
    if name in ("scale", "speedup") and args.workers:
        params["workers"] = [int(x) for x in args.workers.split(",")]
        reduced.append(f"workers={params['workers']}")
    return (params if reduced or added else None), reduced


def _reduced_parity(params: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The parity-only reductions, applied to ``params``; what they reduced."""
    reduced = []
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
    return reduced


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
                          env=env, cwd=REPO, check=False, timeout=24 * 3600)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark {name} exited with {done.returncode}")
    return json.loads((out / f"{name}.json").read_text())


def _needs_child(name: str) -> bool:
    pinned = ONE_THREAD.get(name)
    return bool(pinned) and any(os.environ.get(k) != v for k, v in pinned.items())


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    found.add_argument("--only", default=",".join(NAMES),
                       help="comma-separated subset of " + ",".join(NAMES))
    found.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    found.add_argument("--out", type=Path, default=RESULTS)
    found.add_argument("--no-doc", action="store_true", help="do not refresh docs/BENCHMARKS.md")
    found.add_argument("--sizes", help="ingest: file sizes in MB, e.g. 50 (reduced run)")
    found.add_argument("--datasets", help="parity/roundtrip/methods/schedules/speedup: datasets, "
                       "e.g. digits (reduced run)")
    found.add_argument("--seeds", help="parity: seeds, e.g. 0 (reduced run)")
    found.add_argument("--workers", help="scale, speedup: worker counts, e.g. 1,2,4 (reduced run)")
    found.add_argument("--orders", help="parity: row orders, e.g. sorted (reduced run)")
    found.add_argument("--sim-workers", help="parity: simulated worker counts, e.g. 8")
    found.add_argument("--stack-workers", help="parity: local-stack worker counts, e.g. 4")
    found.add_argument("--repeats", type=int, help="parity: runs of each job on the stack")
    found.add_argument("--no-fit", action="store_true", help="parity: skip the Keras fit reference")
    found.add_argument("--baseline", type=Path,
                       help="roundtrip: a worktree of older code whose overhead benchmark runs "
                            "in the same session, for the before/after table")
    return found


def run_one(name: str, args: argparse.Namespace, argv: list[str] | None
            ) -> dict[str, Any] | None:
    """One benchmark, here or (``ONE_THREAD``) in a child process: its result, written (None:
    it failed, and its traceback is printed)."""
    module = load(name)
    log(f"{name}: start ({'smoke' if args.smoke else 'full'})")
    started = time.monotonic()
    if _needs_child(name):
        try:
            return _run_in_child(name, sys.argv[1:] if argv is None else argv, args.out)
        except Exception:  # noqa: BLE001 - reported with the others at the end
            traceback.print_exc()
            return None
    params, reduced = reduced_params(name, module, args)
    try:
        result = module.run(args.out, smoke=args.smoke, params=params)
        if reduced:
            result["reduced"] = reduced
    except Exception:
        traceback.print_exc()
        return None
    if result.get("seconds") is None:
        result["seconds"] = time.monotonic() - started
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    path = write_result(args.out, name, result)
    log(f"{name}: done in {time.monotonic() - started:.0f} s -> {path}")
    return result


def main(argv: list[str] | None = None) -> int:
    command = parser()
    args = command.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        command.error(f"unknown benchmark(s): {', '.join(unknown)}")
    failed = []
    fresh: dict[str, dict[str, Any]] = {}
    for name in names:
        result = run_one(name, args, argv)
        if result is None:
            failed.append(name)
        else:
            fresh[name] = result
    print(render(fresh))
    if not args.smoke and not args.no_doc and args.out.resolve() == RESULTS.resolve():
        refresh_doc(load_results(args.out, NAMES))
        log(f"refreshed {DOC}")
    if failed:
        log(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
