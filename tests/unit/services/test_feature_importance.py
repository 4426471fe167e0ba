"""A finished job says which columns its model relies on: permutation importance of each
original column on the holdout, in the job document and ``status --json``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bucketlearn.bootstrap import memory_services
from bucketlearn.entrypoints.cli.printing import print_status
from bucketlearn.local.simulation import simulate_pipeline
from bucketlearn.options import JobOptions
from bucketlearn.usecases.status import status_object


def write_planted(path: Path, rows: int = 1200, seed: int = 0) -> None:
    """Classes from ``signal`` (mostly) and ``helper`` (a little) and the text column
    ``shade``; ``noise`` is planted: drawn apart from everything."""
    rng = np.random.default_rng(seed)
    signal, helper, noise = rng.normal(size=(3, rows))
    shade = rng.choice(["red", "blue"], size=rows)
    score = 2 * signal + 0.7 * helper + np.where(shade == "red", 0.8, -0.8)
    label = np.where(score > 0, "yes", "no")
    lines = ["noise,signal,shade,helper,label"]
    lines += [f"{n:.4f},{s:.4f},{c},{h:.4f},{y}"
              for n, s, c, h, y in zip(noise, signal, shade, helper, label, strict=True)]
    path.write_text("\n".join(lines) + "\n")


def test_a_planted_irrelevant_column_is_ranked_last(tmp_path: Path, capsys) -> None:
    # Prepare
    write_planted(tmp_path / "planted.csv")
    # Execute: upload, learners and aggregator on the in-memory ports, to DONE
    out = simulate_pipeline(str(tmp_path / "planted.csv"), JobOptions(epochs=8), workers=1,
                            svc=memory_services())
    # Assert
    job = out["job"]
    assert job.status == "DONE", job.error
    status = status_object(job)
    ranked = [c["column"] for c in status["feature_importance"]]
    assert sorted(ranked) == ["helper", "noise", "shade", "signal"]
    assert ranked[0] == "signal" and ranked[-1] == "noise", status["feature_importance"]
    assert job.feature_importance["metric"] == "accuracy"
    assert job.feature_importance["rows"] == job.dataset["holdout_rows"]
    assert abs(status["feature_importance"][-1]["importance"]) < 0.02
    print_status(status)  # what `bucketlearn status` prints
    assert "relies on: signal " in capsys.readouterr().out


def test_a_numeric_targets_columns_are_ranked_by_their_fall_in_r2(tmp_path: Path) -> None:
    # Prepare: the target is 3 x signal; noise is planted
    rng = np.random.default_rng(1)
    signal, noise = rng.normal(size=(2, 800))
    lines = ["signal,noise,target"] + [f"{s:.4f},{n:.4f},{3 * s + 10:.4f}"
                                       for s, n in zip(signal, noise, strict=True)]
    (tmp_path / "numbers.csv").write_text("\n".join(lines) + "\n")
    # Execute
    out = simulate_pipeline(str(tmp_path / "numbers.csv"), JobOptions(epochs=5), workers=1,
                            svc=memory_services())
    # Assert
    job = out["job"]
    assert job.status == "DONE", job.error
    found = job.feature_importance
    assert found["metric"] == "r2" and found["baseline"] > 0.9
    assert [c["column"] for c in found["columns"]] == ["signal", "noise"]
    assert found["columns"][0]["importance"] > 1.0  # shuffled, R² falls below 0
