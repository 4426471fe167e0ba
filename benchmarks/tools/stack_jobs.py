"""Jobs of the round-trip benchmark's datasets, one after another on one local stack with every
process logging its calls: per job, its wall, the remote calls each process made in its window,
and its learners' per-task figures (part fetch, training, result write, CPU, from the versions'
``task_stats``). For measuring one change by hand, A/B on alternating stacks.

    python -m benchmarks.tools.stack_jobs OUT trips-120k,trips-120k,trips-120k [KEY=VALUE ...]

KEY=VALUE pairs go to every process of the stack's environment. Prints a few lines per job and
writes ``OUT/jobs.json``. Takes about a minute and a half for three trips-120k jobs.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.harness.stack import emulators, local_stack, submit, wait_ended, warm_up
from benchmarks.suites.roundtrip import FULL, dataset_file, load_calls
from bucketlearn.options import JobOptions

TASK_FIGURES = ("fetch_seconds", "train_seconds", "write_seconds", "cpu_seconds")


def task_figures(svc: Any, job_id: str) -> dict[str, dict[str, float]]:
    """Sum, median and max of each learner-side figure over the job's applied tasks."""
    stats = [s for v in svc.registry.list_versions(job_id) for s in (v.task_stats or {}).values()]
    out = {}
    for key in TASK_FIGURES:
        values = [float(s.get(key) or 0.0) for s in stats]
        if values:
            out[key] = {"sum": round(sum(values), 3), "median": round(statistics.median(values), 4),
                        "max": round(max(values), 3), "n": len(values)}
    return out


def main(out: Path, names: list[str], env: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    calls_dir = out / "calls"
    jobs = []
    with (emulators(out) as emus,
          local_stack(out / "stack", 1, emus, "stack-jobs",
                      extra_env={"BUCKETLEARN_CALL_LOG": str(calls_dir), **env}) as (_, svc)):
        warm_up(svc, out, "stack-jobs")
        for name in names:
            spec = FULL["datasets"][name]
            job_id, t0 = submit(svc, dataset_file(name, spec, out),
                                JobOptions(**spec.get("options", {})))
            job = wait_ended(svc, job_id, timeout=3600)
            time.sleep(1.5)  # the processes' call logs are flushed every 0.5 s
            end = job.finished_at or time.time()
            calls = Counter((c["process"], c["kind"]) for c in load_calls(calls_dir)
                            if t0 <= c["started"] <= end)
            figures = {"dataset": name, "wall_seconds": round(end - t0, 3),
                       "status": job.status, "tasks": task_figures(svc, job_id),
                       "calls": {f"{p} {k}": n for (p, k), n in calls.most_common()}}
            jobs.append(figures)
            print(f"{name}: {figures['status']} in {figures['wall_seconds']} s, "
                  f"{sum(calls.values())} calls", flush=True)
            for key, value in figures["tasks"].items():
                print(f"  {key}: {value}", flush=True)
    (out / "jobs.json").write_text(json.dumps(jobs, indent=1))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2].split(","),
         dict(pair.split("=", 1) for pair in sys.argv[3:]))
