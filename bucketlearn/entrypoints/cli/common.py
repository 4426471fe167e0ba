"""What every command of the CLI shares: its exit codes, the services and target a command
talks to (``connect``, ``services``, ``stack_check``), the job option flags, JSON output.

Which adapters serve a command is not decided here: ``cli.main`` is handed a Services factory
(``ServicesFactory``; ``bootstrap.google_services`` by default) and puts it on the parsed
arguments as ``args.services``; ``connect`` finds the target (the local stack or the cloud,
``bucketlearn.entrypoints.target``) and makes the Services for its settings with that factory.
A test hands ``main`` a factory that returns its in-memory Services."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bucketlearn.config import Settings, load_settings, local_state_dir
from bucketlearn.entrypoints.target import LOCAL, StackWatch, Target, resolve_target
from bucketlearn.options import OPTION_SPECS, default_text
from bucketlearn.ports import Services

# The Services for a target's settings (``cli.main``'s ``services``).
ServicesFactory = Callable[[Settings], Services]

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_NO_TARGET = 0, 1, 2, 3, 4
# ``submit --wait`` / ``demo``: the job was cancelled; ``cancel``: the job had already ended
# (DONE, REJECTED or FAILED), so it was not cancelled.
EXIT_CANCELLED, EXIT_ALREADY_ENDED = 5, 6
# How long --wait goes on while the registry does not answer (a local stack's death is noticed
# at once, see StackWatch).
UNREACHABLE_SECONDS = 60.0


def state_home() -> Path:
    return Path(local_state_dir())


def connect(args: argparse.Namespace) -> tuple[Services, Target]:
    """Services for the backend this command goes to (made by ``args.services``, the factory
    ``cli.main`` was handed), and that target (``bucketlearn.entrypoints.target``)."""
    target = resolve_target(os.environ, state_home())
    return args.services(load_settings(target.environ)), target


def services(args: argparse.Namespace) -> Services:
    """The Services for the backend this command goes to (``connect`` without the target)."""
    return connect(args)[0]


def stack_check(target: Target) -> Any:
    """What a wait loop checks between polls: the local stack's watch (None for the cloud)."""
    return StackWatch(target.state).check if target.kind == LOCAL and target.state else None


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    for spec in OPTION_SPECS:
        flag = "--" + spec.name.replace("_", "-")
        parser.add_argument(flag, dest=spec.name, default=None, metavar=spec.name.upper(),
                            help=f"{spec.help} (default: {default_text(spec.name)})")


def option_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {spec.name: getattr(args, spec.name) for spec in OPTION_SPECS
            if getattr(args, spec.name, None) is not None}


def emit(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))
