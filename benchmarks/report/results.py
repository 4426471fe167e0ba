"""The result every benchmark writes: ``<out>/<name>.json`` with the date, the machine, the code
state, the parameters, raw figures, ratios against a same-run baseline, goals and notes."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import REPO
from bucketlearn.config import SINGLE_THREADED_TF

PACKAGES = ("tensorflow-cpu", "tensorflow", "keras", "numpy", "pyarrow", "safetensors", "pandas",
            "google-cloud-firestore", "google-cloud-storage", "google-cloud-pubsub",
            "gcp-storage-emulator", "functions-framework")


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = round(int(line.split()[1]) * 1024 / 1024**3, 1)
    versions = {}
    for name in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc = os.cpu_count() or 0
    return {
        "nproc": nproc, "cpu_model": cpu, "ram_gib": ram,
        "python": platform.python_version(), "platform": platform.platform(),
        "packages": versions, "load_average_at_start": list(os.getloadavg()),
        "tf_threads": {k: os.environ.get(k) for k in SINGLE_THREADED_TF},
    }


def code_state() -> dict[str, Any]:
    """The commit measured, and which tracked files differed from it (the tree may be dirty)."""
    import hashlib
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                  timeout=30).stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""

    ingest = REPO / "bucketlearn" / "ingest.py"
    return {"commit": git("rev-parse", "--short", "HEAD") or None,
            "modified": [line[3:] for line in git("status", "--porcelain", "--untracked-files=no",
                                                   "bucketlearn").splitlines()],
            "ingest_py_sha256": hashlib.sha256(ingest.read_bytes()).hexdigest()[:16]
            if ingest.exists() else None}


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def write_result(out: Path, name: str, result: dict[str, Any]) -> Path:
    """Write ``<out>/<name>.json`` atomically."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=False, default=jsonable) + "\n")
    tmp.replace(path)
    return path


def jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def new_result(name: str, smoke: bool, params: dict[str, Any]) -> dict[str, Any]:
    """The skeleton every benchmark fills: figures (raw), ratios (against a same-run baseline),
    goals (each with target, value and met), notes (what the numbers mean, what was reduced)."""
    return {"benchmark": name, "date": now_iso(), "smoke": smoke, "machine": machine(),
            "code": code_state(), "params": params, "figures": {}, "ratios": {}, "goals": [], "notes": [],
            "seconds": None}


def goal(result: dict[str, Any], name: str, value: float | None, target: str,
         met: bool | None) -> None:
    result["goals"].append({"name": name, "value": value, "target": target, "met": met})


def print_goals(result: dict[str, Any]) -> None:
    """Each goal of ``result`` on a line: met or MISS, its value and its target."""
    for g in result["goals"]:
        value = "-" if g["value"] is None else f"{g['value']:.3f}"
        print(f"{'met ' if g['met'] else 'MISS'} {g['name']}: {value} (goal {g['target']})")


def load_results(directory: Path, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``<directory>/<name>.json`` of each name that has one."""
    results = {}
    for name in names:
        path = directory / f"{name}.json"
        if path.exists():
            results[name] = json.loads(path.read_text())
    return results
