"""One ingestion contender on one file, in a fresh process: prints one JSON line.

    python -m benchmarks.ingest_worker CONTENDER FILE [--bucket B --object O --work-bucket W]

Contenders:
    split           bucketlearn.ingest.split_upload from a local file; parts are encoded exactly as in
                    production, then handed to a store that *discards* them (isolates ingest cost)
    split-tempdir   the same, the store writes every part to a temporary directory (removed after)
    split-emulator  the upload function's real I/O: the CSV is streamed from gcp-storage-emulator
                    (STORAGE_EMULATOR_HOST) and parts are written back to it
    split-bounded   EXPERIMENT, not shipped code: 4 MiB CSV blocks and at most 3 blocks read ahead
                    (the fix proposed for the RSS growth; see docs/BENCHMARKS.md)
    pyarrow         pyarrow.csv.read_csv(FILE) (type inference, multi-threaded)
    pandas          pandas.read_csv(FILE) (C engine)
    probe-readahead diagnosis: how many blocks pyarrow's streaming reader has read when the first
                    batch is returned (split's block size, 4 MiB, 1 MiB)
    probe-stages    diagnosis: tracemalloc peaks of split's per-block steps

Peak RSS is the process's VmHWM at the end; ``base_rss_mb`` is VmRSS after imports, before reading.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from benchmarks.common import MB, proc_status_mb

BOUNDED_BLOCK_MIB = 4
BOUNDED_AHEAD_BLOCKS = 3


class DiscardStore:
    """A BlobStore that counts what it is given and keeps nothing."""

    def __init__(self) -> None:
        self.parts = 0
        self.bytes = 0

    def write_bytes(self, bucket: str, name: str, data: bytes, content_type: str,
                    metadata: Mapping[str, str] | None = None) -> Any:
        from bucketlearn.ports import BlobInfo

        self.parts += 1
        self.bytes += len(data)
        return BlobInfo(bucket, name, len(data), self.parts)


class TempDirStore(DiscardStore):
    """A BlobStore that writes every object under a temporary directory."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root

    def write_bytes(self, bucket: str, name: str, data: bytes, content_type: str,
                    metadata: Mapping[str, str] | None = None) -> Any:
        path = os.path.join(self.root, bucket, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
        return super().write_bytes(bucket, name, data, content_type, metadata)


class _BoundedReader(io.RawIOBase):
    """A file whose reads wait while more than ``ahead`` blocks are unconsumed (experiment)."""

    def __init__(self, path: str, gate: _Gate) -> None:
        self.handle = open(path, "rb")  # noqa: SIM115 - closed in close()
        self.gate = gate
        self.reads = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        self.gate.wait_for_room(self.reads)
        self.reads += 1
        return self.handle.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.handle.close()
        super().close()


class _Gate:
    def __init__(self, ahead: int) -> None:
        self.ahead = ahead
        self.consumed = 0
        self.cond = threading.Condition()

    def wait_for_room(self, reads: int) -> None:
        with self.cond:  # the timeout only guards against a reader that needs more look-ahead
            self.cond.wait_for(lambda: reads - self.consumed < self.ahead, timeout=5)

    def advance(self) -> None:
        with self.cond:
            self.consumed += 1
            self.cond.notify_all()

    def reset(self) -> None:
        with self.cond:
            self.consumed = 0
            self.cond.notify_all()


def run_split(path: str, store_kind: str, args: argparse.Namespace) -> dict[str, Any]:
    from bucketlearn import ingest
    from bucketlearn.config import JobOptions, Limits
    from bucketlearn.ingest import SourceFile

    options = JobOptions()
    limits = Limits()
    size = os.path.getsize(path)
    source = SourceFile(os.path.basename(path), size, lambda: open(path, "rb"))
    extra: dict[str, Any] = {}
    scratch = None
    if store_kind == "discard":
        store: Any = DiscardStore()
        bucket = "work"
    elif store_kind == "tempdir":
        scratch = tempfile.mkdtemp(prefix="bucketlearn-bench-parts-")
        store = TempDirStore(scratch)
        bucket = "work"
    elif store_kind == "emulator":
        from bucketlearn.adapters.gcs import GcsBlobStore
        from bucketlearn.config import Settings

        settings = Settings(storage_emulator_host=os.environ["STORAGE_EMULATOR_HOST"])
        gcs = GcsBlobStore(settings)
        info = gcs.stat(args.bucket, args.object)
        assert info is not None, "the CSV is not in the emulator"
        source = SourceFile(f"gs://{args.bucket}/{args.object}", info.size,
                            lambda: gcs.open_read(args.bucket, args.object))
        store, bucket = gcs, args.work_bucket
    elif store_kind == "bounded":
        gate = _Gate(BOUNDED_AHEAD_BLOCKS)
        original = ingest._batches

        def batches(*a: Any, **k: Any) -> Any:
            gate.reset()
            for batch in original(*a, **k):
                yield batch
                gate.advance()

        ingest._batches = batches  # the experiment: a bounded read-ahead around the same reader
        limits = Limits(max_line_bytes=BOUNDED_BLOCK_MIB << 19)  # block = 2 x max line = 4 MiB
        source = SourceFile(os.path.basename(path), size, lambda: _BoundedReader(path, gate))
        store, bucket = DiscardStore(), "work"
        extra = {"block_mib": BOUNDED_BLOCK_MIB, "ahead_blocks": BOUNDED_AHEAD_BLOCKS}
    else:
        raise SystemExit(f"unknown store {store_kind}")
    base = proc_status_mb("VmRSS")
    started = time.perf_counter()
    try:
        manifest = ingest.split_upload(source, store, bucket, "bench", options, limits)
        seconds = time.perf_counter() - started
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    parts = getattr(store, "parts", None)
    written = getattr(store, "bytes", None)
    if store_kind == "emulator":
        listed = list(store.list(bucket, "jobs/bench/"))
        parts, written = len(listed), sum(i.size for i in listed)
    return {"rows": manifest.rows, "seconds": seconds, "base_rss_mb": base,
            "shards": len(manifest.shards), "parts_written": parts,
            "bytes_written": written, **extra}


def run_reader(kind: str, path: str) -> dict[str, Any]:
    if kind == "pyarrow":
        import pyarrow.csv as pacsv

        base = proc_status_mb("VmRSS")
        started = time.perf_counter()
        table = pacsv.read_csv(path)
        seconds = time.perf_counter() - started
        rows = table.num_rows
    else:
        import pandas as pd

        base = proc_status_mb("VmRSS")
        started = time.perf_counter()
        frame = pd.read_csv(path)
        seconds = time.perf_counter() - started
        rows = len(frame)
    return {"rows": rows, "seconds": seconds, "base_rss_mb": base}


def probe_readahead(path: str) -> dict[str, Any]:
    """How far pyarrow's streaming CSV reader reads ahead of the consumer, with split's options."""
    import pyarrow.csv as pacsv

    from bucketlearn import ingest
    from bucketlearn.config import Limits

    limits = Limits()
    columns = ingest.read_header(ingest.SourceFile(path, os.path.getsize(path),
                                                   lambda: open(path, "rb")), limits)
    block = max(1 << 20, min(limits.max_line_bytes * 2, 64 << 20))  # as ingest._batches
    out: dict[str, Any] = {"block_bytes_split": block}
    for label, size in (("split_block", block), ("block_4mib", 4 << 20), ("block_1mib", 1 << 20)):
        counter = {"reads": 0}
        handle = open(path, "rb")  # noqa: SIM115 - closed below

        class Counting(io.RawIOBase):
            def readable(self) -> bool:
                return True

            def read(self, n: int = -1, counter: dict[str, int] = counter,
                     handle: Any = handle) -> bytes:
                counter["reads"] += 1
                return handle.read(n)

        rss0 = proc_status_mb("VmRSS") or 0.0  # meaningful for the first (fresh) probe only
        reader = pacsv.open_csv(Counting(), read_options=pacsv.ReadOptions(
            block_size=size, column_names=columns, skip_rows=1),
            convert_options=pacsv.ConvertOptions(include_columns=[columns[-1]]))
        reader.read_next_batch()
        time.sleep(1.5)  # let the background reader run as far as it will
        out[label] = {"block_bytes": size, "reads_after_first_batch": counter["reads"],
                      "bytes_read_ahead": min(counter["reads"] * size, os.path.getsize(path)),
                      "rss_growth_mb": ((proc_status_mb("VmRSS") or 0.0) - rss0
                                        if label == "split_block" else None)}
        reader.close()
        handle.close()
    return {"rows": 0, "seconds": 1.0, "base_rss_mb": None, **out}


def probe_stages(path: str) -> dict[str, Any]:
    """Transient Python/numpy allocation peaks (tracemalloc) of split's per-block steps."""
    import functools
    import tracemalloc

    from bucketlearn import ingest
    from bucketlearn.config import JobOptions, Limits

    peaks: dict[str, float] = {}

    def wrap(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def measured(*a: Any, **k: Any) -> Any:
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            value = original(*a, **k)
            _, peak = tracemalloc.get_traced_memory()
            peaks[label] = max(peaks.get(label, 0.0), (peak - before) / MB)
            return value

        setattr(owner, name, measured)

    wrap(ingest, "_features", "features_float32_block")
    wrap(ingest._RunningStats, "add", "running_stats_float64_copies")
    wrap(ingest._ShardWriter, "flush", "shard_part_concat_and_npz")
    wrap(ingest._HoldoutWriter, "flush", "holdout_part_concat_and_npz")
    tracemalloc.start()
    started = time.perf_counter()
    manifest = ingest.split_upload(ingest.SourceFile(path, os.path.getsize(path),
                                                     lambda: open(path, "rb")),
                                   DiscardStore(), "work", "bench", JobOptions(), Limits())
    seconds = time.perf_counter() - started
    tracemalloc.stop()
    return {"rows": manifest.rows, "seconds": seconds, "base_rss_mb": None,
            "transient_peaks_mb": peaks}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("contender", choices=["split", "split-tempdir", "split-emulator",
                                              "split-bounded", "pyarrow", "pandas",
                                              "probe-readahead", "probe-stages"])
    parser.add_argument("file")
    parser.add_argument("--bucket")
    parser.add_argument("--object")
    parser.add_argument("--work-bucket")
    args = parser.parse_args(argv)
    size = os.path.getsize(args.file)
    if args.contender == "probe-readahead":
        out = probe_readahead(args.file)
    elif args.contender == "probe-stages":
        out = probe_stages(args.file)
    elif args.contender.startswith("split"):
        store = {"split": "discard", "split-tempdir": "tempdir", "split-emulator": "emulator",
                 "split-bounded": "bounded"}[args.contender]
        out = run_split(args.file, store, args)
    else:
        out = run_reader(args.contender, args.file)
    out.update(contender=args.contender, file_mb=size / MB, mb_per_s=size / MB / out["seconds"],
               peak_rss_mb=proc_status_mb("VmHWM"), pid=os.getpid())
    print(json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (freeing a 3 GB table takes a while)


if __name__ == "__main__":
    main()
