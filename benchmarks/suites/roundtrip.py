"""Benchmark — the round trip: what a training round costs on its critical path.

On the real local stack (emulators, the upload function, the long-running aggregator, one
learner process; TensorFlow on one thread in every process), each dataset is uploaded and
trained to DONE, with every process logging its remote calls (``BUCKETLEARN_CALL_LOG``,
``adapters.metered``). From the versions' documents (what each task's learner measured, when its
result was sent and heard, the fold's steps) and the call logs it measures:

* **seconds per round on the critical path**, median and p90: from the end of a round's last
  task's training (its result is written after it) to the first training step of the next
  round's task, broken down by hop (result write, Pub/Sub to the aggregator, waiting for the
  fold, read, fold, write, commit, from the commit to the next task's first step). A chained
  round (R = 1) waits for no hop but the learner's own: its next task starts before the commit.
* **sequential remote calls per round** on that path, counted from the call logs: the learner's
  main thread in the window (and, for a round that is not chained, the aggregator's job thread
  and the next task's pull and reads), and a **cloud projection**: the same path with each call
  priced at a stated cloud latency (``LATENCY``) instead of its local time.
* **Firestore writes** per applied task and per version on the job's document, from the calls.
* **pipeline wall / train-local wall**, one worker, both on one TensorFlow thread.

``train-local`` runs in a child process with one TensorFlow thread (the learners' setting), the
best of ``serial_repeats`` runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.data import scratch_dir, write_hmnist
from benchmarks.harness.datasets import trips
from benchmarks.harness.figures import stats, timed
from benchmarks.harness.paths import DIGITS
from benchmarks.harness.procs import bench_env, log
from benchmarks.harness.serial import serial_seconds
from benchmarks.harness.stack import emulators, local_stack, submit, wait_ended, warm_up
from benchmarks.report.markdown import md_table
from benchmarks.report.results import goal, new_result

FULL = {
    "datasets": {"digits": {"source": "data/digits.csv (as shipped)", "options": {}},
                 "hmnist": {"source": "make_hmnist rows=3000 (shuffled)", "rows": 3000,
                            "options": {"epochs": 3}},
                 "hmnist-12k": {"source": "make_hmnist rows=12000 (shuffled)", "rows": 12000,
                                "options": {"epochs": 3, "rows_per_shard": 1024}},
                 "trips-120k": {"source": "benchmarks.harness.datasets.trips count=120000 (a "
                                          "table with text and date columns, empty cells)",
                                "rows": 120_000, "options": {"epochs": 2}},
                 # the same table in parallel rounds of 4, forced (its automatic plan trains one
                 # task at a time where rounds do not pay): what a parallel round costs; the
                 # one-worker wall of a layout the plan turned down is not a goal
                 "trips-120k-r4": {"source": "the same rows as trips-120k, parallel_tasks=4",
                                   "data": "trips-120k", "rows": 120_000, "forced": True,
                                   "options": {"epochs": 2, "parallel_tasks": 4}}},
    "stack": True,
    "workers": 1,
    "serial_repeats": 2,
}
SMOKE = {
    "datasets": {"digits": {"source": "data/digits.csv (as shipped)", "options": {"epochs": 1}}},
    "stack": False,
    "workers": 1,
    "serial_repeats": 1,
}
GOALS = {"critical_path_local_median_s": 0.05, "cloud_projection_s": 0.4,
         "firestore_writes_per_task_r1": 3.0, "job_writes_per_version": 1.0, "wall_ratio": 1.3}

# Cloud latency of each call kind on a round's critical path (seconds, one call, same region).
# Assumed round figures, stated so the projection can be re-priced: Firestore point reads and
# single-RPC commits take tens of milliseconds, a transaction (begin, read, commit) about three
# RPCs; a Cloud Storage object of under a few MB is written in tens of milliseconds; a message
# published to Pub/Sub reaches a waiting streaming (or long-polling) pull in tens of
# milliseconds (the architecture brief: "tens of ms"; an Eventarc trigger costs 1-3 s instead).
LATENCY = {
    "firestore.get_job": 0.010, "firestore.get_version": 0.010, "firestore.get_task": 0.010,
    "firestore.commit_version": 0.030, "firestore.update_job": 0.020,
    "firestore.update_job_if": 0.030, "firestore.read_for_attempt": 0.010,
    "firestore.record_attempt": 0.020, "firestore.refund_attempt": 0.020,
    "firestore.update_task": 0.020,
    "firestore.record_evaluation": 0.050, "firestore.acquire_lease": 0.030,
    "storage.write_bytes": 0.060, "storage.read_bytes": 0.040, "storage.read_range": 0.040,
    "storage.stat": 0.025, "storage.list": 0.050, "storage.delete": 0.030,
    "pubsub.publish": 0.020, "pubsub.pull": 0.050,
}
DEFAULT_LATENCY = 0.030
DELIVERY = 0.050  # a published message reaching a waiting pull
LATENCY_SOURCE = ("assumed round figures for one call in one region (the architecture brief: "
                  "streaming pull tens of ms, Eventarc 1-3 s); see benchmarks/suites/roundtrip.py")
# calls that never sit on a round's critical path, whatever their timing
OFF_PATH_THREADS = ("heartbeat", "evaluator", "leases", "call-log", "announce", "learner-io")


def dataset_file(name: str, spec: dict[str, Any], tmp: Path) -> Path:
    """The dataset's CSV, generated once into ``tmp`` (a variant names its rows' dataset as
    ``data``, as in the speed-up suite)."""
    name = spec.get("data", name)
    if name == "digits":
        return DIGITS
    path = tmp / f"{name}.csv"
    if path.exists():
        return path
    if name.startswith("trips"):
        return trips(path, "shuffled", count=int(spec["rows"]))
    write_hmnist(path, count=int(spec["rows"]))
    return path


# --- reading a finished job ----------------------------------------------------------------------

def load_calls(directory: Path) -> list[dict[str, Any]]:
    """Every call every process logged, with the process's file name as ``process``."""
    calls = []
    for path in sorted(directory.glob("*.jsonl")):
        process = path.stem.rsplit("-", 1)[0]
        for line in path.read_text().splitlines():
            if line.strip():
                calls.append({**json.loads(line), "process": process})
    return sorted(calls, key=lambda c: c["started"])


