"""What every command of the CLI shares: its exit codes, the services and target a command
talks to (``connect``, ``services``, ``stack_check``), the job option flags, JSON output.

Commands call ``common.services()`` and ``common.connect()`` through this module, so a test
that gives the CLI in-memory services replaces ``common.services`` once."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from bucketlearn.config import Settings, load_settings, local_state_dir
from bucketlearn.entrypoints.backend import LOCAL, StackWatch, Target, resolve_target
from bucketlearn.options import OPTION_SPECS, option_text

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_NO_TARGET = 0, 1, 2, 3, 4
# ``submit --wait`` / ``demo``: the job was cancelled; ``cancel``: the job had already ended
# (DONE, REJECTED or FAILED), so it was not cancelled.
EXIT_CANCELLED, EXIT_ALREADY_ENDED = 5, 6
# How long --wait goes on while the registry does not answer (a local stack's death is noticed
# at once, see StackWatch).
UNREACHABLE_SECONDS = 60.0


def state_home() -> Path:
    return Path(local_state_dir())


def connect() -> tuple[Any, Target]:
    """Services for the backend this command goes to, and that target (``bucketlearn.entrypoints.backend``)."""
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
