"""What the e2e modules share: the CLI in a subprocess, waiting for a job, the ledger check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bucketlearn import layout
from bucketlearn.usecases import waiting

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "data" / "digits.csv"


def cli(stack: Any, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``bucketlearn ARGS`` against ``stack`` as a user would (a subprocess)."""
    env = {**os.environ, "BUCKETLEARN_HOME": str(stack.home)}
    return subprocess.run([sys.executable, "-m", "bucketlearn.entrypoints.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=REPO)


def submit_and_wait(stack: Any, path: Path, *flags: str, timeout: float = 500) -> dict[str, Any]:
    result = cli(stack, "submit", str(path), "--wait", "--json", "--timeout", str(timeout),
                 *flags, timeout=timeout + 60)
    assert result.stdout.strip(), f"no output; stderr:\n{result.stderr[-3000:]}"
    return json.loads(result.stdout)


def assert_ledger_consistent(svc: Any, job_id: str) -> list[dict[str, Any]]:
    """Versions dense from 0, each folding the next whole round of the plan, in order; each
    planned task applied at most once, and every one of them unless training stopped early
    once validation stopped improving (invariants 2 and 3)."""
    job = svc.registry.get_job(job_id)
    versions = svc.registry.list_versions(job_id)
    plan = job.plan
    assert [v.version for v in versions] == list(range(job.version + 1))
    assert all(v.parent == v.version - 1 for v in versions[1:])
    applied = [t for v in versions for t in v.tasks_applied]
    assert len(applied) == len(set(applied)), "a task was applied twice"
    rounds = [(e, r) for e in range(1, plan.epochs + 1) for r in range(plan.rounds_per_epoch)]
    assert [(v.epoch, v.round) for v in versions[1:]] == rounds[:len(versions) - 1]
    for v in versions[1:]:
        expected = {layout.task_id_for(job_id, v.epoch, t) for t in plan.round_range(v.round)}
        assert set(v.tasks_applied) | set(v.tasks_failed) == expected, v.version
    planned = {layout.task_id_for(job_id, e, t) for e in range(1, job.options["epochs"] + 1)
               for t in range(job.tasks_per_epoch)}
    stopped = (job.selection or {}).get("stop_epoch") or plan.epochs
    assert set(applied) <= planned and job.tasks_applied == len(applied)
    if stopped >= plan.epochs:
        assert set(applied) == planned and job.tasks_applied == job.tasks_planned
    # once the job has ended only the exported version's weights are kept (aggregation.wind_up)
    assert svc.store.stat(svc.settings.models_bucket, job.head.weights_path) is not None
    return versions


def wait_terminal(svc: Any, job_id: str, timeout: float) -> dict[str, Any]:
    """The job once it has ended; AssertionError naming its state if it has not in time."""
    job = waiting.wait_terminal(svc.registry, job_id, timeout)
    if job is None or not job.is_terminal:
        raise AssertionError(f"job {job_id} did not finish in {timeout}s: {job}")
    return job
