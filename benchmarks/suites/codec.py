"""The formats bucketlearn stores arrays in, measured side by side.

    python -m benchmarks.suites.codec [--repeats 15] [--mutations 2000] [--out benchmarks/results/codec.json]

What is stored (``bucketlearn/codec.py``): a version's weights and Adam state, a task's result
(its weights, the Adam state it ended with, metadata), shard and holdout parts (x float32 rows ×
width, y int32 labels). The payloads: the weights of the 1,006,914-parameter MLP
``bucketlearn.ml.model`` builds on 7,800 features and 2 classes (the shapes and dtypes it
builds; Adam's state is an int64 step count, then m and v for each weight); a result of those
weights, that Adam state and a learner's metadata; a 256-row HMNIST shard (``data/make_hmnist.py``:
2,352 integer pixels as float32, 7 classes); a 256-row table shard of 40 features (24
continuous, 12 one-hot, 4 small counts; 3 classes).

Candidates, each decoder doing the checks the project needs (numeric dtypes only, never a
pickle; Arrow and Parquet: the schema checked exactly, ``validate(full=True)``, no nulls):
  * npz: ``codec.py`` as it was at NPZ_COMMIT (``np.savez``; its own strict parser), from git;
  * safetensors: ``codec.py`` today (``safetensors.numpy.save``; ``safetensors.deserialize``);
  * shards only: Arrow IPC streams (x one FixedSizeList<float32>[width] column, uncompressed and
    zstd; or one float32 column per feature) and Parquet (pyarrow's defaults: dictionary
    encoding and snappy; and zstd).

Figures: milliseconds, the median of ``--repeats`` runs after one warm-up, every candidate of a
payload measured in turn within each repeat (so a busy moment hits them all); bytes. Robustness:
``--mutations`` mutations of a valid HMNIST-shaped shard (16 × 12) per format (bit flips,
overwritten words, cuts, insertions, deletions), decoded in-process: how many decode, and the
exception types the rest raise.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import subprocess
import sys
import time
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from benchmarks.harness.data import make_hmnist_module
from benchmarks.harness.paths import REPO, RESULTS
from benchmarks.report.results import machine, now_iso, write_result
from bucketlearn import codec

NPZ_COMMIT = "4c86960"  # the last commit whose codec.py wrote .npz archives
MLP = [(7800, 128), (128,), (128, 64), (64,), (64, 2), (2,)]  # 1,006,914 parameters
Codec = tuple[Callable[[Any], bytes], Callable[[bytes], Any]]


def npz_codec() -> types.ModuleType:
    """``bucketlearn/codec.py`` as it was at NPZ_COMMIT, loaded from git as a module."""
    source = subprocess.run(["git", "show", f"{NPZ_COMMIT}:bucketlearn/codec.py"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    module = types.ModuleType("codec_npz")
    exec(compile(source, f"codec.py@{NPZ_COMMIT}", "exec"), module.__dict__)  # noqa: S102
    return module


def payloads() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    weights = [rng.normal(0, 0.05, s).astype(np.float32) for s in MLP]
    adam = [np.array(40, np.int64)] + [rng.normal(0, 1e-3, s).astype(np.float32)
                                       for s in MLP for _ in ("m", "v")]
    meta = {"job_id": "hmnist-3f2a9c1b7e4d", "task_id": "hmnist-3f2a9c1b7e4d:e0001:t00003",
            "epoch": 1, "task_index": 3, "round": 2, "base_version": 5,
            "base_digest": "sha256:" + "0" * 64, "examples": 256, "train_loss": 0.4123,
            "worker_id": "learner-1", "content": "weights"}
    hmnist = make_hmnist_module()
    rows = list(hmnist.rows(256, seed=0, sorted_by_label=False))
    image_x = np.stack([pixels for pixels, _ in rows]).astype(np.float32)
    image_y = np.array([label for _, label in rows], dtype=np.int32)
    table_x = np.hstack([np.round(rng.normal(0, 3, (256, 24)), 3),
                         np.eye(12)[rng.integers(0, 12, 256)],
                         rng.poisson(2, (256, 4))]).astype(np.float32)
    table_y = rng.integers(0, 3, 256).astype(np.int32)
    return {"weights": (weights, [], {"job_id": meta["job_id"], "version": 5}),
            "result": (weights, adam, meta),
            "shard-hmnist": (image_x, image_y), "shard-table": (table_x, table_y)}


# --- Arrow IPC and Parquet shards -------------------------------------------------------------

def arrow_table(x: np.ndarray, y: np.ndarray, columns: bool) -> pa.Table:
    if columns:
        return pa.table({**{f"f{i:04d}": x[:, i] for i in range(x.shape[1])}, "y": y})
    return pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1]),
                     "y": y})


def arrow_arrays(table: pa.Table, columns: bool) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of a shard table, after the checks a reader of untrusted bytes needs."""
    names = table.schema.names
    wanted = ([f"f{i:04d}" for i in range(len(names) - 1)] if columns else ["x"]) + ["y"]
    if names != wanted or table.schema.field("y").type not in (pa.int32(), pa.float32()):
        raise ValueError(f"expected columns {wanted[:3]}…; found {names[:3]}…")
    feature_types = {table.schema.field(n).type for n in names[:-1]}
    if (feature_types != {pa.float32()} if columns else
            not (pa.types.is_fixed_size_list(table.schema.field("x").type)
                 and table.schema.field("x").type.value_type == pa.float32())):
        raise ValueError(f"expected float32 features; found {feature_types}")
    table.validate(full=True)
    if any(column.null_count for column in table.columns):
        raise ValueError("expected no nulls")
    y = table.column("y").to_numpy()
    if columns:
        return np.column_stack([table.column(n).to_numpy() for n in names[:-1]]), y
    x = table.column("x").combine_chunks()
    return x.flatten().to_numpy().reshape(len(x), x.type.list_size), y


