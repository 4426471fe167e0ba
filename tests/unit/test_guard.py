"""Processes the local stack starts cannot outlive their starter, even when it is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_grandchildren_die_when_the_starter_is_killed(tmp_path: Path) -> None:
    # Prepare: starter -> guard (session leader) -> sh -> sleep (a grandchild, like gcloud's java)
    pid_file = tmp_path / "grandchild.pid"
    starter_code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-m', 'bucketlearn.local.guard', 'sh', '-c', "
        f"'sleep 300 & echo $! > {pid_file}; wait'], start_new_session=True)\n"
        "time.sleep(300)\n")
    starter = subprocess.Popen([sys.executable, "-c", starter_code])
    try:
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 20)
        grandchild = int(pid_file.read_text())
        assert alive(grandchild)
        # Execute: the starter dies without any chance to clean up
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=10)
        # Assert
        assert wait_until(lambda: not alive(grandchild), 20), "the grandchild outlived the starter"
    finally:
        starter.kill()
