"""The search benchmark's projection and goals (``benchmarks/suites/search.py``), on figures
made up for the purpose: no table is downloaded or trained here."""

from __future__ import annotations

import pytest

from benchmarks.suites import search


def _run(seconds: float) -> dict:
    """Four candidates: two pruned after rung 0 (2 s each, 10 tasks), two finalists (2 s, then
    6 s and 4 s, 30 and 20 tasks)."""
    candidates = [
        {"index": 0, "rung_seconds": [2.0, 6.0], "rung_tasks": [10, 30]},
        {"index": 1, "rung_seconds": [2.0], "rung_tasks": [10]},
        {"index": 2, "rung_seconds": [2.0], "rung_tasks": [10]},
        {"index": 3, "rung_seconds": [2.0, 4.0], "rung_tasks": [10, 20]},
    ]
    return {"seconds": seconds, "candidates": candidates}


def test_the_projection_schedules_each_rung_and_prices_every_task() -> None:
    # Execute: 18 s of candidate training in a 20 s run; no hop, then 0.1 s a task
    bare = search.projection(_run(20.0), 0.0)
    priced = search.projection(_run(20.0), 0.1)
    # Assert: 2 s outside the candidates; rung 0 is 8 s on one learner, 4 on two, 2 on 8
    assert bare == pytest.approx({"1": 2 + 8 + 10, "2": 2 + 4 + 6, "8": 2 + 2 + 6,
                                  "32": 2 + 2 + 6})
    # each rung-0 candidate 2 + 1 s; the finalists 6 + 3 and 4 + 2 s
    assert priced["1"] == pytest.approx(2 + 12 + 15)
    assert priced["2"] == pytest.approx(2 + 6 + 9)


def _cell(table: str, search_vs_default: float, search_vs_hgb: float, regression: bool,
          one: float, two: float, eight: float, default: float) -> dict:
    projected = {"1": one, "2": two, "8": eight, "32": eight}
    return {"table": table, "hgb": {"regression": regression},
            "search_vs_default": search_vs_default, "search_vs_hgb": search_vs_hgb,
            "projected": projected,
            "speedup": {w: one / s for w, s in projected.items()},
            "search_wall_ratio": {w: s / default for w, s in projected.items()}}


def test_the_goals_follow_the_figures() -> None:
    cells = [_cell("a", 0.5, 1.2, False, 100.0, 60.0, 19.0, 15.0),
             _cell("b", -0.1, -0.005, True, 100.0, 75.0, 25.0, 10.0)]
    result = {"figures": {c["table"]: c for c in cells}, "ratios": {}, "goals": []}
    # Execute
    search.judge(result)
    met = {g["name"]: g["met"] for g in result["goals"]}
    # Assert
    assert not met["tables where the searched model is at least the default"]
    assert met["tables within 1 point of HGB (a numeric target within 0.01 of its R²)"]
    # mean of 1.2 points and -0.5 hundredths of R²: above 0
    assert met["mean over the tables against HGB (points; R² in hundredths)"]
    assert met["a: projected wall on 2 learners / 1"] and not met["b: projected wall on 2 learners / 1"]
    assert met["a: projected speed-up on 8 learners"] and not met["b: projected speed-up on 8 learners"]
    assert not met["b: searched wall on 8 learners / the default's"]
    assert met["a: searched wall on 8 learners / the default's"]
