"""What a user sees of a numeric target: the status object, the CLI's lines and the
dashboard's figures, from documents as the aggregator writes them (no TensorFlow)."""

from __future__ import annotations

from bucketlearn.domain.head import Head
from bucketlearn.domain.job import Job
from bucketlearn.domain.version import Version
from bucketlearn.entrypoints import cli
from bucketlearn.entrypoints.cli import printing
from bucketlearn.usecases.status import status_object
from bucketlearn.views import headline, jobs_list, options_data, training_figures

DATASET = {"rows": 342, "train_rows": 274, "holdout_rows": 68, "features": 7,
           "label_column": "body_mass_g", "classes": [], "label_kind": "float",
           "class_counts": [], "shards": 9, "task": "regression",
           "task_reason": "auto: 94 distinct numeric labels in the first 344 rows",
           "target_mean": 4203.2, "target_std": 799.9, "bin_edges": [3312.0, 3488.0],
           "bin_counts": [40, 31, 33], "missing_targets": 2}
VERSION = Version.from_doc({
    "version": 3, "weights_path": "w3", "epoch": 1, "created_at": 10.0, "holdout_accuracy": None,
    "holdout_loss": 56079.4, "train_loss": 60000.0, "samples": 274, "holdout_rmse": 236.81,
    "holdout_mae": 193.93, "holdout_r2": 0.9133, "holdout_macro_f1": None})


def regression_job(**fields):
    head = Head(3, "w", "c", holdout_accuracy=None, holdout_loss=56079.4,
                holdout_rmse=236.81, holdout_mae=193.93, holdout_r2=0.9133)
    return Job("j1", status="DONE", phase="done", version=3, epoch=1, options={"epochs": 1},
               dataset=DATASET, head=head, tasks_applied=3, tasks_planned=3, **fields)


def test_the_status_object_has_the_task_and_rmse_mae_r2():
    status = status_object(regression_job())
    assert status["task"] == "regression" and status["task_reason"].startswith("auto: 94")
    assert (status["rmse"], status["mae"], status["r2"]) == (236.81, 193.93, 0.9133)
    assert status["accuracy"] is None and status["warning"] is None
    assert status["missing_targets"] == 2


def test_a_classification_head_stores_no_regression_keys():
    doc = Head(1, "w", "c", holdout_accuracy=0.9, holdout_loss=0.3).to_doc()
    assert "holdout_rmse" not in doc and Head.from_doc(doc).holdout_rmse is None
    status = status_object(Job.from_doc({"job_id": "j", "head": doc,
                                         "dataset": {"classes": ["a"]}}))
    assert status["task"] == "classification" and status["rmse"] is None


def test_the_cli_prints_rmse_mae_and_r2(capsys):
    status = status_object(regression_job())
    printing.print_status(status)
    out = capsys.readouterr().out
    assert "holdout:   RMSE 236.8, MAE 193.9, R² 0.913" in out
    assert "target:    numeric (auto: 94 distinct" in out and "accuracy:" not in out
    assert printing.progress_line(regression_job()).endswith("holdout RMSE 236.8, MAE 193.9, R² 0.913")


def test_the_dashboard_shows_rmse_mae_r2_per_version_and_the_target():
    job = regression_job()
    summary = headline.job_summary(job, [VERSION], now=20.0)
    metrics = {label: value for row in headline.headline_rows(summary) for label, value in row}
    assert metrics["Holdout RMSE"] == "236.8100" and metrics["Holdout R²"] == "0.9133"
    assert "Holdout accuracy" not in metrics
    frame = training_figures.version_frame([VERSION])
    assert frame.loc[0, "holdout_rmse"] == 236.81 and frame.loc[0, "holdout_r2"] == 0.9133
    assert training_figures.evaluated_versions([VERSION]) == [3]
    report = training_figures.version_report(VERSION, [])
    assert dict(report["metrics"])["MAE"] == "193.9300" and report["per_class"].empty
    facts = options_data.dataset_facts(job)
    assert facts["task"] == "regression" and facts["rows without a target (left out)"] == 2
    assert jobs_list.overview_rows([job], 20.0)[0]["r2"] == 0.9133
    assert headline.is_regression(summary) and not headline.is_regression({"task": "classification"})


def test_predict_prints_numbers_and_the_figures_against_the_label_column(capsys):
    from bucketlearn.entrypoints.cli.model_commands import cmd_predict

    found = {"rows": 2, "label_column": "y", "task": "regression", "predictions": [4867.7637, 3.5],
             "rmse": 264.6, "mae": 211.9, "r2": 0.891, "scored_rows": 2}
    args = cli.build_parser().parse_args(["predict", "m.keras", "rows.csv"])
    assert args.func is cmd_predict
    code = cmd_predict(args, predict=lambda *args: found)
    out, err = capsys.readouterr()
    assert code == 0 and out.splitlines() == ["4867.76", "3.5"]
    assert "RMSE 264.6, MAE 211.9, R² 0.891 against column 'y' (2 rows" in err
