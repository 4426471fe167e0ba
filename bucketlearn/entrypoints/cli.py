"""The ``bucketlearn`` command line.

Talks to the local stack when one is running in this directory (``.bucketlearn/local.json``),
otherwise to Google Cloud as configured by the environment (``BUCKETLEARN_TARGET=cloud`` forces
the cloud even when a local stack runs). ``bucketlearn.entrypoints.target`` decides; when there is nothing to
talk to (no stack, a stack that stopped, no project, no credentials) a command says so and exits
with code 4.

Commands import what they use inside their function: ``status`` or ``cancel`` must not pay for
TensorFlow and the Google client libraries (seconds at start-up) that ``train-local`` needs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bucketlearn import layout
from bucketlearn.config import (
    LOCAL_SCALE_DOWN_COOLDOWN_SECONDS,
    OPTION_SPECS,
    Settings,
    load_settings,
    local_state_dir,
    option_text,
    resolve_options,
)
from bucketlearn.domain.columns import kinds_text
from bucketlearn.domain.forecast import plan_lines
from bucketlearn.domain.job import Job
from bucketlearn.domain.metrics import regression_headline
from bucketlearn.domain.target import REGRESSION
from bucketlearn.entrypoints.target import (
    LOCAL,
    START_HINT,
    StackWatch,
    Target,
    resolve_target,
    stack_problem,
    started_text,
)
from bucketlearn.errors import BucketlearnError, ConfigError, NoTargetError, UnreachableError
from bucketlearn.services import jobs

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_NO_TARGET = 0, 1, 2, 3, 4
# ``submit --wait`` / ``demo``: the job was cancelled; ``cancel``: the job had already ended
# (DONE, REJECTED or FAILED), so it was not cancelled.
EXIT_CANCELLED, EXIT_ALREADY_ENDED = 5, 6
# How long --wait goes on while the registry does not answer (a local stack's death is noticed
# at once, see StackWatch).
UNREACHABLE_SECONDS = 60.0


# --- settings and services ---------------------------------------------------------------------

def state_home() -> Path:
    return Path(local_state_dir())


def connect() -> tuple[Any, Target]:
    """Services for the backend this command goes to, and that target (``bucketlearn.entrypoints.target``)."""
    from bucketlearn.bootstrap import google_services  # noqa: PLC0415

    target = resolve_target(os.environ, state_home())
    return google_services(load_settings(target.environ)), target


def services(settings: Settings | None = None) -> Any:
    from bucketlearn.bootstrap import google_services  # noqa: PLC0415

    return google_services(settings) if settings is not None else connect()[0]


def stack_check(target: Target) -> Any:
    """What a wait loop checks between polls: the local stack's watch (None for the cloud)."""
    return StackWatch(target.state).check if target.kind == LOCAL and target.state else None


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    for spec in OPTION_SPECS:
        flag = "--" + spec.name.replace("_", "-")
        parser.add_argument(flag, dest=spec.name, default=None, metavar=spec.name.upper(),
                            help=f"{spec.help} (default: {option_text(spec.name, spec.default)})")


def option_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {spec.name: getattr(args, spec.name) for spec in OPTION_SPECS
            if getattr(args, spec.name, None) is not None}


