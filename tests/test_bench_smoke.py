"""The benchmarks' smoke run: every benchmark runs at tiny sizes and writes a well-formed result.

A benchmark is not a timed test: nothing here asserts on speed, only that the harness works and
produces finite figures.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NAMES = ("ingest", "parity", "roundtrip", "scale", "methods", "schedules", "speedup")
KEYS = {"benchmark", "date", "smoke", "machine", "params", "figures", "ratios", "goals", "notes",
        "seconds"}


def numbers(value: Any) -> list[float]:
    """Every int/float inside a JSON value (bools excluded)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return []


def test_smoke_run_writes_every_result(tmp_path: Path) -> None:
    # Prepare
    doc = REPO / "docs" / "BENCHMARKS.md"
    doc_before = doc.stat().st_mtime_ns if doc.exists() else None
    # Execute
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUCKETLEARN_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--out",
                           str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    # Assert
    assert done.returncode == 0, done.stderr[-4000:]
    assert "#### Goals" in done.stdout
    for name in NAMES:
        path = tmp_path / f"{name}.json"
        assert path.exists(), f"{name}.json was not written"
        result = json.loads(path.read_text())
        assert KEYS <= set(result), f"{name}: missing {KEYS - set(result)}"
        assert result["benchmark"] == name and result["smoke"] is True
        assert result["machine"]["nproc"] >= 1 and result["machine"]["python"]
        assert result["figures"] and result["ratios"], f"{name}: no figures or ratios"
        ratios = numbers(result["ratios"])
        assert ratios and all(math.isfinite(r) for r in ratios), (name, result["ratios"])
        assert all(math.isfinite(n) for n in numbers(result["figures"])), name
        for goal in result["goals"]:
            assert {"name", "value", "target", "met"} <= set(goal)
    assert (doc.stat().st_mtime_ns if doc.exists() else None) == doc_before, \
        "a smoke run must not rewrite docs/BENCHMARKS.md"
