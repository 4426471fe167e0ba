"""``bucketlearn local up --detach`` / ``local env`` / ``local down`` as a user runs them, and what
the CLI does when that stack is gone or dies under it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from bucketlearn.local import processes

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "data" / "digits.csv"
EXIT_NO_TARGET = 4


def cli_env(home: Path) -> dict[str, str]:
    return {**os.environ, "BUCKETLEARN_HOME": str(home)}


def run(home: Path, *args: str, timeout: float = 360) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bucketlearn.entrypoints.cli", *args], capture_output=True,
                          text=True, env=cli_env(home), timeout=timeout, cwd=REPO)


def alive(pid: int) -> bool:
    return processes.alive(pid)  # a zombie is gone for our purposes


def wait_until(predicate: Callable[[], Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return bool(predicate())


def stack_status(home: Path) -> dict[str, Any]:
    result = run(home, "local", "status", "--json", timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def open_ports(state: dict[str, Any]) -> list[str]:
    """The stack's servers (emulators, functions, dashboard) that still accept connections."""
    addresses = [urlsplit(url) for url in state["urls"].values()]
    return [f"{a.hostname}:{a.port}" for a in addresses
            if processes.port_open(a.hostname or "127.0.0.1", a.port or 80, timeout=1.0)]


class Stacks:
    """The stacks a test starts in ``home``; ``cleanup`` leaves none of their processes."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.ids: set[str] = set()

    def up(self, *flags: str) -> subprocess.CompletedProcess[str]:
        result = run(self.home, "local", "up", "--detach", "--workers", "1", *flags)
        assert result.returncode == 0, result.stdout + result.stderr
        self.ids.add(stack_status(self.home)["stack_id"])
        return result

    def survivors(self) -> list[int]:
        return [pid for stack_id in self.ids for pid in processes.marked(stack_id)]

    def cleanup(self) -> None:
        run(self.home, "local", "down", timeout=120)
        for stack_id in self.ids:
            processes.stop_marked(stack_id, timeout=5)


@pytest.fixture
def stacks(tmp_path: Path) -> Iterator[Stacks]:
    started = Stacks(tmp_path / "home")
    try:
        yield started
    finally:
        started.cleanup()


def test_detached_stack_starts_reports_and_stops_everything(stacks: Stacks) -> None:
    # Prepare
    home = stacks.home
    # Execute
    stacks.up()
    status = stack_status(home)
    env = run(home, "local", "env").stdout
    # Assert: every piece is up and reachable, and env names the emulators
    names = set(status["processes"]) | set(status["emulators"])
    assert {"pubsub", "firestore", "storage", "upload_fn", "aggregator", "worker-0"} <= names
    assert all(p["alive"] for p in status["processes"].values())
    assert requests.get(status["urls"]["pubsub"], timeout=5).ok
    for key in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST", "STORAGE_EMULATOR_HOST",
                "BUCKETLEARN_UPLOADS_BUCKET"):
        assert f"export {key}=" in env
    infos = [*status["processes"].values(), *status["emulators"].values()]
    pids = [status["pid"], *(p["pid"] for p in infos), *(p["command_pid"] for p in infos)]
    # Execute
    down = run(home, "local", "down", timeout=120)
    # Assert: nothing is left running, not even the JVMs gcloud started
    assert down.returncode == 0 and "stopped" in down.stdout
    assert [pid for pid in pids if alive(pid)] == []
    assert stacks.survivors() == []
    assert open_ports(status) == []
    assert not (home / "local.json").exists()


def test_after_local_down_commands_say_no_stack_runs_here(stacks: Stacks) -> None:
    """Item 9: every command used to fall back to the cloud and print a DefaultCredentialsError
    traceback."""
    # Prepare: a stack up, then down
    stacks.up()
    assert run(stacks.home, "local", "down", timeout=120).returncode == 0
    for args in (["status"], ["submit", str(DIGITS)], ["download", "some-job"],
                 ["cancel", "some-job"]):
        # Execute
        result = run(stacks.home, *args, timeout=120)
        # Assert
        assert result.returncode == EXIT_NO_TARGET, (args, result.stdout + result.stderr)
        assert "no local stack is running here" in result.stderr
        assert "bucketlearn local up" in result.stderr
        assert "BUCKETLEARN_TARGET=cloud" in result.stderr
        assert "Traceback" not in result.stderr + result.stdout


def test_a_stack_killed_outright_leaves_nothing_and_wait_says_so(stacks: Stacks,
                                                                   tmp_path: Path) -> None:
    """Item 10: a SIGKILL to a worker's guard (the pid `local status` shows) used to leave the
    learner running; a SIGKILL to the stack's process left both emulator JVMs running, and
    `submit --wait` waiting on, saying nothing."""
    # Prepare
    home = stacks.home
    stacks.up()
    state = stack_status(home)
    worker = state["processes"]["worker-0"]
    # Execute: SIGKILL the worker's guard
    os.kill(worker["pid"], signal.SIGKILL)
    # Assert: the learner dies with it, and the stack starts a new worker
    assert wait_until(lambda: not alive(worker["command_pid"]), 20), "the learner outlived it"

    def restarted() -> bool:
        info = stack_status(home)["processes"]["worker-0"]
        return info["alive"] and info["restarts"] >= 1 and info["pid"] != worker["pid"]

    assert wait_until(restarted, 60)
    # Prepare: a long job, followed by submit --wait
    out_path, err_path = tmp_path / "submit.out", tmp_path / "submit.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        submit = subprocess.Popen(
            [sys.executable, "-m", "bucketlearn.entrypoints.cli", "submit", str(DIGITS), "--wait",
             "--epochs", "200"], stdout=out, stderr=err, env=cli_env(home), cwd=REPO)
    try:
        assert wait_until(lambda: out_path.read_text().strip(), 120), err_path.read_text()
        assert wait_until(lambda: "RUNNING" in err_path.read_text(), 120), err_path.read_text()
        state = stack_status(home)
        assert stacks.survivors()
        # Execute: SIGKILL the stack's own process
        killed_at = time.monotonic()
        os.kill(state["pid"], signal.SIGKILL)
        # Assert: within a bounded time no process of the stack runs and no port is open
        assert wait_until(lambda: not stacks.survivors(), 30), [
            Path(f"/proc/{pid}/cmdline").read_text() for pid in stacks.survivors()]
        # (an exiting process gives up its memory, and with it the environment that marks it as
        # the stack's, before its files: a large JVM's listening socket can outlast the mark)
        assert wait_until(lambda: open_ports(state) == [], 15), open_ports(state)
        # Assert: submit --wait noticed, said so and ended
        code = submit.wait(timeout=90)
        waited = time.monotonic() - killed_at
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.wait(timeout=10)
    stderr = err_path.read_text()
    assert code == EXIT_NO_TARGET, stderr
    assert f"is no longer running (pid {state['pid']} gone)" in stderr
    assert "Traceback" not in stderr
    assert waited < 90
    # Assert: later commands say the same; local down clears the state file
    status = run(home, "status", timeout=120)
    assert status.returncode == EXIT_NO_TARGET
    assert f"is no longer running (pid {state['pid']} gone)" in status.stderr
    down = run(home, "local", "down", timeout=120)
    assert "was no longer running" in down.stdout
    assert not (home / "local.json").exists()


def test_local_up_clears_what_a_dead_stack_left(stacks: Stacks) -> None:
    """The stack's process and every guard SIGKILLed at once (nothing left to clean up after the
    others): gcloud dies with its guard, its JVM does not; `local up` stops those first."""
    # Prepare
    home = stacks.home
    stacks.up()
    state = stack_status(home)
    guards = [info["pid"] for info in [*state["processes"].values(),
                                       *state["emulators"].values()]]
    # Execute: everything with a guard or a supervisor role is killed outright
    for pid in [state["pid"], *guards]:
        os.kill(pid, signal.SIGKILL)
    time.sleep(2)
    orphans = stacks.survivors()
    assert orphans, "precondition: the JVMs outlive gcloud"
    up = stacks.up()
    # Assert
    assert f"was no longer running (pid {state['pid']} gone)" in up.stdout
    assert "of its processes that were still running" in up.stdout
    assert [pid for pid in orphans if alive(pid)] == []
    assert stack_status(home)["stack_id"] != state["stack_id"]


# --- what the CLI prints: no library start-up logs (unless --verbose), plain words ------------

LIBRARY_LINES = ("absl::InitializeLog", "oneDNN", "port.cc")


def library_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines of a command's output (both streams) that TensorFlow's C++ libraries wrote."""
    return [line for line in (result.stdout + result.stderr).splitlines()
            if any(mark in line for mark in LIBRARY_LINES)]


