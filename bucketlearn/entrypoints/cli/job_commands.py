"""The job commands: ``submit`` (and following a job until it ends: ``--wait``), ``status``,
``cancel``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bucketlearn import layout
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import CANCELLED, DONE
from bucketlearn.domain.target import REGRESSION
from bucketlearn.entrypoints.cli import common
from bucketlearn.entrypoints.cli.common import (
    EXIT_ALREADY_ENDED,
    EXIT_CANCELLED,
    EXIT_JOB_FAILED,
    EXIT_NO_TARGET,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    UNREACHABLE_SECONDS,
    emit,
    option_overrides,
    stack_check,
)
from bucketlearn.entrypoints.cli.printing import format_accuracy, print_status, progress_line
from bucketlearn.errors import NoTargetError, UnreachableError
from bucketlearn.options import resolve_options
from bucketlearn.usecases.status import prediction_summary, status_object
from bucketlearn.usecases.waiting import wait_terminal


def cmd_submit(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        print(f"{path}: no such file", file=sys.stderr)
        return EXIT_USAGE
    overrides = option_overrides(args)
    resolve_options(overrides=overrides)  # fail here, not after the upload, on a bad flag
    svc, target = common.connect(args)
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
        job = wait_terminal(svc.registry, job_id, timeout, poll=1.0, on_update=show,
                            check=check, unreachable_after=UNREACHABLE_SECONDS)
    except (NoTargetError, UnreachableError) as exc:
        if tty:
            print(file=sys.stderr)
        prefix = "" if isinstance(exc, UnreachableError) else f"job {job_id}: "
        print(f"error: {prefix}{exc}", file=sys.stderr)
        return EXIT_NO_TARGET
    if tty:
        print(file=sys.stderr)
    if job is None or not job.is_terminal:
        print(f"job {job_id}: still not finished after {timeout:.0f}s", file=sys.stderr)
        return EXIT_TIMEOUT
    status = job_status(svc, job)
    if as_json:
        emit(status)
    else:
        print_status(status)
    return exit_code(job)


def exit_code(job: Job) -> int:
    """How ``submit --wait`` ends for a job that has ended: 0 DONE, 5 CANCELLED, else 1."""
    return {DONE: EXIT_OK, CANCELLED: EXIT_CANCELLED}.get(str(job.status), EXIT_JOB_FAILED)


def job_status(svc: Any, job: Job) -> dict[str, Any]:
    """One job's status object, with its batch prediction requests (``predictions``)."""
    status = status_object(job, svc.settings.models_bucket)
    status["predictions"] = prediction_summary(svc.registry, job.job_id,
                                               svc.settings.models_bucket)
    return status


def cmd_status(args: argparse.Namespace) -> int:
    svc = common.services(args)
    if args.job:
        job = svc.registry.get_job(args.job)
        if job is None:
            print(f"job {args.job}: no such job", file=sys.stderr)
            return EXIT_JOB_FAILED
        status = job_status(svc, job)
        emit(status) if args.json else print_status(status)
        return EXIT_OK
    rows = [status_object(j, svc.settings.models_bucket) for j in svc.registry.list_jobs(50)]
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
    from bucketlearn.usecases.cancel import CancelResult, cancel_job  # noqa: PLC0415

    outcome = cancel_job(common.services(args), args.job, canceller(), args.reason)
    refused = outcome.result is CancelResult.ALREADY_ENDED
    if args.json:
        emit(outcome.to_dict())
    else:
        print(outcome.message, file=sys.stderr if refused else sys.stdout)
    return EXIT_ALREADY_ENDED if refused else EXIT_OK
