"""Benchmark 4 — control-plane scale.

A. Throughput with 1, 2, 4, 8, 16 worker processes (real local stack on the emulators) on a job
   whose model is so small that compute is negligible: a generated CSV with 4 features and 2
   classes (MLP, ~9k parameters), ``rows_per_shard=8`` (one gradient step per task), 64 tasks per
   epoch, 2 epochs, rounds of ``max(2, W)`` tasks (``parallel_tasks``) so that every worker can
   have a task. Each stack is warmed with a tiny job first (TensorFlow imports in every worker
   that got a task). Measured from Firestore timestamps: tasks/s and versions/s over the training
   span (first task started -> last version committed), plus CPU seconds per component (from
   /proc, by process group) over the measured job — which is how we say *why* it saturates.
B. Aggregator deltas/s for a ~1M-parameter model (7,800 features x MLP 128-64 x 2 classes =
   1,006,914 parameters):
     * in-process micro-benchmark: decode K deltas + weights + fold + encode (no I/O);
     * end to end on the in-memory ports: a real job (split, version 0) whose epoch-1 results
       are written directly, round by round (2 tasks a round), and folded by ``aggregate_job``,
       including the holdout evaluation and the version commit.
C. Firestore writes per applied task, *measured*: every process of the stack loads
   ``benchmarks/tools/fscount/sitecustomize.py``, which counts the writes in every Firestore commit RPC by
   collection; the counts over the measured job are divided by its applied tasks. Next to it the
   figure *derived* from the code paths.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.data import scratch_dir
from benchmarks.harness.figures import median, stats
from benchmarks.harness.procs import log
from benchmarks.harness.stack import cpu_snapshot, emulators, local_stack, submit, wait_ended
from benchmarks.report.markdown import md_table
from benchmarks.report.results import goal, new_result

FULL = {
    "workers": [1, 2, 4, 8, 16],
    "tiny": {"features": 4, "classes": 2, "tasks_per_epoch": 64, "epochs": 2,
             "rows_per_shard": 8},
    "aggregator": {"features": 7800, "classes": 2, "rows": 400, "rows_per_shard": 8,
                   "micro_k": [1, 2, 8], "end_to_end": True},
}
SMOKE = {
    "workers": [],
    "tiny": {"features": 4, "classes": 2, "tasks_per_epoch": 64, "epochs": 2, "rows_per_shard": 8},
    "aggregator": {"features": 7800, "classes": 2, "rows": 400, "rows_per_shard": 8,
                   "micro_k": [1, 2], "end_to_end": False},
}
FSCOUNT_DIR = Path(__file__).resolve().parents[1] / "tools" / "fscount"


# --- data ----------------------------------------------------------------------------------------

def write_tiny_csv(path: Path, features: int, classes: int, rows: int, seed: int = 0) -> Path:
    """Gaussian blobs, one per class (learnable, but the point is the control plane)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, rows)
    centers = rng.normal(0, 2, (classes, features))
    x = centers[labels] + rng.normal(0, 1, (rows, features))
    header = ",".join([f"f{i}" for i in range(features)] + ["label"])
    body = "\n".join(",".join(f"{v:.4f}" for v in row) + f",{int(c)}"
                     for row, c in zip(x, labels, strict=True))
    path.write_text(header + "\n" + body + "\n")
    return path


def rows_for_tasks(tasks: int, rows_per_shard: int, holdout: float = 0.2) -> int:
    return int(round(tasks * rows_per_shard / (1 - holdout)))


def mlp_shapes(features: int, classes: int) -> list[tuple[int, ...]]:
    """Weight shapes of bucketlearn's MLP (Normalization holds no weights in Keras 3)."""
    return [(features, 128), (128,), (128, 64), (64,), (64, classes), (classes,)]


# --- B. aggregator -------------------------------------------------------------------------------

