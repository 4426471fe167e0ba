"""Continued training (``continue_from``) on the in-memory ports: a table split in two halves,
the parent trained on the first, the child continued on the second from the parent's weights
with the parent's columns, vocabularies and scaling; and each refusal names its reason."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bucketlearn import codec, layout
from bucketlearn.aggregation import writer as aggregator
from bucketlearn.bootstrap import memory_services
from bucketlearn.domain import recipe
from bucketlearn.domain.job import Job, fail_fields
from bucketlearn.domain.lifecycle import CANCELLED, DONE, FAILED, REJECTED, SPLITTING
from bucketlearn.errors import ConfigError
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.local.simulation import simulate_pipeline
from bucketlearn.options import JobOptions
from bucketlearn.services import endings
from bucketlearn.services.caches import job_runtime
from bucketlearn.usecases.cancel import cancel_job
from bucketlearn.usecases.model_files import model_bytes, predict_file
from bucketlearn.usecases.status import status_object
from bucketlearn.usecases.train_local import train_local
from bucketlearn.usecases.upload import Outcome, StorageEvent, handle_upload
from tests.unit.helpers import MIXED_HEADER, blobs_rows, csv_bytes, mixed_rows
from tests.unit.steps import start_job, train_pending

OPTIONS = {"epochs": 2, "rows_per_shard": 64, "parallel_tasks": 1}


def weights_of(svc, weights_path):
    return codec.decode_state(svc.store.read_bytes(svc.settings.models_bucket, weights_path))[0]


def submit(svc, name, data, metadata):
    info = svc.store.write_bytes(svc.settings.uploads_bucket, name, data, "text/csv", metadata)
    outcome, job_id = handle_upload(svc, StorageEvent(info.bucket, info.name, info.generation,
                                                      info.size))
    return outcome, svc.registry.get_job(job_id)


@pytest.fixture(scope="module")
def halves(tmp_path_factory):
    """A mixed table (text columns, empty cells and markers, a timestamp, an identifier and a
    constant column left out) of 900 rows in two halves: the parent trained on the first, the
    child continued from it on the second."""
    folder = tmp_path_factory.mktemp("halves")
    rows = mixed_rows(900, seed=3)
    first, second = folder / "first.csv", folder / "second.csv"
    first.write_bytes(csv_bytes(MIXED_HEADER, rows[:450]))
    second.write_bytes(csv_bytes(MIXED_HEADER, rows[450:]))
    svc = memory_services()
    parent = simulate_pipeline(str(first), JobOptions(**OPTIONS), workers=1, svc=svc)["job"]
    child = simulate_pipeline(str(second), JobOptions(**OPTIONS, continue_from=parent.job_id),
                              workers=1, svc=svc)["job"]
    return svc, parent, child, rows, first, second, folder


def test_the_child_starts_from_the_parents_exported_weights_to_the_bit(halves):
    """The child's version 0 is the parent's exported version's weights, bit for bit (read
    before it ends: an ended job keeps its head's weights only), and its status names the
    parent and the version."""
    # Prepare
    svc, parent, child, _, _, second, _ = halves
    # Execute
    outcome, again = submit(svc, "second_again.csv", second.read_bytes(),
                            {"continue_from": parent.job_id, "epochs": "1"})
    # Assert
    assert parent.status == DONE and child.status == DONE, child.error
    assert outcome is Outcome.ACCEPTED and again.version == 0
    ours = weights_of(svc, svc.registry.get_version(again.job_id, 0).weights_path)
    theirs = weights_of(svc, parent.head.weights_path)
    assert [w.tobytes() for w in ours] == [w.tobytes() for w in theirs]
    status = status_object(child)
    assert status["continued_from"]["job_id"] == parent.job_id
    assert status["continued_from"]["version"] == parent.head.version
    assert status_object(again)["continued_from"] == {"job_id": parent.job_id,
                                                      "version": parent.head.version}
    assert status_object(parent)["continued_from"] is None
    assert child.head.version > 0  # it trained on


def test_the_child_keeps_the_parents_columns_vocabularies_and_scaling(halves):
    """The child's manifest is the parent's columns, vocabularies, scaling and classes; only
    the rows (their counts, shards and holdout) are the second half's."""
    # Prepare
    svc, parent, child, *_ = halves
    # Execute
    kept = [Manifest.from_json(svc.store.read_bytes(svc.settings.models_bucket,
                                                    layout.kept_manifest_path(job.job_id)))
            for job in (parent, child)]
    # Assert
    theirs, ours = kept
    assert ours.columns == theirs.columns and ours.preprocessing == theirs.preprocessing
    assert ours.mean == theirs.mean and ours.variance == theirs.variance
    assert ours.classes == theirs.classes and ours.dropped == theirs.dropped
    assert ours.rows == 450 and ours.holdout_parts != theirs.holdout_parts
    assert child.model == parent.model | {"learning_rate": child.model["learning_rate"]}


