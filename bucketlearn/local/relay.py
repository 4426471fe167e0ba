"""Local stand-in for Eventarc's storage trigger: the CloudEvent it sends, and a polling relay.

``cloudevent_for`` builds the binary-mode CloudEvent (``google.cloud.storage.object.v1.finalized``,
StorageObjectData JSON body) for one object generation, and ``post_event`` delivers it: like
Eventarc with ``RETRY_POLICY_RETRY``, a non-2xx answer or a connection error is retried with
exponential backoff (up to ``max_age`` seconds), so a function crash never loses an event. The
uploads bucket's events come from Cloud Storage notifications (``bucketlearn.local.notifications``,
as Eventarc's do in the cloud); ``StorageEventRelay`` finds events by listing the watched buckets
instead (the deltas bucket's, until results travel over Pub/Sub). ``duplicate`` delivers every
event twice (fault injection: at-least-once).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from urllib.parse import quote

import requests

from bucketlearn.ports import BlobInfo, BlobStore

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


class StorageEventRelay:
    def __init__(self, store: BlobStore, routes: dict[str, str], poll_seconds: float = 0.1,
                 duplicate: bool = False, max_age: float = 3600.0, workers: int = 8,
                 on_delivered: Callable[[BlobInfo, int], None] | None = None) -> None:
        self.store = store
        self.routes = routes
        self.poll_seconds = poll_seconds
        self.duplicate = duplicate
        self.max_age = max_age
        self.on_delivered = on_delivered
        self.seen: set[tuple[str, str, int]] = set()
        self.stop_event = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="relay")
        self.thread = threading.Thread(target=self._loop, name="relay-poll", daemon=True)
        self.delivered = 0

    def start(self, skip_existing: bool = True) -> None:
        if skip_existing:
            for bucket in self.routes:
                for info in self.store.list(bucket):
                    self.seen.add((bucket, info.name, info.generation))
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=10)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            for bucket, url in self.routes.items():
                try:
                    infos = list(self.store.list(bucket))
                except Exception:  # noqa: BLE001 - storage down: poll again later
                    log.warning("relay: cannot list gs://%s", bucket, exc_info=True)
                    continue
                for info in infos:
                    key = (bucket, info.name, info.generation)
                    if key in self.seen:
                        continue
                    self.seen.add(key)
                    copies = 2 if self.duplicate else 1
                    for _ in range(copies):
                        self.pool.submit(self._deliver, url, info)
            self.stop_event.wait(self.poll_seconds)

    def _deliver(self, url: str, info: BlobInfo) -> None:
        headers, body = cloudevent_for(info)
        attempt = post_event(url, headers, body, self.stop_event, self.max_age,
                             f"gs://{info.bucket}/{info.name}")
        if attempt is not None:
            self.delivered += 1
            if self.on_delivered:
                self.on_delivered(info, attempt)
