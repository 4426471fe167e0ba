"""Wiring in one place: which adapters serve the ports, made once per process, lazily."""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bucketlearn import errors
from bucketlearn.config import Settings, load_settings
from bucketlearn.ports import BlobStore, Registry, ResultQueue, TaskQueue


@dataclass
class Services:
    """Everything a service function needs; built by ``google_services`` or ``memory_services``."""

    settings: Settings
    store: BlobStore
    queue: TaskQueue  # the tasks topic
    registry: Registry
    results: ResultQueue  # the results topic (learners and the watchdog -> the aggregator)
    clock: Callable[[], float] = time.time
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    cache: dict[str, Any] = field(default_factory=dict)
    # which exceptions are worth retrying (the adapters' backends add their own)
    transient: Callable[[BaseException], bool] = errors.is_transient
    # counts what this process asks of the cloud, per job (``adapters.metered``); None: nothing
    # is counted (the in-memory services, unless a test meters them)
    meter: Any = None

    def usage(self, job_id: str) -> dict[str, float]:
        """What this process used for a job since it was last asked (and forget it)."""
        return self.meter.take(job_id) if self.meter is not None else {}


def google_services(settings: Settings | None = None) -> Services:
    """Services backed by Google Cloud (or the emulators named in the settings)."""
    from bucketlearn.adapters.firestore import FirestoreRegistry  # noqa: PLC0415
    from bucketlearn.adapters.gcs import GcsBlobStore  # noqa: PLC0415
    from bucketlearn.adapters.google_errors import is_transient  # noqa: PLC0415
    from bucketlearn.adapters.metered import Meter, metered  # noqa: PLC0415
    from bucketlearn.adapters.pubsub import PubSubQueue, results_queue  # noqa: PLC0415

    settings = settings or load_settings()
    meter = Meter()
    if settings.call_log_dir:
        meter.write_to(settings.call_log_dir, settings.process_name or "process")
    return metered(Services(settings=settings, store=GcsBlobStore(settings),
                            queue=PubSubQueue(settings), registry=FirestoreRegistry(settings),
                            results=results_queue(settings), transient=is_transient), meter)


@functools.lru_cache(maxsize=1)
def process_services() -> Services:
    """The process-wide Services for entry points (made on first use, then reused)."""
    return google_services()


def memory_services(settings: Settings | None = None) -> Services:
    from bucketlearn.adapters.memory import MemoryBlobStore, MemoryQueue, MemoryRegistry  # noqa: PLC0415

    settings = settings or Settings()
    # the uploads bucket keeps noncurrent versions, as Terraform creates it
    return Services(settings=settings, store=MemoryBlobStore((settings.uploads_bucket,)),
                    queue=MemoryQueue(), registry=MemoryRegistry(), results=MemoryQueue())
