"""An in-process pipeline simulation (``simulate_pipeline``): the real upload, learner and
aggregator code on the in-memory ports with W workers whose tasks overlap in time (each trains
the round's task it pulled). Training in synchronous rounds makes the result independent of W:
it only changes how long a round takes. Handed its ``Services`` by the caller (the tests and the
benchmarks pass fresh in-memory ones)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from typing import Any

from bucketlearn.aggregation.writer import aggregate_job
from bucketlearn.loops.learner import Learner
from bucketlearn.options import JobOptions
from bucketlearn.ports import RuntimeCache, Services
from bucketlearn.usecases.upload import StorageEvent, handle_upload


def simulate_pipeline(path: str, options: JobOptions, workers: int = 2, *,
                      svc: Services) -> dict[str, Any]:
    """Run upload -> learners -> aggregator in-process with ``workers`` overlapping tasks, on
    ``svc`` (in-memory services of the run's own: the upload, the job and its versions stay
    there and are returned as ``"svc"``)."""
    with open(path, "rb") as handle:
        info = svc.store.write_bytes(svc.settings.uploads_bucket, os.path.basename(path),
                                     handle.read(), "text/csv", options.to_metadata())
    _, job_id = handle_upload(svc, StorageEvent(info.bucket, info.name, info.generation, info.size))
    assert job_id is not None
    # one model (and optimizer) per worker, as in separate processes: each its own runtime cache
    learners = [Learner(dataclasses.replace(svc, cache=RuntimeCache()), f"sim-{i}")
                for i in range(workers)]
    in_flight: deque[tuple[Any, Learner]] = deque()
    pulled = 0
    started = time.perf_counter()
    for _ in range(1_000_000):
        job = svc.registry.get_job(job_id)
        assert job is not None
        if job.is_terminal:
            break
        while len(in_flight) < workers:
            received = svc.queue.pull(0)
            if received is None:
                break
            in_flight.append((received, learners[pulled % workers]))
            pulled += 1
        if not in_flight:
            aggregate_job(svc, job_id)
            continue
        received, learner = in_flight.popleft()
        decision = learner.handle(received)
        received.ack() if decision.value == "ack" else received.nack()
        aggregate_job(svc, job_id)
    job = svc.registry.get_job(job_id)
    assert job is not None
    return {"job": job, "seconds": time.perf_counter() - started,
            "versions": svc.registry.list_versions(job_id), "svc": svc}
