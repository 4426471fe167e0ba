"""The rate-rule benchmark's one-shot ensemble (docs/TRAINING.md "What 8 learners
would need"): checked against the serial run it must reduce to, on the digits table."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.suites import rate_rule


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rate_rule")


def test_an_ensemble_of_one_is_serial_training(scratch: Path) -> None:
    """With k = 1 the ensemble is one model trained one task at a time on every shard: the
    serial cell's accuracy, to the bit. Fails if the ensemble skips shards, trains in another
    order, or reads its members' outputs wrongly."""
    serial = rate_rule.run_cell({"data": "digits", "R": 1, "seed": 0}, scratch)
    one = rate_rule.run_cell({"data": "digits", "R": 1, "seed": 0, "ensemble": 1}, scratch)
    assert one == serial


def test_an_ensemble_of_several_is_not_a_copy_of_one_model(scratch: Path) -> None:
    """k = 4 members each see a quarter of the shards: a different model from serial training,
    still far better than chance (10 classes)."""
    serial = rate_rule.run_cell({"data": "digits", "R": 1, "seed": 0}, scratch)
    four = rate_rule.run_cell({"data": "digits", "R": 1, "seed": 0, "ensemble": 4}, scratch)
    assert four != serial
    assert 0.5 < four <= 1.0
