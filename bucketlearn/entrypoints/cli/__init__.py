"""The ``bucketlearn`` command line.

Talks to the local stack when one is running in this directory (``.bucketlearn/local.json``),
otherwise to Google Cloud as configured by the environment (``BUCKETLEARN_TARGET=cloud`` forces
the cloud even when a local stack runs). ``bucketlearn.entrypoints.target`` decides; when there is nothing to
talk to (no stack, a stack that stopped, no project, no credentials) a command says so and exits
with code 4.

Commands import what they use inside their function: ``status`` or ``cancel`` must not pay for
TensorFlow and the Google client libraries (seconds at start-up) that ``train-local`` needs.

The package, by command group: ``local_commands`` (``local up|down|env|status``, ``demo``),
``job_commands`` (``submit``, ``status``, ``cancel``), ``model_commands`` (``download``,
``train-local``, ``predict``), ``process_commands`` (``worker``, ``aggregator``, ``autoscale``,
``watchdog``); ``printing`` (a job's progress line and status), ``common`` (exit codes, the services a
command talks to, option flags). This module holds the parser and ``main`` (the ``bucketlearn``
console script; ``python -m bucketlearn.entrypoints.cli`` runs ``__main__``).

``main`` is handed the factory that makes a command's Services for its target's settings
(``services``; ``bootstrap.google_services``, the real adapters, by default): the commands find
it as ``args.services``. A test passes one returning its in-memory Services.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bucketlearn.bootstrap import google_services
from bucketlearn.config import LOCAL_SCALE_DOWN_COOLDOWN_SECONDS
from bucketlearn.entrypoints.cli.common import (
    EXIT_JOB_FAILED,
    EXIT_NO_TARGET,
    EXIT_USAGE,
    ServicesFactory,
    add_option_flags,
)
from bucketlearn.entrypoints.cli.job_commands import cmd_cancel, cmd_status, cmd_submit
from bucketlearn.entrypoints.cli.local_commands import (
    cmd_demo,
    cmd_local_down,
    cmd_local_env,
    cmd_local_status,
    cmd_local_up,
)
from bucketlearn.entrypoints.cli.model_commands import cmd_download, cmd_predict, cmd_train_local
from bucketlearn.entrypoints.cli.process_commands import (
    cmd_aggregator,
    cmd_autoscale,
    cmd_watchdog,
    cmd_worker,
)
from bucketlearn.errors import BucketlearnError, ConfigError, NoTargetError, UnreachableError

VERBOSE_HELP = ("also print the libraries' logs: TensorFlow's start-up lines and "
                "bucketlearn's own (INFO)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bucketlearn", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
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
    sub.add_parser("watchdog", aliases=["tend"], help="one pass of the watchdog (also as `tend`): republish the lost tasks of stalled "
                   "jobs, nudge the aggregator, end splits that never finished"
                   ).set_defaults(func=cmd_watchdog)
    _add_verbose(sub)
    return parser


def _add_verbose(sub: Any) -> None:
    """``--verbose`` after every command too (``bucketlearn predict -v ...``,
    ``bucketlearn local up -v``); given there, it is kept, else the one before the command."""
    for command in {id(c): c for c in sub.choices.values()}.values():  # (an alias: the same)
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help=VERBOSE_HELP)


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
    _add_verbose(local_sub)
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

    predict = sub.add_parser(
        "predict", help="predict label values for every row of a CSV: with a .keras model here "
                        "(predict MODEL.keras FILE.csv), or with a job's model through the "
                        "buckets (predict --job JOB FILE.csv -o OUT.csv)")
    predict.add_argument("model", help="a .keras model (with --job: the CSV to predict)")
    predict.add_argument("file", nargs="?", help="the CSV to predict (not with --job)")
    predict.add_argument("--job", help="predict with this job's exported model, by an upload to "
                                       "predict/JOB/ and the upload function")
    predict.add_argument("--timeout", type=float, default=900.0,
                         help="with --job: seconds to wait for the predictions (default 900)")
    predict.add_argument("-o", "--output", help="write predictions to this CSV")
    predict.add_argument("--json", action="store_true")
    predict.set_defaults(func=cmd_predict)


def main(argv: list[str] | None = None, services: ServicesFactory = google_services) -> int:
    """Run one command (``argv``, default the process's arguments) and return its exit code.
    ``services`` makes the Services for the target's settings (given to the commands as
    ``args.services``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.services = services
    if args.verbose:
        from bucketlearn.logs import setup_logging  # noqa: PLC0415

        setup_logging()
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
