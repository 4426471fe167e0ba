"""Continued training on the whole local stack, as a user runs it: penguins.csv in two halves,
``submit --continue-from`` on the second, the status naming the parent with its model's figures
on the new holdout, the downloaded model predicting the parent's raw rows; a file missing one
of the parent's columns is REJECTED naming it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import REPO, cli, submit_and_wait

pytestmark = pytest.mark.e2e

PENGUINS = REPO / "data" / "penguins.csv"
PENGUINS_NEW = REPO / "data" / "penguins_new.csv"


@pytest.fixture(scope="module")
def stack(make_module_stack: Any) -> Any:
    return make_module_stack("continued", workers=1)


@pytest.fixture(scope="module")
def halves(tmp_path_factory: Any) -> tuple[Path, Path]:
    """penguins.csv shuffled, in two halves of 172 rows."""
    header, *rows = PENGUINS.read_text().splitlines()
    random.Random(1).shuffle(rows)
    folder = tmp_path_factory.mktemp("halves")
    first, second = folder / "penguins_a.csv", folder / "penguins_b.csv"
    first.write_text("\n".join([header, *rows[:172]]) + "\n")
    second.write_text("\n".join([header, *rows[172:]]) + "\n")
    return first, second


@pytest.fixture(scope="module")
def parent(stack: Any, halves: tuple[Path, Path]) -> dict[str, Any]:
    status = submit_and_wait(stack, halves[0], "--label-column", "species", "--epochs", "5")
    assert status["status"] == "DONE", status
    return status


def test_a_job_continued_on_the_second_half_names_its_parent(stack: Any, halves: Any,
                                                             parent: dict[str, Any],
                                                             tmp_path: Path) -> None:
    # Execute
    status = submit_and_wait(stack, halves[1], "--continue-from", parent["job_id"],
                             "--epochs", "5")
    # Assert
    assert status["status"] == "DONE", status
    continued = status["continued_from"]
    assert (continued["job_id"], continued["version"]) == (parent["job_id"],
                                                           parent["model_version"])
    assert 0 <= continued["parent_holdout"]["accuracy"] <= 1
    assert continued["parent_holdout"]["rows"] == 35
    model = tmp_path / "child.keras"
    assert cli(stack, "download", status["job_id"], "-o", str(model)).returncode == 0
    predicted = json.loads(cli(stack, "predict", str(model), str(PENGUINS_NEW),
                               "--json").stdout)
    assert all(p in ("Adelie", "Chinstrap", "Gentoo") for p in predicted["predictions"])


def test_a_file_without_one_of_the_parents_columns_is_rejected_naming_it(
        stack: Any, halves: Any, parent: dict[str, Any], tmp_path: Path) -> None:
    # Prepare
    lines = [line.split(",") for line in halves[1].read_text().splitlines()]
    at = lines[0].index("bill_length_mm")
    narrow = tmp_path / "narrow.csv"
    narrow.write_text("\n".join(",".join(c for i, c in enumerate(line) if i != at)
                                for line in lines) + "\n")
    # Execute
    status = submit_and_wait(stack, narrow, "--continue-from", parent["job_id"])
    # Assert
    assert status["status"] == "REJECTED", status
    assert status["error_detail"]["column"] == "bill_length_mm"
    assert "continued from job" in status["error"]