def test_the_exported_model_predicts_raw_rows_of_the_parents_format(halves, tmp_path):
    """The continued model downloads as a .keras that takes the parent's raw rows (text,
    empty cells, markers, timestamps) and predicts them as well as the parent's model did."""
    # Prepare
    svc, parent, child, _, first, second, _ = halves
    paths = {}
    for job in (parent, child):
        paths[job.job_id] = tmp_path / f"{job.job_id}.keras"
        paths[job.job_id].write_bytes(model_bytes(svc, job.job_id, None)[0])
    # Execute
    ours = predict_file(str(paths[child.job_id]), str(first), None)
    theirs = predict_file(str(paths[parent.job_id]), str(first), None)
    # Assert
    assert ours["rows"] == 450 and set(ours["predictions"]) <= {"tip", "no_tip"}
    assert ours["accuracy"] > 0.7 and theirs["accuracy"] > 0.7
    assert predict_file(str(paths[child.job_id]), str(second), None)["accuracy"] > 0.7


def test_the_report_gives_the_parents_model_on_the_childs_holdout(halves):
    """At DONE, the parent's model's figures on the child's holdout stand beside the child's."""
    # Prepare
    _, _, child, *_ = halves
    # Execute
    compared = status_object(child)["continued_from"]["parent_holdout"]
    # Assert
    assert compared["rows"] == child.final_holdout_rows
    assert 0.0 <= compared["accuracy"] <= 1.0 and compared["loss"] > 0
    assert status_object(child)["accuracy"] is not None


def rejected(svc, name, data, metadata):
    outcome, job = submit(svc, name, data, metadata)
    assert outcome is Outcome.REJECTED and job.status == REJECTED
    return job


def test_no_such_parent_is_refused(halves):
    svc, *_ = halves
    job = rejected(svc, "orphan.csv", csv_bytes(MIXED_HEADER, mixed_rows(60)),
                   {"continue_from": "nosuch-000000000000"})
    assert "no such job to continue from" in job.error
    assert job.error_detail["found"] == "no job 'nosuch-000000000000'"


def test_a_parent_that_has_not_finished_is_refused(halves):
    svc, *_ = halves
    svc.registry.create_job(Job(job_id="busy-000000000000", status="QUEUED", phase=SPLITTING))
    job = rejected(svc, "early.csv", csv_bytes(MIXED_HEADER, mixed_rows(60)),
                   {"continue_from": "busy-000000000000"})
    assert "has no finished model to continue from" in job.error
    assert job.error_detail["expected"] == "a job that is DONE, or CANCELLED with a version"
    assert job.error_detail["found"].startswith("QUEUED")


def test_a_version_the_parent_does_not_have_is_refused(halves):
    svc, parent, *_ = halves
    job = rejected(svc, "later.csv", csv_bytes(MIXED_HEADER, mixed_rows(60)),
                   {"continue_from": f"{parent.job_id}@999"})
    assert "has no version 999" in job.error
    assert job.error_detail["found"] == "v999"
    assert f"the one it exported: v{parent.head.version}" in job.error_detail["expected"]


def test_a_missing_column_of_the_parent_is_named(halves):
    svc, parent, *_ = halves
    header = [c for c in MIXED_HEADER if c != "distance"]
    rows = [[v for c, v in zip(MIXED_HEADER, row, strict=True) if c != "distance"]
            for row in mixed_rows(60)]
    job = rejected(svc, "narrow.csv", csv_bytes(header, rows), {"continue_from": parent.job_id})
    assert "a column of the model continued from job" in job.error
    assert job.error_detail["column"] == "distance"
    assert "distance" in job.error_detail["expected"]
    assert job.error_detail["found"].startswith("no 'distance' among the file's columns: ")


def test_a_label_the_parent_never_saw_is_refused(halves):
    svc, parent, *_ = halves
    rows = mixed_rows(60)
    for row in rows[:3]:
        row[-1] = "big_tip"
    job = rejected(svc, "new_label.csv", csv_bytes(MIXED_HEADER, rows),
                   {"continue_from": parent.job_id})
    assert "a label the model continued from job" in job.error
    assert job.error_detail["column"] == "label"
    assert job.error_detail["expected"] == "labels among its classes: no_tip, tip"
    assert job.error_detail["found"] == "'big_tip' (3 rows)"


