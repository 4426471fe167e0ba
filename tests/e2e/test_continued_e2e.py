"""Continued training on the whole local stack, as a user runs it: penguins.csv in two halves,
``submit --continue-from`` on the second, the status naming the parent with its model's figures
on the new holdout, the downloaded model predicting the parent's raw rows; a file missing one
of the parent's columns is REJECTED naming it. Faults: a continued upload's event delivered
twice and its learner killed mid-training (rows in
``tests/artifacts/reliability-continued.json``)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import requests

from bucketlearn.bootstrap import google_services
from bucketlearn.local.relay import cloudevent_for
from tests.e2e import faults
from tests.e2e.faults import Supervisor, wait_for
from tests.e2e.helpers import REPO, assert_ledger_consistent, cli, submit_and_wait, wait_terminal

pytestmark = pytest.mark.e2e
RESULTS: list[dict[str, Any]] = []
reliability_summary = faults.reliability_summary("continued", RESULTS)

PENGUINS = REPO / "data" / "penguins.csv"
PENGUINS_NEW = REPO / "data" / "penguins_new.csv"


@pytest.fixture(scope="module")
def stack(make_module_stack: Any) -> Any:
    return make_module_stack("continued", workers=1,
                             extra_env={"BUCKETLEARN_ACK_DEADLINE_SECONDS": "10"})


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


def test_a_duplicated_event_and_a_learner_killed_mid_training_lose_nothing(
        stack: Any, halves: Any, parent: dict[str, Any], tmp_path: Path) -> None:
    """The continued upload's event delivered a second time, and the learner SIGKILLed while a
    task of the continued job is RUNNING (the supervisor restarts it; the task comes back after
    the 10 s ack deadline): one job, DONE, continued from the parent, each task applied once."""
    # Prepare: the second half 10 times, so that training lasts long enough to be interrupted
    header, *rows = halves[1].read_text().splitlines()
    bigger = tmp_path / "penguins_b10.csv"
    bigger.write_text("\n".join([header, *(rows * 10)]) + "\n")
    svc = google_services(stack.settings)
    info = svc.store.write_file(stack.settings.uploads_bucket, "continued-faults.csv",
                                str(bigger), "text/csv",
                                {"continue_from": parent["job_id"], "epochs": "8"})
    headers, body = cloudevent_for(info)
    # Execute
    with Supervisor(stack):
        again = requests.post(stack.urls["upload_fn"], json=body, headers=headers, timeout=120)
        assert again.status_code < 300
        jobs = wait_for(lambda: [j for j in svc.registry.list_jobs(500)
                                 if j.source.get("name") == info.name], 120, "the job")
        job_id = jobs[0].job_id
        wait_for(lambda: [t for t in svc.registry.list_tasks(job_id) if t.state == "RUNNING"],
                 180, "a task of the continued job to be RUNNING")
        victim = stack.procs["worker-0"]
        restarts = victim.restarts
        victim.kill()
        wait_for(lambda: victim.restarts > restarts, 60, "the learner to be restarted")
        job = wait_terminal(svc, job_id, 400)
    # Assert
    assert job.status == "DONE", job.error
    assert [j.job_id for j in svc.registry.list_jobs(500)
            if j.source.get("name") == info.name] == [job_id]
    assert job.continued_from["job_id"] == parent["job_id"]
    versions = assert_ledger_consistent(svc, job_id)
    faults.record(RESULTS, "continued upload: duplicated event, learner killed",
                  "the continued upload's storage event posted to the upload function a second "
                  "time; SIGKILL to the only learner while a task of the continued job was "
                  "RUNNING (the supervisor restarts it; ack deadline 10 s)",
                  "one job for the upload, DONE, continued from the parent; versions dense, "
                  "each task applied once", versions=len(versions), tasks=job.tasks_applied,
                  max_attempts=max(t.attempts for t in svc.registry.list_tasks(job_id)))
