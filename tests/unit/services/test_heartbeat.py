"""A worker's heartbeat is written off the task path: state changes within a second (the latest
wins), the current state again every ``heartbeat_seconds``, and "stopped" when the worker ends."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bucketlearn.bootstrap import memory_services
from bucketlearn.faults import inject
from bucketlearn.loops.heartbeat import LearnerTuning, Reporter
from bucketlearn.loops.learner import Learner
from tests.unit.helpers import eventually
from tests.unit.steps import start_job


class Recorder:
    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, state: str, task: Any) -> None:
        with self.lock:
            self.writes.append((state, task))

    def states(self) -> list[str]:
        with self.lock:
            return [state for state, _ in self.writes]


def test_a_burst_of_state_changes_is_one_write_of_the_latest(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    # Prepare
    # a window far longer than the burst takes, however loaded the machine
    recorder = Recorder()
    # Execute
    with Reporter(recorder, LearnerTuning(report_min_seconds=2.0)) as reporter:
        for state in ("busy", "idle", "waiting", "busy"):
            reporter.set(state, "task-7")
        assert eventually(lambda: recorder.states(), seconds=10)
        time.sleep(0.5)  # a second write, were one due, would come now
    # Assert
    assert recorder.writes == [("busy", "task-7")]
    assert not reporter.thread.is_alive()


def test_the_state_is_written_again_while_nothing_changes(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A worker idle on an empty queue still shows as alive."""
    # Prepare
    recorder = Recorder()
    # Execute
    with Reporter(recorder, LearnerTuning(report_min_seconds=0.01,
                                          heartbeat_seconds=0.05)) as reporter:
        reporter.set("idle", None)
        assert eventually(lambda: len(recorder.states()) >= 3)
    # Assert
    assert set(recorder.states()) == {"idle"}


def test_run_writes_no_heartbeat_per_task(tmp_path: Path) -> None:
    """Six tasks in well under a second: "idle" at the start, at most one write from the
    reporter, "stopped" at the end; before, every task wrote "busy" and "idle"."""
    # Prepare
    svc, job_id = start_job(tmp_path, parallel_tasks=5)  # one round of every task, published
    planned = int(svc.registry.get_job(job_id).tasks_per_epoch)
    writes: list[str] = []
    svc = inject(svc, "registry", heartbeat=lambda real, worker_id, fields: (
        writes.append(fields["state"]), real(worker_id, fields)))
    # Execute
    handled = Learner(svc, "w1").run(threading.Event(), max_tasks=planned, pull_timeout=0.1)
    # Assert
    assert handled == planned >= 5
    assert writes[0] == "idle" and writes[-1] == "stopped"
    assert len(writes) <= 3
    [doc] = svc.registry.list_workers()
    assert doc["state"] == "stopped" and doc["tasks_done"] >= 1
    # the registry's TTL policy deletes it a day after it was last written
    assert doc["expire_at"].timestamp() == pytest.approx(doc["last_seen"] + 24 * 3600)


def test_a_late_heartbeat_never_lands_after_stopped() -> None:
    """A reporter write still in flight when ``run`` ends (a slow registry, longer than the
    reporter's join) lands before "stopped", never after it."""
    # Prepare: the reporter writes often; its writes take longer than run waits for it
    in_flight = threading.Event()

    def slow_from_the_reporter(real: Any, worker_id: str, fields: dict[str, Any]) -> None:
        if threading.current_thread().name == "heartbeat":
            in_flight.set()
            time.sleep(1.0)
        real(worker_id, fields)

    svc = inject(inject(memory_services(), "queue", pull=lambda real, timeout: time.sleep(timeout)),
                 "registry", heartbeat=slow_from_the_reporter)
    stop = threading.Event()
    threading.Thread(target=lambda: in_flight.wait(10) and stop.set(), daemon=True).start()
    # Execute: run ends while the reporter's write is in flight
    tuning = LearnerTuning(report_min_seconds=0.01, heartbeat_seconds=0.05,
                           reporter_join_seconds=0.1)
    Learner(svc, "w1", tuning=tuning).run(stop, pull_timeout=0.02)
    for thread in threading.enumerate():
        if thread.name == "heartbeat":
            thread.join(timeout=10)
    # Assert
    assert in_flight.is_set()
    [doc] = svc.registry.list_workers()
    assert doc["state"] == "stopped"
