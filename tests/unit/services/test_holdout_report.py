"""Holdout figures beyond accuracy and the class_weight option, wired through the evaluation,
the aggregator, train-local, the status object and the CLI (in-memory ports)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bucketlearn import codec
from bucketlearn.aggregation.writer import aggregate_job
from bucketlearn.bootstrap import memory_services
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import DONE
from bucketlearn.domain.metrics import confusion_rows
from bucketlearn.domain.plan import class_weights
from bucketlearn.entrypoints.cli import common
from bucketlearn.local.simulation import simulate_pipeline
from bucketlearn.ml.model import ModelSpec, build_model
from bucketlearn.ml.training import (
    EPSILON,
    EVAL_BATCH,
    evaluate_parts,
    optimizer_state,
    shuffle_rows,
    train_task,
)
from bucketlearn.options import JobOptions
from bucketlearn.usecases.status import status_object
from bucketlearn.usecases.train_local import train_local
from bucketlearn.usecases.upload import StorageEvent, handle_upload
from tests.unit.helpers import write_imbalanced_csv
from tests.unit.steps import train_pending


class _TableModel:
    """A tiny model for hand computation: a row's first feature is the index of the
    probabilities it answers."""

    def __init__(self, table: list[list[float]]) -> None:
        self.table = np.asarray(table, dtype=np.float32)

    def set_weights(self, weights: Any) -> None:
        pass

    def predict_on_batch(self, x: np.ndarray) -> np.ndarray:
        return self.table[np.asarray(x[:, 0], dtype=np.int64)]


def _model(classes: int = 3, features: int = 6):
    spec = ModelSpec(kind="mlp", n_features=features, n_classes=classes, image_shape=None,
                     seed=5, learning_rate=1e-2)
    return build_model(spec, [0.0] * features, [1.0] * features)


def test_the_evaluation_tallies_the_confusion_matrix_worked_by_hand():
    """Six rows in two parts, three classes: row by row (truth -> answer) 0->0, 0->0, 0->1,
    1->1, 1->2, 2->2 give the confusion [[2,1,0],[0,1,1],[0,0,1]]; precision is each answer
    column's share right, recall each truth row's."""
    # Prepare
    model = _TableModel([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3],
                         [0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.1, 0.2, 0.7]])
    x = np.arange(6, dtype=np.float32).reshape(-1, 1)
    y = np.array([0, 0, 0, 1, 1, 2])
    # Execute
    found = evaluate_parts(model, None, [(x[:4], y[:4]), (x[4:], y[4:])])
    # Assert
    report = found.report
    assert report["confusion"] == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert found.accuracy == report["accuracy"] == pytest.approx(4 / 6)
    assert report["precision"] == pytest.approx([1.0, 1 / 2, 1 / 2])
    assert report["recall"] == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert report["majority_accuracy"] == pytest.approx(3 / 6) and report["beats_majority"]
    picked = np.array([0.7, 0.6, 0.2, 0.8, 0.3, 0.7], dtype=np.float32)
    assert found.loss == pytest.approx(float(np.mean(-np.log(picked.astype(np.float64)))))
    assert found.predicted_counts == [2, 2, 2] and found.true_counts == [3, 2, 1]
    assert "roc_auc" not in report


def test_the_evaluation_keeps_accuracy_and_loss_to_the_bit():
    """Accuracy and loss are the numbers the evaluation gave before it tallied a confusion
    matrix (the parity benchmark and the end-to-end tests compare them to the bit): the loop
    it ran then, over parts that straddle EVAL_BATCH, gives the same floats."""
    # Prepare
    rng = np.random.default_rng(4)
    model = _model()
    y = rng.integers(0, 3, 2 * EVAL_BATCH + 300)
    x = (rng.normal(size=(len(y), 6)) + y[:, None]).astype(np.float32)
    cut = EVAL_BATCH + 123
    parts = [(x[:cut], y[:cut]), (x[cut:], y[cut:])]
    correct, loss_sum = 0, 0.0
    for px, py in parts:  # the evaluation as it was written before
        for start in range(0, len(py), EVAL_BATCH):
            probs = np.asarray(model.predict_on_batch(px[start:start + EVAL_BATCH]))
            batch = py[start:start + EVAL_BATCH]
            correct += int(np.count_nonzero(np.argmax(probs, axis=1) == batch))
            picked = np.clip(probs[np.arange(len(batch)), batch], EPSILON, 1.0)
            loss_sum += float(np.sum(-np.log(picked.astype(np.float64))))
    # Execute
    found = evaluate_parts(model, None, parts)
    # Assert
    assert found.accuracy == correct / len(y)
    assert found.loss == loss_sum / len(y)
    assert sum(map(sum, found.report["confusion"])) == len(y) == found.rows


def test_balanced_class_weights_weigh_rows_as_keras_class_weight_does():
    """A task with balanced weights takes the steps of fit(class_weight=...) over the same rows
    (Keras's own weighting), and different steps from an unweighted task."""
    # Prepare
    rng = np.random.default_rng(2)
    y = rng.choice(3, size=96, p=[0.7, 0.2, 0.1])
    x = (rng.normal(size=(96, 6)) + y[:, None]).astype(np.float32)
    weights = class_weights("balanced", np.bincount(y, minlength=3).tolist())
    task_model, fit_model, plain_model = _model(), _model(), _model()
    base = [w.copy() for w in task_model.get_weights()]
    xs, ys = shuffle_rows(x, y, seed=0, epoch=1, task_index=0)
    # Execute
    weighted = train_task(task_model, base, optimizer_state(task_model), x, y, 32, 1e-2, 0, 1, 0,
                          weights)
    plain = train_task(plain_model, base, optimizer_state(plain_model), x, y, 32, 1e-2, 0, 1, 0)
    fit_model.fit(xs, ys, batch_size=32, epochs=1, shuffle=False, verbose=0,
                  class_weight=dict(enumerate(weights)))
    # Assert
    assert weights is not None and weights[2] > weights[1] > weights[0]
    for mine, theirs in zip(weighted.weights, fit_model.get_weights(), strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-6)
    assert any(not np.allclose(a, b) for a, b in zip(weighted.weights, plain.weights,
                                                     strict=True))


@pytest.fixture(scope="module")
def imbalanced_csv(tmp_path_factory) -> Path:
    """340 rows of class 0 and 60 of class 1, in overlapping blobs."""
    return write_imbalanced_csv(tmp_path_factory.mktemp("imb") / "imbalanced.csv", [340, 60],
                                spread=3.0)


def _final_weights(run: dict[str, Any]) -> list[bytes]:
    """The weights of the version the job exported (its head at DONE)."""
    svc, head = run["svc"], run["job"].head
    weights, _, _ = codec.decode_state(svc.store.read_bytes(svc.settings.models_bucket,
                                                            head.weights_path))
    return [w.tobytes() for w in weights]


def test_balanced_training_is_the_same_in_the_pipeline_and_in_train_local(imbalanced_csv):
    """class_weight=balanced with one task at a time: the learners and train-local weight the
    same rows alike, so the pipeline's model is train-local's to the bit, and its
    head's figures are train-local's; with class_weight=none the model differs."""
    # Prepare
    balanced = JobOptions(epochs=2, rows_per_shard=64, parallel_tasks=1,
                          class_weight="balanced")
    serial = train_local(str(imbalanced_csv), balanced, svc=memory_services())
    # Execute
    run = simulate_pipeline(str(imbalanced_csv), balanced, workers=2, svc=memory_services())
    plain = simulate_pipeline(str(imbalanced_csv), JobOptions(epochs=2, rows_per_shard=64,
                                                              parallel_tasks=1),
                              svc=memory_services())
    # Assert
    head = run["job"].head
    assert run["job"].status == DONE and run["job"].options["class_weight"] == "balanced"
    assert _final_weights(run) == [np.asarray(w).tobytes() for w in serial.weights]
    assert _final_weights(plain) != _final_weights(run)
    assert head.holdout_accuracy == serial.accuracy
    assert head.holdout_macro_f1 == serial.report["macro_f1"]
    assert confusion_rows(head.holdout_report) == serial.report["confusion"]
    # 80 % of each class is not held out; a tenth of that validates
    assert serial.manifest.train_counts == [245, 43]


def test_a_done_jobs_head_and_versions_carry_the_report(imbalanced_csv):
    """Every evaluated version records macro-F1, the majority baseline, ROC AUC (two classes)
    and the per-class report; the DONE head's figures are those of the whole holdout and agree
    with its accuracy."""
    # Execute
    run = simulate_pipeline(str(imbalanced_csv), JobOptions(epochs=3, rows_per_shard=64,
                                                            parallel_tasks=2),
                            svc=memory_services())
    # Assert
    job, versions = run["job"], run["versions"]
    head = job.head
    rows = confusion_rows(head.holdout_report)
    assert job.status == DONE
    assert sum(map(sum, rows)) == job.final_holdout_rows == 80
    assert head.holdout_accuracy == (rows[0][0] + rows[1][1]) / 80
    assert head.holdout_majority_accuracy == 68 / 80
    assert 0.0 <= head.holdout_roc_auc <= 1.0
    evaluated = [v for v in versions if v.figure("holdout_accuracy") is not None]
    assert len(evaluated) == len(versions) - 1  # all but version 0
    for v in evaluated:
        assert v.figure("holdout_report")["classes"] == 2 and not v.figure("holdout_report")["truncated"]
        assert v.figure("holdout_macro_f1") is not None and v.figure("holdout_roc_auc") is not None
    status = status_object(job)
    assert status["beats_majority"] is True and status["warning"] is None


@pytest.fixture
def hopeless_job(tmp_path) -> tuple[Any, str]:
    """A RUNNING job at v1 on 180 rows of class 0 and 20 of class 1 whose features are the same
    in every row, so no model beats always answering class 0, on in-memory services (the
    CLI's, through ``run_cli``)."""
    svc = memory_services()
    path = write_imbalanced_csv(tmp_path / "hopeless.csv", [180, 20], n_features=2,
                                informative=False)
    info = svc.store.write_bytes(svc.settings.uploads_bucket, "hopeless.csv", path.read_bytes(),
                                 "text/csv", {"epochs": "2", "rows_per_shard": "64",
                                              "parallel_tasks": "2"})
    _, job_id = handle_upload(svc, StorageEvent(info.bucket, info.name, info.generation,
                                                info.size))
    assert job_id is not None
    train_pending(svc, 2)
    aggregate_job(svc, job_id)
    return svc, job_id


def test_status_json_shows_the_figures_and_warns_below_the_majority(hopeless_job, run_cli,
                                                                     capsys):
    """status --json of the head version: macro-F1, the majority baseline and class, ROC AUC
    (two classes: every row scores alike, so one half), per-class precision and recall, the
    confusion matrix and a warning, since the accuracy is not above the baseline."""
    # Prepare
    svc, job_id = hopeless_job
    # Execute
    code = run_cli(svc, "status", job_id, "--json")
    # Assert
    status = json.loads(capsys.readouterr().out)
    assert code == common.EXIT_OK and status["version"] == 1
    assert status["majority_accuracy"] == 36 / 40 and status["majority_class"] == "0"
    assert status["accuracy"] <= status["majority_accuracy"]
    assert status["beats_majority"] is False
    assert status["warning"].startswith(f"accuracy {status['accuracy']:.2%} is not above the "
                                        "90.00% of always answering '0'")
    assert status["roc_auc"] == 0.5
    assert status["report_classes"] == ["0", "1"] and set(status["precision"]) == {"0", "1"}
    assert set(status["recall"]) == {"0", "1"} and not math.isnan(status["macro_f1"])
    assert [sum(row) for row in status["confusion"]] == [36, 4]
    assert sum(1 for col in zip(*status["confusion"], strict=True) if any(col)) == 1
    stored = svc.registry.get_version(job_id, 1).figure("holdout_report")
    assert stored["confusion"] == [{"row": row} for row in status["confusion"]]


def test_status_prints_a_one_line_warning(hopeless_job, run_cli, capsys):
    """The human-readable status says macro-F1 and the baseline, and warns in one line."""
    # Prepare
    svc, job_id = hopeless_job
    # Execute
    code = run_cli(svc, "status", job_id)
    # Assert
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert code == common.EXIT_OK
    assert len(warnings) == 1 and "always answering '0'" in warnings[0]
    assert any(line.startswith("macro-F1:") and "majority baseline 0.9000" in line
               for line in out.splitlines())


def test_status_of_a_head_evaluated_before_the_figures_existed():
    """A job document written before these figures: None and empty, no warning, no error."""
    # Prepare
    job = Job.from_doc({"job_id": "old-000000000000", "status": "DONE", "version": 4,
                        "dataset": {"classes": ["a", "b"]},
                        "head": {"version": 4, "weights_path": "w", "holdout_accuracy": 0.5,
                                 "holdout_loss": 0.7}})
    # Execute
    status = status_object(job)
    # Assert
    assert status["accuracy"] == 0.5
    assert status["macro_f1"] is None and status["roc_auc"] is None
    assert status["warning"] is None and status["beats_majority"] is None
    assert status["confusion"] == [] and status["precision"] == {}
