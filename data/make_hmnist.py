"""Generate a synthetic HMNIST-shaped CSV (28x28 RGB: pixel0000…pixel2351, label) of any size.

The layout matches Kaggle's ``hmnist_28_28_RGB.csv``: 2,352 integer pixel columns in (row, col,
channel) order and a ``label`` column with 7 classes. Each class is a colour-tinted blob pattern
at its own position plus noise, so a small CNN or MLP learns it but not trivially. Rows are
written as they are generated (constant memory, any size).

Usage:
    python data/make_hmnist.py OUT.csv --rows 5000            # by row count
    python data/make_hmnist.py OUT.csv --size-mb 500          # until the file is ~500 MB
    python data/make_hmnist.py OUT.csv --rows 5000 --sorted   # grouped by label (worst case)
"""

from __future__ import annotations

import argparse
import os

import numpy as np

SIDE, CHANNELS, CLASSES = 28, 3, 7
FEATURES = SIDE * SIDE * CHANNELS


def class_templates(seed: int) -> np.ndarray:
    """One mean image per class: a tinted Gaussian blob at a class-specific place."""
    rng = np.random.default_rng([seed, 1])
    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    templates = np.empty((CLASSES, SIDE, SIDE, CHANNELS))
    for c in range(CLASSES):
        cy, cx = rng.uniform(6, 22, size=2)
        blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * rng.uniform(3, 6) ** 2))
        tint = rng.uniform(0.3, 1.0, size=CHANNELS)
        templates[c] = 60 + 150 * blob[..., None] * tint
    return templates


def rows(count: int | None, seed: int, sorted_by_label: bool, chunk: int = 512):
    """Yield (pixels[int], label) rows; with ``sorted_by_label`` grouped class by class."""
    rng = np.random.default_rng([seed, 2])
    templates = class_templates(seed)
    produced = 0
    while count is None or produced < count:
        n = chunk if count is None else min(chunk, count - produced)
        if sorted_by_label and count is not None:
            labels = (np.arange(produced, produced + n) * CLASSES) // count
        else:
            labels = rng.integers(0, CLASSES, size=n)
        shift = rng.integers(-2, 3, size=(n, 2))
        noise = rng.normal(0, 28, size=(n, SIDE, SIDE, CHANNELS))
        for i in range(n):
            image = np.roll(templates[labels[i]], tuple(shift[i]), axis=(0, 1)) + noise[i]
            yield np.clip(image, 0, 255).astype(np.int64).reshape(-1), int(labels[i])
        produced += n


def write_csv(path: str, count: int | None = None, size_mb: float | None = None, seed: int = 0,
              sorted_by_label: bool = False) -> int:
    """Write the CSV; stop after ``count`` rows or once the file reaches ``size_mb``."""
    if count is None and size_mb is None:
        raise ValueError("give a row count or a size in MB")
    if sorted_by_label and count is None:
        raise ValueError("--sorted needs --rows (the class boundaries depend on the count)")
    limit = None if size_mb is None else int(size_mb * 1024 * 1024)
    written = 0
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(",".join([f"pixel{i:04d}" for i in range(FEATURES)] + ["label"]) + "\n")
        for pixels, label in rows(count, seed, sorted_by_label):
            handle.write(",".join(map(str, pixels.tolist())) + f",{label}\n")
            written += 1
            if limit is not None and written % 256 == 0 and handle.tell() >= limit:
                break
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--rows", type=int)
    parser.add_argument("--size-mb", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sorted", action="store_true", help="group rows by label")
    args = parser.parse_args()
    count = write_csv(args.out, args.rows, args.size_mb, args.seed, args.sorted)
    print(f"wrote {count} rows, {os.path.getsize(args.out) / 1e6:.1f} MB to {args.out}")


if __name__ == "__main__":
    main()
