"""``train-local`` timed in a child process (``tools/train_local.py``), on one TensorFlow thread
as the learners run, or at TensorFlow's default thread count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import REPO
from benchmarks.harness.procs import bench_env
from bucketlearn.config import SINGLE_THREADED_TF


def serial_seconds(path: Path, options: dict[str, Any], repeats: int,
                   one_thread: bool = True) -> dict[str, Any]:
    """train-local in a child process on one TensorFlow thread (or at TensorFlow's default
    thread count): best wall of ``repeats``."""
    env = bench_env(**(SINGLE_THREADED_TF if one_thread else {}))
    runs = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-m", "benchmarks.tools.train_local", str(path),
                               json.dumps(options)], capture_output=True, text=True, timeout=7200,
                              env=env, cwd=REPO)
        if done.returncode != 0:
            raise RuntimeError(f"train-local failed: {done.stderr[-2000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["seconds"])
    return {**best, "all_seconds": [r["seconds"] for r in runs]}
