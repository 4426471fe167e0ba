"""Where things are, and the unit sizes are given in."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
DIGITS = REPO / "data" / "digits.csv"
CACHE = REPO / ".cache"  # public datasets fetched from the package index, kept between runs
MB = 1_000_000  # file sizes, throughput and RSS are all in MB = 10^6 bytes
