"""One ingestion contender on one file, in a fresh process: prints one JSON line.

    python -m benchmarks.tools.ingest_worker CONTENDER FILE [--bucket B --object O --work-bucket W]

Contenders:
    split           bucketlearn.ingest.split.split_upload from a local file, as shipped (4 MiB CSV blocks,
                    at most 3 read ahead: bucketlearn.ingest.readahead); parts are encoded exactly as in
                    production, then handed to a store that *discards* them (isolates ingest cost)
    split-tempdir   the same, the store writes every part to a temporary directory (removed after)
    split-emulator  the upload function's real I/O: the CSV is streamed from gcp-storage-emulator
                    (STORAGE_EMULATOR_HOST) and parts are written back to it
    pyarrow         pyarrow.csv.read_csv(FILE) (type inference, multi-threaded)
    pandas          pandas.read_csv(FILE) (C engine)
    pyarrow-twice   the floor of a two-pass reader: pyarrow's streaming reader (pyarrow.csv.open_csv,
                    4 MiB blocks as split reads) over the whole file twice, every column as text,
                    doing nothing with the batches
    pyarrow-once-typed  the floor of a one-pass reader that converts types: pyarrow's streaming
                    reader over the file once (4 MiB blocks), types as pyarrow infers them from the
                    first block, doing nothing with the batches
    probe-readahead diagnosis: how many blocks have been read when the first batch is returned:
                    pyarrow's streaming reader alone (32 MiB blocks, as split used before; 4 MiB)
                    and split's bounded reader (4 MiB)
    probe-stages    diagnosis: tracemalloc peaks of split's per-block steps

Peak RSS is the process's VmHWM at the end; ``base_rss_mb`` is VmRSS after imports, before reading.

The stores here are the two no adapter of the project is: one that discards what it is given
(``MemoryBlobStore`` keeps every part, which would count in the peak RSS measured) and one that
writes to a local directory.
"""

from __future__ import annotations

import argparse
import importlib.metadata  # noqa: F401 - see below
import importlib.util  # noqa: F401 - see below
import io
import json
import os
import shutil
import subprocess  # noqa: F401 - see below
import tempfile
import time
import uuid  # noqa: F401 - see below
from collections.abc import Mapping
from typing import Any

# The modules marked "see below" and bucketlearn.config (numpy with it) are not used here: this
# process loaded them with the shared helpers it imported when its figures were first measured,
# and loads them still, so that its RSS after imports and its peak stay comparable.
import bucketlearn.config  # noqa: F401
from benchmarks.harness.paths import MB
from benchmarks.harness.procs import proc_status_mb


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


def run_split(path: str, store_kind: str, args: argparse.Namespace) -> dict[str, Any]:
    from bucketlearn.config import Limits
    from bucketlearn.ingest import split as ingest
    from bucketlearn.ingest.stream import READ_AHEAD_BLOCKS, READ_BLOCK_BYTES, SourceFile
    from bucketlearn.options import JobOptions
    from bucketlearn.usecases.train_local import local_source

    options = JobOptions()
    limits = Limits()
    source = local_source(path)
    extra: dict[str, Any] = {"block_mib": READ_BLOCK_BYTES / 2**20,
                             "ahead_blocks": READ_AHEAD_BLOCKS}
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


