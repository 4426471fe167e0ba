"""Local stand-in for Eventarc's storage trigger: the CloudEvent it sends, and its delivery.

``cloudevent_for`` builds the binary-mode CloudEvent (``google.cloud.storage.object.v1.finalized``,
StorageObjectData JSON body) for one object generation, and ``post_event`` delivers it: like
Eventarc with ``RETRY_POLICY_RETRY``, a non-2xx answer or a connection error is retried with
exponential backoff (up to ``max_age`` seconds), so a function crash never loses an event. The
uploads bucket's events come from Cloud Storage notifications (``bucketlearn.local.notifications``,
as Eventarc's do in the cloud); nothing lists a bucket to find them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import quote

import requests

from bucketlearn.ports import BlobInfo

log = logging.getLogger(__name__)

EVENT_TYPE = "google.cloud.storage.object.v1.finalized"
POST_TIMEOUT = 600.0


def header_value(text: str) -> str:
    """A CloudEvents HTTP header value: percent-encode space, '"', '%' and anything outside
    printable ASCII (the binding's rule). Object names may hold newlines or any unicode, which
    HTTP headers cannot carry as is."""
    return "".join(ch if "!" <= ch <= "~" and ch not in '"%' else quote(ch, safe="")
                   for ch in text)


def cloudevent_for(info: BlobInfo, resource: Mapping[str, object] | None = None,
                   event_time: str | None = None) -> tuple[dict[str, str], dict[str, object]]:
    """Headers and JSON body of a binary-mode storage CloudEvent for one object generation.

    ``resource``: the object resource as a storage notification carries it (its fields replace
    the ones built from ``info``); ``event_time``: the notification's (RFC 3339; default now).
    """
    now = event_time or datetime.now(UTC).isoformat().replace("+00:00", "Z")
    headers = {
        "ce-id": uuid.uuid4().hex,
        "ce-specversion": "1.0",
        "ce-type": EVENT_TYPE,
        "ce-source": header_value(f"//storage.googleapis.com/projects/_/buckets/{info.bucket}"),
        "ce-subject": header_value(f"objects/{info.name}"),
        "ce-time": now,
        "content-type": "application/json",
    }
    body = {
        "kind": "storage#object",
        "bucket": info.bucket,
        "name": info.name,
        "generation": str(info.generation),
        "metageneration": "1",
        "size": str(info.size),
        "contentType": info.content_type or "application/octet-stream",
        "metadata": info.metadata,
        "timeCreated": now,
        "updated": now,
        **(resource or {}),
    }
    return headers, body


def post_event(url: str, headers: Mapping[str, str], body: Mapping[str, object],
               stop: threading.Event, max_age: float, what: str) -> int | None:
    """POST one CloudEvent until ``url`` answers 2xx: the number of attempts it took, or None
    when ``stop`` was set or ``max_age`` seconds went by first. ``what`` names it in the log."""
    started = time.monotonic()
    delay = 0.5
    attempt = 0
    while not stop.is_set():
        attempt += 1
        try:
            response = requests.post(url, json=body, headers=dict(headers), timeout=POST_TIMEOUT)
            if response.status_code < 300:
                return attempt
            log.info("%s answered %s for %s; retrying", url, response.status_code, what)
        except requests.RequestException as exc:
            log.info("%s unreachable for %s (%s); retrying", url, what, exc)
        if time.monotonic() - started > max_age:
            log.error("giving up on %s after %d attempts", what, attempt)
            return None
        stop.wait(delay)
        delay = min(delay * 2, 10.0)
    return None
