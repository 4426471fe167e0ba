"""Generated files: HMNIST-shaped CSVs and taxi-trip-like mixed-type CSVs, in a scratch
directory outside the repository (the benchmark datasets are in ``datasets``)."""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import MB, REPO


def make_hmnist_module() -> Any:
    """``data/make_hmnist.py`` (not a package) loaded by path."""
    spec = importlib.util.spec_from_file_location("bench_make_hmnist", REPO / "data" / "make_hmnist.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_hmnist(path: Path, count: int | None = None, size_mb: float | None = None,
                 sorted_by_label: bool = False, seed: int = 0) -> int:
    return int(make_hmnist_module().write_csv(str(path), count=count, size_mb=size_mb, seed=seed,
                                              sorted_by_label=sorted_by_label))


@contextlib.contextmanager
def scratch_dir(label: str) -> Iterator[Path]:
    """A temporary directory outside the repository, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"bucketlearn-bench-{label}-") as tmp:
        yield Path(tmp)


def warm_page_cache(path: Path) -> None:
    with open(path, "rb") as handle:
        while handle.read(16 << 20):
            pass


MIXED_HEADER = ("trip_id,start,city,payment,company,distance,fare,minutes,tip_pct,label")


def write_mixed(path: Path, size_mb: float, seed: int = 0, chunk: int = 50_000) -> int:
    """A mixed-type CSV of about ``size_mb`` MB, taxi-trip-like: an identifier, a timestamp, three
    text columns (one of 5,000 values), four numbers with empty cells and ``NA``, a text label.
    Returns the row count."""
    import numpy as np  # noqa: PLC0415 - numpy is only needed by the generators

    rng = np.random.default_rng(seed)
    cities = np.array(["Chicago", "Evanston", "Oak Park", "Skokie", "Cicero", "Berwyn"])
    payments = np.array(["Cash", "Credit Card", "Mobile", "Prcard", "NA", ""])
    companies = np.array([f"Company {i:04d}" for i in range(5000)])
    rows = 0
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(MIXED_HEADER + "\n")
        while handle.tell() < size_mb * MB:
            n = chunk
            ids = [f"{rows + i:012x}" for i in range(n)]
            day = rng.integers(0, 365 * 3, n)
            seconds = rng.integers(0, 86400, n)
            stamps = (np.datetime64("2022-01-01T00:00:00") + day.astype("timedelta64[D]")
                      + seconds.astype("timedelta64[s]")).astype(str)
            distance = rng.gamma(2.0, 3.0, n)
            fare = 3.25 + 2.25 * distance + rng.normal(0, 1, n)
            minutes = distance * 3 + rng.gamma(2.0, 2.0, n)
            tip = np.clip(rng.normal(12, 6, n), 0, None)
            blank = rng.random((n, 4)) < 0.05
            numbers = [np.where(blank[:, j], "", np.char.mod("%.2f", v))
                       for j, v in enumerate((distance, fare, minutes, tip))]
            numbers[3] = np.where(rng.random(n) < 0.02, "NA", numbers[3])
            label = np.where(tip > 15, "high", np.where(tip > 8, "mid", "low"))
            columns = [ids, stamps, cities[rng.integers(0, len(cities), n)],
                       payments[rng.integers(0, len(payments), n)],
                       companies[rng.zipf(1.3, n) % len(companies)], *numbers, label]
            handle.write("\n".join(",".join(cells) for cells in zip(*columns, strict=True)))
            handle.write("\n")
            rows += n
    return rows
