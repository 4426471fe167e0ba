"""Helpers shared by the unit tests: CSV builders and in-memory sources."""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
REPO_DIR = Path(__file__).resolve().parents[2]


def csv_bytes(header: Sequence[str], rows: Iterable[Sequence[object]]) -> bytes:
    """A CSV (LF line ends, no quoting) as bytes."""
    lines = [",".join(header)] + [",".join(str(v) for v in row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def source_from_bytes(data: bytes, name: str = "upload.csv"):
    """An ingest.SourceFile reading from memory."""
    from bucketlearn.ingest import SourceFile

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
