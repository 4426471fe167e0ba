"""Which backend a CLI command talks to, and what it says when there is none."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bucketlearn.adapters.memory import MemoryRegistry
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import DONE, RUNNING
from bucketlearn.entrypoints import cli
from bucketlearn.entrypoints.target import (
    CLOUD,
    ENVIRONMENT,
    LOCAL,
    StackGoneError,
    StackProbe,
    StackWatch,
    decide_target,
    resolve_target,
)
from bucketlearn.errors import NoTargetError, TransientError, UnreachableError
from bucketlearn.local import processes
from bucketlearn.usecases.waiting import wait_terminal

HOME = Path("/work/project/.bucketlearn")
STATE: dict[str, Any] = {
    "pid": 4242, "started_at": 1_700_000_000.0, "stack_id": "s1",
    "env": {"PUBSUB_EMULATOR_HOST": "127.0.0.1:10001",
            "FIRESTORE_EMULATOR_HOST": "127.0.0.1:10002",
            "STORAGE_EMULATOR_HOST": "http://127.0.0.1:10003",
            "BUCKETLEARN_UPLOADS_BUCKET": "local-uploads"},
}
ALIVE = StackProbe(supervisor_alive=True)
DEAD = StackProbe(supervisor_alive=False)
PROJECT = {"GOOGLE_CLOUD_PROJECT": "my-project"}


# --- the decision ------------------------------------------------------------------------------

def test_a_running_stack_is_the_target() -> None:
    target = decide_target({"PATH": "/bin"}, HOME, STATE, ALIVE)
    assert target.kind == LOCAL
    assert target.environ["BUCKETLEARN_UPLOADS_BUCKET"] == "local-uploads"
    assert target.environ["PATH"] == "/bin"


def test_the_cloud_when_forced_even_with_a_stack_here() -> None:
    target = decide_target({"BUCKETLEARN_TARGET": "cloud", **PROJECT}, HOME, STATE, ALIVE)
    assert target.kind == CLOUD
    assert "BUCKETLEARN_UPLOADS_BUCKET" not in target.environ


def test_the_cloud_forced_without_a_project_says_which_variable_is_missing() -> None:
    with pytest.raises(NoTargetError, match="expected GOOGLE_CLOUD_PROJECT"):
        decide_target({"BUCKETLEARN_TARGET": "cloud"}, HOME, None, None)


@pytest.mark.parametrize("environ", [{}, PROJECT], ids=["no project", "a project"])
def test_a_stack_that_died_is_reported_never_replaced_by_the_cloud(environ: dict[str, str]
                                                                   ) -> None:
    with pytest.raises(StackGoneError) as excinfo:
        decide_target(environ, HOME, STATE, DEAD)
    message = str(excinfo.value)
    assert "is no longer running (pid 4242 gone)" in message
    assert "started at " in message and "unknown" not in message
    assert "bucketlearn local up" in message
    assert "BUCKETLEARN_TARGET=cloud" in message


def test_a_stack_whose_emulator_is_gone_is_reported() -> None:
    probe = StackProbe(supervisor_alive=True, silent=("pubsub (127.0.0.1:10001)",))
    with pytest.raises(StackGoneError) as excinfo:
        decide_target({}, HOME, STATE, probe)
    assert "its pubsub (127.0.0.1:10001) emulator does not answer" in str(excinfo.value)
    assert "bucketlearn local down" in str(excinfo.value)


@pytest.mark.parametrize("environ", [PROJECT, {"BUCKETLEARN_PROJECT": "p"},
                                     {"FIRESTORE_EMULATOR_HOST": "127.0.0.1:8080"}])
def test_without_a_stack_the_environment_when_it_names_a_backend(environ: dict[str, str]
                                                                 ) -> None:
    assert decide_target(environ, HOME, None, None).kind == ENVIRONMENT


def test_no_stack_and_no_cloud_says_how_to_start_one_or_target_the_cloud() -> None:
    with pytest.raises(NoTargetError) as excinfo:
        decide_target({"PATH": "/bin"}, HOME, None, None)
    message = str(excinfo.value)
    assert message.startswith(f"no local stack is running here ({HOME})")
    assert "bucketlearn local up --detach" in message
    assert "BUCKETLEARN_TARGET=cloud and GOOGLE_CLOUD_PROJECT" in message


# --- the probes around it ----------------------------------------------------------------------

def write_state(home: Path, **fields: Any) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "local.json").write_text(json.dumps({**STATE, **fields}))


def test_resolve_reads_the_state_file_and_probes_the_pid(tmp_path: Path) -> None:
    # Prepare: a state file whose process is gone
    write_state(tmp_path, pid=2**22 + 12345)
    # Execute / Assert
    with pytest.raises(StackGoneError, match="no longer running"):
        resolve_target({}, tmp_path)


def test_a_reused_pid_is_not_the_stack(tmp_path: Path) -> None:
    """The recorded pid is alive, but that process started later than the stack did."""
    ticks = processes.start_ticks(os.getpid())
    assert ticks is not None
    write_state(tmp_path, pid=os.getpid(), pid_start=ticks + 1)
    with pytest.raises(StackGoneError, match=f"pid {os.getpid()} gone"):
        resolve_target({}, tmp_path)


def test_resolve_probes_the_emulators_of_a_live_stack(tmp_path: Path) -> None:
    # Prepare: our own process stands for the stack's; nothing listens on the emulators' ports
    write_state(tmp_path, pid=os.getpid(), pid_start=processes.start_ticks(os.getpid()),
                env={"PUBSUB_EMULATOR_HOST": "127.0.0.1:1"})
    # Execute / Assert
    with pytest.raises(StackGoneError, match=r"its pubsub \(127.0.0.1:1\) emulator does not"):
        resolve_target({}, tmp_path)


# --- waiting on a job --------------------------------------------------------------------------

class Probes:
    def __init__(self, *found: StackProbe) -> None:
        self.found = list(found)

    def __call__(self, state: dict[str, Any]) -> StackProbe:
        return self.found.pop(0) if len(self.found) > 1 else self.found[0]


def test_the_watch_raises_at_once_when_the_stack_is_gone() -> None:
    watch = StackWatch(STATE, probe=Probes(ALIVE, DEAD))
    watch.check()
    with pytest.raises(StackGoneError, match="no longer running .* and submit again"):
        watch.check()


def test_the_watch_tolerates_a_silent_emulator_for_its_grace() -> None:
    now = [0.0]
    silent = StackProbe(supervisor_alive=True, silent=("firestore (127.0.0.1:10002)",))
    watch = StackWatch(STATE, grace=15.0, probe=Probes(silent), clock=lambda: now[0])
    watch.check()
    now[0] = 14.0
    watch.check()
    now[0] = 15.0
    with pytest.raises(StackGoneError, match="firestore .* does not answer"):
        watch.check()


def a_job(status: str) -> Job:
    return Job("j1", status=status)


def test_wait_ends_when_the_check_says_the_stack_is_gone() -> None:
    registry = MemoryRegistry()
    registry.create_job(a_job(RUNNING))
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise StackGoneError("the local stack is no longer running")

    with pytest.raises(StackGoneError):
        wait_terminal(registry, "j1", timeout=30, poll=0.01, check=check)
    assert len(calls) == 3


class FlakyRegistry:
    """get_job fails with a TransientError ``failures`` times, then answers."""

    def __init__(self, failures: int, status: str = DONE) -> None:
        self.failures, self.status = failures, status

    def get_job(self, job_id: str) -> Job:
        if self.failures:
            self.failures -= 1
            raise TransientError("firestore get job: ServiceUnavailable: connection refused")
        return a_job(self.status)


def test_wait_rides_out_a_short_registry_outage() -> None:
    job = wait_terminal(FlakyRegistry(3), "j1", timeout=30, poll=0.01,
                        unreachable_after=10.0)
    assert job is not None and job.status == DONE


def test_wait_gives_up_when_the_registry_stays_unreachable() -> None:
    with pytest.raises(UnreachableError, match="has not answered for"):
        wait_terminal(FlakyRegistry(10**9), "j1", timeout=30, poll=0.01,
                      unreachable_after=0.2)


class StuckRegistry:
    """get_job answers its first read, then blocks as a Google client does while it retries a
    read against a backend that is gone (Firestore's: up to 300 s), here for ``hold`` seconds,
    and then fails; ``release`` ends a blocked read at once."""

    def __init__(self, hold: float) -> None:
        self.hold, self.reads = hold, 0
        self.release = threading.Event()

    def get_job(self, job_id: str) -> Job:
        self.reads += 1
        if self.reads == 1:
            return a_job(RUNNING)
        self.release.wait(self.hold)
        raise TransientError("firestore get job: RetryError: Timeout of 300.0s exceeded")


@pytest.mark.timeout(60)
def test_a_read_that_retries_longer_than_the_watch_allows_ends_the_wait_in_time() -> None:
    """After `local down`, `submit --wait` waited 4.5-6 minutes, as one
    registry read retried past the 60 s the watch allows. Each read is bounded by what is left
    of that budget: UnreachableError once it is spent, not when the client gives up."""
    # Prepare
    registry = StuckRegistry(hold=20.0)
    started = time.monotonic()
    # Execute
    try:
        with pytest.raises(UnreachableError, match="still unanswered after") as ended:
            wait_terminal(registry, "j1", timeout=30, poll=0.05, unreachable_after=1.0)
    finally:
        registry.release.set()
    # Assert
    elapsed = time.monotonic() - started
    assert elapsed < 1.0 + 0.05 + 1.0, elapsed  # the budget, one poll, and a margin
    assert "expected an answer within 1 s" in str(ended.value)
    assert registry.reads == 2


@pytest.mark.timeout(60)
def test_the_stack_watch_runs_while_a_read_is_stuck() -> None:
    """A stack that is gone ends the wait within a poll or two, even while a read is out."""
    # Prepare
    registry = StuckRegistry(hold=20.0)
    probes = Probes(ALIVE, ALIVE, DEAD)
    watch = StackWatch(STATE, grace=15.0, probe=probes)
    started = time.monotonic()
    # Execute
    try:
        with pytest.raises(StackGoneError, match="no longer running"):
            wait_terminal(registry, "j1", timeout=30, poll=0.05, check=watch.check,
                          unreachable_after=10.0)
    finally:
        registry.release.set()
    # Assert
    assert time.monotonic() - started < 1.0
    assert registry.reads == 2


# --- the CLI boundary --------------------------------------------------------------------------

def test_the_cli_says_no_stack_runs_here(capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: tests/conftest.py points BUCKETLEARN_HOME at an empty directory, no project
    # Execute
    code = cli.main(["status"])
    # Assert
    err = capsys.readouterr().err
    assert code == cli.EXIT_NO_TARGET
    assert "no local stack is running here" in err and "Traceback" not in err


def test_missing_credentials_are_a_message_not_a_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The cloud target without Application Default Credentials (google.auth raises
    DefaultCredentialsError when the clients are made)."""
    # Prepare
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    def no_credentials(*args: Any, **kwargs: Any) -> Any:
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_credentials)
    monkeypatch.setenv("BUCKETLEARN_TARGET", "cloud")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "my-project")
    # Execute
    code = cli.main(["status"])
    # Assert
    err = capsys.readouterr().err
    assert code == cli.EXIT_NO_TARGET
    assert "no Google Cloud credentials were found" in err
    assert "gcloud auth application-default login" in err
