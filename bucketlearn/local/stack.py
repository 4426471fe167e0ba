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
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bucketlearn.config import ONE_THREAD_BLAS, SINGLE_THREADED_TF, Settings, load_settings
from bucketlearn.local import processes
from bucketlearn.local.emulators import (
    Emulators,
    Proc,
    free_port,
    new_stack_id,
    repo_root,
    stop_all,
    stop_pids,
    uploads_bucket_for,
    wait_http,
)

log = logging.getLogger(__name__)

STATE_FILE = "local.json"
WATCHDOG_EVERY_SECONDS = 10.0
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
    scaling: Any = None  # a bucketlearn.loops.autoscale.ScalingPolicy, or None for a fixed worker count
    _retired: set[str] = field(default_factory=set)
    _registry: Any = None
    _services: Any = None
    _watched_at: float = 0.0
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
                # notifications for this stack's uploads bucket only, as deployed
                self.emulators = Emulators(logs, stack_id=self.stack_id,
                                           uploads_bucket=uploads_bucket_for(self.name_prefix))
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
        extra variables; BLAS on one thread for every process (over the shell's setting; only
        ``extra_env`` changes it) and TensorFlow on one thread for the functions, the aggregator
        and the learners (they share the machine's cores with one another)."""
        assert self.settings is not None
        env = {**os.environ, **ONE_THREAD_BLAS, **self.extra_env, **self.settings.to_env(),
               "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
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
            self._watchdog_pass()
            self.write_state()

    def _watchdog_pass(self) -> None:
        """The watchdog's pass over the stack's jobs, every ``WATCHDOG_EVERY_SECONDS``: what the
        cloud's controller job does every minute (``bucketlearn.loops.watchdog``)."""
        from bucketlearn.bootstrap import google_services  # noqa: PLC0415
        from bucketlearn.loops.watchdog import watchdog_pass  # noqa: PLC0415

        now = time.monotonic()
        if now - self._watched_at < WATCHDOG_EVERY_SECONDS or self.settings is None:
            return
        self._watched_at = now
        try:
            if self._services is None:
                self._services = google_services(self.settings)
            watchdog_pass(self._services)
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
        from bucketlearn.loops.autoscale import desired_workers, outstanding_tasks  # noqa: PLC0415

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