def test_a_search_cannot_continue(halves):
    svc, parent, *_ = halves
    job = rejected(svc, "searched.csv", csv_bytes(MIXED_HEADER, mixed_rows(60)),
                   {"continue_from": parent.job_id, "search": "4"})
    assert job.error_detail["expected"] == "search=off with continue_from"


def test_the_cli_status_names_the_parent_and_both_figures(halves, capsys):
    from bucketlearn.entrypoints.cli.printing import print_status

    _, parent, child, *_ = halves
    print_status(status_object(child))
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("continues:"))
    assert line.startswith(f"continues: {parent.job_id} v{parent.head.version} (on this job's "
                           "holdout: its model accuracy 0.")
    assert np.isfinite(child.continued_from["parent_holdout"]["loss"])


def test_a_version_whose_weights_went_with_the_parents_end_is_refused(halves):
    """An ended job keeps its exported version's weights only: an earlier one is refused,
    naming the version to continue from instead."""
    svc, parent, *_ = halves
    assert parent.head.version > 0
    job = rejected(svc, "first_version.csv", csv_bytes(MIXED_HEADER, mixed_rows(60)),
                   {"continue_from": f"{parent.job_id}@0"})
    assert "is not kept to continue from" in job.error
    assert job.error_detail["expected"] == (f"the version it exported: "
                                            f"{parent.job_id}@{parent.head.version}")


def target_rows(n, seed):
    """y = 30 a - 20 b + 1000 + noise, with a text column: a numeric target far from 0."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(size=n)
    kind = rng.choice(["x", "y", "z"], size=n)
    y = 30 * a - 20 * b + 1000 + 5 * (kind == "x") + rng.normal(scale=2.0, size=n)
    return [[f"{a[i]:.5f}", f"{b[i]:.5f}", kind[i], f"{y[i]:.3f}"] for i in range(n)]


def test_a_numeric_target_continues_with_the_parents_target_scaling(tmp_path):
    """A regression parent's target scaling is kept: the child's model predicts in the same
    units, and its report gives the parent's RMSE on the child's holdout."""
    # Prepare
    header = ["a", "b", "kind", "y"]
    rows = target_rows(600, seed=5)
    first, second = tmp_path / "t1.csv", tmp_path / "t2.csv"
    first.write_bytes(csv_bytes(header, rows[:300]))
    second.write_bytes(csv_bytes(header, rows[300:]))
    svc = memory_services()
    options = {"epochs": 3, "rows_per_shard": 64, "parallel_tasks": 1}
    parent = simulate_pipeline(str(first), JobOptions(**options), svc=svc)["job"]
    # Execute
    child = simulate_pipeline(str(second), JobOptions(**options, continue_from=parent.job_id),
                              svc=svc)["job"]
    # Assert
    assert parent.status == DONE and child.status == DONE, child.error
    assert child.model["target_mean"] == parent.model["target_mean"]
    assert child.model["target_std"] == parent.model["target_std"]
    compared = status_object(child)["continued_from"]["parent_holdout"]
    assert compared["rmse"] > 0 and "accuracy" not in compared
    path = tmp_path / "child.keras"
    path.write_bytes(model_bytes(svc, child.job_id, None)[0])
    assert predict_file(str(path), str(first), None)["r2"] > 0.5


def test_a_file_with_fewer_of_the_parents_classes_continues(tmp_path):
    """Integer classes 0, 1, 2 in the parent; the child's file has 0 and 2 only: its rows are
    stored as the parent's class numbers, the model keeps its three outputs, and the report
    is of the classes the child's holdout has. Class 1, never trained on again, is forgotten
    (docs/CONTINUED.md says so): the parent's first half is predicted right but for it."""
    # Prepare
    header = ["f0", "f1", "f2", "label"]
    rows = blobs_rows(600, 3, 3, seed=2)
    first, second = tmp_path / "b1.csv", tmp_path / "b2.csv"
    first.write_bytes(csv_bytes(header, rows[:300]))
    second.write_bytes(csv_bytes(header, [r for r in rows[300:] if r[-1] != 1]))
    svc = memory_services()
    parent = simulate_pipeline(str(first), JobOptions(**OPTIONS), svc=svc)["job"]
    # Execute
    child = simulate_pipeline(str(second), JobOptions(**OPTIONS, continue_from=parent.job_id),
                              svc=svc)["job"]
    # Assert
    assert child.status == DONE, child.error
    assert child.classes == ["0", "1", "2"] and child.dataset["class_counts"][1] == 0
    status = status_object(child)
    assert status["accuracy"] > 0.9 and status["continued_from"]["parent_holdout"]["accuracy"] > 0.9
    path = tmp_path / "child.keras"
    path.write_bytes(model_bytes(svc, child.job_id, None)[0])
    assert predict_file(str(path), str(second), None)["accuracy"] > 0.9
    assert predict_file(str(path), str(first), None)["accuracy"] > 0.6  # 1 in 3 is class 1


