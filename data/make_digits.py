"""Write scikit-learn's bundled 8x8 digits (1,797 rows) as an HMNIST-layout CSV.

Usage: python data/make_digits.py [OUT.csv]   (needs scikit-learn; the result is committed)
"""

from __future__ import annotations

import sys

import numpy as np


def main(out: str = "data/digits.csv") -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = digits.data.astype(np.int64)
    header = ",".join([f"pixel{i:04d}" for i in range(pixels.shape[1])] + ["label"])
    with open(out, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(header + "\n")
        for row, label in zip(pixels, digits.target, strict=True):
            handle.write(",".join(map(str, row)) + f",{label}\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
