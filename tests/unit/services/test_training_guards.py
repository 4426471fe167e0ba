"""No silently broken model (invariant 9), on the in-memory ports: a non-finite or outlying
delta is never folded (its task is trained again, the job records why); a task whose results
keep being refused fails for good; a diverging job ends FAILED with advice, not DONE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bucketlearn import layout
from bucketlearn.aggregation import writer as aggregator
from bucketlearn.bootstrap import memory_services
from bucketlearn.domain import fold
from bucketlearn.domain.lifecycle import DONE, FAILED
from bucketlearn.local.simulation import simulate_pipeline
from bucketlearn.loops.learner import Learner
from bucketlearn.options import JobOptions
from tests.unit.helpers import csv_bytes
from tests.unit.steps import run_rounds, start_job, write_bad_result


def train_round(svc: Any) -> None:
    learner = Learner(svc, "w-good")
    while (received := svc.queue.pull(0)) is not None:
        learner.handle(received)
        received.ack()


def test_a_nan_delta_is_refused_and_its_task_trained_again(tmp_path: Path) -> None:
    """The round is not folded while one result holds a NaN: that result is deleted, its task
    published again and the job records the refusal; the retrained task completes the round."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    bad = write_bad_result(svc, job_id, "nan")
    train_round(svc)  # the round's other task
    before = len(svc.queue.published)
    # Execute
    aggregator.aggregate_job(svc, job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    again = svc.queue.published[before:]
    assert job.version == 0 and job.deltas_refused == 1
    assert "not finite" in job.last_refusal
    assert svc.store.stat(svc.settings.deltas_bucket, bad) is None
    assert [m.task_index for m in again] == [0] and again[0].base_version == 0
    # Execute: the task is trained again and the job goes on
    run_rounds(svc, job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    versions = svc.registry.list_versions(job_id)
    assert job.status == DONE
    assert all(np.isfinite(v.figure("holdout_loss")) for v in versions[1:])


def test_an_outlying_delta_is_refused(tmp_path: Path) -> None:
    """Once the job has folded a round, a delta 1,000 times the size of its own training's is
    refused as an outlier (never folded)."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    train_round(svc)
    aggregator.aggregate_job(svc, job_id)  # round 0 folded: the job has a delta norm
    assert svc.registry.get_job(job_id).version == 1
    write_bad_result(svc, job_id, "huge")
    train_round(svc)
    # Execute
    aggregator.aggregate_job(svc, job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    assert job.version == 1 and job.deltas_refused == 1
    assert "the job's recent deltas" in job.last_refusal


def test_a_task_refused_three_times_fails_the_job_with_the_reason(tmp_path: Path) -> None:
    """A task whose result is refused MAX_REFUSALS times fails for good; with
    max_failed_tasks=0 the job ends FAILED naming the task and the refusal."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=1, parallel_tasks=2)
    # Execute
    for _ in range(fold.MAX_REFUSALS):
        write_bad_result(svc, job_id, "nan")
        train_round(svc)
        aggregator.aggregate_job(svc, job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    assert job.status == FAILED
    assert "refused 3 times" in job.error and "not finite" in job.error
    assert job.error.startswith("1 task(s) failed for good")


@pytest.fixture(scope="module")
def overlapping_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 rows of 3 overlapping classes in 12 features: learnable, not separable."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 3000)
    x = rng.normal(0, 1.0, (3, 12))[labels] + rng.normal(0, 1.5, (3000, 12))
    rows = [[f"{v:.4f}" for v in row] + [int(c)] for row, c in zip(x, labels, strict=True)]
    path = tmp_path_factory.mktemp("diverge") / "overlap.csv"
    path.write_bytes(csv_bytes([f"f{j}" for j in range(12)] + ["label"], rows))
    return path


def test_a_diverging_job_ends_failed_with_advice_not_done(overlapping_csv: Path) -> None:
    """The learning_rate=1 job: before, it ended DONE with a model that answered one
    class (accuracy 0.33). Now it ends FAILED saying training diverged and which learning rate
    to try, and no model is exported."""
    # Execute
    out = simulate_pipeline(str(overlapping_csv),
                            JobOptions(epochs=3, learning_rate=1.0, rows_per_shard=64,
                                       batch_size=32),
                            workers=2, svc=memory_services())
    # Assert
    job, svc = out["job"], out["svc"]
    assert job.status == FAILED
    assert "training diverged" in job.error and "learning_rate" in job.error
    assert svc.store.stat(svc.settings.models_bucket, layout.model_path(job.job_id)) is None


def test_the_same_data_at_a_sane_learning_rate_is_done(overlapping_csv: Path) -> None:
    """The guard does not fire on a healthy job: the same file at the default rate is DONE
    well above chance."""
    # Execute
    out = simulate_pipeline(str(overlapping_csv), JobOptions(epochs=2, rows_per_shard=64),
                            workers=2, svc=memory_services())
    # Assert
    job = out["job"]
    assert job.status == DONE and job.head.holdout_accuracy > 0.6
    assert not job.deltas_refused
