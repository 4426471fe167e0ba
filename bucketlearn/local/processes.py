"""Process bookkeeping for the local stack (Linux ``/proc``): who is below whom, who belongs to a
stack, and how to stop them all, with timeouts.

Every process the local stack starts carries two environment variables, inherited by everything
it starts in turn (gcloud's Java emulators included): ``BUCKETLEARN_STACK_ID`` (one id per stack)
and ``BUCKETLEARN_STACK_PROC`` (``pubsub``, ``worker-0`` …). ``marked`` finds them again by
reading ``/proc/<pid>/environ``, whatever became of their parents and process groups, and with
no risk of hitting a stranger that reused a recorded pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import time
from collections.abc import Iterable
from typing import Any

STACK_ID_ENV = "BUCKETLEARN_STACK_ID"
STACK_PROC_ENV = "BUCKETLEARN_STACK_PROC"
_PR_SET_PDEATHSIG = 1


def _proc_pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (field 3, the state, comes first)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the pid, names it for good."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def is_same_process(pid: int, ticks: int | None) -> bool:
    """``pid`` is alive and, when ``ticks`` is known, is the process that started then (not a
    later one that was given the same pid)."""
    return alive(pid) and (ticks is None or start_ticks(pid) == ticks)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    found: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/task/{current}/children", encoding="ascii") as handle:
                children = [int(c) for c in handle.read().split()]
        except (OSError, ValueError):
            children = []
        found.extend(children)
        pending.extend(children)
    return found


def group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes of process group ``pgid``."""
    members = []
    for pid in _proc_pids():
        fields = _stat_fields(pid)
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(pid)
    return members


def process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def environ_of(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with ({} when unreadable: gone, or not ours)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def marked(stack_id: str, proc_name: str | None = None) -> list[int]:
    """Live processes started by the stack ``stack_id`` (only by its ``proc_name`` when given)."""
    if not stack_id:
        return []
    found = []
    for pid in _proc_pids():
        if pid == os.getpid():
            continue
        env = environ_of(pid)
        if env.get(STACK_ID_ENV) != stack_id:
            continue
        if proc_name is not None and env.get(STACK_PROC_ENV) != proc_name:
            continue
        if alive(pid):
            found.append(pid)
    return found


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def signal_groups(pgids: Iterable[int], sig: int) -> None:
    for pgid in pgids:
        if pgid > 1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)


def wait_gone(pids: Iterable[int], timeout: float, poll: float = 0.1) -> list[int]:
    """Wait until every pid is gone (or a zombie); return those still alive after ``timeout``."""
    left = [pid for pid in pids if alive(pid)]
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        time.sleep(poll)
        left = [pid for pid in left if alive(pid)]
    return left


def stop_marked(stack_id: str, proc_name: str | None = None, timeout: float = 5.0,
                sig: int = signal.SIGTERM) -> list[int]:
    """Stop every live process of a stack (or of one of its processes): ``sig``, then SIGKILL
    after ``timeout``. Returns the pids it found."""
    pids = marked(stack_id, proc_name)
    if not pids:
        return []
    signal_pids(pids, sig)
    left = wait_gone(pids, timeout if sig != signal.SIGKILL else 5.0)
    if left and sig != signal.SIGKILL:
        signal_pids(left, signal.SIGKILL)
        wait_gone(left, 5.0)
    return pids


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``); False where that does not exist."""
    return _prctl_pdeathsig is not None and _prctl_pdeathsig(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0


def _load_prctl() -> Any:
    try:  # the C library is already loaded: no search (find_library would run ldconfig)
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl_pdeathsig = _load_prctl()  # looked up before any fork: a preexec_fn only calls it


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """Something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
