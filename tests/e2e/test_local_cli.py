"""``bucketlearn local up --detach`` / ``local env`` / ``local down`` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def run(home: Path, *args: str, timeout: float = 360) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BUCKETLEARN_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "bucketlearn.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=REPO)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0); it is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_detached_stack_starts_reports_and_stops_everything(tmp_path: Path) -> None:
    # Prepare
    home = tmp_path / "home"
    try:
        # Execute
        up = run(home, "local", "up", "--detach", "--workers", "1")
        assert up.returncode == 0, up.stdout + up.stderr
        status = json.loads(run(home, "local", "status", "--json").stdout)
        env = run(home, "local", "env").stdout
        # Assert: every piece is up and reachable, and env names the emulators
        names = set(status["processes"]) | set(status["emulators"])
        assert {"pubsub", "firestore", "storage", "upload_fn", "delta_fn", "worker-0"} <= names
        assert all(p["alive"] for p in status["processes"].values())
        assert requests.get(status["urls"]["pubsub"], timeout=5).ok
        for key in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST", "STORAGE_EMULATOR_HOST",
                    "BUCKETLEARN_UPLOADS_BUCKET"):
            assert f"export {key}=" in env
        pids = [p["pid"] for p in [*status["processes"].values(), *status["emulators"].values()]]
        pids.append(status["pid"])
    finally:
        down = run(home, "local", "down", timeout=120)
    # Assert: nothing is left running
    assert down.returncode == 0 and "stopped" in down.stdout
    assert [pid for pid in pids if alive(pid)] == []
    assert not (home / "local.json").exists()
