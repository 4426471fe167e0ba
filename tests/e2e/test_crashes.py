"""Fault injection on the real emulators: a process killed at each step of a round, and each
backend unreachable mid-job. Each scenario asserts nothing lost, nothing applied twice, and
records what was injected and checked in ``tests/artifacts/reliability-crashes.json``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from bucketlearn.bootstrap import google_services
from tests.e2e import faults
from tests.e2e.faults import Supervisor, submit, wait_for
from tests.e2e.helpers import assert_ledger_consistent, wait_terminal
from tests.e2e.proxy import ProxiedEmulators

pytestmark = pytest.mark.e2e
RESULTS: list[dict[str, Any]] = []
reliability_summary = faults.reliability_summary("crashes", RESULTS)


def record(scenario: str, injected: str, checked: str, **figures: Any) -> None:
    faults.record(RESULTS, scenario, injected, checked, **figures)


CRASHES = {
    "aggregator.before_commit": ("aggregator", "the aggregator dies between writing a version's "
                                 "weights and its commit"),
    "aggregator.after_commit": ("aggregator", "the aggregator dies after a commit, before "
                                "publishing the next round and acking the round's results"),
    "aggregator.holding_lease": ("aggregator", "the aggregator dies right after taking the "
                                 "job's lease, holding it and the results it pulled"),
    "learner.before_publish": ("worker", "a learner dies after writing its result, before "
                               "announcing it"),
    "learner.before_ack": ("worker", "a learner dies after announcing its result, before "
                           "acking its task"),
}


@pytest.mark.parametrize("who", ["aggregator", "learner"])
def test_a_process_killed_at_each_step_loses_nothing(make_stack: Any, tmp_path: Path,
                                                     who: str, small_digits: Path) -> None:
    """The aggregator (or a learner) dies (``os._exit``) at each of its steps of a round, one
    after another in one job (each point fires once): the supervisor restarts it; the job ends
    DONE, nothing applied twice, versions dense, the head never on an uncommitted object."""
    # Prepare
    points = sorted(p for p in CRASHES if p.startswith(who))
    process = "aggregator" if who == "aggregator" else "worker"
    stack = make_stack("crash", workers=2, extra_env={
        "BUCKETLEARN_FAULTS": ",".join(points), "BUCKETLEARN_FAULT_DIR": str(tmp_path / "faults"),
        "BUCKETLEARN_AGGREGATOR_LEASE_SECONDS": "5", "BUCKETLEARN_ACK_DEADLINE_SECONDS": "10",
        "BUCKETLEARN_CHAIN_GRACE_SECONDS": "3"})
    svc = google_services(stack.settings)
    with Supervisor(stack):
        # Execute
        job_id = submit(svc, "digits.csv", {"epochs": "5"}, small_digits)
        job = wait_terminal(svc, job_id, 400)
    # Assert
    restarted = [p for name, p in stack.procs.items() if name.startswith(process)]
    logs = "".join((stack.home / "logs" / f"{p.name}.log").read_text() for p in restarted)
    for point in points:
        assert (tmp_path / "faults" / f"{point}.fired").exists(), f"{point} never fired"
        assert f"fault injection: crashing at {point}" in logs
    assert sum(p.restarts for p in restarted) >= len(points)
    assert job.status == "DONE", job.error
    versions = assert_ledger_consistent(svc, job_id)
    referenced = {v.weights_path for v in versions}
    # The head points at a committed version's weights (an attempt that died before its commit
    # left an unreferenced object, never pointed at); once the job ended, only the head's
    # weights are kept, and no result is left in the deltas bucket.
    assert job.head.weights_path in referenced
    deadline = time.monotonic() + 30  # the aggregator winds the job up right after DONE
    while time.monotonic() < deadline and (
            list(svc.store.list(stack.settings.deltas_bucket, f"{job_id}/"))
            or len(list(svc.store.list(stack.settings.models_bucket, f"weights/{job_id}/"))) > 1):
        time.sleep(0.5)
    stored = {i.name for i in svc.store.list(stack.settings.models_bucket, f"weights/{job_id}/")}
    assert stored == {job.head.weights_path}
    assert list(svc.store.list(stack.settings.deltas_bucket, f"{job_id}/")) == []
    for point in points:
        record(f"{process} killed at {point.split('.')[1].replace('_', ' ')}",
               f"os._exit at {point}: {CRASHES[point][1]}; the stack's supervisor restarts it "
               f"(the {process}'s other crash points fire in the same job; aggregator lease 5 s, "
               "ack deadline 10 s, chain grace 3 s)", "job DONE; versions dense; each task "
               "applied once; head never points at an uncommitted object; no result left in "
               "the deltas bucket", versions=len(versions))


def test_backend_outages(make_stack: Any, proxied: ProxiedEmulators) -> None:
    """Firestore, then Pub/Sub, then Storage unreachable for 6 s each, mid-job: the job finishes.
    The job is long (24 epochs, 48 one-task rounds) so that it is still training when the last
    outage begins, however fast its chains run: with 24 rounds, a chain that came back from the
    Firestore outage ran its last 22 in 3 s and the job ended before this test, whose own client
    was still reconnecting, could see a version to start the next outage from (2026-11-27)."""
    # Prepare
    stack = make_stack("outage", workers=2, emulators=proxied,
                       extra_env={"BUCKETLEARN_AGGREGATOR_LEASE_SECONDS": "10",
                                  "BUCKETLEARN_ACK_DEADLINE_SECONDS": "15",
                                  "BUCKETLEARN_CHAIN_GRACE_SECONDS": "3"})
    svc = google_services(stack.settings)
    refused = {}
    with Supervisor(stack):
        job_id = submit(svc, "digits.csv", {"epochs": "24"})
        for backend in ("firestore", "pubsub", "storage"):
            # Execute: wait for the job to make progress, then cut that backend off
            def version() -> int:
                return int(getattr(svc.registry.get_job(job_id), "version", None) or 0)

            start = version()
            wait_for(lambda start=start: version() > start, 300,
                     f"a new version before the {backend} outage")
            proxied.proxies[backend].outage(6.0)
            time.sleep(6.0)
            refused[backend] = proxied.proxies[backend].refused
        job = wait_terminal(svc, job_id, 600)
    # Assert
    assert job.status == "DONE", job.error
    versions = assert_ledger_consistent(svc, job_id)
    for backend in ("firestore", "pubsub", "storage"):
        record(f"{backend} outage", f"every connection to the {backend} emulator dropped and "
               "refused for 6 s, mid-job (one job, three outages in turn)", "job DONE; each "
               "task applied once; versions dense", versions=len(versions),
               refused_connections=refused[backend])