def aggregator_micro(features: int, classes: int, ks: list[int], repeats: int = 5
                     ) -> dict[str, Any]:
    from bucketlearn import codec
    from bucketlearn.domain.fold import TaskResult, fold_round

    rng = np.random.default_rng(0)
    shapes = mlp_shapes(features, classes)
    base = [rng.normal(0, 0.05, s).astype(np.float32) for s in shapes]
    params = int(sum(w.size for w in base))
    out: dict[str, Any] = {"parameters": params, "delta_bytes": None, "by_k": {}}
    for k in ks:
        blobs = [codec.encode_state([rng.normal(0, 1e-3, s).astype(np.float32) for s in shapes],
                                    [], {"base_version": 0, "examples": 8}) for _ in range(k)]
        out["delta_bytes"] = len(blobs[0])
        timings: dict[str, list[float]] = {"decode": [], "fold": [], "encode": [], "total": []}
        for _ in range(repeats):
            t0 = time.perf_counter()
            results = [TaskResult(i, *codec.decode_state(b)[:2], 8) for i, b in enumerate(blobs)]
            t1 = time.perf_counter()
            new = fold_round(base, [], results)
            t2 = time.perf_counter()
            codec.encode_state(new[0] if new else base, [], {"version": 1})
            t3 = time.perf_counter()
            for key, value in (("decode", t1 - t0), ("fold", t2 - t1), ("encode", t3 - t2),
                               ("total", t3 - t0)):
                timings[key].append(value)
        med = {key: median(values) for key, values in timings.items()}
        out["by_k"][str(k)] = {**{f"{key}_seconds": v for key, v in med.items()},
                               "deltas_per_second": k / med["total"],
                               "versions_per_second": 1 / med["total"]}
    return out


def aggregator_end_to_end(features: int, classes: int, rows: int, rows_per_shard: int,
                          tmp: Path) -> dict[str, Any]:
    """A real job on the in-memory ports: each round's results written directly (trained on the
    round's version), then folded, for the whole of epoch 1."""
    from bucketlearn import codec, layout
    from bucketlearn.aggregation.writer import aggregate_job
    from bucketlearn.bootstrap import memory_services
    from bucketlearn.options import JobOptions
    from bucketlearn.services import task_messages
    from bucketlearn.usecases.upload import StorageEvent, handle_upload

    path = write_tiny_csv(tmp / "wide.csv", features, classes, rows)
    svc = memory_services()
    options = JobOptions(rows_per_shard=rows_per_shard, epochs=2, parallel_tasks=2)
    info = svc.store.write_bytes(svc.settings.uploads_bucket, path.name, path.read_bytes(),
                                 "text/csv", options.to_metadata())
    _, job_id = handle_upload(svc, StorageEvent(info.bucket, info.name, info.generation,
                                                info.size))
    assert job_id is not None
    job = svc.registry.get_job(job_id)
    base, state, _ = codec.decode_state(svc.store.read_bytes(svc.settings.models_bucket,
                                                             job.head.weights_path))
    rng = np.random.default_rng(1)

    def write_result(index: int, head: int) -> None:
        meta = {"job_id": job_id, "task_id": layout.task_id_for(job_id, 1, index), "epoch": 1,
                "task_index": index, "base_version": head, "examples": rows_per_shard,
                "train_loss": 0.5, "worker_id": "bench"}
        data = codec.encode_state([rng.normal(0, 1e-4, w.shape).astype(np.float32)
                                   for w in base], state, meta)
        svc.store.write_bytes(svc.settings.deltas_bucket,
                              layout.delta_path(job_id, 1, index, layout.new_nonce()), data,
                              "application/octet-stream")

    aggregate_job(svc, job_id)  # warm: builds the job's model and loads the holdout
    elapsed = 0.0
    while (job := svc.registry.get_job(job_id)).epoch == 1 and not job.is_terminal:
        for index in task_messages.current_round_tasks(job):
            write_result(index, int(job.version))
        t = time.perf_counter()
        aggregate_job(svc, job_id)
        elapsed += time.perf_counter() - t
    versions = svc.registry.list_versions(job_id)
    applied = job.tasks_applied
    return {"rounds": {"tasks": job.tasks_per_epoch, "deltas_applied": applied,
                       "versions": len(versions) - 1, "seconds": elapsed,
                       "deltas_per_second": applied / elapsed,
                       "versions_per_second": (len(versions) - 1) / elapsed,
                       "epoch_after": job.epoch,
                       "holdout_rows": job.dataset["holdout_rows"]}}