def test_a_cancelled_job_with_a_version_can_be_continued_once_wound_up(tmp_path):
    """A job cancelled at v1: its wind-up keeps its manifest and head's state beside its
    model, and a job continued from it starts from v1's weights."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=2, parallel_tasks=2)
    train_pending(svc, len(svc.queue))
    aggregator.aggregate_job(svc, job_id)
    cancel_job(svc, job_id, "test")
    aggregator.aggregate_job(svc, job_id)  # finds it ended: winds it up
    parent = svc.registry.get_job(job_id)
    kept = layout.kept_weights_path(job_id, parent.head.version)
    # Execute
    outcome, child = submit(svc, "more.csv", (tmp_path / "blobs.csv").read_bytes(),
                            {"continue_from": job_id, "epochs": "1"})
    # Assert
    assert parent.status == CANCELLED and parent.head.version == 1
    assert outcome is Outcome.ACCEPTED, child.error
    assert child.continued_from == {"job_id": job_id, "version": 1}
    ours = weights_of(svc, svc.registry.get_version(child.job_id, 0).weights_path)
    assert [w.tobytes() for w in ours] == [w.tobytes() for w in weights_of(svc, kept)]


def test_a_kept_state_that_is_not_the_versions_is_refused(halves):
    """The kept state is checked against the version's checksum before it is used."""
    svc, parent, *_ = halves
    bucket, kept = svc.settings.models_bucket, layout.kept_weights_path(
        parent.job_id, parent.head.version)
    original = svc.store.read_bytes(bucket, kept)
    svc.store.write_bytes(bucket, kept, b"not a state", "application/octet-stream")
    try:
        job = rejected(svc, "tampered.csv", csv_bytes(MIXED_HEADER, mixed_rows(60)),
                       {"continue_from": parent.job_id})
    finally:
        svc.store.write_bytes(bucket, kept, original, "application/octet-stream")
    assert "is not the one its version document records" in job.error
    assert job.error_detail["expected"] == parent.head.checksum


def test_a_failed_job_keeps_nothing_for_continuing(tmp_path):
    """A FAILED job is never continued from: its wind-up keeps no manifest or state."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=2, parallel_tasks=2)
    train_pending(svc, len(svc.queue))
    aggregator.aggregate_job(svc, job_id)
    endings.end_job(svc.registry, job_id, fail_fields(svc.clock(), "a test's failure"))
    # Execute
    aggregator.aggregate_job(svc, job_id)  # finds it ended: winds it up
    # Assert
    job = svc.registry.get_job(job_id)
    assert job.status == FAILED and job.head.version == 1
    assert svc.store.stat(svc.settings.models_bucket,
                          layout.kept_weights_path(job_id, job.head.version)) is None


def test_a_continued_job_with_auto_epochs_takes_a_quarter_of_a_new_jobs(halves):
    """The same rows uploaded as a new job and as a continued one, epochs left to auto (a
    batch of 16, so neither is capped): the continued job's epochs are the recipe's quarter
    budget, and its budget says why."""
    svc, parent, _, _, _, second, _ = halves
    metadata = {"rows_per_shard": "64", "batch_size": "16"}
    # Execute
    _, fresh = submit(svc, "second_new.csv", second.read_bytes(), metadata)
    _, continued = submit(svc, "second_cont.csv", second.read_bytes(),
                          {**metadata, "continue_from": parent.job_id})
    # Assert
    rows = sum(s.rows for s in job_runtime(svc, fresh).manifest.shards)
    assert fresh.options["epochs"] == recipe.auto_epochs(rows, 16) == math.ceil(2000 * 16 / rows)
    assert continued.options["epochs"] == recipe.auto_epochs(rows, 16, share=0.25) == \
        math.ceil(500 * 16 / rows)
    assert "a continued job's" in continued.budget["reasons"]["epochs"]
    assert "a continued job's" not in fresh.budget["reasons"]["epochs"]


def test_train_local_refuses_to_continue_a_job(halves):
    """``train-local`` trains a new model in one process: a continued job goes through the
    buckets (before, the flag was taken and a new model trained on a quarter budget)."""
    _, parent, _, _, _, second, _ = halves
    with pytest.raises(ConfigError, match="continue_from"):
        train_local(str(second), JobOptions(**OPTIONS, continue_from=parent.job_id),
                    svc=memory_services())
