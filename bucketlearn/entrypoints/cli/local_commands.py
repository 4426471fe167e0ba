"""The local stack's commands: ``local up|down|env|status`` (the emulator stack in this
directory, ``bucketlearn.local``) and ``demo`` (a stack up, the sample data trained, the models
downloaded)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bucketlearn import layout
from bucketlearn.config import load_settings
from bucketlearn.entrypoints.cli.common import (
    EXIT_JOB_FAILED,
    EXIT_NO_TARGET,
    EXIT_OK,
    EXIT_TIMEOUT,
    emit,
    state_home,
)
from bucketlearn.entrypoints.cli.job_commands import follow
from bucketlearn.entrypoints.cli.printing import figure_text
from bucketlearn.entrypoints.cli.quiet import load_tensorflow, tensorflow_quietly
from bucketlearn.entrypoints.target import START_HINT, StackWatch, stack_problem, started_text
from bucketlearn.usecases.status import status_object


def clear_dead_stack(home: Path) -> dict[str, Any] | None:
    """Stop what a stack recorded in ``home`` left running if that stack is dead, and remove its
    state file; return the state of a stack that is still running (None otherwise)."""
    from bucketlearn.local.stack import load_state, stop_from_state, supervisor_alive  # noqa: PLC0415

    state = load_state(home)
    if state is None or supervisor_alive(state):
        return state
    outcome = stop_from_state(home)
    if outcome is not None:
        print(dead_stack_report(outcome), flush=True)
    return None


def dead_stack_report(outcome: Any) -> str:
    state = outcome.state
    left = (f"stopped {len(outcome.leftovers)} of its processes that were still running"
            if outcome.leftovers else "none of its processes was still running")
    return (f"the local stack started at {started_text(state)} was no longer running (pid "
            f"{state.get('pid')} gone): {left}; removed its state file")


def cmd_local_up(args: argparse.Namespace) -> int:
    from bucketlearn.entrypoints.target import RESTART_HINT, probe_stack  # noqa: PLC0415
    from bucketlearn.local.stack import LocalStack  # noqa: PLC0415

    home = state_home()
    state = clear_dead_stack(home)
    if state is not None:
        print(f"a local stack is already running (pid {state['pid']})")
        print_urls(state["urls"])
        problem = stack_problem(state, probe_stack(state))
        if problem:
            print(f"warning: {problem}; {RESTART_HINT}", file=sys.stderr)
        return EXIT_OK
    scaling = scaling_policy(args)
    if args.detach:
        return start_detached(home, args.workers, args.min_workers, args.max_workers)
    from bucketlearn.logs import setup_logging  # noqa: PLC0415

    setup_logging()
    stack = LocalStack(home=home, workers=args.workers, scaling=scaling)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stack.start()
    sizing = (f"{args.workers} workers" if scaling is None else
              f"{scaling.min_workers}-{scaling.max_workers} workers, autoscaled on backlog")
    print(f"local stack up ({sizing}); logs in {home / 'logs'}", flush=True)
    print_urls(stack.urls)
    try:
        stack.supervise(stop)
    finally:
        stack.stop()
    return EXIT_OK


def scaling_policy(args: argparse.Namespace) -> Any:
    """A ScalingPolicy when --min-workers/--max-workers are given, else None (fixed --workers)."""
    if args.min_workers is None and args.max_workers is None:
        return None
    from bucketlearn.loops.autoscale import ScalingPolicy  # noqa: PLC0415

    minimum = 0 if args.min_workers is None else args.min_workers
    maximum = max(minimum, 1) if args.max_workers is None else args.max_workers
    return ScalingPolicy(min_workers=minimum, max_workers=maximum,
                         scale_down_cooldown_seconds=args.cooldown)


def start_detached(home: Path, workers: int, min_workers: int | None = None,
                   max_workers: int | None = None, timeout: float = 300.0) -> int:
    from bucketlearn.local.stack import read_state  # noqa: PLC0415

    (home / "logs").mkdir(parents=True, exist_ok=True)
    log_path = home / "logs" / "supervisor.log"
    with open(log_path, "ab") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bucketlearn.entrypoints.cli", "local", "up", "--workers", str(workers),
             *(["--min-workers", str(min_workers)] if min_workers is not None else []),
             *(["--max-workers", str(max_workers)] if max_workers is not None else [])],
            stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "BUCKETLEARN_HOME": str(home)})
    print(f"starting the local stack in the background (log: {log_path}) …", flush=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read_state(home)
        if state is not None:
            print_urls(state["urls"])
            print("stop it with: bucketlearn local down")
            return EXIT_OK
        if proc.poll() is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
            print(f"the local stack failed to start:\n{tail}", file=sys.stderr)
            return EXIT_JOB_FAILED
        time.sleep(0.5)
    print(f"the local stack did not come up within {timeout:.0f}s; see {log_path}",
          file=sys.stderr)
    return EXIT_TIMEOUT


def print_urls(urls: dict[str, str]) -> None:
    if "dashboard" in urls:
        print(f"dashboard: {urls['dashboard']}")
    for name in ("storage", "pubsub", "firestore", "upload_fn"):
        if name in urls:
            print(f"{name}: {urls[name]}")


def cmd_local_down(args: argparse.Namespace) -> int:
    from bucketlearn.local.stack import stop_from_state  # noqa: PLC0415

    outcome = stop_from_state(state_home())
    if outcome is None:
        print("no local stack is running here")
    elif outcome.was_running:
        extra = (f" (and {len(outcome.leftovers)} of its processes that outlived it)"
                 if outcome.leftovers else "")
        print(f"local stack stopped{extra}")
    else:
        print(dead_stack_report(outcome))
    return EXIT_OK


def running_stack_state() -> dict[str, Any] | None:
    """The state of the stack running here; None, after saying why on stderr, when none is."""
    from bucketlearn.entrypoints.target import probe_stack  # noqa: PLC0415
    from bucketlearn.local.stack import load_state  # noqa: PLC0415

    home = state_home()
    state = load_state(home)
    if state is None:
        print(f"no local stack is running here ({home}); start one with: bucketlearn local up "
              "--detach", file=sys.stderr)
        return None
    probe = probe_stack(state)
    if not probe.supervisor_alive:
        print(f"{stack_problem(state, probe)}; {START_HINT}", file=sys.stderr)
        return None
    return state


def cmd_local_env(args: argparse.Namespace) -> int:
    state = running_stack_state()
    if state is None:
        return EXIT_JOB_FAILED
    for key, value in sorted(state["env"].items()):
        print(f"export {key}={value}")
    return EXIT_OK


def cmd_local_status(args: argparse.Namespace) -> int:
    state = running_stack_state()
    if state is None:
        return EXIT_JOB_FAILED
    if args.json:
        emit(state)
        return EXIT_OK
    print_urls(state["urls"])
    for name, info in {**state.get("emulators", {}), **state["processes"]}.items():
        print(f"{name:12s} pid {info['pid']} (runs {info.get('command_pid')})  "
              f"{'up' if info['alive'] else 'DOWN'}  restarts {info.get('restarts', 0)}  "
              f"log {info['log']}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from bucketlearn.local.emulators import repo_root  # noqa: PLC0415
    from bucketlearn.local.stack import read_state  # noqa: PLC0415

    home = state_home()
    if clear_dead_stack(home) is None:
        code = start_detached(home, args.workers)
        if code != EXIT_OK:
            return code
    state = read_state(home)
    if state is None:
        print(f"the local stack in {home} stopped right after it started; see "
              f"{home / 'logs' / 'supervisor.log'}", file=sys.stderr)
        return EXIT_NO_TARGET
    svc = args.services(load_settings({**os.environ, **state["env"]}))
    data = repo_root() / "data"
    runs = [(Path(args.file), {})] if args.file else [
        (data / "digits.csv", {}),  # 8x8 images of digits: a numeric matrix
        (data / "penguins.csv", {"label_column": "species"}),  # text, NA cells, as published
    ]
    for path, metadata in runs:
        code = demo_job(svc, state, path, metadata, args)
        if code != EXIT_OK:
            return code
    print(f"dashboard:        {state['urls'].get('dashboard', '(not running)')}")
    print("the local stack keeps running; stop it with: bucketlearn local down")
    return EXIT_OK


def demo_job(svc: Any, state: dict[str, Any], path: Path, metadata: dict[str, str],
             args: argparse.Namespace) -> int:
    """Upload one file to the local stack, follow its job, download its model; for a file with
    a ``<name>_new.csv`` beside it, predict those raw rows with the downloaded model."""
    info = svc.store.write_file(svc.settings.uploads_bucket, path.name, str(path), "text/csv",
                                metadata)
    job_id = layout.job_id_for(info.bucket, info.name, info.generation)
    print(f"submitted {path} as job {job_id}; training …", flush=True)
    code = follow(svc, job_id, args.timeout, as_json=False, check=StackWatch(state).check)
    if code != EXIT_OK:
        return code
    from bucketlearn.usecases.model_files import model_bytes, predict_file  # noqa: PLC0415

    with tensorflow_quietly(args.verbose):  # (a DONE job's is exported: no TensorFlow)
        blob, version = model_bytes(svc, job_id, None)
    out = Path(args.output_dir) / f"{job_id}.keras"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(blob)
    job = svc.registry.get_job(job_id)
    print()
    if job is not None:
        print(f"holdout:          {figure_text(status_object(job))}")
    print(f"model:            {out.resolve()}  (version {version})")
    new_rows = path.with_name(f"{path.stem}_new.csv")
    if new_rows.exists():
        load_tensorflow(args.verbose)
        result = predict_file(str(out), str(new_rows), None)
        print(f"predictions for the raw rows of {new_rows} (empty cells, an unseen island): "
              + ", ".join(str(p) for p in result["predictions"]))
    print()
    return EXIT_OK