# --- A + C. the stack ----------------------------------------------------------------------------

def _counts(directory: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in directory.glob("*.json"):
        try:
            out[path.stem] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
    return out


def _role(argv: str) -> str:
    if "bucketlearn.entrypoints.worker" in argv:  # the learner process (its parent makes no calls)
        return "worker"
    if "bucketlearn.entrypoints.aggregator" in argv:
        return "aggregator"
    if "on_upload" in argv:
        return "split (upload_fn)"
    return "other"


def counts_diff(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
                ) -> dict[str, Any]:
    """Writes (and reads) per role and per collection between two snapshots."""
    total: dict[str, Any] = {"writes": 0, "writes_failed": 0, "commits": 0,
                             "transactional_commits": 0, "documents_looked_up": 0, "queries": 0,
                             "by_role": {}, "by_collection": {}, "failed_by_collection": {}}
    for pid, now in after.items():
        prev = before.get(pid, {})
        role = _role(str(now.get("argv", "")))
        entry = total["by_role"].setdefault(role, {"writes": 0, "writes_failed": 0,
                                                   "documents_looked_up": 0, "queries": 0})
        for key in ("writes", "writes_failed", "commits", "transactional_commits",
                    "documents_looked_up", "queries"):
            delta = int(now.get(key, 0)) - int(prev.get(key, 0))
            total[key] += delta
            if key in entry:
                entry[key] += delta
        for field, target in (("writes_by_collection", "by_collection"),
                              ("writes_failed_by_collection", "failed_by_collection")):
            for coll, n in now.get(field, {}).items():
                delta = int(n) - int(prev.get(field, {}).get(coll, 0))
                if delta:
                    total[target][coll] = total[target].get(coll, 0) + delta
    return total


def wait_workers_ready(svc: Any, stack: Any, timeout: float = 300) -> int:
    """Wait until every worker of this stack has written its first heartbeat."""
    expected = len(stack.worker_procs())
    pids = {str(p.popen.pid) for p in stack.worker_procs() if p.popen}
    prefix = f"{stack.name_prefix}-worker-"  # explicit worker ids (BUCKETLEARN_WORKER_ID)

    def ours(worker_id: str) -> bool:
        return worker_id.startswith(prefix) or worker_id.rsplit("-", 1)[-1] in pids

    deadline = time.monotonic() + timeout
    ready = 0
    while time.monotonic() < deadline:
        ready = sum(1 for w in svc.registry.list_workers() if ours(str(w.get("worker_id", ""))))
        if ready >= expected:
            return ready
        time.sleep(0.5)
    return ready


def stack_run(workers: int, emus: Any, tmp: Path, tiny: dict[str, Any]) -> dict[str, Any]:
    from bucketlearn.options import JobOptions

    counts_dir = tmp / f"fscount-{workers}"
    counts_dir.mkdir()
    pythonpath = os.pathsep.join(p for p in (str(FSCOUNT_DIR), os.environ.get("PYTHONPATH")) if p)
    with local_stack(tmp / f"stack-{workers}", workers, emus, f"scale{workers}", timeout=300,
                     extra_env={"PYTHONPATH": pythonpath,
                                "BUCKETLEARN_BENCH_FS_COUNT_DIR": str(counts_dir)}
                     ) as (stack, svc):
        ready = wait_workers_ready(svc, stack)
        # rounds as wide as the workers: this measures the control plane, not accuracy
        options = JobOptions(rows_per_shard=tiny["rows_per_shard"], epochs=tiny["epochs"],
                             parallel_tasks=max(2, workers))
        warmed = warm_workers(svc, tmp, workers, tiny)
        data = write_tiny_csv(tmp / f"tiny-{workers}.csv", tiny["features"], tiny["classes"],
                              rows_for_tasks(tiny["tasks_per_epoch"], tiny["rows_per_shard"]))
        time.sleep(1.0)  # let the warm-up's last writes land before the snapshot
        before, cpu_before = _counts(counts_dir), cpu_snapshot(stack, emus)
        log(f"scale: W={workers} measured job")
        job_id, t0 = submit(svc, data, options)
        job = wait_ended(svc, job_id, timeout=1800)
        cpu_after = cpu_snapshot(stack, emus)
        time.sleep(1.0)
        after = _counts(counts_dir)
        wall = float(job.finished_at) - t0
        versions = svc.registry.list_versions(job_id)
        cpu = {k: round(cpu_after.get(k, 0.0) - cpu_before.get(k, 0.0), 2) for k in cpu_after}
        return {"workers": workers, "workers_ready": ready, "workers_warmed": len(warmed),
                **job_rates(job, versions, workers, wall, counts_diff(before, after), cpu)}


def warm_workers(svc: Any, tmp: Path, workers: int, tiny: dict[str, Any]) -> set[str]:
    """A small job first, so that TensorFlow is imported in the workers that get a task; the
    workers that did."""
    from bucketlearn.options import JobOptions

    warm = write_tiny_csv(tmp / f"warm-{workers}.csv", tiny["features"], tiny["classes"],
                          rows_for_tasks(max(4, 2 * workers), tiny["rows_per_shard"]), seed=1)
    log(f"scale: W={workers} warm-up job")
    warm_id, _ = submit(svc, warm, JobOptions(rows_per_shard=tiny["rows_per_shard"], epochs=1,
                                              parallel_tasks=max(2, workers)))
    wait_ended(svc, warm_id, timeout=900)
    return {t.worker_id for t in svc.registry.list_tasks(warm_id)}


def job_rates(job: Any, versions: list[Any], workers: int, wall: float,
              writes: dict[str, Any], cpu: dict[str, float]) -> dict[str, Any]:
    """The measured job's rates over its training span, its tasks' phases, the CPU and the
    Firestore writes it took."""
    # what each folded task's learner measured travels with its result into the version
    # that folded it (the task document is written once, when the attempt starts)
    tasks = [stats for v in versions for stats in (v.task_stats or {}).values()]
    phases = {phase: [float(t.get(f"{phase}_seconds") or 0.0) for t in tasks]
              for phase in ("train", "fetch", "write")}
    durations = [sum(phases[p][i] for p in phases) for i in range(len(tasks))]
    first = min(float(t["train_started_at"]) - float(t.get("fetch_seconds") or 0.0)
                for t in tasks)
    last_version = versions[-1].created_at
    span = last_version - first
    applied = job.tasks_applied
    busy = sum(durations)
    deltas_per_version = [len(v.tasks_applied) for v in versions[1:]]
    return {
        "status": job.status, "accuracy": job.head.holdout_accuracy,
        "tasks_applied": applied, "tasks_folded": len(tasks),
        "versions": len(versions) - 1, "training_span_seconds": span, "wall_seconds": wall,
        "tasks_per_second": applied / span, "versions_per_second": (len(versions) - 1) / span,
        "deltas_per_version": stats([float(n) for n in deltas_per_version]),
        "worker_utilization": busy / (workers * span),
        "task_seconds": stats(durations),
        **{f"{phase}_seconds": stats(values) for phase, values in phases.items()},
        "cpu_seconds": cpu, "cpu_capacity_seconds": (os.cpu_count() or 1) * wall,
        "firestore": writes,
        "writes_per_applied_task": writes["writes"] / max(applied, 1),
        "failed_writes_per_applied_task": writes["writes_failed"] / max(applied, 1),
    }


def derived_writes_per_task(deltas_per_version: float, tasks_per_epoch: int,
                            tasks_total: int) -> dict[str, Any]:
    """Firestore writes per applied task as the code paths say (no contention, no retries).

    learner, per task: the attempt record (the task's one document write) = 1; heartbeats are
    written by a thread within a second of a change of state, not per task, so they are counted
    in the measured figures only. aggregator, per version: one commit writing the version
    document and the job document (the publish record, health and any evaluation folded in) = 2;
    an evaluation no later commit carries is written on its own (version and job head) = +2, at
    most once per version. Leases: a create per job and a renewal every third of the lease,
    per aggregator, not per version. per job: creation, options, start of training (version 0
    and the job), the export = about 5.
    """
    worker = 1
    low_version, high_version = 2, 4
    per_epoch, per_job = 0, 5
    fixed = per_epoch / tasks_per_epoch + per_job / max(tasks_total, 1)
    return {"worker_per_task": worker, "aggregator_per_version": [low_version, high_version],
            "per_epoch": per_epoch, "per_job": per_job, "deltas_per_version": deltas_per_version,
            "writes_per_applied_task": [worker + low_version / deltas_per_version + fixed,
                                        worker + high_version / deltas_per_version + fixed]}


def run(out: Path, smoke: bool = False, params: dict[str, Any] | None = None) -> dict[str, Any]:
    params = params or (SMOKE if smoke else FULL)
    result = new_result("scale", smoke, params)
    started = time.monotonic()
    agg, tiny = params["aggregator"], params["tiny"]
    figures: dict[str, Any] = {}
    log("scale: aggregator micro-benchmark (~1M parameters)")
    figures["aggregator_micro"] = aggregator_micro(agg["features"], agg["classes"], agg["micro_k"])
    with scratch_dir("scale") as tmp:
        if agg["end_to_end"]:
            log("scale: aggregator end to end on the memory ports (~1M parameters)")
            figures["aggregator_memory_e2e"] = aggregator_end_to_end(
                agg["features"], agg["classes"], agg["rows"], agg["rows_per_shard"], tmp)
        runs = {}
        if params["workers"]:
            with emulators(tmp) as emus:
                for workers in params["workers"]:
                    log(f"scale: stack with {workers} worker(s)")
                    runs[str(workers)] = stack_run(workers, emus, tmp, tiny)
        figures["stack"] = runs
    ratios: dict[str, Any] = {}
    for k, f in figures["aggregator_micro"]["by_k"].items():
        ratios[f"aggregator_micro_k{k}_deltas_per_second"] = f["deltas_per_second"]
    if runs:
        base = runs[min(runs, key=int)]
        for n, r in runs.items():
            ratios[f"tasks_per_second_{n}w_over_1w"] = r["tasks_per_second"] / base["tasks_per_second"]
            ratios[f"versions_per_second_{n}w_over_1w"] = (r["versions_per_second"]
                                                           / base["versions_per_second"])
        best = max(runs.values(), key=lambda r: r["tasks_per_second"])
        figures["saturation"] = {"best_workers": best["workers"],
                                 "best_tasks_per_second": best["tasks_per_second"]}
        measured = [r["writes_per_applied_task"] for r in runs.values()]
        ratios["writes_per_applied_task_min"] = min(measured)
        ratios["writes_per_applied_task_max"] = max(measured)
        for r in runs.values():
            r["writes_derived"] = derived_writes_per_task(
                r["tasks_applied"] / max(1, r["versions"]), tiny["tasks_per_epoch"],
                r["tasks_applied"])
    figures["writes_derived"] = derived_writes_per_task(2.0, tiny["tasks_per_epoch"],
                                                        tiny["tasks_per_epoch"] * tiny["epochs"])
    if not runs:
        result["notes"].append("smoke: the local stack is not started (no tasks/s, versions/s or "
                               "measured writes); aggregator micro-benchmark only")
    goal(result, "aggregator deltas/s, ~1M parameters, K=2, in-process (no goal: reported)",
         figures["aggregator_micro"]["by_k"].get("2", {}).get("deltas_per_second"), "report", None)
    result["figures"] = figures
    result["ratios"] = ratios
    result["seconds"] = time.monotonic() - started
    return result


TABLE_HEADER = ["workers", "tasks/s", "vs 1 worker", "versions/s", "deltas/version (median)",
                "worker utilization", "Firestore writes / applied task", "CPU s (workers / "
                "aggregator / firestore / pubsub / storage) per wall s"]


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    runs = result["figures"].get("stack", {})
    base = runs[min(runs, key=int)]["tasks_per_second"] if runs else None
    for n, r in runs.items():
        cpu = r["cpu_seconds"]
        wall = r["wall_seconds"]
        share = " / ".join(f"{cpu.get(k, 0.0) / wall:.2f}" for k in (
            "workers", "aggregator", "emulator:firestore", "emulator:pubsub", "emulator:storage"))
        rows.append([n, f"{r['tasks_per_second']:.2f}", f"{r['tasks_per_second'] / base:.2f}x",
                     f"{r['versions_per_second']:.2f}", f"{r['deltas_per_version']['median']:.0f}",
                     f"{100 * r['worker_utilization']:.0f}%", f"{r['writes_per_applied_task']:.2f}",
                     share])
    if not runs:
        rows.append(["not run", "", "", "", "", "", "", ""])
    return rows


def extra_tables(result: dict[str, Any]) -> list[str]:
    f = result["figures"]
    micro = f["aggregator_micro"]
    rows = [[f"in-process, K={k}", f"{v['decode_seconds'] * 1000:.1f}", f"{v['fold_seconds'] * 1000:.1f}",
             f"{v['encode_seconds'] * 1000:.1f}", f"{v['deltas_per_second']:.1f}",
             f"{v['versions_per_second']:.1f}"] for k, v in micro["by_k"].items()]
    for mode, v in f.get("aggregator_memory_e2e", {}).items():
        rows.append([f"memory ports end to end, {mode} ({v['versions']} versions)", "", "", "",
                     f"{v['deltas_per_second']:.1f}", f"{v['versions_per_second']:.1f}"])
    tables = [md_table([f"aggregator, {micro['parameters']:,} parameters "
                        f"({micro['delta_bytes'] / 1e6:.1f} MB per delta)", "decode ms", "fold ms",
                        "encode ms", "deltas/s", "versions/s"], rows)]
    derived = f.get("writes_derived")
    runs = f.get("stack", {})
    if derived:
        low, high = derived["writes_per_applied_task"]
        rows = [["derived, K=2 deltas per version", f"{low:.2f}–{high:.2f}",
                 f"worker {derived['worker_per_task']} per task + aggregator "
                 f"{derived['aggregator_per_version'][0]}–{derived['aggregator_per_version'][1]} "
                 f"per version / deltas per version + {derived['per_epoch']} per epoch + "
                 f"{derived['per_job']} per job", ""]]
        for n, r in runs.items():
            fs = r["firestore"]
            by = ", ".join(f"{k} {v}" for k, v in sorted(fs["by_collection"].items()))
            roles = ", ".join(f"{k} {v['writes']}" for k, v in sorted(fs["by_role"].items()))
            d_low, d_high = r["writes_derived"]["writes_per_applied_task"]
            rows.append([f"measured, {n} worker(s)", f"{r['writes_per_applied_task']:.2f}",
                         f"{fs['writes']} writes for {r['tasks_applied']} tasks; by role: {roles}; "
                         f"by collection: {by}; plus {fs['writes_failed']} failed lease creates "
                         f"(contention, {r['failed_writes_per_applied_task']:.2f}/task)",
                         f"{d_low:.2f}–{d_high:.2f} at {r['tasks_applied'] / r['versions']:.1f} "
                         "deltas/version"])
        tables.append(md_table(["Firestore writes per applied task", "value", "how",
                                "derived for that run"], rows))
    return tables
