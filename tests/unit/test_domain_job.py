"""bucketlearn.domain.job: the commit check and the round vocabulary, on plain documents."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from bucketlearn.domain import job as J


@dataclass
class Commit:
    epoch: int = 1
    base_version: int = 4
    version_doc: dict[str, Any] = field(default_factory=lambda: {"version": 5})
    applied: list[int] = field(default_factory=lambda: [2, 3])
    failed: list[int] = field(default_factory=list)


JOB = {"status": J.RUNNING, "phase": J.TRAINING, "version": 4, "epoch": 1, "round": 1}


@pytest.mark.parametrize(("job", "epoch", "exists", "commit", "reason"), [
    (JOB, {"applied": [0, 1]}, False, Commit(), None),
    (None, {}, False, Commit(), "no such job"),
    ({**JOB, "status": J.CANCELLED}, {}, False, Commit(), "the job is CANCELLED"),
    (JOB, None, False, Commit(), "epoch 1 has no document"),
    (JOB, {}, True, Commit(), "version 5 exists"),
    ({**JOB, "version": 5}, {}, False, Commit(), "the head is v5, not the base v4"),
    (JOB, {"applied": [3]}, False, Commit(), "a task of it is already applied or failed"),
    (JOB, {"failed": [2]}, False, Commit(), "a task of it is already applied or failed"),
], ids=["allowed", "no-job", "ended", "no-epoch", "version-used", "head-moved", "applied-twice",
        "failed-then-applied"])
def test_commit_refusal_names_the_first_rule_broken(job, epoch, exists, commit, reason) -> None:
    """A commit needs a live job, its epoch, an unused version, the head at its base and no
    task finished twice; the answer says which rule failed."""
    # Execute / Assert
    assert J.commit_refusal(job, epoch, exists, commit) == reason


def test_a_round_is_published_only_under_its_own_name() -> None:
    """``published`` names the last round published; an older round's name is not this one."""
    # Prepare
    job = {"epoch": 2, "round": 13, "published": "e0002r00012"}
    # Execute / Assert
    assert J.current_round_key(job) == J.round_key(2, 13) == "e0002r00013"
    assert not J.is_published(job)
    assert J.is_published({**job, "published": "e0002r00013"})
    assert J.done_tasks({"applied": [1, 2], "failed": [7]}) == {1, 2, 7}
    assert J.is_terminal({"status": J.DONE}) and not J.is_terminal({"status": J.RUNNING})
    assert not J.is_terminal(None)
