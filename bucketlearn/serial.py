"""The serial baseline (``bucketlearn train-local``) and an in-process pipeline simulation.

``train_local`` runs the *same* split (same options, same seed, hence the same holdout), builds
the same model with the same initial weights and trains it in one process with Keras ``fit``.
``simulate_pipeline`` runs the real split, learner and aggregator code on the in-memory ports
with W workers whose tasks overlap in time (each starts from the head it saw when it pulled), so
staleness and buffering behave as in the distributed pipeline, minus the network. Each simulated
worker has its own model and optimizer state, as a worker process does.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from bucketlearn import jobs
from bucketlearn.bootstrap import Services, memory_services
from bucketlearn.config import JobOptions, Limits, Settings
from bucketlearn.ingest import Manifest, SourceFile, load_parts, split_upload
from bucketlearn.model import build_model, choose_spec
from bucketlearn.training import evaluate


@dataclass
class SerialResult:
    accuracy: float
    loss: float
    seconds: float
    manifest: Manifest
    model: Any


def local_source(path: str) -> SourceFile:
    return SourceFile(display_name=os.path.basename(path), size=os.path.getsize(path),
                      opener=lambda: open(path, "rb"))


def train_local(path: str, options: JobOptions, limits: Limits | None = None) -> SerialResult:
    """Train serially on the same split the pipeline would make; evaluate on the same holdout."""
    started = time.perf_counter()
    svc = memory_services()
    source = local_source(path)
    manifest = split_upload(source, svc.store, svc.settings.work_bucket, "local", options,
                            limits or Limits())
    spec = choose_spec(options.model, len(manifest.feature_names), len(manifest.classes),
                       options.seed, options.learning_rate, source.display_name)
    parts = [p for shard in manifest.shards for p in shard.parts]
    x, y = load_parts(svc.store, svc.settings.work_bucket, parts)
    x_hold, y_hold = load_parts(svc.store, svc.settings.work_bucket, manifest.holdout_parts)
    model = build_model(spec, manifest.mean, manifest.variance)
    order = np.random.default_rng([options.seed, 3]).permutation(len(y))
    model.fit(x[order], y[order], batch_size=options.batch_size, epochs=options.epochs,
              shuffle=True, verbose=0)
    accuracy, loss = evaluate(model, None, x_hold, y_hold)
    return SerialResult(accuracy, loss, time.perf_counter() - started, manifest, model)


def simulate_pipeline(path: str, options: JobOptions, workers: int = 2,
                      svc: Services | None = None) -> dict[str, Any]:
    """Run split -> learners -> aggregator in-process with ``workers`` overlapping tasks."""
    from bucketlearn.aggregator import aggregate_job  # noqa: PLC0415
    from bucketlearn.split import StorageEvent, handle_upload  # noqa: PLC0415
    from bucketlearn.worker import Learner  # noqa: PLC0415

    svc = svc or memory_services(Settings())
    with open(path, "rb") as handle:
        info = svc.store.write_bytes(svc.settings.uploads_bucket, os.path.basename(path),
                                     handle.read(), "text/csv", options.to_metadata())
    _, job_id = handle_upload(svc, StorageEvent(info.bucket, info.name, info.generation, info.size))
    assert job_id is not None
    # one model (and Adam state) per worker, as in separate processes: each its own runtime cache
    learners = [Learner(dataclasses.replace(svc, cache={}), f"sim-{i}") for i in range(workers)]
    in_flight: deque[tuple[Any, dict[str, Any], Learner]] = deque()
    pulled = 0
    started = time.perf_counter()
    for _ in range(1_000_000):
        job = svc.registry.get_job(job_id)
        assert job is not None
        if jobs.is_terminal(job):
            break
        while len(in_flight) < workers:
            received = svc.queue.pull(0)
            if received is None:
                break
            in_flight.append((received, svc.registry.get_job(job_id), learners[pulled % workers]))
            pulled += 1
        if not in_flight:
            aggregate_job(svc, job_id)
            continue
        received, snapshot, learner = in_flight.popleft()
        task = received.message
        epoch_doc = svc.registry.get_epoch(job_id, task.epoch) or {}
        if int(snapshot["epoch"]) <= task.epoch and task.task_index not in epoch_doc.get(
                "applied", []):
            learner.train(task, snapshot)
        received.ack()
        aggregate_job(svc, job_id)
    job = svc.registry.get_job(job_id)
    assert job is not None
    return {"job": job, "seconds": time.perf_counter() - started,
            "versions": svc.registry.list_versions(job_id), "svc": svc}