def arrow_ipc(columns: bool, compression: str | None) -> Codec:
    def encode(shard: Any) -> bytes:
        table = arrow_table(*shard, columns)
        sink = pa.BufferOutputStream()
        options = ipc.IpcWriteOptions(compression=compression)
        with ipc.new_stream(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    def decode(data: bytes) -> Any:
        return arrow_arrays(ipc.open_stream(pa.py_buffer(data)).read_all(), columns)
    return encode, decode


def parquet(compression: str) -> Codec:
    def encode(shard: Any) -> bytes:
        sink = io.BytesIO()
        pq.write_table(arrow_table(*shard, False), sink, compression=compression)
        return sink.getvalue()

    def decode(data: bytes) -> Any:
        return arrow_arrays(pq.read_table(pa.py_buffer(data)), False)
    return encode, decode


def candidates(npz: types.ModuleType) -> dict[str, dict[str, Codec]]:
    """Payload kind -> candidate name -> (encode, decode), as the project calls them."""
    def state(module: Any) -> Codec:
        return (lambda p: module.encode_state(*p)), module.decode_state

    def shard(module: Any) -> Codec:
        return (lambda p: module.encode_arrays({"x": p[0], "y": p[1]})), module.decode_arrays

    shards = {"npz": shard(npz), "safetensors": shard(codec),
              "Arrow IPC, FixedSizeList": arrow_ipc(False, None),
              "Arrow IPC, FixedSizeList, zstd": arrow_ipc(False, "zstd"),
              "Arrow IPC, a column per feature": arrow_ipc(True, None),
              "Parquet (dictionary, snappy)": parquet("snappy"),
              "Parquet (dictionary, zstd)": parquet("zstd")}
    return {"weights": {"npz": state(npz), "safetensors": state(codec)},
            "result": {"npz": state(npz), "safetensors": state(codec)},
            "shard-hmnist": shards, "shard-table": shards}


def measure(payload: Any, contenders: dict[str, Codec], repeats: int) -> dict[str, Any]:
    """Encode and decode ms (median, min, max) and bytes of each contender, interleaved."""
    blobs = {name: encode(payload) for name, (encode, _) in contenders.items()}  # warm-up
    for name, (_, decode) in contenders.items():
        decode(blobs[name])
    times: dict[str, dict[str, list[float]]] = {n: {"encode": [], "decode": []} for n in contenders}
    for _ in range(repeats):
        for name, (encode, decode) in contenders.items():
            start = time.perf_counter()
            blob = encode(payload)
            middle = time.perf_counter()
            decode(blob)
            end = time.perf_counter()
            times[name]["encode"].append((middle - start) * 1000)
            times[name]["decode"].append((end - middle) * 1000)
    return {name: {"bytes": len(blobs[name]),
                   **{f"{op}_ms": {"median": round(statistics.median(v), 3),
                                   "min": round(min(v), 3), "max": round(max(v), 3)}
                      for op, v in times[name].items()}}
            for name in contenders}


def mutate(data: bytes, rng: random.Random) -> bytes:
    """1-4 mutations: a bit flip, an interesting word written over, a cut, an insertion, a
    deleted range (the mutations of tests/unit/core/test_codec.py's fuzz test)."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not out:
            break
        at, kind = rng.randrange(len(out)), rng.choice("fotid")
        if kind == "f":
            out[at] ^= 1 << rng.randrange(8)
        elif kind == "o":
            width = rng.choice([1, 2, 4, 8])
            value = rng.choice([0, 1, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**63 - 1])
            out[at:at + width] = (value % (1 << 8 * width)).to_bytes(width, "little")
        elif kind == "t":
            del out[at:]
        elif kind == "i":
            out[at:at] = rng.randbytes(rng.randint(1, 16))
        else:
            del out[at:at + rng.randint(1, 64)]
    return bytes(out)


def robustness(shards: dict[str, Codec], mutations: int) -> dict[str, dict[str, int]]:
    """Per format: mutated valid shards that decode, and the exception types of the rest."""
    rng = np.random.default_rng(1)
    small = (rng.integers(0, 256, (16, 12)).astype(np.float32), np.arange(16, dtype=np.int32))
    out = {}
    for name, (encode, decode) in shards.items():
        valid, tally, pick = encode(small), Counter(), random.Random(0)
        for _ in range(mutations):
            try:
                decode(mutate(valid, pick))
                tally["decoded"] += 1
            except Exception as exc:
                tally[type(exc).__name__] += 1
        out[name] = dict(tally.most_common())
    return out


def table(name: str, figures: dict[str, Any]) -> str:
    lines = [f"| {name} | encode ms | decode ms | bytes |", "|---|---|---|---|"]
    base = figures["npz"]
    for candidate, f in figures.items():
        lines.append(f"| {candidate} | {f['encode_ms']['median']:.2f} | "
                     f"{f['decode_ms']['median']:.2f} "
                     f"({base['decode_ms']['median'] / f['decode_ms']['median']:.1f}× npz) | "
                     f"{f['bytes']:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bucketlearn's stored-array formats, measured")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--mutations", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS / "codec.json")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {
        "benchmark": "codec", "date": now_iso(), "machine": machine(),
        "parameters": {"repeats": args.repeats, "mutations": args.mutations,
                       "npz_commit": NPZ_COMMIT, "mlp_shapes": MLP}, "figures": {}}
    everything, data = candidates(npz_codec()), payloads()
    for kind, contenders in everything.items():
        print(f"codec: {kind}", file=sys.stderr, flush=True)
        result["figures"][kind] = measure(data[kind], contenders, args.repeats)
    result["robustness"] = robustness(everything["shard-hmnist"], args.mutations)
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    write_result(args.out.parent, args.out.stem, result)
    for kind, figures in result["figures"].items():
        print(table(kind, figures) + "\n")
    print("| format (mutated shards) | outcomes |\n|---|---|")
    for name, tally in result["robustness"].items():
        print(f"| {name} | {', '.join(f'{k} {v}' for k, v in tally.items())} |")


if __name__ == "__main__":
    main()
    # Everything is written: skip the interpreter's teardown, where pyarrow's Parquet threads
    # now and then abort the process ("terminate called without an active exception", exit
    # 134; apache/arrow#34314): 3 of 35 runs here before this line
    sys.stdout.flush()
    os._exit(0)
