"""What a local stack leaves when it dies is found from its state file and stopped:
by ``local down``, by ``local up`` before it starts a new one, and by the supervisor when one
process's guard was killed outright."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bucketlearn.entrypoints.cli import local_commands
from bucketlearn.local import processes
from bucketlearn.local.emulators import Proc
from bucketlearn.local.processes import STACK_ID_ENV, STACK_PROC_ENV
from bucketlearn.local.stack import stop_from_state
from tests.unit.helpers import wait_until

GONE_PID = 2**22 + 4321  # above the default pid_max: never a live process


@pytest.fixture
def popens() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for popen in started:
        popen.kill()
        popen.wait(timeout=10)


def start_marked(stack_id: str, name: str, popens: list[subprocess.Popen[bytes]]
                 ) -> subprocess.Popen[bytes]:
    """A stand-in for an orphaned emulator JVM: a process carrying the stack's id."""
    popen = subprocess.Popen(["sleep", "300"], start_new_session=True,
                             env={**os.environ, STACK_ID_ENV: stack_id, STACK_PROC_ENV: name})
    popens.append(popen)
    # an orphan has been running a while: wait until /proc shows it with its mark (once, in a
    # CI run on two busy workers, the scan right after the start did not find it)
    wait_until(lambda: popen.pid in processes.marked(stack_id, name), 10, poll=0.02)
    return popen


def write_dead_state(home: Path, stack_id: str, recorded: dict[str, int]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "local.json").write_text(json.dumps({
        "pid": GONE_PID, "started_at": time.time() - 60, "stack_id": stack_id, "env": {},
        "processes": {name: {"pid": pid} for name, pid in recorded.items()}, "emulators": {}}))


def test_local_down_stops_what_a_dead_stack_left_and_nothing_else(
        tmp_path: Path, popens: list[subprocess.Popen[bytes]]) -> None:
    # Prepare: the stack's process is gone; its JVM is not; a stranger holds a recorded pid
    stack_id = uuid.uuid4().hex
    orphan = start_marked(stack_id, "pubsub", popens)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    popens.append(stranger)
    write_dead_state(tmp_path, stack_id, {"pubsub": orphan.pid, "worker-0": stranger.pid})
    # Execute
    outcome = stop_from_state(tmp_path, timeout=5)
    # Assert
    assert outcome is not None and not outcome.was_running
    assert outcome.leftovers == [orphan.pid]
    assert orphan.wait(timeout=10) == -signal.SIGTERM
    assert stranger.poll() is None, "a process that is not the stack's was signalled"
    assert not (tmp_path / "local.json").exists()


def test_local_up_clears_a_dead_stack_first(tmp_path: Path,
                                            popens: list[subprocess.Popen[bytes]],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare
    stack_id = uuid.uuid4().hex
    orphan = start_marked(stack_id, "firestore", popens)
    write_dead_state(tmp_path, stack_id, {})
    # Execute
    running = local_commands.clear_dead_stack(tmp_path)
    # Assert
    assert running is None
    assert orphan.wait(timeout=10) is not None
    out = capsys.readouterr().out
    assert f"was no longer running (pid {GONE_PID} gone)" in out
    assert "stopped 1 of its processes that were still running" in out


def test_the_supervisor_stops_what_a_killed_guard_left(tmp_path: Path) -> None:
    """A guard SIGKILLed: its command dies with it (parent-death signal), but what the command
    started (like gcloud's JVM) is orphaned; ``Proc.stop_leftovers`` finds it by the stack's id."""
    # Prepare: guard -> sh -> sleep
    pid_file = tmp_path / "jvm.pid"
    proc = Proc("pubsub", ["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"],
                tmp_path / "pubsub.log", dict(os.environ), stack_id=uuid.uuid4().hex)
    proc.start()
    try:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, proc.tail()
            time.sleep(0.1)
        jvm = int(pid_file.read_text())
        command = proc.command_pid()
        assert command is not None
        assert proc.popen is not None
        # Execute: the guard is killed outright
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(timeout=10)
        # its command dies of the parent-death signal (not at once on a loaded machine)
        assert processes.wait_gone([command], 10) == []
        assert processes.alive(jvm), "precondition: the grandchild was orphaned"
        left = proc.stop_leftovers()
        # Assert
        assert left == [jvm]
        assert processes.wait_gone([jvm], 10) == []
    finally:
        proc.kill()
        if proc.command_pid():
            processes.signal_groups([proc.command_pid() or 0], signal.SIGKILL)


def test_start_ticks_tell_a_process_from_a_later_one_with_its_pid() -> None:
    ticks = processes.start_ticks(os.getpid())
    assert processes.is_same_process(os.getpid(), ticks)
    assert not processes.is_same_process(os.getpid(), (ticks or 0) + 1)
    assert not processes.is_same_process(GONE_PID, None)
    assert sys.platform != "linux" or ticks is not None
