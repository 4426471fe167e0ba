"""Timing a call and summarizing what was measured: means, medians, percentiles, gaps."""

from __future__ import annotations

import time
from typing import Any


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and its wall time in seconds (perf_counter)."""
    started = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - started


def mean(values: list[float]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def median(values: list[float]) -> float | None:
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def stats(values: list[float]) -> dict[str, float | None]:
    """Count, total, median, p90 and max of a list of seconds."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return {"n": 0, "total": None, "median": None, "p90": None, "max": None}
    return {"n": len(ordered), "total": round(sum(ordered), 4), "median": round(median(ordered), 4),
            "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 4),
            "max": round(ordered[-1], 4)}


def gap(serial: float, run: dict[str, Any], regression: bool) -> float:
    """A run's gap to serial training: points of accuracy, or for a numeric target how much
    lower its RMSE is, in percent of serial training's (both: positive is the pipeline better)."""
    if regression:
        return (serial - run["rmse"]) / serial * 100
    return (run["accuracy"] - serial) * 100