def emit(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


# --- local stack -------------------------------------------------------------------------------

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
    from bucketlearn.services.autoscale import ScalingPolicy  # noqa: PLC0415

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


# --- jobs --------------------------------------------------------------------------------------

def cmd_submit(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        print(f"{path}: no such file", file=sys.stderr)
        return EXIT_USAGE
    overrides = option_overrides(args)
    resolve_options(overrides=overrides)  # fail here, not after the upload, on a bad flag
    svc, target = connect()
    name = args.name or path.name
    metadata = {k: str(v) for k, v in overrides.items()}
    info = svc.store.write_file(svc.settings.uploads_bucket, name, str(path), "text/csv",
                                metadata)
    job_id = layout.job_id_for(info.bucket, info.name, info.generation)
    if not args.json:
        print(job_id, flush=True)
    if not args.wait:
        if args.json:
            emit({"job_id": job_id, "object": f"gs://{info.bucket}/{info.name}",
                  "generation": info.generation})
        return EXIT_OK
    return follow(svc, job_id, args.timeout, args.json, check=stack_check(target))


def follow(svc: Any, job_id: str, timeout: float, as_json: bool, check: Any = None) -> int:
    """Follow a job until it ends, with a one-line progress display on stderr. ``check`` runs
    between polls and raises NoTargetError when the backend serving the job is gone."""
    tty = sys.stderr.isatty()
    shown = [""]

    def show(job: Job) -> None:
        line = progress_line(job)
        if line != shown[0]:
            print(("\r" + line.ljust(100)) if tty else line, end="" if tty else "\n",
                  file=sys.stderr, flush=True)
            shown[0] = line

    try:
        job = jobs.wait_terminal(svc.registry, job_id, timeout, poll=1.0, on_update=show,
                                 check=check, unreachable_after=UNREACHABLE_SECONDS)
    except (NoTargetError, UnreachableError) as exc:
        if tty:
            print(file=sys.stderr)
        prefix = "" if isinstance(exc, UnreachableError) else f"job {job_id}: "
        print(f"error: {prefix}{exc}", file=sys.stderr)
        return EXIT_NO_TARGET
    if tty:
        print(file=sys.stderr)
    if job is None or not jobs.is_terminal(job):
        print(f"job {job_id}: still not finished after {timeout:.0f}s", file=sys.stderr)
        return EXIT_TIMEOUT
    status = jobs.status_object(job, svc.settings.models_bucket)
    if as_json:
        emit(status)
    else:
        print_status(status)
    return exit_code(job)


def exit_code(job: Job) -> int:
    """How ``submit --wait`` ends for a job that has ended: 0 DONE, 5 CANCELLED, else 1."""
    return {jobs.DONE: EXIT_OK, jobs.CANCELLED: EXIT_CANCELLED}.get(str(job.status),
                                                                     EXIT_JOB_FAILED)


def format_accuracy(value: Any) -> str:
    """A holdout accuracy to four places, or "-" before the first evaluation."""
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


def figure_text(status: dict[str, Any]) -> str:
    """The head's holdout figure for one line: accuracy, or a numeric target's RMSE/MAE/R²."""
    if status.get("task") == REGRESSION:
        return regression_headline(status.get("rmse"), status.get("mae"), status.get("r2"))
    return f"accuracy {format_accuracy(status.get('accuracy'))}"


def progress_line(job: Job) -> str:
    status = jobs.status_object(job)
    return (f"{status['job_id']}: {status['status']} ({status['phase']}) "
            f"epoch {status['epoch'] or 0}/{status['epochs'] or '?'} v{status['version'] or 0} "
            f"tasks {status['tasks_applied'] or 0}/{status['tasks_planned'] or '?'} "
            f"holdout {figure_text(status)}")


def columns_lines(status: dict[str, Any]) -> list[str]:
    """The job's feature columns by kind, and those left out with their reasons."""
    columns = status.get("columns") or {}
    lines = []
    if columns.get("kinds"):
        lines.append(f"columns:   {kinds_text(columns['kinds'])}")
    for dropped in status.get("dropped_columns") or []:
        lines.append(f"left out:  {dropped['name']}: {dropped['reason']}")
    return lines


def print_status(status: dict[str, Any]) -> None:
    print(f"job:       {status['job_id']}")
    print(f"status:    {status['status']}")
    if status.get("error"):
        label = "cancelled:" if status["status"] == jobs.CANCELLED else "error:"
        print(f"{label:11s}{status['error']}")
    print(f"version:   {status['version']}")
    if status.get("task") == REGRESSION:
        print(f"target:    numeric ({status.get('task_reason') or 'task=regression'})")
        print(f"holdout:   {figure_text(status)}")
    else:
        print(f"accuracy:  {format_accuracy(status.get('accuracy'))}")
    for line in columns_lines(status):
        print(line)
    if status.get("macro_f1") is not None:
        auc = status.get("roc_auc")
        print(f"macro-F1:  {format_accuracy(status['macro_f1'])} (majority baseline "
              f"{format_accuracy(status.get('majority_accuracy'))}"
              + ("" if auc is None else f", ROC AUC {format_accuracy(auc)}") + ")")
    if status.get("warning"):
        print(f"warning:   {status['warning']}")
    print(f"tasks:     {status.get('tasks_applied')}/{status.get('tasks_planned')} applied, "
          f"{status.get('tasks_failed') or 0} failed")
    for label, text in plan_lines(status.get("plan"), status.get("forecast"),
                                  status.get("actual")):
        print(f"{label + ':':11s}{text}")
    if status.get("model_uri"):
        print(f"model:     {status['model_uri']}")
    elif status["status"] == jobs.CANCELLED and status.get("version") is not None:
        print(f"model:     v{status['version']}, built from its weights by: bucketlearn "
              f"download {status['job_id']}")


def cmd_status(args: argparse.Namespace) -> int:
    svc = services()
    if args.job:
        job = svc.registry.get_job(args.job)
        if job is None:
            print(f"job {args.job}: no such job", file=sys.stderr)
            return EXIT_JOB_FAILED
        status = jobs.status_object(job, svc.settings.models_bucket)
        emit(status) if args.json else print_status(status)
        return EXIT_OK
    rows = [jobs.status_object(j, svc.settings.models_bucket) for j in svc.registry.list_jobs(50)]
    if args.json:
        emit(rows)
        return EXIT_OK
    if not rows:
        print("no jobs yet")
    for s in rows:
        acc_text = (f"R² {format_accuracy(s.get('r2'))}" if s.get("task") == REGRESSION
                    else format_accuracy(s["accuracy"]))
        print(f"{s['job_id']:42s} {s['status']:9s} v{s['version'] or 0:<5} {acc_text:7s} "
              f"{(s['error'] or '')[:80]}")
    return EXIT_OK


def canceller() -> str:
    """Who is cancelling, as the job records it: user@host and the command."""
    import getpass  # noqa: PLC0415
    import socket  # noqa: PLC0415

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name (a container without a passwd entry)
        user = "unknown"
    return f"{user}@{socket.gethostname()} (bucketlearn cancel)"


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel a job: exit 0 when it is CANCELLED (now or before), 6 when it had already ended
    otherwise, 1 when there is no such job."""
    from bucketlearn.services.cancel import CancelResult, cancel_job  # noqa: PLC0415

    outcome = cancel_job(services(), args.job, canceller(), args.reason)
    refused = outcome.result is CancelResult.ALREADY_ENDED
    if args.json:
        emit(outcome.to_dict())
    else:
        print(outcome.message, file=sys.stderr if refused else sys.stdout)
    return EXIT_ALREADY_ENDED if refused else EXIT_OK


def cmd_download(args: argparse.Namespace) -> int:
    from bucketlearn.services.models import model_bytes  # noqa: PLC0415

    svc = services()
    data, version = model_bytes(svc, args.job, args.version)
    out = Path(args.output or f"{args.job}.keras")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    print(f"wrote {out} (job {args.job}, version {version})")
    return EXIT_OK


def cmd_train_local(args: argparse.Namespace) -> int:
    from bucketlearn.services.models import serial_sidecar  # noqa: PLC0415
    from bucketlearn.services.serial import train_local  # noqa: PLC0415

    options = resolve_options(overrides=option_overrides(args))
    result = train_local(args.file, options, load_settings().limits)
    if args.output:
        from bucketlearn.ml.model import export_keras  # noqa: PLC0415

        Path(args.output).write_bytes(export_keras(result.model, serial_sidecar(
            result.manifest, options, result.accuracy, result.report)))
    regression = result.manifest.task == REGRESSION
    report = {"accuracy": result.accuracy, "loss": result.loss, "seconds": result.seconds,
              "train_rows": result.manifest.train_rows,
              "holdout_rows": result.manifest.holdout_rows, "options": options.to_dict(),
              "task": result.manifest.task, "task_reason": result.manifest.task_reason,
              **{key: result.report.get(key) for key in (
                  ("rmse", "mae", "r2") if regression else
                  ("macro_f1", "majority_accuracy", "roc_auc"))}}
    if args.output:
        report["model"] = args.output
    if args.json:
        emit(report)
        return EXIT_OK
    if regression:
        print(f"numeric target '{result.manifest.label_column}' ({result.manifest.task_reason})")
        print(f"holdout {regression_headline(report['rmse'], report['mae'], report['r2'])} "
              f"(MSE {result.loss:.4g}) on {result.manifest.holdout_rows} rows; trained in "
              f"{result.seconds:.1f}s")
    else:
        print(f"holdout accuracy {result.accuracy:.4f} (loss {result.loss:.4f}) on "
              f"{result.manifest.holdout_rows} rows; trained in {result.seconds:.1f}s")
    if args.output:
        print(f"model: {args.output}")
    return EXIT_OK


def cmd_predict(args: argparse.Namespace) -> int:
    from bucketlearn.services.models import predict_file  # noqa: PLC0415

    result = predict_file(args.model, args.file, args.output)
    if args.json:
        emit(result)
        return EXIT_OK
    if args.output:
        print(f"wrote {result['rows']} predictions to {args.output}")
    else:
        for value in result["predictions"]:  # (a numeric target's to 6 significant digits)
            print(f"{value:.6g}" if isinstance(value, float) else value)
    if result.get("accuracy") is not None:
        print(f"accuracy {result['accuracy']:.4f} against column '{result['label_column']}'",
              file=sys.stderr)
    if result.get("rmse") is not None:
        print(f"{regression_headline(result['rmse'], result['mae'], result['r2'])} against "
              f"column '{result['label_column']}' ({result['scored_rows']} rows with a number "
              "there)", file=sys.stderr)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from bucketlearn.local.stack import read_state, repo_root  # noqa: PLC0415

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
    svc = services(load_settings({**os.environ, **state["env"]}))
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
    from bucketlearn.services.models import model_bytes, predict_file  # noqa: PLC0415

    blob, version = model_bytes(svc, job_id, None)
    out = Path(args.output_dir) / f"{job_id}.keras"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(blob)
    job = svc.registry.get_job(job_id)
    print()
    if job is not None:
        print(f"holdout:          {figure_text(jobs.status_object(job))}")
    print(f"model:            {out.resolve()}  (version {version})")
    new_rows = path.with_name(f"{path.stem}_new.csv")
    if new_rows.exists():
        result = predict_file(str(out), str(new_rows), None)
        print(f"predictions for the raw rows of {new_rows} (empty cells, an unseen island): "
              + ", ".join(str(p) for p in result["predictions"]))
    print()
    return EXIT_OK


def tend_once(svc: Any) -> dict[str, Any]:
    """One watchdog pass: dead letters into failure markers, then stalled jobs moved on."""
    from bucketlearn.adapters.pubsub import PubSubQueue  # noqa: PLC0415
    from bucketlearn.services.tend import drain_dead_letters, tend  # noqa: PLC0415

    markers = 0
    if svc.settings.dead_letter_subscription:
        markers = drain_dead_letters(svc, PubSubQueue(svc.settings,
                                                      svc.settings.dead_letter_subscription))
    return {"dead_letters": markers, "tended": tend(svc)}


def cmd_tend(args: argparse.Namespace) -> int:
    """One pass of the watchdog over every active job (the autoscaler runs it too)."""
    emit(tend_once(services()))
    return EXIT_OK


def cmd_autoscale(args: argparse.Namespace) -> int:
    """One step of the cloud controller (run every minute by Cloud Scheduler): the worker pool
    sized from the backlog, then the watchdog's pass."""
    from bucketlearn.adapters.cloudrun import CloudRunWorkerPool  # noqa: PLC0415
    from bucketlearn.bootstrap import google_services  # noqa: PLC0415
    from bucketlearn.config import load_autoscaler_settings  # noqa: PLC0415
    from bucketlearn.logs import setup_logging  # noqa: PLC0415
    from bucketlearn.services.autoscale import (  # noqa: PLC0415
        JOBS_PER_AGGREGATOR,
        ScalingPolicy,
        autoscale_once,
    )

    settings = load_settings()
    setup_logging(settings.log_format)
    scaler = load_autoscaler_settings()
    svc = google_services(settings)
    state = svc.registry.get_control("autoscaler") or {}
    cooldown = scaler.scale_down_cooldown_seconds
    aggregators = (CloudRunWorkerPool(scaler.aggregator_pool) if scaler.aggregator_pool
                   else None)
    decision = autoscale_once(svc.registry, CloudRunWorkerPool(scaler.worker_pool),
                              ScalingPolicy(scaler.min_workers, scaler.max_workers,
                                            scale_down_cooldown_seconds=cooldown),
                              time.time(), state, aggregators,
                              ScalingPolicy(scaler.min_aggregators, scaler.max_aggregators,
                                            JOBS_PER_AGGREGATOR, cooldown))
    svc.registry.set_control("autoscaler", {
        "last_change_at": state.get("last_change_at"),
        "aggregators_changed_at": state.get("aggregators_changed_at"),
        "last_decision": decision})
    tended = tend_once(svc)  # after the resize: a slow pass must not keep workers from starting
    emit({**decision, **tended})
    return EXIT_OK


def cmd_worker(args: argparse.Namespace) -> int:
    from bucketlearn.entrypoints.worker import run_learners  # noqa: PLC0415

    return run_learners()


def cmd_aggregator(args: argparse.Namespace) -> int:
    from bucketlearn.entrypoints.aggregator import main as run_aggregator  # noqa: PLC0415

    run_aggregator()
    return EXIT_OK


# --- parser ------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bucketlearn", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_local_commands(sub)
    _add_job_commands(sub)
    _add_model_commands(sub)
    sub.add_parser("worker", help="run a learner worker (container entry point)").set_defaults(
        func=cmd_worker)
    sub.add_parser("aggregator", help="run the long-running aggregator: fold results into "
                   "versions (container entry point)").set_defaults(func=cmd_aggregator)
    sub.add_parser("autoscale", help="one step of the cloud controller: the worker pool's "
                   "instance count from the backlog, then the watchdog's pass"
                   ).set_defaults(func=cmd_autoscale)
    sub.add_parser("tend", help="one pass of the watchdog: republish the lost tasks of stalled "
                   "jobs, nudge the aggregator, end splits that never finished"
                   ).set_defaults(func=cmd_tend)
    return parser


def _add_local_commands(sub: Any) -> None:
    """``local up|down|env|status`` and ``demo``."""
    local = sub.add_parser("local", help="the local stack on emulators")
    local_sub = local.add_subparsers(dest="local_command", required=True)
    up = local_sub.add_parser("up", help="start emulators, the upload function, the aggregator, workers, dashboard")
    up.add_argument("--workers", type=int, default=2, help="learner processes (default 2)")
    up.add_argument("--min-workers", type=int, default=None,
                    help="autoscale on backlog: fewest workers (0 scales to zero when idle)")
    up.add_argument("--max-workers", type=int, default=None,
                    help="autoscale on backlog: most workers")
    up.add_argument("--cooldown", type=float, default=LOCAL_SCALE_DOWN_COOLDOWN_SECONDS,
                    help="seconds between scaling down steps when autoscaling (default "
                         f"{LOCAL_SCALE_DOWN_COOLDOWN_SECONDS:g})")
    up.add_argument("--detach", action="store_true", help="run in the background and return")
    up.set_defaults(func=cmd_local_up)
    local_sub.add_parser("down", help="stop the local stack").set_defaults(func=cmd_local_down)
    local_sub.add_parser("env", help="print export lines for the emulators").set_defaults(
        func=cmd_local_env)
    st = local_sub.add_parser("status", help="processes of the local stack")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_local_status)
    demo = sub.add_parser("demo", help="local stack up, train the sample data, download the model")
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--file", help="CSV to train on (default: data/digits.csv, then "
                                     "data/penguins.csv)")
    demo.add_argument("--output-dir", default="bucketlearn-demo")
    demo.add_argument("--timeout", type=float, default=1800.0)
    demo.set_defaults(func=cmd_demo)


def _add_job_commands(sub: Any) -> None:
    """``submit``, ``status``, ``cancel``."""
    submit = sub.add_parser("submit", help="upload a CSV; prints the job id")
    submit.add_argument("file")
    submit.add_argument("--name", help="object name in the uploads bucket (default: file name)")
    submit.add_argument("--wait", action="store_true", help="follow the job until it ends")
    submit.add_argument("--timeout", type=float, default=3600.0, help="seconds --wait waits")
    submit.add_argument("--json", action="store_true", help="print the final status as JSON")
    add_option_flags(submit)
    submit.set_defaults(func=cmd_submit)

    status = sub.add_parser("status", help="a job's status (or all jobs)")
    status.add_argument("job", nargs="?")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    cancel = sub.add_parser("cancel", help="stop a job: it ends CANCELLED, workers skip its "
                            "tasks, its last version stays downloadable")
    cancel.add_argument("job")
    cancel.add_argument("--reason", help="why (recorded with who and when)")
    cancel.add_argument("--json", action="store_true", help="print the outcome as JSON")
    cancel.set_defaults(func=cmd_cancel)


def _add_model_commands(sub: Any) -> None:
    """``download``, ``train-local``, ``predict``."""
    download = sub.add_parser("download", help="write a job's model as .keras")
    download.add_argument("job")
    download.add_argument("--version", type=int, default=None, help="a version (default: latest)")
    download.add_argument("-o", "--output", help="output path (default: <job>.keras)")
    download.set_defaults(func=cmd_download)

    train = sub.add_parser("train-local", help="the serial baseline, in one process")
    train.add_argument("file")
    train.add_argument("-o", "--output", help="also save the model as .keras")
    train.add_argument("--json", action="store_true")
    add_option_flags(train)
    train.set_defaults(func=cmd_train_local)

    predict = sub.add_parser("predict", help="predict label values for every row of a CSV")
    predict.add_argument("model")
    predict.add_argument("file")
    predict.add_argument("-o", "--output", help="write predictions to this CSV")
    predict.add_argument("--json", action="store_true")
    predict.set_defaults(func=cmd_predict)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (NoTargetError, UnreachableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_NO_TARGET
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BucketlearnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_JOB_FAILED
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        problem = credentials_problem(exc)
        if problem is None:
            raise
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_NO_TARGET


def credentials_problem(exc: BaseException) -> str | None:
    """What to tell the user when ``exc`` is Google's "no usable credentials" (None if not)."""
    from google.auth import exceptions as auth_exceptions  # noqa: PLC0415

    if isinstance(exc, auth_exceptions.DefaultCredentialsError):
        found = "no Google Cloud credentials were found"
    elif isinstance(exc, auth_exceptions.RefreshError):
        found = f"the Google Cloud credentials could not be refreshed ({exc})"
    else:
        return None
    return (f"{found}; expected Application Default Credentials for the cloud target: run "
            "`gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS), "
            "or use a local stack instead: `bucketlearn local up --detach`")


if __name__ == "__main__":
    sys.exit(main())