def rounds(versions: list[Any]) -> list[dict[str, Any]]:
    """Each folded version's round: when its tasks trained, were sent and heard, and the fold."""
    out = []
    for version in versions[1:]:
        tasks = [s for s in version.task_stats.values() if s.get("train_started_at")]
        if not tasks:
            continue
        last = max(tasks, key=lambda s: s["train_ended_at"])
        out.append({"version": version.version, "round": version.round, "epoch": version.epoch,
                    "tasks": len(tasks), "chained": all(s.get("chained") for s in tasks),
                    "first_start": min(s["train_started_at"] for s in tasks),
                    "last_end": last["train_ended_at"], "write": last.get("write_seconds"),
                    "sent": last.get("sent_at"), "heard": last.get("heard_at"),
                    "fold_start": version.aggregator.get("planning_started_at"),
                    "steps": {k: version.aggregator.get(k) for k in
                              ("read_seconds", "fold_seconds", "write_seconds")},
                    "created": version.created_at})
    return out


def _on_path(call: dict[str, Any], chained: bool) -> bool:
    """Whether a call can sit on a round's critical path: a learner's main thread always; for
    a round that is not chained, the aggregator's job thread and its result readers too."""
    thread = str(call.get("thread") or "")
    if any(thread.startswith(p) for p in OFF_PATH_THREADS):
        return False
    if call["process"].startswith("worker"):
        return thread == "MainThread"
    return not chained and call["process"].startswith("aggregator") and (
        thread.startswith("job-") or thread.startswith("read-results"))


