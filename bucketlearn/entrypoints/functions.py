"""Decode the upload function's events, call one core function, log the outcome (task results
go to the long-running aggregator over Pub/Sub: ``bucketlearn.entrypoints.aggregator``).

Kept apart from ``functions/main.py`` so the decoding is unit-testable without the framework.
``upload_handler(services)`` builds the function's handler on a Services factory:
``functions/main.py`` gives it ``bootstrap.process_services`` (the default), a test its own;
``handle_upload_event(cloud_event, svc)`` is one event on given Services.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from werkzeug.exceptions import ServiceUnavailable

from bucketlearn.bootstrap import process_services
from bucketlearn.errors import PermanentError, TransientError
from bucketlearn.events import Outcome
from bucketlearn.logs import setup_logging
from bucketlearn.ports import Services

log = logging.getLogger(__name__)


def _event_time(cloud_event: Any) -> float | None:
    raw = cloud_event["time"] if "time" in cloud_event else None
    if not raw:
        return None
    try:
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class RetryLater(ServiceUnavailable):
    """Answered as HTTP 503 (no traceback): Eventarc / the local relay retry with backoff."""


def upload_handler(services: Callable[[], Services] = process_services
                   ) -> Callable[[Any], str]:
    """The upload function's handler, ``on_upload(cloud_event)``, on the Services ``services()``
    gives. They are made on the first event, not when the function's module is loaded (a
    failure is retried with the next event), and logging is set up from their settings then."""
    made: list[Services] = []

    def on_upload(cloud_event: Any) -> str:
        if not made:
            made.append(services())
            setup_logging(made[0].settings.log_format)
        return handle_upload_event(cloud_event, made[0])

    return on_upload


def handle_upload_event(cloud_event: Any, svc: Services) -> str:
    """Storage finalize event on the uploads bucket -> split (at most one job per upload), or,
    for an object under ``predict/``, a batch prediction (``usecases.batch_predict``: at most
    one per generation).

    Args:
        cloud_event: the Eventarc ``object.finalized`` CloudEvent.
        svc: the Services to use.

    Returns:
        The outcome's name (the job's, or the prediction's); returning (HTTP 200) acks the
        event, permanent failures included: retrying them for a day would change nothing.

    Raises:
        RetryLater: transient trouble (HTTP 503): Eventarc retries the event.
    """
    from bucketlearn.usecases.batch_predict import (  # noqa: PLC0415
        handle_predict,
        is_predict_request,
    )
    from bucketlearn.usecases.upload import StorageEvent, display_uri, handle_upload  # noqa: PLC0415

    event = StorageEvent.from_cloudevent_data(cloud_event.data, _event_time(cloud_event))
    if event.bucket != svc.settings.uploads_bucket:
        log.warning("on_upload: ignoring an event for bucket %r (expected %s)", event.bucket,
                    svc.settings.uploads_bucket)
        return "ignored"
    shown = display_uri(event.bucket, event.name)
    # predict/<job>/<name>.csv asks for predictions with a job's model: no job is made
    handle = handle_predict if is_predict_request(event) else handle_upload
    try:
        outcome, job_id = handle(svc, event)
    except TransientError as exc:
        log.warning("upload %s: %s; the event will be retried", shown, exc)
        raise RetryLater(str(exc)) from exc
    except PermanentError as exc:
        log.error("upload %s: %s; not retried (retrying cannot help)", shown, exc)
        return Outcome.FAILED.value
    log.info("upload %s -> %s (%s %s)", shown, outcome.value,
             "prediction" if handle is handle_predict else "job", job_id)
    return outcome.value
