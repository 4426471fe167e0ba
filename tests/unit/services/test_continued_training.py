"""Continued training (``continue_from``) on the in-memory ports: a table split in two halves,
the parent trained on the first, the child continued on the second from the parent's weights
with the parent's columns, vocabularies and scaling; and each refusal names its reason."""

from __future__ import annotations

import numpy as np
import pytest

from bucketlearn import codec, layout
from bucketlearn.bootstrap import memory_services
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import DONE, REJECTED, SPLITTING
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.local.simulation import simulate_pipeline
from bucketlearn.options import JobOptions
from bucketlearn.usecases.model_files import model_bytes, predict_file
from bucketlearn.usecases.status import status_object
from bucketlearn.usecases.upload import Outcome, StorageEvent, handle_upload
from tests.unit.helpers import MIXED_HEADER, csv_bytes, mixed_rows

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
