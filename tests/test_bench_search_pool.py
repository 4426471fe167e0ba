"""The pool search benchmark's projection and goals (``benchmarks/suites/search_pool.py``), on
figures made up for the purpose: no table is downloaded, no stack started here."""

from __future__ import annotations

import pytest

from benchmarks.suites import search_pool


def _stack(seconds: float, selected: list[int], accuracy: float = 0.9) -> dict:
    """Four candidates on one learner: two pruned after rung 0 (2 s), two finalists (2 s, then
    6 s and 4 s), in a ``seconds`` wall."""
    return {"seconds": seconds, "accuracy": accuracy, "selected": selected,
            "rung_seconds": {"0": [2.0, 6.0], "1": [2.0], "2": [2.0], "3": [2.0, 4.0]},
            "cost_usd": {"total": 0.01}}


def test_the_projection_schedules_each_rung_and_prices_every_segment() -> None:
    # Execute: 18 s of segments in a 20 s wall; no hop, then 0.5 s a segment
    bare = search_pool.projection(_stack(20.0, [0, 3]), 0.0)
    priced = search_pool.projection(_stack(20.0, [0, 3]), 0.5)
    # Assert: 2 s outside the segments; rung 0 takes 2 s and rung 1 6 s on 8 learners
    assert bare == pytest.approx({"8": 2 + 2 + 6, "32": 2 + 2 + 6})
    assert priced == pytest.approx({"8": 2 + 2.5 + 6.5, "32": 2 + 2.5 + 6.5})


def _cell(one: float, two: float, selected_two: list[int], rows: int) -> dict:
    return {"hgb": {"regression": False, "accuracy": 0.89, "rows": rows},
            "default": {"accuracy": 0.9, "seconds": 5.0, "tasks": 10},
            "one_process": {"seconds": one, "accuracy": 0.9, "selected": [0, 3]},
            "stack_1": _stack(20.0, [0, 3]), "stack_2": _stack(two, selected_two)}


def test_the_goals_follow_the_figures() -> None:
    result = {"figures": {"a": _cell(30.0, 15.0, [0, 3], 1000),
                          "b": _cell(30.0, 25.0, [3, 0], 200_000)}, "goals": []}
    # Execute
    search_pool.judge(result)
    met = {g["name"]: g["met"] for g in result["goals"]}
    # Assert
    assert met["a: stack wall on 2 learners / one process"]
    assert not met["b: stack wall on 2 learners / one process"]
    assert met["a: the same model on 1 and 2 learners and in one process (1: yes)"]
    assert not met["b: the same model on 1 and 2 learners and in one process (1: yes)"]
    assert met["a: searched model - HGB"] and met["a: searched model - default"]
    assert not met["a: projected speed-up on 8 learners"]  # 20 s / 10 s
    assert met["b: the searched job's cost (its own estimate)"]
    assert "a: the searched job's cost (its own estimate)" not in met  # under 100,000 rows