def streaming_reads(path: str, passes: int, as_text: bool) -> dict[str, Any]:
    """pyarrow's streaming reader over the file ``passes`` times (4 MiB blocks, as split reads),
    every column as text or typed as pyarrow infers, doing nothing with the batches."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from bucketlearn.ingest.stream import READ_BLOCK_BYTES

    read = pacsv.ReadOptions(block_size=READ_BLOCK_BYTES)
    convert = None
    if as_text:
        with open(path, "rb") as handle:
            names = handle.readline().decode().strip().split(",")
        convert = pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()))
    base = proc_status_mb("VmRSS")
    started = time.perf_counter()
    rows = 0
    for _ in range(passes):
        rows = sum(b.num_rows for b in pacsv.open_csv(path, read_options=read,
                                                      convert_options=convert))
    return {"rows": rows, "seconds": time.perf_counter() - started, "base_rss_mb": base}


def run_reader(kind: str, path: str) -> dict[str, Any]:
    if kind == "pyarrow-twice":
        return streaming_reads(path, passes=2, as_text=True)
    if kind == "pyarrow-once-typed":
        return streaming_reads(path, passes=1, as_text=False)
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
    """How far the CSV stream is read ahead of the consumer when the first batch is returned."""
    import pyarrow.csv as pacsv

    from bucketlearn.config import Limits
    from bucketlearn.ingest import readahead
    from bucketlearn.ingest import stream as ingest
    from bucketlearn.ingest.sniff import read_header
    from bucketlearn.usecases.train_local import local_source

    columns = read_header(local_source(path), Limits())
    out: dict[str, Any] = {}
    probes = (("pyarrow_32mib", 32 << 20, False,
               "pyarrow.csv.open_csv alone, 32 MiB blocks (split before the bounded reader)"),
              ("pyarrow_4mib", 4 << 20, False, "pyarrow.csv.open_csv alone, 4 MiB blocks"),
              ("split_bounded", ingest.READ_BLOCK_BYTES, True,
               f"split's reader: open_csv on readahead.BoundedReader, "
               f"{ingest.READ_BLOCK_BYTES >> 20} MiB blocks, {ingest.READ_AHEAD_BLOCKS} ahead"))
    for label, size, bounded, what in probes:
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
        options = pacsv.ReadOptions(block_size=size, column_names=columns, skip_rows=1)
        convert = pacsv.ConvertOptions(include_columns=[columns[-1]])
        if bounded:
            stream = readahead.BoundedReader(Counting(), ahead=ingest.READ_AHEAD_BLOCKS)
            batches = stream.batches(lambda s, options=options, convert=convert: pacsv.open_csv(
                s, read_options=options, convert_options=convert))
            next(batches)
        else:
            reader = pacsv.open_csv(Counting(), read_options=options, convert_options=convert)
            reader.read_next_batch()
        time.sleep(1.5)  # let the background reader run as far as it will
        out[label] = {"what": what, "block_bytes": size,
                      "reads_after_first_batch": counter["reads"],
                      "bytes_read_ahead": min(counter["reads"] * size, os.path.getsize(path)),
                      "rss_growth_mb": ((proc_status_mb("VmRSS") or 0.0) - rss0
                                        if label == probes[0][0] else None)}
        if bounded:
            batches.close()
        else:
            reader.close()
        handle.close()
    return {"rows": 0, "seconds": 1.0, "base_rss_mb": None, **out}


def probe_stages(path: str) -> dict[str, Any]:
    """Transient Python/numpy allocation peaks (tracemalloc) of split's per-block steps."""
    import functools
    import tracemalloc

    from bucketlearn.config import Limits
    from bucketlearn.ingest import split as ingest
    from bucketlearn.ingest.parts import HoldoutWriter, ShardWriter
    from bucketlearn.ingest.stream import READ_BLOCK_BYTES
    from bucketlearn.options import JobOptions
    from bucketlearn.usecases.train_local import local_source

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

    # split's per-block steps are private to bucketlearn.ingest.split and have no public
    # equivalent: this diagnosis wraps them by name (a rename there fails it loudly)
    wrap(ingest, "_checked_features", "features_float32_block")
    wrap(ingest.RunningStats, "add", "running_stats_float64_copies")
    wrap(ShardWriter, "flush", "shard_part_concat_and_npz")
    wrap(HoldoutWriter, "flush", "holdout_part_concat_and_npz")
    tracemalloc.start()
    started = time.perf_counter()
    manifest = ingest.split_upload(local_source(path), DiscardStore(), "work", "bench",
                                   JobOptions(), Limits())
    seconds = time.perf_counter() - started
    tracemalloc.stop()
    return {"rows": manifest.rows, "seconds": seconds, "base_rss_mb": None,
            "transient_peaks_mb": peaks, "block_mib": READ_BLOCK_BYTES / 2**20}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("contender", choices=["split", "split-tempdir", "split-emulator",
                                              "pyarrow", "pyarrow-twice", "pyarrow-once-typed",
                                              "pandas",
                                              "probe-readahead",
                                              "probe-stages"])
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
        store = {"split": "discard", "split-tempdir": "tempdir",
                 "split-emulator": "emulator"}[args.contender]
        out = run_split(args.file, store, args)
    else:
        out = run_reader(args.contender, args.file)
    out.update(contender=args.contender, file_mb=size / MB, mb_per_s=size / MB / out["seconds"],
               peak_rss_mb=proc_status_mb("VmHWM"), pid=os.getpid())
    print(json.dumps(out), flush=True)
    os._exit(0)  # skip interpreter teardown (freeing a 3 GB table takes a while)


if __name__ == "__main__":
    main()