def test_train_local_and_predict_print_no_tensorflow_start_up_lines(tmp_path: Path) -> None:
    """TensorFlow's C++ start-up lines (absl's "All log messages before absl::InitializeLog()",
    oneDNN's notice, twice each) used to open the output of every command that loads it; they
    are back with --verbose."""
    # Prepare
    home, model = tmp_path / "home", tmp_path / "digits.keras"
    # Execute
    trained = run(home, "train-local", str(DIGITS), "--json", "--epochs", "1", "-o", str(model))
    predicted = run(home, "predict", str(model), str(DIGITS), "-o", str(tmp_path / "p.csv"))
    verbose = run(home, "predict", "--verbose", str(model), str(DIGITS), "--json")
    # Assert
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout)["accuracy"] > 0.5  # stdout is the JSON alone
    assert json.loads(trained.stdout)["selection"]["best"]["epoch"] == 1  # by validation
    assert library_lines(trained) == [], trained.stderr
    assert predicted.returncode == 0, predicted.stderr
    assert library_lines(predicted) == [], predicted.stderr
    assert "accuracy" in predicted.stderr and "wrote 1797 predictions" in predicted.stdout
    assert verbose.returncode == 0 and library_lines(verbose), verbose.stderr


def test_the_demo_prints_no_library_logs_and_says_its_plan_in_words(stacks: Stacks,
                                                                    tmp_path: Path) -> None:
    """``bucketlearn demo`` (on a small table with rows to predict beside it): no TensorFlow
    start-up lines when it predicts, and the plan said as what was decided and why, not as
    the rule's formula (that is in ``status --json``)."""
    # Prepare
    table, new_rows = tmp_path / "tiny.csv", tmp_path / "tiny_new.csv"
    lines = DIGITS.read_text().splitlines()
    table.write_text("\n".join(lines[:301]) + "\n")
    new_rows.write_text("\n".join([lines[0], *lines[-5:]]) + "\n")
    # Execute
    try:
        demo = run(stacks.home, "demo", "--workers", "1", "--file", str(table),
                   "--output-dir", str(tmp_path / "models"), "--timeout", "400", timeout=600)
    finally:
        if (stacks.home / "local.json").exists():
            stacks.ids.add(stack_status(stacks.home)["stack_id"])
    # Assert
    output = demo.stdout + demo.stderr
    assert demo.returncode == 0, output
    assert library_lines(demo) == [], output
    assert "predictions for the raw rows of" in demo.stdout
    (plan,) = [line for line in demo.stdout.splitlines() if line.startswith("plan:")]
    assert "trains one task at a time: " in plan and "R*H" not in output and "sqrt" not in output