def round_path(previous: dict[str, Any], current: dict[str, Any],
               calls: list[dict[str, Any]]) -> dict[str, Any]:
    """One round's critical path (from ``previous``'s last training step to ``current``'s first)
    and the calls on it, locally and projected to the cloud."""
    start, end = previous["last_end"], current["first_start"]
    chained = current["chained"]
    inside = [c for c in calls if c["ended"] > start and c["started"] < end
              and _on_path(c, chained)]
    # parallel result reads are one step of the path
    sequential = [c for c in inside if not str(c.get("thread", "")).startswith("read-results")]
    reads = [c for c in inside if str(c.get("thread", "")).startswith("read-results")]
    steps = len(sequential) + (1 if reads else 0)
    local_calls = sum(min(c["ended"], end) - max(c["started"], start) for c in sequential)
    local_calls += max((c["ended"] - c["started"] for c in reads), default=0.0)
    cloud_calls = sum(LATENCY.get(c["kind"], DEFAULT_LATENCY) for c in sequential)
    cloud_calls += max((LATENCY.get(c["kind"], DEFAULT_LATENCY) for c in reads), default=0.0)
    gap = end - start
    delivery = 0.0
    if not chained and previous.get("heard") and previous.get("sent"):
        delivery = max(0.0, previous["heard"] - previous["sent"])  # result -> aggregator
    projected = max(0.0, gap - local_calls - delivery) + cloud_calls + (
        0.0 if chained else DELIVERY)
    return {"seconds": gap, "chained": chained, "calls": steps,
            "kinds": sorted({c["kind"] for c in inside}), "projected_seconds": projected,
            "local_call_seconds": local_calls}


def hops(previous: dict[str, Any], current: dict[str, Any], commit: dict[str, Any] | None
         ) -> dict[str, float | None]:
    """Where the time from ``previous``'s round to ``current``'s went, hop by hop: the result
    written and announced, heard by the aggregator, the fold of ``previous``'s version (its
    wait, read, fold and write steps), its commit, then the next task's first step (negative
    when the round was chained: the learner started it before the commit). None where not
    recorded."""
    def span(a: Any, b: Any) -> float | None:
        return None if a is None or b is None else b - a

    steps = previous["steps"]
    return {"result_write": previous.get("write"),
            "to_aggregator": span(previous.get("sent"), previous.get("heard")),
            "waiting_for_fold": span(previous.get("heard"), previous.get("fold_start")),
            "fold_read": steps.get("read_seconds"), "fold_fold": steps.get("fold_seconds"),
            "fold_write": steps.get("write_seconds"),
            "commit": span(commit["started"], commit["ended"]) if commit else None,
            "commit_to_next_start": span(commit["ended"] if commit else None,
                                         current["first_start"])}


def commits_by_version(calls: list[dict[str, Any]], job_id: str, versions: int
                       ) -> dict[int, dict[str, Any]]:
    """The aggregator's commit calls for a job, by the version each committed (in order; empty
    when a refused commit makes the mapping ambiguous)."""
    found = [c for c in calls if c["kind"] == "firestore.commit_version" and c["job"] == job_id]
    return {i + 1: c for i, c in enumerate(found)} if len(found) == versions else {}


def writes(calls: list[dict[str, Any]], job_id: str, process: str = "") -> dict[str, int]:
    """Firestore document writes of a job, by document, from its calls (of processes whose
    name starts with ``process``; an update on condition counts as a write whether or not it
    landed: an upper bound)."""
    job_writes = {"create_job": 1, "update_job": 1, "update_job_if": 1, "start_training": 1,
                  "commit_version": 1, "record_evaluation": 1}
    version_writes = {"start_training": 1, "commit_version": 1, "record_evaluation": 1}
    task_writes = {"record_attempt": 1, "refund_attempt": 1, "update_task": 1}
    out = {"job": 0, "version": 0, "task": 0}
    for call in calls:
        if (call["job"] != job_id or not call["kind"].startswith("firestore.")
                or not call["process"].startswith(process)):
            continue
        method = call["kind"].split(".", 1)[1]
        out["job"] += job_writes.get(method, 0)
        out["version"] += version_writes.get(method, 0)
        out["task"] += task_writes.get(method, 0)
    return out


def writes_per_round(calls: list[dict[str, Any]], job_id: str, tasks: int, folds: int) -> float:
    """Firestore writes that scale with the job's tasks, per applied task: the task documents'
    writes, and the aggregator's writes to version and job documents other than the end."""
    learners = writes(calls, job_id, "worker")
    aggregator = writes(calls, job_id, "aggregator")
    scaling = learners["task"] + aggregator["version"] + aggregator["job"] - 1
    return scaling / max(1, tasks)


def phases(job: Any, versions: list[Any], ordered: list[dict[str, Any]], t0: float
           ) -> dict[str, float | None]:
    """Where the job's wall went: the upload reaching the function, the split (to version 0),
    version 0 to the first training step, the training span, the last step to DONE."""
    if not ordered:
        return {}
    first, last = ordered[0]["first_start"], ordered[-1]["last_end"]
    return {"upload_to_job": job.created_at - t0,
            "split_to_version_0": versions[0].created_at - job.created_at,
            "version_0_to_first_step": first - versions[0].created_at,
            "training_span": last - first,
            "last_step_to_done": float(job.finished_at) - last}


