"""Storage events through Cloud Storage notifications, on the real emulators.

fake-gcs-server publishes a notification for every object finalized to the Pub/Sub emulator; the
local stack's ``NotificationForwarder`` turns the uploads bucket's into the binary-mode CloudEvent
Eventarc would send, and POSTs it to a local HTTP endpoint standing in for the upload function.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import pytest

from bucketlearn.local.notifications import NotificationForwarder, subscriber_client
from bucketlearn.local.relay import EVENT_TYPE

pytestmark = pytest.mark.integration
WAIT = 30.0  # seconds for an event to arrive
QUIET = 4.0  # seconds with no further event after the expected ones


@dataclass
class Endpoint:
    """A local HTTP server recording every POST; ``statuses`` answers them in turn (then 200)."""

    statuses: list[int] = field(default_factory=list)
    received: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def wait_for(self, count: int, timeout: float = WAIT) -> None:
        """Block until ``count`` POSTs arrived (or ``timeout`` went by)."""
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.received) >= count, timeout=timeout)

    def settled(self, count: int) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """Every POST, once ``count`` arrived and ``QUIET`` seconds passed for any more."""
        self.wait_for(count)
        time.sleep(QUIET)
        with self.arrived:
            return list(self.received)


@contextlib.contextmanager
def endpoint(statuses: list[int] | None = None) -> Iterator[Endpoint]:
    state = Endpoint(statuses=list(statuses or []))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.arrived:
                status = state.statuses.pop(0) if state.statuses else 200
                state.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                state.arrived.notify_all()
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    state.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=state.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.server.shutdown()
        state.server.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def forwarding(cloud: Any, url: str, **options: Any) -> Iterator[NotificationForwarder]:
    forwarder = NotificationForwarder(cloud.settings, {cloud.settings.uploads_bucket: url},
                                      **options).start()
    try:
        yield forwarder
    finally:
        forwarder.stop()


def settle(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_an_upload_reaches_the_function_once_as_a_storage_cloudevent(cloud: Any) -> None:
    """Finalized in the uploads bucket -> one binary-mode CloudEvent naming the object's bucket,
    name, generation and metadata; objects of other buckets are not forwarded."""
    # Prepare
    bucket = cloud.settings.uploads_bucket
    name = f"dir with space/ü-{uuid.uuid4().hex[:6]}.csv"
    with endpoint() as function, forwarding(cloud, function.url) as forwarder:
        # Execute
        cloud.store.write_bytes(cloud.settings.work_bucket, "not-an-upload.csv", b"x",
                                "text/csv")
        info = cloud.store.write_bytes(bucket, name, b"a,b\n1,2\n", "text/csv",
                                       {"epochs": "3", "label_column": "b"})
        received = function.settled(1)
        # Assert
        assert len(received) == 1, [body for _, body in received]
        headers, body = received[0]
        assert headers["ce-type"] == EVENT_TYPE
        assert headers["ce-specversion"] == "1.0"
        assert unquote(headers["ce-source"]) == f"//storage.googleapis.com/projects/_/buckets/{bucket}"
        assert unquote(headers["ce-subject"]) == f"objects/{name}"
        assert headers["content-type"].startswith("application/json")
        assert (body["bucket"], body["name"], body["generation"]) == (bucket, name,
                                                                      str(info.generation))
        assert body["metadata"] == {"epochs": "3", "label_column": "b"}
        assert (body["size"], body["contentType"]) == ("8", "text/csv")
        assert forwarder.delivered == 1
        assert settle(lambda: forwarder.dropped >= 1, WAIT)  # the work bucket's, acknowledged


def test_duplicate_delivers_every_event_twice(cloud: Any) -> None:
    # Prepare
    with endpoint() as function, forwarding(cloud, function.url, duplicate=True):
        # Execute
        info = cloud.store.write_bytes(cloud.settings.uploads_bucket, "twice.csv", b"1",
                                       "text/csv")
        received = function.settled(2)
        # Assert
        assert [body["generation"] for _, body in received] == [str(info.generation)] * 2


def test_a_failing_function_gets_the_event_again_until_it_answers_2xx(cloud: Any) -> None:
    """503, 500, then 200: three POSTs of the same event (the same CloudEvent id, as Eventarc
    retries), and none after the 200."""
    # Prepare
    with endpoint(statuses=[503, 500]) as function, forwarding(cloud, function.url) as forwarder:
        # Execute
        info = cloud.store.write_bytes(cloud.settings.uploads_bucket, "retried.csv", b"1",
                                       "text/csv")
        received = function.settled(3)
        # Assert
        assert len(received) == 3
        assert len({headers["ce-id"] for headers, _ in received}) == 1
        assert {body["generation"] for _, body in received} == {str(info.generation)}
        assert forwarder.delivered == 1


def test_each_generation_is_an_event_and_stop_removes_the_subscription(cloud: Any) -> None:
    """An overwrite is a new finalize (a new generation, so a new job); after stop() the
    forwarder's subscription is gone (on a shared emulator it would keep every notification)."""
    # Prepare
    bucket = cloud.settings.uploads_bucket
    with endpoint() as function:
        with forwarding(cloud, function.url) as forwarder:
            # Execute
            first = cloud.store.write_bytes(bucket, "same.csv", b"1", "text/csv")
            second = cloud.store.write_bytes(bucket, "same.csv", b"22", "text/csv")
            received = function.settled(2)
            path = forwarder.subscription_path
        # Assert
        generations = sorted(body["generation"] for _, body in received)
        assert generations == sorted([str(first.generation), str(second.generation)])
        assert first.generation != second.generation
        subscriber = subscriber_client(cloud.settings.pubsub_emulator_host)
        try:
            listed = subscriber.list_subscriptions(
                request={"project": f"projects/{cloud.settings.project}"}, timeout=30)
            assert path not in [s.name for s in listed]
        finally:
            subscriber.close()