def test_train_local_search_says_its_leaderboard_and_exports_the_selected_model(
        tmp_path: Path) -> None:
    """``train-local --search 6``: six candidates, two pruned after the first rung, four
    finalists; the model is their mean, and it predicts; a count out of range is refused naming what was expected."""
    # Prepare
    home, model = tmp_path / "home", tmp_path / "searched.keras"
    # Execute
    searched = run(home, "train-local", str(DIGITS), "--search", "6", "--epochs", "3", "--json",
                   "-o", str(model))
    plain = run(home, "train-local", str(DIGITS), "--search", "6", "--epochs", "3")
    predicted = run(home, "predict", str(model), str(DIGITS), "-o", str(tmp_path / "p.csv"))
    refused = run(home, "train-local", str(DIGITS), "--search", "65")
    with zipfile.ZipFile(model) as archive:  # the model says what it is
        sidecar = json.loads(archive.read("bucketlearn.json"))
    # Assert
    assert searched.returncode == 0, searched.stderr
    report = json.loads(searched.stdout)
    candidates = report["search"]["candidates"]
    assert len(candidates) == 6 and report["accuracy"] > 0.5
    finalists = {c["index"] for c in candidates if c["state"] == "finalist"}
    assert len(finalists) == 4 and set(report["search"]["selected"]["candidates"]) == finalists
    assert plain.returncode == 0, plain.stderr
    assert "search: 6 candidates over 2 rungs" in plain.stdout
    assert plain.stdout.count(" pruned ") == 2 and "selected: " in plain.stdout
    assert "retracing" not in plain.stderr  # TensorFlow's warnings stay out of the output
    assert predicted.returncode == 0 and "wrote 1797 predictions" in predicted.stdout
    assert sidecar["search"]["candidates"] == report["search"]["selected"]["candidates"]
    assert refused.returncode != 0
    assert "'off' or a whole number from 2 to 64" in refused.stderr
    assert "'65'" in refused.stderr