def job_figures(svc: Any, job_id: str, t0: float, calls: list[dict[str, Any]]
                ) -> dict[str, Any]:
    """A finished job's round trip: per round, the critical path, its calls, the projection,
    the hops; the Firestore writes; the wall."""
    job = svc.registry.get_job(job_id)
    versions = svc.registry.list_versions(job_id)
    ordered = rounds(versions)
    commits = commits_by_version(calls, job_id, len(versions) - 1)
    paths, hop_rows = [], []
    for previous, current in zip(ordered, ordered[1:], strict=False):
        paths.append(round_path(previous, current, calls))
        hop_rows.append(hops(previous, current, commits.get(previous["version"])))
    counted = writes(calls, job_id)
    folds = max(1, len(versions) - 1)
    marginal = writes_per_round(calls, job_id, job.tasks_applied, folds)
    return {
        "phases": phases(job, versions, ordered, t0),
        "train_seconds_total": sum(float(t.get("train_seconds") or 0) for v in versions
                                   for t in v.task_stats.values()),
        "wall_seconds": float(job.finished_at) - t0, "status": job.status,
        "accuracy": job.head.holdout_accuracy if job.head else None,
        "versions": len(versions), "tasks": job.tasks_applied,
        "parallel_tasks": job.plan.parallel_tasks if job.plan is not None else None,
        "chained_rounds": sum(p["chained"] for p in paths),
        "critical_path": stats([p["seconds"] for p in paths]),
        "critical_path_chained": stats([p["seconds"] for p in paths if p["chained"]]),
        "critical_path_published": stats([p["seconds"] for p in paths if not p["chained"]]),
        "calls_per_round": stats([float(p["calls"]) for p in paths]),
        "calls_per_round_published": stats([float(p["calls"]) for p in paths
                                            if not p["chained"]]),
        "call_kinds_published": sorted({k for p in paths if not p["chained"]
                                        for k in p["kinds"]}),
        "projected": stats([p["projected_seconds"] for p in paths]),
        "projected_published": stats([p["projected_seconds"] for p in paths
                                      if not p["chained"]]),
        "hops": {key: stats([h[key] for h in hop_rows if h[key] is not None])
                 for key in (hop_rows[0] if hop_rows else {})},
        "firestore_writes": counted,
        # every write of the job's documents, its fixed ones (create, claim, start, the first
        # publish record, version 0, the end) included
        "firestore_writes_per_task_total": sum(counted.values()) / max(1, job.tasks_applied),
        # what each further task adds: its task document, and its share of a version's commit
        # (the version's document and the job's)
        "firestore_writes_per_task": marginal,
        # the aggregator's writes to the job document, less the one that ends it (DONE)
        "job_writes_per_version": (writes(calls, job_id, "aggregator")["job"] - 1) / folds,
        "usage": dict(job.usage or {}),
    }


def run_stack(cells: dict[str, tuple[Path, Any]], workers: int, tmp: Path) -> dict[str, Any]:
    """Each dataset on the real local stack with one learner, every process logging its calls."""
    out = {}
    calls_dir = tmp / "calls"
    with (emulators(tmp) as emus,
          local_stack(tmp / "stack", workers, emus, "roundtrip",
                      extra_env={"BUCKETLEARN_CALL_LOG": str(calls_dir)}) as (_, svc)):
        warm_up(svc, tmp, "roundtrip")
        for name, (path, options) in cells.items():
            log(f"roundtrip: stack W={workers} {name}")
            job_id, t0 = submit(svc, path, options)
            wait_ended(svc, job_id, timeout=3600)
            time.sleep(1.5)  # the processes' call logs are flushed every 0.5 s
            out[name] = {**job_figures(svc, job_id, t0, load_calls(calls_dir)), "job_id": job_id}
    return out


