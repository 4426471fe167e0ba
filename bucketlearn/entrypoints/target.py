"""Which backend a CLI command talks to: the local stack in this directory, or Google Cloud.

``decide_target`` is pure: it takes the environment, the local stack's state file and what the
probes found (``StackProbe``), and returns a ``Target`` or raises ``NoTargetError`` saying what
is wrong and what to do. The order (README, "The CLI"):

1. ``BUCKETLEARN_TARGET=cloud``: Google Cloud as the environment configures it (a project must be
   named).
2. A state file in ``BUCKETLEARN_HOME`` (default ``./.bucketlearn``): that stack, when its process
   runs and its emulators answer. When it does not, say so and stop: the user ran a local stack
   here and never meant the cloud (which, without credentials, fails with a traceback).
3. No state file: the environment when it names a project or emulators; else say that no local
   stack runs here and how to start one or target the cloud.

``resolve_target`` does the I/O around it; ``StackWatch`` repeats the check while a command waits
on a job, so that a stack that dies meanwhile ends the wait with a message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bucketlearn.config import EMULATOR_ENV, target_configured, target_is_cloud
from bucketlearn.errors import NoTargetError

LOCAL, CLOUD, ENVIRONMENT = "local", "cloud", "environment"
START_HINT = ("start a stack with `bucketlearn local up --detach` (it also stops whatever the old "
              "one left running), or set BUCKETLEARN_TARGET=cloud and GOOGLE_CLOUD_PROJECT to "
              "use Google Cloud")
RESTART_HINT = "restart it: `bucketlearn local down`, then `bucketlearn local up --detach`"
CLOUD_HINT = ("target the cloud with BUCKETLEARN_TARGET=cloud and GOOGLE_CLOUD_PROJECT=<project> "
              "(the Terraform output env_vars sets both; credentials: "
              "`gcloud auth application-default login`)")


class StackGoneError(NoTargetError):
    """The local stack recorded in this directory has stopped, or its emulators do not answer."""


@dataclass(frozen=True)
class StackProbe:
    """What the probes found about the stack a state file records."""

    supervisor_alive: bool              # its own process (``local up``) runs
    silent: tuple[str, ...] = ()        # emulators refusing connections, "pubsub (host:port)"


@dataclass(frozen=True)
class Target:
    """Where a command goes: ``environ`` is what its settings are loaded from."""

    kind: str                           # LOCAL, CLOUD or ENVIRONMENT
    environ: dict[str, str]
    state: dict[str, Any] | None = None  # the local stack's state file (LOCAL only)


def started_text(state: Mapping[str, Any]) -> str:
    started = state.get("started_at")
    if not isinstance(started, (int, float)):
        return "an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))


def stack_problem(state: Mapping[str, Any], probe: StackProbe) -> str | None:
    """Why the stack in ``state`` cannot serve a command (None when it can)."""
    pid = state.get("pid")
    if not probe.supervisor_alive:
        return (f"the local stack started at {started_text(state)} is no longer running "
                f"(pid {pid} gone)")
    if probe.silent:
        plural = len(probe.silent) > 1
        return (f"the local stack started at {started_text(state)} (pid {pid}) is running, but "
                f"its {', '.join(probe.silent)} emulator{'s do' if plural else ' does'} not "
                "answer")
    return None


def decide_target(environ: Mapping[str, str], home: Path, state: dict[str, Any] | None,
                  probe: StackProbe | None) -> Target:
    """Where a CLI command goes (see the module docstring for the order).

    Args:
        environ: the process environment.
        home: the directory of the local stack's state file (for messages).
        state: that state file, whether or not its stack still runs; None when there is none.
        probe: what ``probe_stack`` found about ``state``'s stack (needed when ``state`` is).

    Raises:
        NoTargetError: nothing to talk to; the message says what was found and what to do.
    """
    if target_is_cloud(environ):
        if not target_configured(environ):
            raise NoTargetError("BUCKETLEARN_TARGET=cloud: expected GOOGLE_CLOUD_PROJECT (or "
                                "BUCKETLEARN_PROJECT) to name the project; found neither. The "
                                "Terraform output env_vars sets both")
        return Target(CLOUD, dict(environ))
    if state is not None:
        problem = stack_problem(state, probe or StackProbe(supervisor_alive=False))
        if problem is not None:
            hint = START_HINT if probe is None or not probe.supervisor_alive else RESTART_HINT
            raise StackGoneError(f"{problem}; {hint}")
        return Target(LOCAL, {**environ, **state.get("env", {})}, state)
    if target_configured(environ):
        return Target(ENVIRONMENT, dict(environ))
    raise NoTargetError(f"no local stack is running here ({home}) and no Google Cloud project is "
                        f"configured; start one with `bucketlearn local up --detach`, or "
                        f"{CLOUD_HINT}")


def emulator_addresses(state: Mapping[str, Any]) -> dict[str, tuple[str, int]]:
    """The emulators' (host, port) from a state file's environment."""
    env = state.get("env") or {}
    found = {}
    for key, field_name in EMULATOR_ENV.items():
        value = env.get(key)
        if not value:
            continue
        host, _, port = value.split("://", 1)[-1].rstrip("/").rpartition(":")
        if host and port.isdigit():
            found[field_name.removesuffix("_emulator_host")] = (host, int(port))
    return found


def probe_stack(state: Mapping[str, Any], timeout: float = 1.0) -> StackProbe:
    """Whether the stack's process runs and which of its emulators refuse connections."""
    from bucketlearn.local.processes import port_open  # noqa: PLC0415
    from bucketlearn.local.stack import supervisor_alive  # noqa: PLC0415

    if not supervisor_alive(dict(state)):
        return StackProbe(supervisor_alive=False)
    silent = tuple(f"{name} ({host}:{port})"
                   for name, (host, port) in emulator_addresses(state).items()
                   if not port_open(host, port, timeout))
    return StackProbe(supervisor_alive=True, silent=silent)


def resolve_target(environ: Mapping[str, str], home: Path) -> Target:
    """``decide_target`` on this machine: reads the state file and probes its stack."""
    from bucketlearn.local.stack import load_state  # noqa: PLC0415

    state = None if target_is_cloud(environ) else load_state(home)
    probe = probe_stack(state) if state is not None else None
    return decide_target(environ, home, state, probe)


class StackWatch:
    """Checked while a command waits on a job the local stack serves: ``check`` raises
    StackGoneError as soon as the stack's process is gone, or once an emulator has refused
    connections for ``grace`` seconds (a blip is not an outage)."""

    def __init__(self, state: dict[str, Any], grace: float = 15.0,
                 probe: Callable[[dict[str, Any]], StackProbe] = probe_stack,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state, self.grace, self.probe, self.clock = state, grace, probe, clock
        self.silent_since: float | None = None

    def check(self) -> None:
        found = self.probe(self.state)
        if found.supervisor_alive and not found.silent:
            self.silent_since = None
            return
        now = self.clock()
        if found.supervisor_alive:
            self.silent_since = now if self.silent_since is None else self.silent_since
            if now - self.silent_since < self.grace:
                return
        problem = stack_problem(self.state, found)
        todo = ("restart the stack (`bucketlearn local down`, then `bucketlearn local up "
                "--detach`)" if found.supervisor_alive else
                "start a new stack with `bucketlearn local up --detach`")
        raise StackGoneError(f"{problem}; the job lived in its emulators' memory and is lost: "
                             f"{todo} and submit again")
