"""Fault injection on the real emulators: workers killed or replaced, duplicated messages,
poison tasks, many jobs at once. Each scenario asserts nothing lost, nothing applied twice, and
records what was injected and checked in ``tests/artifacts/reliability-faults.json``
(``tests/e2e/test_crashes.py`` has the crash points and the backend outages).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bucketlearn import codec, layout
from bucketlearn.bootstrap import google_services
from bucketlearn.ingest.manifest import Manifest
from tests.conftest import overwrite_packed_part
from tests.e2e import faults
from tests.e2e.faults import submit, wait_for
from tests.e2e.helpers import DIGITS, assert_ledger_consistent, wait_terminal

pytestmark = pytest.mark.e2e
RESULTS: list[dict[str, Any]] = []
reliability_summary = faults.reliability_summary("faults", RESULTS)


def record(scenario: str, injected: str, checked: str, **figures: Any) -> None:
    faults.record(RESULTS, scenario, injected, checked, **figures)


def test_worker_sigkill_mid_training(make_stack: Any, small_digits: Path) -> None:
    """A worker SIGKILLed while training: its task is redelivered and finished by someone."""
    # Prepare
    stack = make_stack("kill", workers=2, extra_env={"BUCKETLEARN_ACK_DEADLINE_SECONDS": "10"})
    svc = google_services(stack.settings)
    job_id = submit(svc, "digits.csv", {"epochs": "3"}, small_digits)
    # Execute: kill whichever worker holds a task first (a job that trains one task at a time
    # may never hand one to a given worker)
    running = wait_for(lambda: svc.registry.get_job(job_id) and [
        t for t in svc.registry.list_tasks(job_id) if t.state == "RUNNING"
        and str(t.worker_id or "").startswith(f"{stack.name_prefix}-worker-")], 120,
        "a worker to pick up a task")
    victim = stack.procs[running[0].worker_id.removeprefix(f"{stack.name_prefix}-")]
    victim.kill()
    job = wait_terminal(svc, job_id, 400)
    # Assert
    assert job.status == "DONE", job.error
    versions = assert_ledger_consistent(svc, job_id)
    attempts = max(t.attempts for t in svc.registry.list_tasks(job_id))
    assert attempts >= 2
    record("worker killed mid-training", "SIGKILL to a worker's process group while a task of "
           "it was RUNNING (ack deadline 10 s)", "job DONE; applied tasks == planned, each once; "
           "versions dense; the task was redelivered", tasks=job.tasks_applied,
           versions=len(versions), max_attempts=attempts, accuracy=job.head.holdout_accuracy)


def test_learners_are_replaced_between_jobs_and_lose_nothing(make_stack: Any,
                                                             small_digits: Path) -> None:
    """A learner that has built ``BUCKETLEARN_WORKER_MAX_MODELS`` models hands over to a
    fresh process between tasks (TensorFlow frees a model's memory only at exit): three jobs
    uploaded at once through one worker that is replaced after every second job."""
    # Prepare
    stack = make_stack("recycle", workers=1, extra_env={"BUCKETLEARN_WORKER_MAX_MODELS": "2"})
    svc = google_services(stack.settings)
    # Execute
    job_ids = [submit(svc, f"digits-{i}.csv", {"epochs": "1"}, small_digits) for i in range(3)]
    jobs = [wait_terminal(svc, job_id, 400) for job_id in job_ids]
    # Assert
    assert [job.status for job in jobs] == ["DONE"] * 3, [job.error for job in jobs]
    for job_id in job_ids:
        assert_ledger_consistent(svc, job_id)
    log_text = stack.procs["worker-0"].log_path.read_text()
    recycled = log_text.count("recycled (its memory is given back)")
    assert recycled >= 1, log_text[-3000:]
    assert stack.procs["worker-0"].alive()
    record("learner replaced between jobs", "BUCKETLEARN_WORKER_MAX_MODELS=2, one worker, three "
           "jobs uploaded at once", "every job DONE with a consistent ledger; the learner "
           "process was replaced", recycles=recycled,
           tasks=sum(int(job.tasks_applied) for job in jobs))


def test_duplicates_everywhere(make_stack: Any, small_digits: Path) -> None:
    """Every storage event delivered twice and every task published twice."""
    # Prepare
    stack = make_stack("dups", workers=2, duplicate_events=True,
                       extra_env={"BUCKETLEARN_FAULTS": "queue.duplicate_publish"})
    svc = google_services(stack.settings)
    # Execute
    job_id = submit(svc, "digits.csv", {"epochs": "2"}, small_digits)
    job = wait_terminal(svc, job_id, 400)
    # Assert
    assert job.status == "DONE", job.error
    jobs_for_upload = [j.job_id for j in svc.registry.list_jobs(500)
                       if j.source.get("bucket") == stack.settings.uploads_bucket]
    assert jobs_for_upload == [job_id]
    versions = assert_ledger_consistent(svc, job_id)
    log_text = (stack.home / "logs" / "upload_fn.log").read_text()
    assert "duplicate event ignored" in log_text or "being split by another" in log_text
    record("duplicates everywhere", "the storage events' forwarder delivers every event twice; every task and "
           "result message published twice", "one job per upload; each task applied once; versions "
           "dense", tasks=job.tasks_applied, versions=len(versions))


def test_poison_results_stop_nothing(make_stack: Any, small_digits: Path) -> None:
    """On the results topic, before a job: bytes that are not JSON, a job id Firestore refuses
    (``a/b``), a job that does not exist, stats too large, a number that is not finite; in the
    deltas bucket, a forged result (nonce 0000000000000000) for every task of epoch 1. The
    aggregator, never restarted (no supervisor runs), drops each message once and folds only
    the learners' own results."""
    # Prepare
    stack = make_stack("poison-results", workers=1)
    svc = google_services(stack.settings)
    aggregator = stack.procs["aggregator"]
    pid = aggregator.command_pid()
    good = {"job_id": "x-000000000000", "kind": "result", "epoch": 1, "task_index": 0,
            "path": layout.delta_path("x-000000000000", 1, 0, "0" * 16)}
    bodies = [b"not json", json.dumps({**good, "job_id": "a/b"}).encode(),
              json.dumps({**good, "stats": {"pad": "x" * 100_000}}).encode(),
              json.dumps({**good, "stats": {"train_loss": 1}}).encode().replace(b"1}", b"NaN}"),
              json.dumps(good).encode()]  # well formed, no such job
    publisher, topic = svc.results.publisher, svc.results.topic_path
    for body in bodies:
        publisher.publish(topic, body).result(timeout=30)
    # Execute
    job_id = submit(svc, "digits.csv", {"epochs": "2"}, small_digits)
    wait_for(lambda: getattr(svc.registry.get_job(job_id), "head", None), 120, "version 0")
    job = svc.registry.get_job(job_id)
    forged = [layout.delta_path(job_id, 1, t, "0" * 16) for t in range(job.tasks_per_epoch)]
    base = svc.store.read_bytes(stack.settings.models_bucket, job.head.weights_path)
    weights, optimizer, _ = codec.decode_state(base)
    for path in forged:
        svc.store.write_bytes(stack.settings.deltas_bucket, path, codec.encode_state(
            [w + 1.0 for w in weights], optimizer, {"content": "weights",
                                                    "base_digest": job.head.digest}),
            "application/octet-stream")
    job = wait_terminal(svc, job_id, 400)
    # Assert
    assert job.status == "DONE", job.error
    versions = assert_ledger_consistent(svc, job_id)
    assert aggregator.alive() and aggregator.command_pid() == pid and aggregator.restarts == 0
    assert job.deltas_refused == 0
    log_text = aggregator.log_path.read_text()
    assert log_text.count("dropping a result message that is not one of ours") >= 4
    assert "ignoring" in log_text and "no attempt 0000000000000000" in log_text
    record("poison results", "not JSON, job id 'a/b', no such job, 100 kB of stats, NaN on the "
           "results topic; a forged result (nonce 0000000000000000) for every task of epoch 1",
           "each message dropped once, the aggregator never restarted; job DONE, each task "
           "applied once, versions dense, no forged result folded",
           versions=len(versions), forged=len(forged))


def break_part(svc: Any, bucket: str, job_id: str, shard: int) -> None:
    """Overwrite a shard's first part, a byte range of its pack, with bytes that are not a
    safetensors object (the pack's other parts stay as they were)."""
    manifest = Manifest.from_json(svc.store.read_bytes(bucket, layout.manifest_path(job_id)))
    overwrite_packed_part(svc.store, bucket, manifest.shards[shard].parts[0],
                          b"not a safetensors object", b"!")


@pytest.mark.parametrize("allowed, expected", [(0, "FAILED"), (2, "DONE")])
def test_poison_task(make_stack: Any, allowed: int, expected: str, small_digits: Path) -> None:
    """A task whose shard is unreadable fails after N attempts; the job policy decides the end."""
    # Prepare: no workers yet, so the shard can be broken before anyone trains it; rounds of 3
    # one-shard tasks, so one task per epoch holds the broken shard
    stack = make_stack("poison", workers=0, extra_env={"BUCKETLEARN_MAX_TASK_ATTEMPTS": "3"})
    svc = google_services(stack.settings)
    job_id = submit(svc, f"digits-{allowed}.csv", {"epochs": "2", "parallel_tasks": "3",
                                                   "max_failed_tasks": str(allowed)}, small_digits)
    wait_for(lambda: getattr(svc.registry.get_job(job_id), "published", None) == "e0001r00000",
             120, "round 1 of epoch 1 to be published")
    break_part(svc, stack.settings.work_bucket, job_id, shard=0)
    # Execute
    for i in range(2):
        stack.start_worker(i)
    job = wait_terminal(svc, job_id, 400)
    # Assert
    assert job.status == expected, job.error
    failed = [t for t in svc.registry.list_tasks(job_id) if t.state == "FAILED"]
    assert failed and all(t.attempts == 4 for t in failed)  # 3 tries + the one that gives up
    assert len({t.epoch for t in failed}) == len(failed)  # one task an epoch: shard 0's
    if expected == "FAILED":
        assert "failed after 3 attempts" in job.error and ":e0001:t" in job.error
        assert "expected a safetensors object" in job.error or "CorruptObject" in job.error
    else:
        assert job.tasks_failed == 2 and job.tasks_applied == job.tasks_planned - 2
    record(f"poison task (max_failed_tasks={allowed})", "shard 0 overwritten with bytes that "
           "are not a safetensors object; BUCKETLEARN_MAX_TASK_ATTEMPTS=3", f"task FAILED after 3 attempts, "
           f"no endless redelivery; job {expected}" + (" with the task and the decode error in "
                                                       "its reason" if expected == "FAILED"
                                                       else " without it"),
           status=job.status, tasks_failed=job.tasks_failed)


def test_five_jobs_four_workers(make_stack: Any, tmp_path: Path) -> None:
    """Five jobs at once on four workers: isolated, all complete, throughput shared."""
    # Prepare: five different uploads (digits halves and thirds, two label-sorted)
    lines = DIGITS.read_text().splitlines()
    files = []
    for i, (start, stop, sort) in enumerate([(1, 700, False), (700, 1400, False), (1, 900, True),
                                             (300, 1000, False), (1000, 1798, False)]):
        rows = lines[start:stop]
        if sort:
            rows = sorted(rows, key=lambda r: int(r.rsplit(",", 1)[1]))
        path = tmp_path / f"part{i}.csv"
        path.write_text("\n".join([lines[0], *rows]) + "\n")
        files.append(path)
    stack = make_stack("five", workers=4)
    svc = google_services(stack.settings)
    # Execute
    # Small uploads get one task per round by default; ask for rounds of 3 so work can spread.
    job_ids = [submit(svc, p.name, {"epochs": "2", "parallel_tasks": "3"}, p) for p in files]
    finished = [wait_terminal(svc, job_id, 600) for job_id in job_ids]
    # Assert
    assert [j.status for j in finished] == ["DONE"] * 5
    workers_per_job = []
    for job_id in job_ids:
        assert_ledger_consistent(svc, job_id)
        workers_per_job.append(len({t.worker_id for t in svc.registry.list_tasks(job_id)}))
    assert sum(w > 1 for w in workers_per_job) >= 4, workers_per_job  # work was shared
    record("five jobs, four workers", "5 uploads at once (one label-sorted), 4 workers",
           "all DONE; every ledger exact; tasks of each job spread over workers",
           workers_per_job=workers_per_job,
           accuracies=[round(j.head.holdout_accuracy, 4) for j in finished])