def run_baseline(tree: Path, datasets: list[str], tmp: Path) -> dict[str, Any]:
    """The overhead benchmark of an older checkout (``tree``: a git worktree with the same
    dependencies), in this session, for the same datasets it has: today's code beside it."""
    out = tmp / "baseline"
    env = bench_env(PYTHONPATH=str(tree))
    log(f"roundtrip: the baseline's overhead benchmark in {tree}")
    done = subprocess.run([sys.executable, "-m", "benchmarks.run", "--only", "overhead",
                           "--out", str(out), "--no-doc", "--datasets", ",".join(datasets)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=4 * 3600)
    if done.returncode != 0:
        raise RuntimeError(f"baseline benchmark failed: {done.stderr[-3000:]}")
    result = json.loads((out / "overhead.json").read_text())
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                            text=True, timeout=30).stdout.strip()
    return {"commit": commit, "date": result["date"], "figures": result["figures"]}


def smoke_figures(path: Path, options: Any) -> dict[str, Any]:
    """The smoke run: the in-process simulation on metered in-memory ports (no stack)."""
    from bucketlearn.adapters.metered import Meter, metered
    from bucketlearn.bootstrap import memory_services
    from bucketlearn.local.simulation import simulate_pipeline

    meter = Meter()
    svc = metered(memory_services(), meter)
    sim, seconds = timed(simulate_pipeline, str(path), options, workers=1, svc=svc)
    job = sim["job"]
    used = {k: v for counts in meter.counts.values() for k, v in counts.items()}
    return {"seconds": seconds, "accuracy": job.head.holdout_accuracy,
            "versions": len(sim["versions"]), "tasks": job.tasks_applied,
            "firestore_writes_per_task": used.get("firestore_writes", 0) / max(1,
                                                                                job.tasks_applied)}


def run(out: Path, smoke: bool = False, params: dict[str, Any] | None = None) -> dict[str, Any]:
    from bucketlearn.options import JobOptions

    params = params or (SMOKE if smoke else FULL)
    result = new_result("roundtrip", smoke, params)
    started = time.monotonic()
    figures: dict[str, Any] = {}
    with scratch_dir("roundtrip") as tmp:
        cells = {}
        for name, spec in params["datasets"].items():
            options = JobOptions(**spec["options"])
            path = dataset_file(name, spec, tmp)
            log(f"roundtrip: train-local {name} (one TensorFlow thread)")
            figures[name] = {"options": options.to_dict(), "serial": serial_seconds(
                path, spec["options"], int(params.get("serial_repeats", 1)))}
            if not params["stack"]:
                figures[name]["sim-1"] = smoke_figures(path, options)
            cells[name] = (path, options)
        if params["stack"]:
            for name, found in run_stack(cells, int(params["workers"]), tmp).items():
                figures[name]["stack-1"] = found
        if params.get("baseline"):
            result["baseline"] = run_baseline(Path(params["baseline"]),
                                              [n for n in cells if n != "trips-120k"], tmp)
    result["figures"] = figures
    result["ratios"] = ratios(figures)
    result["latency"] = {"per_call": LATENCY, "default": DEFAULT_LATENCY, "delivery": DELIVERY,
                         "source": LATENCY_SOURCE}
    evaluate_goals(result, figures)
    result["seconds"] = time.monotonic() - started
    return result


def ratios(figures: dict[str, Any]) -> dict[str, float]:
    out = {}
    for name, f in figures.items():
        serial = f["serial"]["seconds"]
        for key in ("stack-1", "sim-1"):
            if key in f:
                wall = f[key].get("wall_seconds", f[key].get("seconds"))
                out[f"{name}:{key}_over_serial"] = wall / serial
    return out


