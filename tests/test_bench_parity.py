"""The parity benchmark's checkpoint (a run stopped part-way is taken up where it stopped) and
its merge of several invocations.

The full parity matrix runs for hours; a run the OOM killer stopped after 95 minutes once lost
everything, because results were written only at the end.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from benchmarks.suites import parity
from benchmarks.tools import merge_parity


def _seed_figures(serial: float, pipeline: float) -> dict:
    run = {"status": "DONE", "accuracy": pipeline, "versions": 3, "parallel_tasks": 1,
           "tasks_applied": 6, "seconds": 1.0, "error": None}
    return {"serial": serial, "fit": None, "pipeline": {"sim-2": [run]}, "rows": 1797,
            "holdout_rows": 360, "model": "mlp"}


def test_a_checkpointed_seed_is_not_run_again_and_the_file_goes_once_done(tmp_path: Path
                                                                          ) -> None:
    # Prepare: a checkpoint that already holds the smoke run's only seed (figures no training
    # gives, so the result shows where they came from)
    params = copy.deepcopy(parity.SMOKE)
    params["fit_reference"] = False
    saved = parity.Checkpoint(tmp_path, params)
    saved.seed_done("digits/shuffled/0", _seed_figures(0.5, 0.25))
    # Execute
    result = parity.run(tmp_path, params=params)
    # Assert
    cell = result["figures"]["digits/shuffled"]
    assert cell["serial"] == 0.5 and cell["rows"] == 1797
    assert cell["pipeline"]["sim-2"]["mean_gap_pp"] == -25.0
    assert not (tmp_path / "parity.partial.json").exists()


def test_a_checkpoint_is_taken_up_by_the_same_measurement_and_kept_aside_otherwise(
        tmp_path: Path) -> None:
    # Prepare
    params = copy.deepcopy(parity.SMOKE)
    parity.Checkpoint(tmp_path, params).seed_done("digits/shuffled/0", _seed_figures(0.5, 0.5))
    more_seeds = {**params, "seeds": [0, 1], "held_out": ["digits"]}  # the same measurement
    other = {**params, "sim_workers": [4]}  # another measurement
    # Execute
    same = parity.Checkpoint(tmp_path, more_seeds)
    different = parity.Checkpoint(tmp_path, other)
    # Assert
    assert list(same.seeds) == ["digits/shuffled/0"]
    assert different.seeds == {} and different.stack == {}
    aside = tmp_path / "parity.partial.json.stale-0"
    assert not (tmp_path / "parity.partial.json").exists() and aside.exists()
    assert "digits/shuffled/0" in json.loads(aside.read_text())["seeds"]


def test_stack_runs_in_the_checkpoint_are_returned_without_starting_a_stack(tmp_path: Path
                                                                            ) -> None:
    # Prepare: every run of the todo list is done (no emulators are started if nothing is left)
    todo = [("digits", "sorted", 0, tmp_path / "x.csv", None)]
    done = {parity.run_key("digits", "sorted", 0, r): {"status": "DONE", "accuracy": 0.9 + r}
            for r in range(2)}
    # Execute
    found = parity.stack_runs(todo, 2, 2, 1, tmp_path, done=done)
    # Assert
    assert found == {("digits", "sorted", 0, 0): done["digits/sorted/0/0"],
                     ("digits", "sorted", 0, 1): done["digits/sorted/0/1"]}


def _cell(serial: float, runs: dict, held_out: bool = False) -> dict:
    return {"dataset": "digits", "order": "sorted", "held_out": held_out, "rows": 1797,
            "holdout_rows": 360, "model": "mlp",
            "seeds": {"0": {"serial": serial, "fit": None, "pipeline": runs}}}


def _run(accuracy: float) -> dict:
    return {"status": "DONE", "accuracy": accuracy, "versions": 3, "parallel_tasks": 1}


def test_merging_keeps_every_stack_run_and_one_copy_of_the_simulation() -> None:
    # Prepare: two invocations of the same cell and seed
    cells = {"digits/sorted": _cell(0.9, {"sim-8": [_run(0.9)], "stack-2": [_run(0.9)]})}
    other = {"digits/sorted": _cell(0.9, {"sim-8": [_run(0.9)], "stack-2": [_run(0.89)],
                                          "stack-4": [_run(0.91)]})}
    # Execute
    problems = merge_parity.merge_cells(cells, other)
    result = {"goals": [], "notes": []}
    parity.conclude(result, cells)
    # Assert
    assert problems == []
    runs = cells["digits/sorted"]["seeds"]["0"]["pipeline"]
    assert [r["accuracy"] for r in runs["stack-2"]] == [0.9, 0.89]
    assert len(runs["sim-8"]) == 1 and [r["accuracy"] for r in runs["stack-4"]] == [0.91]
    assert cells["digits/sorted"]["pipeline"]["stack-2"]["worst_gap_pp"] == pytest.approx(-1.0)
    assert [g["met"] for g in result["goals"]] == [True, True, True]


def test_merging_refuses_simulations_that_disagree() -> None:
    cells = {"digits/sorted": _cell(0.9, {"sim-8": [_run(0.9)]})}
    other = {"digits/sorted": _cell(0.9, {"sim-8": [_run(0.8)]})}
    assert merge_parity.merge_cells(cells, other) == ["digits/sorted seed 0: sim-8 differs"]


def test_a_checkpoint_of_a_stopped_run_reads_as_a_result_of_what_it_holds(tmp_path: Path
                                                                          ) -> None:
    # Prepare: seed 0 measured with one stack run; seed 1 never reached
    params = {**copy.deepcopy(parity.SMOKE), "seeds": [0, 1],
              "stack": {"workers": [2], "repeats": 2}}
    saved = parity.Checkpoint(tmp_path, params)
    saved.seed_done("digits/shuffled/0", _seed_figures(0.5, 0.5))
    saved.stack_done(2, ("digits", "shuffled", 0, 0), _run(0.49))
    # Execute
    result = merge_parity.load(tmp_path / "parity.partial.json")
    parity.conclude(result, result["figures"])
    # Assert
    cell = result["figures"]["digits/shuffled"]
    assert list(cell["seeds"]) == ["0"] and cell["rows"] == 1797
    assert cell["pipeline"]["stack-2"]["runs"] == 1
    assert cell["pipeline"]["stack-2"]["mean_gap_pp"] == pytest.approx(-1.0)
