"""Helpers shared by the unit tests: CSV builders and in-memory sources."""

from __future__ import annotations

import io
import time
import unicodedata
import warnings
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bucketlearn.services import jobs
from bucketlearn.services import upload as split

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
REPO_DIR = Path(__file__).resolve().parents[2]


def csv_bytes(header: Sequence[str], rows: Iterable[Sequence[object]]) -> bytes:
    """A CSV (LF line ends, no quoting) as bytes."""
    lines = [",".join(header)] + [",".join(str(v) for v in row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def source_from_bytes(data: bytes, name: str = "upload.csv"):
    """An ingest.SourceFile reading from memory."""
    from bucketlearn.ingest.split import SourceFile

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
    plain = len(name) <= split.MAX_OBJECT_NAME and not any(
        unicodedata.category(ch) == "Cc" or ch in "\u2028\u2029" for ch in name)
    return f"gs://{bucket}/{name}" if plain else split.display_uri(bucket, name)


def assert_rejection_reason(job: dict[str, Any], case: dict[str, Any], bucket: str,
                            name: str) -> None:
    """The REJECTED job's error and error_detail say what the manifest says they say."""
    error, detail = job["error"], job["error_detail"]
    uri = expected_uri(bucket, name)
    assert job["status"] == jobs.REJECTED and jobs.is_terminal(job), job
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


# --- malformed .npz archives (codec and aggregator tests) ---------------------------------------

def npy_member(shape, descr="<f4", fortran=False, body=None, version=(1, 0)):
    """A .npy member: a header declaring ``shape``/``descr`` and ``body`` (default: zeros)."""
    buffer = io.BytesIO()
    header = {"descr": descr, "fortran_order": fortran, "shape": shape}
    if version == (1, 0):
        np.lib.format.write_array_header_1_0(buffer, header)
    else:
        np.lib.format.write_array_header_2_0(buffer, header)
    if body is None:
        body = b"\0" * (int(np.prod(shape)) * np.dtype(descr).itemsize)
    return buffer.getvalue() + body


def zip_archive(*members, compression=zipfile.ZIP_STORED):
    """A zip archive of (name, bytes) members."""
    buffer = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buffer, "w", compression=compression) as zf:
        warnings.simplefilter("ignore")  # "Duplicate name": wanted, for one case
        for name, data in members:
            zf.writestr(name, data)
    return buffer.getvalue()


def deflated_with_bad_stream():
    """A deflated member whose compressed bytes are damaged (zlib.error when inflated)."""
    good = zip_archive(("w0000.npy", npy_member((64,))), compression=zipfile.ZIP_DEFLATED)
    start = good.index(b"w0000.npy") + len("w0000.npy") + 5
    return good[:start] + bytes(b ^ 0x5A for b in good[start:start + 20]) + good[start + 20:]