def evaluate_goals(result: dict[str, Any], figures: dict[str, Any]) -> None:
    stacked = {n: f["stack-1"] for n, f in figures.items() if "stack-1" in f}
    if not stacked:
        result["notes"].append("smoke: the local stack is not started; only the in-process "
                               "simulation is measured, and no goal is evaluated")
        return
    specs = result["params"]["datasets"]
    for name, s in stacked.items():
        wall = s["wall_seconds"] / figures[name]["serial"]["seconds"]
        if not specs.get(name, {}).get("forced"):
            goal(result, f"pipeline (1 worker) / train-local, one TF thread, {name}", wall,
                 f"<= {GOALS['wall_ratio']}", wall <= GOALS["wall_ratio"])
        median = s["critical_path"]["median"]
        if median is not None:
            goal(result, f"critical path per round, median (s), {name}", median,
                 f"<= {GOALS['critical_path_local_median_s']}",
                 median <= GOALS["critical_path_local_median_s"])
        projected = s["projected"]["median"]
        if projected is not None:
            goal(result, f"cloud projection per round, median (s), {name}", projected,
                 f"<= {GOALS['cloud_projection_s']}", projected <= GOALS["cloud_projection_s"])
        if s["parallel_tasks"] == 1:
            per_task = s["firestore_writes_per_task"]
            goal(result, f"Firestore writes per applied task (R = 1; the job's fixed writes "
                 f"apart: {s['firestore_writes_per_task_total']:.2f} with them), {name}",
                 per_task,
                 f"<= {GOALS['firestore_writes_per_task_r1']}",
                 per_task <= GOALS["firestore_writes_per_task_r1"])
        per_version = s["job_writes_per_version"]
        goal(result, f"writes to the job document per version, {name}", per_version,
             f"<= {GOALS['job_writes_per_version']}",
             per_version <= GOALS["job_writes_per_version"])


TABLE_HEADER = ["dataset", "R", "train-local (s)", "pipeline (s)", "pipeline / train-local",
                "rounds chained", "critical path per round, median / p90 (s)",
                "calls per round (median)", "cloud projection, median (s)",
                "Firestore writes per task", "job writes per version"]


def _pair(s: dict[str, Any] | None) -> str:
    if not s or s.get("median") is None:
        return "–"
    return f"{s['median']:.3f} / {s['p90']:.3f}"


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, f in result["figures"].items():
        serial = f["serial"]["seconds"]
        stack = f.get("stack-1")
        if stack is None:
            sim = f["sim-1"]
            rows.append([name, "–", f"{serial:.1f}", f"{sim['seconds']:.1f} (sim)",
                         f"{sim['seconds'] / serial:.2f}x", "–", "–", "–", "–",
                         f"{sim['firestore_writes_per_task']:.2f}", "–"])
            continue
        rounds_total = max(1, stack["versions"] - 2)
        rows.append([name, str(stack["parallel_tasks"]), f"{serial:.1f}",
                     f"{stack['wall_seconds']:.1f}", f"{stack['wall_seconds'] / serial:.2f}x",
                     f"{stack['chained_rounds']} of {rounds_total}",
                     _pair(stack["critical_path"]),
                     f"{stack['calls_per_round']['median']:.0f}",
                     f"{stack['projected']['median']:.3f}",
                     f"{stack['firestore_writes_per_task']:.2f}",
                     f"{stack['job_writes_per_version']:.2f}"])
    return rows


def extra_tables(result: dict[str, Any]) -> list[str]:
    tables = []
    for name, f in result["figures"].items():
        stack = f.get("stack-1")
        if not stack or not stack["hops"]:
            continue
        rows = [[hop.replace("_", " "), str(s["n"]), f"{s['median']:.4f}", f"{s['p90']:.4f}"]
                for hop, s in stack["hops"].items() if s["n"]]
        rows.append(["(rounds not chained: critical path)",
                     str(stack["critical_path_published"]["n"]),
                     *(f"{stack['critical_path_published'][k]:.4f}"
                       if stack["critical_path_published"]["n"] else "–"
                       for k in ("median", "p90"))])
        tables.append(md_table([f"hop ({name}, seconds)", "n", "median", "p90"], rows))
        wall = stack["wall_seconds"]
        rows = [[phase.replace("_", " "), f"{sec:.2f}", f"{100 * sec / wall:.0f}%"]
                for phase, sec in stack["phases"].items() if sec is not None]
        rows.append(["(training inside tasks, all rounds)", f"{stack['train_seconds_total']:.2f}",
                     f"{100 * stack['train_seconds_total'] / wall:.0f}%"])
        tables.append(md_table([f"phase ({name})", "seconds", "share of wall"], rows))
    baseline = result.get("baseline")
    if baseline:
        rows = []
        for name, f in baseline["figures"].items():
            old = f.get("stack-1") or {}
            now = result["figures"].get(name, {}).get("stack-1") or {}
            rows.append([name, f"{old.get('wall_seconds', float('nan')):.1f}",
                         f"{now.get('wall_seconds', float('nan')):.1f}"])
        tables.append(md_table([f"pipeline wall, 1 worker (s): {baseline['commit'][:7]} "
                                "(before) / now, same session", "before", "now"], rows))
    return tables
