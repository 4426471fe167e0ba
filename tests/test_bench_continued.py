"""The continued-training benchmark's pure parts (``benchmarks/suites/continued.py``): the
split into kept-back test rows and two halves, the check that a CSV has a record a line, and
the goals on figures made up for the purpose (no stack started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.suites.continued import data_lines, judge, split_rows, tables


def test_the_split_keeps_a_fifth_back_and_halves_the_rest_without_overlap() -> None:
    # Prepare
    rows = [f"row-{i}" for i in range(101)]
    # Execute
    test, first, second = split_rows(rows, 0.2, seed=0)
    # Assert
    assert len(test) == 20 and len(first) == 40 and len(second) == 41
    assert sorted(test + first + second) == sorted(rows)
    assert test == [r for r in rows if r in set(test)]  # kept back in file order
    assert first != sorted(first, key=rows.index)  # the halves are shuffled


def test_the_split_is_fixed_by_its_seed() -> None:
    # Prepare
    rows = [str(i) for i in range(200)]
    # Execute
    again = split_rows(rows, 0.2, seed=3) == split_rows(list(rows), 0.2, seed=3)
    other = split_rows(rows, 0.2, seed=3) != split_rows(rows, 0.2, seed=4)
    # Assert
    assert again and other


def test_a_quoted_cell_spanning_lines_is_refused(tmp_path: Path) -> None:
    # Prepare
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    good.write_text('a,b\n1,"x"\n2,y\n')
    bad.write_text('a,b\n1,"two\nlines"\n2,y\n')
    # Execute
    header, rows = data_lines(good)
    # Assert
    assert (header, rows) == ("a,b", ['1,"x"', "2,y"])
    with pytest.raises(ValueError, match="spans lines"):
        data_lines(bad)


def _job(wall: float, **test: float) -> dict:
    return {"wall_seconds": wall, "test": test}


def test_the_goals_follow_the_figures() -> None:
    # Prepare: a numeric target 0.005 of R² below and at half the wall; classes 2 points below
    # and at 0.8 of the wall
    result = {"ratios": {}, "goals": [], "figures": {
        "near": {"regression": True, "all": _job(100.0, r2=0.90), "parent": _job(60.0, r2=0.85),
                 "continued": _job(50.0, r2=0.895)},
        "far": {"regression": False, "all": _job(10.0, accuracy=0.90),
                "parent": _job(6.0, accuracy=0.85), "continued": _job(8.0, accuracy=0.88)}}}
    # Execute
    judge(result)
    met = {g["name"].split(":")[0] + ("/wall" if "wall" in g["name"] else "/model"): g["met"]
           for g in result["goals"]}
    # Assert
    assert met == {"near/model": True, "near/wall": True, "far/model": False, "far/wall": False}
    assert result["ratios"]["near"]["parent_plus_continued_over_all"] == pytest.approx(1.1)
    assert result["ratios"]["far"]["continued_minus_all"] == pytest.approx(-2.0)


def test_a_variant_gets_its_ratios_and_a_row_but_no_goal() -> None:
    # Prepare: B continued again with epochs=5, at a fifth of the all-rows wall, R² 0.02 below
    cell = {"regression": True, "rows": {"all": 10, "a": 5, "b": 5, "test": 3},
            "all": _job(100.0, r2=0.90), "parent": _job(60.0, r2=0.85),
            "continued": _job(50.0, r2=0.895), "continued-e5": _job(20.0, r2=0.88)}
    for key in ("all", "parent", "continued", "continued-e5"):
        cell[key].update(epochs=5, stop_epoch=5, best_epoch=4, rows_seen=100,
                         test={**cell[key]["test"], "rmse": 1.0})
    result = {"params": {"variants": {"continued-e5": {"epochs": 5}}}, "ratios": {},
              "goals": [], "figures": {"t": cell}}
    # Execute
    judge(result)
    jobs, ratios = (rows for _, _, rows in tables(result))
    # Assert
    assert result["ratios"]["t"]["continued-e5_over_all"] == pytest.approx(0.2)
    assert result["ratios"]["t"]["continued-e5_minus_all"] == pytest.approx(-0.02)
    assert len(result["goals"]) == 2
    assert [row[1] for row in jobs][-1] == "continued (B), epochs=5"
    assert [row[3] for row in ratios] == ["0.50", "0.20"]
