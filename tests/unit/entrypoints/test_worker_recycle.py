"""A learner process hands over to a fresh one once it has built ``worker_max_models`` models
(TensorFlow frees a model's memory only at process exit): the learner stops between tasks,
leaving every other message in the queue, and the parent starts the next process."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bucketlearn.bootstrap import memory_services
from bucketlearn.loops.learner import Learner
from bucketlearn.loops.learner_process import LEARNER_CHILD_ENV, RECYCLE_EXIT
from bucketlearn.services.caches import models_built
from bucketlearn.usecases.upload import StorageEvent, handle_upload
from tests.unit.helpers import write_blobs_csv


def _two_jobs(tmp_path: Path, names: tuple[str, ...] = ("a.csv", "b.csv")
              ) -> tuple[object, list[str]]:
    """Uploads (two by default) on one set of in-memory services, each with its first round of
    2 tasks published."""
    svc = memory_services()
    path = write_blobs_csv(tmp_path / "blobs.csv", n_rows=400)
    job_ids = []
    for name in names:
        info = svc.store.write_bytes(svc.settings.uploads_bucket, name, path.read_bytes(),
                                     "text/csv", {"epochs": "1", "rows_per_shard": "64",
                                                  "parallel_tasks": "2"})
        _, job_id = handle_upload(svc, StorageEvent(info.bucket, info.name, info.generation,
                                                    info.size))
        job_ids.append(job_id)
    return svc, job_ids


def test_the_learner_stops_between_tasks_once_it_has_built_max_models_models(tmp_path: Path
                                                                           ) -> None:
    # Prepare
    svc, job_ids = _two_jobs(tmp_path)
    queued = len(svc.queue)
    # Execute
    learner = Learner(svc, "w1", max_models=2)
    handled = learner.run(threading.Event(), max_tasks=queued, pull_timeout=0.1)
    # Assert: it stopped after its first task of the second job; the rest wait in the queue
    assert learner.recycle
    assert models_built(svc) == 2 and len(job_ids) == 2
    assert 2 <= handled < queued
    assert len(svc.queue) == queued - handled


def test_jobs_served_in_turns_do_not_rebuild_their_models(tmp_path: Path) -> None:
    """Three jobs whose tasks come in turns (a, b, c, a, b, c): each model is built once. With
    a cache of two jobs every task rebuilt its model, a second of tracing and memory TensorFlow
    keeps until exit (learners reached 5.6 GB in the parity benchmark's stack)."""
    # Prepare
    svc, job_ids = _two_jobs(tmp_path, ("a.csv", "b.csv", "c.csv"))
    received = [svc.queue.pull(0) for _ in range(len(svc.queue))]
    by_job = {job_id: [r for r in received if r.message.job_id == job_id] for job_id in job_ids}
    in_turns = [by_job[job_id][i] for i in range(2) for job_id in job_ids]
    learner = Learner(svc, "w1")
    # Execute
    decisions = [learner.process(r.message) for r in in_turns]
    # Assert
    assert [d.value for d in decisions] == ["ack"] * 6
    assert models_built(svc) == 3


def test_without_a_bound_the_learner_runs_on(tmp_path: Path) -> None:
    # Prepare
    svc, _ = _two_jobs(tmp_path)
    queued = len(svc.queue)
    # Execute
    learner = Learner(svc, "w1")
    handled = learner.run(threading.Event(), max_tasks=queued, pull_timeout=0.1)
    # Assert
    assert not learner.recycle and handled == queued and len(svc.queue) == 0


COUNTING_LEARNER = """
import os, sys
from pathlib import Path
runs = Path(sys.argv[1])
runs.write_text(runs.read_text() + os.environ["{env}"] + "\\n" if runs.exists() else "1\\n")
sys.exit({recycle} if len(runs.read_text().split()) < 3 else 3)
"""


PARENT = ("import sys; from bucketlearn.entrypoints.worker import run_learners; "
          "sys.exit(run_learners(sys.argv[1:]))")


def test_the_parent_starts_a_fresh_learner_each_time_one_asks_to_be_recycled(tmp_path: Path
                                                                             ) -> None:
    # Prepare: a learner that asks to be recycled twice, then exits with 3
    runs = tmp_path / "runs"
    script = COUNTING_LEARNER.format(env=LEARNER_CHILD_ENV, recycle=RECYCLE_EXIT)
    # Execute: the parent in a fresh interpreter (this one may hold gRPC's threads from other
    # tests, and a fork beside them can abort the child before it runs: exit 134, seen once)
    done = subprocess.run([sys.executable, "-c", PARENT, sys.executable, "-c", script, str(runs)],
                          capture_output=True, text=True, timeout=120)
    # Assert: three processes, each told it runs under the parent
    assert done.returncode == 3, done.stderr
    assert runs.read_text().split() == ["1", "1", "1"]


STOPPING_LEARNER = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, lambda *_: sys.exit({recycle}))
Path(sys.argv[1]).write_text("ready")
time.sleep(60)
sys.exit(0)
"""


SIGNALLED_PARENT = ("import signal, sys; from bucketlearn.entrypoints.worker import run_learners; "
                    "code = run_learners(sys.argv[1:]); "
                    "print('restored' if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL "
                    "else 'not restored'); sys.exit(code)")


def test_sigterm_reaches_the_learner_and_the_parent_does_not_start_another(tmp_path: Path
                                                                           ) -> None:
    # Prepare: a learner that, told to stop, exits as if it were due for recycling; the parent
    # in a fresh interpreter (no gRPC threads beside its fork)
    ready = tmp_path / "ready"
    script = STOPPING_LEARNER.format(recycle=RECYCLE_EXIT)
    started = time.monotonic()
    parent = subprocess.Popen([sys.executable, "-c", SIGNALLED_PARENT, sys.executable, "-c",
                               script, str(ready)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the learner never started"
        # Execute: the parent's handler forwards it to the learner
        parent.send_signal(signal.SIGTERM)
        out, err = parent.communicate(timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
    # Assert: the learner got the signal (it did not sleep its 60 s), was not restarted, and
    # the parent's previous handler is back
    assert parent.returncode == RECYCLE_EXIT, err
    assert time.monotonic() - started < 30
    assert out.split() == ["restored"]


def test_the_worker_command_runs_the_learner_under_the_parent() -> None:
    # Execute: the real parent, with a learner command that fails at once
    done = subprocess.run([sys.executable, "-c",
                           "import sys; from bucketlearn.entrypoints.worker import run_learners; "
                           "sys.exit(run_learners([sys.executable, '-c', "
                           "'import os, sys; sys.exit(5 if os.environ.get(\"" + LEARNER_CHILD_ENV
                           + "\") == \"1\" else 6)']))"],
                          capture_output=True, text=True, timeout=60)
    # Assert
    assert done.returncode == 5, done.stderr


def test_the_learner_command_runs_the_learner_process_not_another_parent(monkeypatch) -> None:
    """The command the parent starts (``LEARNER``: this module with ``--learner``) runs
    ``learner_main``, the learner process."""
    # Prepare
    from bucketlearn.entrypoints import worker

    started: list[bool] = []
    monkeypatch.setattr(worker, "learner_main", lambda: started.append(True))
    monkeypatch.setattr(sys, "argv", ["worker.py", *worker.LEARNER[3:]])
    # Execute
    worker.main()
    # Assert
    assert started == [True]
    assert worker.LEARNER[1:3] == ["-m", "bucketlearn.entrypoints.worker"]
