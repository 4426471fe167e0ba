"""Processes the local stack starts cannot outlive their starter or their guard, even when either
is SIGKILLed, nor can anything a guarded command leaves behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.helpers import wait_until

GUARD = [sys.executable, "-m", "bucketlearn.local.guard"]
# Like gcloud: unless it leads its session, it moves into a process group of its own, then starts
# the long-lived process (the Java emulator) as its child.
REGROUPING_COMMAND = (
    "import os, subprocess, sys\n"
    "if os.getsid(0) != os.getpid():\n"
    "    os.setpgid(0, 0)\n"
    "child = subprocess.Popen(['sleep', '300'])\n"
    "open(sys.argv[1], 'w').write(str(child.pid))\n"
    "child.wait()\n")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def read_pid(path: Path, timeout: float = 20) -> int:
    assert wait_until(lambda: path.exists() and path.read_text().strip(), timeout), path
    return int(path.read_text())


@pytest.fixture
def started() -> Iterator[list[int]]:
    """Pids a test started (directly or not); whatever is still alive is SIGKILLed at the end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_starter(command: list[str]) -> subprocess.Popen[bytes]:
    """A process that starts a guard the way the stack does (a session of its own) and waits."""
    code = (f"import subprocess, sys, time\n"
            f"subprocess.Popen({command!r}, start_new_session=True)\n"
            "time.sleep(300)\n")
    return subprocess.Popen([sys.executable, "-c", code])


def test_grandchildren_die_when_the_starter_is_killed(tmp_path: Path, started: list[int]) -> None:
    # Prepare: starter -> guard (session leader) -> sh -> sleep
    pid_file = tmp_path / "grandchild.pid"
    starter = start_starter([*GUARD, "sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"])
    started.append(starter.pid)
    grandchild = read_pid(pid_file)
    started.append(grandchild)
    assert alive(grandchild)
    # Execute: the starter dies without any chance to clean up
    starter.send_signal(signal.SIGKILL)
    starter.wait(timeout=10)
    # Assert
    assert wait_until(lambda: not alive(grandchild), 20), "the grandchild outlived the starter"


def test_a_command_that_moves_to_a_group_of_its_own_dies_with_the_starter(
        tmp_path: Path, started: list[int]) -> None:
    """gcloud leaves its process group for a new one and starts the emulator's JVM there; the
    guard used to stop only its own group, and the JVM outlived the stack."""
    # Prepare: starter -> guard -> regrouping python -> sleep
    pid_file = tmp_path / "jvm.pid"
    starter = start_starter([*GUARD, sys.executable, "-c", REGROUPING_COMMAND, str(pid_file)])
    started.append(starter.pid)
    jvm = read_pid(pid_file)
    started.append(jvm)
    # Execute
    starter.send_signal(signal.SIGKILL)
    starter.wait(timeout=10)
    # Assert
    assert wait_until(lambda: not alive(jvm), 20), "the regrouped grandchild outlived the starter"


def test_the_command_dies_with_its_guard(tmp_path: Path, started: list[int]) -> None:
    """`local status` shows the guard's pid; a SIGKILL to it (a user, the OOM killer) used to
    leave the learner running, reparented to init."""
    # Prepare: guard -> sh, which becomes sleep (exec), whose pid it wrote
    pid_file = tmp_path / "command.pid"
    guard = subprocess.Popen([*GUARD, "sh", "-c", f"echo $$ > {pid_file}; exec sleep 300"],
                             start_new_session=True)
    started.append(guard.pid)
    command = read_pid(pid_file)
    started.append(command)
    assert alive(command)
    # Execute
    guard.send_signal(signal.SIGKILL)
    guard.wait(timeout=10)
    # Assert
    assert wait_until(lambda: not alive(command), 10), "the command outlived its guard"


def test_what_the_command_leaves_behind_is_stopped_when_it_exits(tmp_path: Path,
                                                                  started: list[int]) -> None:
    # Prepare: the command starts a background sleep and exits at once
    pid_file = tmp_path / "leftover.pid"
    guard = subprocess.Popen([*GUARD, "sh", "-c", f"sleep 300 & echo $! > {pid_file}; exit 3"],
                             start_new_session=True)
    started.append(guard.pid)
    leftover = read_pid(pid_file)
    started.append(leftover)
    # Execute
    code = guard.wait(timeout=30)
    # Assert
    assert code == 3
    assert not alive(leftover), "a process the command left behind outlived the guard"


def test_sigterm_to_the_guard_reaches_the_whole_group(tmp_path: Path, started: list[int]) -> None:
    # Prepare
    pid_file = tmp_path / "jvm.pid"
    guard = subprocess.Popen([*GUARD, sys.executable, "-c", REGROUPING_COMMAND, str(pid_file)],
                             start_new_session=True)
    started.append(guard.pid)
    jvm = read_pid(pid_file)
    started.append(jvm)
    # Execute
    guard.send_signal(signal.SIGTERM)
    guard.wait(timeout=30)
    # Assert
    assert wait_until(lambda: not alive(jvm), 10)
