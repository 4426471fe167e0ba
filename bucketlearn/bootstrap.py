"""Wiring in one place: which adapters serve the ports (``ports.Services``).

Only the entry points call it (the upload function, the aggregator's and the learners'
processes: ``process_services``, made once per process, lazily; the CLI: a ``google_services``
for its target's settings; the dashboard: ``dashboard/app.py`` hands the page
``process_services``), and the local stack, the tests and the benchmarks. They hand a service its
``Services``: ``train-local`` and the simulation are handed fresh ``memory_services()``. No
service, nor ``ml`` or ``ingest``, imports this module or reaches Google otherwise than through
the ports (pyproject.toml's import contracts, ``lint-imports``)."""

from __future__ import annotations

import functools

from bucketlearn.config import Settings, load_settings
from bucketlearn.ports import ResultMessage, Services, TaskMessage


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
    # the uploads bucket keeps noncurrent versions, as Terraform creates it; messages travel as
    # the bytes Pub/Sub carries, checked at the edge as the Pub/Sub adapter checks them
    return Services(settings=settings, store=MemoryBlobStore((settings.uploads_bucket,)),
                    queue=MemoryQueue(TaskMessage), registry=MemoryRegistry(),
                    results=MemoryQueue(ResultMessage))
