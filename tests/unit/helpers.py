"""Helpers shared by the unit tests: CSV builders and in-memory sources."""

from __future__ import annotations

import io
import json
import time
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bucketlearn.domain.lifecycle import REJECTED
from bucketlearn.options import JobOptions
from bucketlearn.usecases import upload as upload_service

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
REPO_DIR = Path(__file__).resolve().parents[2]


def csv_bytes(header: Sequence[str], rows: Iterable[Sequence[object]]) -> bytes:
    """A CSV (LF line ends, no quoting) as bytes."""
    lines = [",".join(header)] + [",".join(str(v) for v in row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def source_from_bytes(data: bytes, name: str = "upload.csv"):
    """An ingest.SourceFile reading from memory."""
    from bucketlearn.ingest.stream import SourceFile

    return SourceFile(display_name=name, size=len(data), opener=lambda: io.BytesIO(data))


def blobs_rows(n_rows: int, n_classes: int, n_features: int, seed: int = 0,
               spread: float = 8.0) -> list[list[object]]:
    """Well-separated Gaussian blobs, classes interleaved (row i has class i % n_classes)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=spread, size=(n_classes, n_features))
    rows = []
    for i in range(n_rows):
        c = i % n_classes
        x = centers[c] + rng.normal(size=n_features)
        rows.append([f"{v:.5f}" for v in x] + [c])
    return rows


def write_blobs_csv(path: Path, n_rows: int = 600, n_classes: int = 3, n_features: int = 4,
                    seed: int = 0) -> Path:
    header = [f"f{j}" for j in range(n_features)] + ["label"]
    path.write_bytes(csv_bytes(header, blobs_rows(n_rows, n_classes, n_features, seed)))
    return path


def write_imbalanced_csv(path: Path, counts: Sequence[int], n_features: int = 4, seed: int = 0,
                         spread: float = 2.0, informative: bool = True) -> Path:
    """A table with ``counts[c]`` rows of class ``c`` in a seeded order: Gaussian blobs (centres
    ``spread`` apart, overlapping for a small spread), or with ``informative=False`` the same
    feature values in every row, so no model can tell the classes apart."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=spread, size=(len(counts), n_features))
    labels = rng.permutation(np.repeat(np.arange(len(counts)), counts))
    rows = []
    for c in labels:
        x = centers[c] + rng.normal(size=n_features) if informative else np.ones(n_features)
        rows.append([f"{v:.5f}" for v in x] + [int(c)])
    header = [f"f{j}" for j in range(n_features)] + ["label"]
    path.write_bytes(csv_bytes(header, rows))
    return path


# --- bad-input cases (tests/data/bad/cases.json) -----------------------------------------------

BAD_DIR = DATA_DIR / "bad"
LONG_LINE_BYTES = 10 * 1000 * 1000  # the 'long_line' generator's line: 10 MB
LONG_NAME_CHARS = 1100  # the 'long_name' generator's object name (GCS allows 1024)


def load_bad_cases() -> list[dict]:
    """The bad-input manifest: one dict per case (see tests/data/bad/README.md)."""
    import json

    return json.loads((BAD_DIR / "cases.json").read_text(encoding="utf-8"))


def bad_case_path(case: dict, tmp_dir: Path) -> Path:
    """The file to upload for a case: committed under tests/data/bad, or generated into tmp_dir."""
    if case.get("generate") != "long_line":
        return BAD_DIR / case["file"]
    path = tmp_dir / case["file"]
    if not path.exists():
        rows = [f"{i}.5,{2 * i},{i % 2}".encode() for i in range(1, 13)]
        rows[4] = b"5.5," + b"x" * (LONG_LINE_BYTES - 6) + b",1"  # data row 5, column b
        path.write_bytes(b"a,b,label\n" + b"\n".join(rows) + b"\n")
    return path


def bad_case_object_name(case: dict) -> str:
    """The object name a case is uploaded under."""
    if case.get("generate") == "long_name":
        segment = "d" * 99 + "/"  # 100-character path segments, as a deep folder would give
        name = segment * (LONG_NAME_CHARS // 100)
        return name[: LONG_NAME_CHARS - len("long.csv")] + "long.csv"
    return case.get("object_name") or case["file"]


def bad_case_id(case: dict) -> str:
    return case["id"]


def expected_uri(bucket: str, name: str) -> str:
    """How the file must be named in the reason (control characters escaped, long names cut)."""
    plain = len(name) <= upload_service.MAX_OBJECT_NAME and not any(
        unicodedata.category(ch) == "Cc" or ch in "\u2028\u2029" for ch in name)
    return f"gs://{bucket}/{name}" if plain else upload_service.display_uri(bucket, name)


def assert_rejection_reason(job: dict[str, Any], case: dict[str, Any], bucket: str,
                            name: str) -> None:
    """The REJECTED job's error and error_detail say what the manifest says they say."""
    error, detail = job.error, job.error_detail
    uri = expected_uri(bucket, name)
    assert job.status == REJECTED and job.is_terminal, job
    assert error.startswith(uri), (error, uri)
    assert detail["file"] == uri
    assert (detail["row"], detail["column"]) == (case["row"], case["column"]), detail
    if case["row"] is not None:
        assert f"row {case['row']}" in error
    if case["column"] is not None:
        assert f"column '{case['column']}'" in error
    assert case["message_contains"] in detail["message"], detail
    assert case["expected_contains"] in detail["expected"], detail
    assert case["found_contains"] in detail["found"], detail
    assert f"expected {detail['expected']}" in error
    assert f"found: {detail['found']}" in error
    # one printable line: no object name or cell value can forge a log line
    assert not any(unicodedata.category(ch) == "Cc" for ch in error), repr(error)


def eventually(condition: Any, seconds: float = 5.0) -> bool:
    """Poll ``condition`` every 10 ms until it holds or ``seconds`` pass; its last value."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())


# --- malformed safetensors objects (codec and aggregator tests) ---------------------------------

_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "F16": 2, "BF16": 2, "I32": 4, "F32": 4,
             "I64": 8, "F64": 8, "C64": 8}


def tensor_entry(shape, dtype="F32", start=0, size=None):
    """A safetensors header entry: ``dtype`` and ``shape`` over the bytes [start, start + size)
    (default: the size they need)."""
    if size is None:
        size = int(np.prod(shape)) * _ITEMSIZE.get(dtype, 1)
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [start, start + size]}


def safetensors_bytes(header, body=None, length=None):
    """Bytes laid out as a safetensors object: the header's length (8 bytes, little-endian;
    ``length`` declares another), the header (a dict written as JSON, or bytes as given), then
    ``body`` (default: zeros up to the largest offset the header declares)."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    if body is None:
        ends = [entry["data_offsets"][1] for entry in header.values()
                if isinstance(entry, dict) and "data_offsets" in entry] \
            if isinstance(header, dict) else []
        body = b"\0" * max(ends, default=0)
    return (len(raw) if length is None else length).to_bytes(8, "little") + raw + body


# --- mixed-type tables ---------------------------------------------------------------------------

MIXED_HEADER = ["trip_id", "city", "payment", "distance", "fare", "start", "flag", "label"]


def mixed_rows(n_rows: int, seed: int = 0, missing: float = 0.1) -> list[list[object]]:
    """A table as people have them: an identifier, two text columns (one with missing cells),
    numbers with empty cells and markers, a timestamp, a constant column; the label depends on
    the city, the distance and the hour, so every kind of column carries signal."""
    rng = np.random.default_rng(seed)
    cities = ["Chicago", "Evanston", "Oak Park", "Skokie", "Cicero"]
    rows = []
    for i in range(n_rows):
        city = cities[int(rng.integers(len(cities)))]
        payment = ["cash", "card", "mobile"][int(rng.integers(3))]
        distance = float(rng.gamma(2.0, 3.0))
        hour = int(rng.integers(24))
        start = f"2024-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}T{hour:02d}:" \
                f"{int(rng.integers(60)):02d}:00"
        score = (city in ("Chicago", "Oak Park")) + (distance > 5) + (7 <= hour <= 9) \
            + 0.3 * float(rng.normal())
        label = "tip" if score >= 1.5 else "no_tip"
        fare = f"{2.5 + 1.8 * distance:.2f}"
        cells: list[object] = [f"T{i:06d}", city, payment, f"{distance:.3f}", fare, start, "Y",
                               label]
        if rng.random() < missing:
            cells[2] = ["", "NA"][int(rng.integers(2))]
        if rng.random() < missing:
            cells[3] = ["", "?", "null"][int(rng.integers(3))]
        if rng.random() < missing / 2:
            cells[5] = ""
        rows.append(cells)
    return rows


def write_mixed_csv(path: Path, n_rows: int = 600, seed: int = 0) -> Path:
    path.write_bytes(csv_bytes(MIXED_HEADER, mixed_rows(n_rows, seed)))
    return path


def random_date_strings(n: int, seed: int = 0) -> list[str]:
    """Valid ISO dates and timestamps, and near misses: bad days, months, hours, separators,
    truncations, tails."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        y, mo, d = int(rng.integers(1, 3000)), int(rng.integers(0, 14)), int(rng.integers(0, 33))
        text = f"{y:04d}-{mo:02d}-{d:02d}"
        if rng.random() < 0.6:
            text += ["T", " ", "x"][int(rng.integers(3))] + f"{int(rng.integers(0, 26)):02d}:" \
                    f"{int(rng.integers(0, 62)):02d}"
            if rng.random() < 0.6:
                text += f":{int(rng.integers(0, 62)):02d}"
        if rng.random() < 0.3:
            text += [".123", "Z", "+02:00", "-0500", "!", "0"][int(rng.integers(6))]
        if rng.random() < 0.15:
            text = text[:int(rng.integers(0, len(text)))]
        if rng.random() < 0.03:  # non-ASCII digits, a line break, a long tail
            text = [text.replace("2", "\uff12"), text + "\n", text + ".é" * 20][int(rng.integers(3))]
        out.append(text)
    return out


def outputs_without_bucketlearn(model_path: Path, rows: dict[str, list[list[object]]]
                                ) -> np.ndarray:
    """The outputs of an exported ``.keras`` on raw rows (one list of cells per input), loaded
    with plain Keras in safe mode in a fresh process where ``import bucketlearn`` fails."""
    import json
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import sys
        sys.modules["bucketlearn"] = None  # import bucketlearn fails
        import json, keras, numpy as np, tensorflow as tf
        model = keras.models.load_model({str(model_path)!r}, safe_mode=True, compile=False)
        rows = json.loads({json.dumps(rows)!r})
        feed = {{k: tf.constant(v) for k, v in rows.items()}}
        print(json.dumps(np.asarray(model(feed)).tolist()))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return np.array(json.loads(done.stdout.strip().splitlines()[-1]))


def wait_until(predicate: Any, timeout: float = 30.0, poll: float = 0.01) -> bool:
    """Whether ``predicate()`` held within ``timeout`` seconds (asked every ``poll``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return bool(predicate())


def write_search_table(path, n: int = 600, seed: int = 0):
    """Two classes from a number, a text column and an empty cell now and then."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        a, b = rng.normal(), rng.normal()
        colour = rng.choice(["red", "green", "blue"])
        label = "yes" if a + (colour == "red") + 0.3 * rng.normal() > 0.5 else "no"
        rows.append([f"{a:.4f}" if rng.random() > 0.05 else "", f"{b:.4f}", colour, label])
    path.write_bytes(csv_bytes(["a", "b", "colour", "label"], rows))
    return path


SEARCH_OPTIONS = JobOptions(epochs=9, rows_per_shard=64, patience=9)
