"""The local stack for a benchmark: the emulators, a stack on them, jobs submitted as
``bucketlearn submit`` does and waited for with the project's own ``wait_terminal``."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import DIGITS
from benchmarks.harness.procs import log, process_table, tree_cpu
from bucketlearn.usecases.waiting import wait_terminal

BENCH_UPLOADS = "bench-uploads"


def unique_prefix(label: str) -> str:
    return f"b{uuid.uuid4().hex[:8]}-{label}"[:30]


@contextlib.contextmanager
def emulators(home: Path) -> Iterator[Any]:
    """The three emulators on free ports, shared by the stacks of one benchmark, one after
    another: their uploads bucket is ``BENCH_UPLOADS``, the only one whose objects raise
    storage notifications, as in a deployment (``Emulators.uploads_bucket``)."""
    from bucketlearn.local.emulators import Emulators

    emus = Emulators(home / "emulator-logs", uploads_bucket=BENCH_UPLOADS).start(timeout=240)
    try:
        yield emus
    finally:
        emus.stop()


@contextlib.contextmanager
def local_stack(home: Path, workers: int, emus: Any, label: str, timeout: float = 240,
                prefix: str | None = None, **kwargs: Any) -> Iterator[tuple[Any, Any]]:
    """A started LocalStack on shared emulators (no dashboard) and its Google services; stopped
    afterwards. Its resources are named under ``prefix`` (None: a new one from ``label``): a
    stack started on the same emulators with an earlier stack's prefix finds that one's jobs,
    models and records. ``kwargs`` go to LocalStack (e.g. ``extra_env``)."""
    from bucketlearn.bootstrap import google_services
    from bucketlearn.local.stack import LocalStack

    stack = LocalStack(home=home, workers=workers, dashboard=False, emulators=emus,
                       name_prefix=prefix or unique_prefix(label), **kwargs)
    stack.start(timeout=timeout)
    try:
        yield stack, google_services(stack.settings)
    finally:
        stack.stop()


def cpu_snapshot(stack: Any, emus: Any) -> dict[str, float]:
    """CPU seconds so far per component: each started process and all its descendants (gcloud's
    Java emulators included); the relay and the polling run in this process."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[str, float] = {}
    groups = {**{f"emulator:{n}": p for n, p in emus.procs.items()}, **stack.procs}
    for name, proc in groups.items():
        if proc.popen is None:
            continue
        key = "workers" if name.startswith("worker-") else name
        out[key] = out.get(key, 0.0) + tree_cpu(proc.popen.pid, table, children)
    usage = os.times()
    out["benchmark process (relay, polling)"] = usage.user + usage.system
    return out


def gcp_storage_emulator_argv(port: int) -> list[str]:
    """gcp-storage-emulator in memory on ``port``: the storage benchmarks' baseline."""
    return [str(Path(sys.executable).parent / "gcp-storage-emulator"), "start",
            "--host=127.0.0.1", f"--port={port}", "--in-memory"]


def wait_ended(svc: Any, job_id: str, timeout: float) -> Any:
    """The job once it has ended (``wait_terminal``, read every second as ``bucketlearn wait``
    reads it: the walls are taken from the job's own ``finished_at``, and a faster poll is load
    on the Firestore emulator, which shares the cores with the job measured); a job still
    running after ``timeout`` seconds stops the benchmark (TimeoutError), its figures would be
    wrong."""
    job = wait_terminal(svc.registry, job_id, timeout, 1.0)
    if job is None or not job.is_terminal:
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
    from bucketlearn.options import JobOptions

    warm = tmp / "warmup.csv"
    lines = DIGITS.read_text().splitlines()
    warm.write_text("\n".join(lines[:201]) + "\n")
    log(f"{label}: warm-up job (imports TensorFlow in the learner and the aggregator)")
    job_id, _ = submit(svc, warm, JobOptions(epochs=1))
    wait_ended(svc, job_id, timeout=600)
