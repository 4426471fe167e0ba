"""Local stand-in for Eventarc's storage trigger, built as the cloud builds it: on Cloud Storage's
Pub/Sub notifications.

The storage emulator (fake-gcs-server) publishes a notification for every object finalized, in
Cloud Storage's ``JSON_API_V1`` format (attributes ``eventType``, ``bucketId``, ``objectId``,
``objectGeneration``, ``eventTime``; data: the object resource as JSON), to one topic of the
Pub/Sub emulator, ``STORAGE_EVENTS_TOPIC``. A ``NotificationForwarder`` pulls them from a
subscription of its own (streaming pull) and POSTs, for each finalize in a bucket it routes, the
binary-mode CloudEvent the relay builds (``relay.cloudevent_for``, its body the notification's
object resource) to that bucket's function. A notification is acknowledged only once the function
answered 2xx; a non-2xx answer or a connection error is retried with backoff
(``relay.post_event``); one given up on (after ``max_age``, or at stop) is nacked, so Pub/Sub
delivers it again. ``duplicate`` POSTs every event twice (fault injection: at-least-once).

Notifications of other buckets and other event types are acknowledged and dropped here: the
emulator has one notification topic (fake-gcs-server 1.54 takes it on its command line and has
no per-bucket notification API), stacks sharing the emulators each have a subscription on it,
and the Pub/Sub emulator accepts a subscription's filter but does not apply it (the filter is
set anyway: Pub/Sub applies it). A stack that starts its own emulators has them notify for its
uploads bucket alone (``Emulators.uploads_bucket``), as its deployment does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.cloud import pubsub_v1

from bucketlearn.config import Settings
from bucketlearn.local.relay import cloudevent_for, post_event
from bucketlearn.ports import BlobInfo

log = logging.getLogger(__name__)

STORAGE_EVENTS_TOPIC = "storage-events"  # the storage emulator's notification topic
FINALIZE = "OBJECT_FINALIZE"
ADMIN_TIMEOUT = 30.0
# Reconnect quickly after the emulator (or the network to it) comes back.
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 250),
                    ("grpc.max_reconnect_backoff_ms", 2000)]


def _admin_retry(seconds: float) -> Retry:
    return Retry(initial=0.25, maximum=5.0, multiplier=2.0, timeout=seconds,
                 predicate=if_exception_type(gexc.ServiceUnavailable, gexc.DeadlineExceeded))


def _channel(host: str) -> Any:
    import grpc  # noqa: PLC0415

    return grpc.insecure_channel(host, _CHANNEL_OPTIONS)


def publisher_client(pubsub_host: str) -> pubsub_v1.PublisherClient:
    from google.pubsub_v1.services.publisher.transports import (  # noqa: PLC0415
        PublisherGrpcTransport,
    )

    return pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=_channel(pubsub_host)))


def subscriber_client(pubsub_host: str) -> pubsub_v1.SubscriberClient:
    from google.pubsub_v1.services.subscriber.transports import (  # noqa: PLC0415
        SubscriberGrpcTransport,
    )

    return pubsub_v1.SubscriberClient(
        transport=SubscriberGrpcTransport(channel=_channel(pubsub_host)))


def ensure_topic(pubsub_host: str, project: str, topic: str,
                 timeout: float = ADMIN_TIMEOUT) -> str:
    """Create ``topic`` on the Pub/Sub emulator at ``pubsub_host`` if missing; its path."""
    publisher = publisher_client(pubsub_host)
    path = publisher.topic_path(project, topic)
    try:
        publisher.create_topic(request={"name": path}, timeout=timeout,
                               retry=_admin_retry(timeout))
    except gexc.AlreadyExists:
        pass
    finally:
        publisher.transport.close()
    return path


def subscription_for(settings: Settings) -> str:
    """The forwarder's subscription for a stack: named after its work bucket (stacks on
    emulators with an ``uploads_bucket`` share that bucket, never their work bucket)."""
    return f"{settings.work_bucket}-upload-events"


def object_info(resource: Mapping[str, Any], attributes: Mapping[str, str]) -> BlobInfo:
    """The object a notification names: its resource (data), the attributes where it is silent."""
    return BlobInfo(
        bucket=str(resource.get("bucket") or attributes["bucketId"]),
        name=str(resource.get("name") or attributes["objectId"]),
        size=int(resource.get("size") or 0),
        generation=int(resource.get("generation") or attributes.get("objectGeneration") or 0),
        metadata={str(k): str(v) for k, v in (resource.get("metadata") or {}).items()},
        content_type=str(resource["contentType"]) if resource.get("contentType") else None)


class _Outstanding:
    """One notification and its deliveries: acked once every copy was delivered, else nacked."""

    def __init__(self, message: Any, copies: int) -> None:
        self.message, self.left, self.ok = message, copies, True
        self.lock = threading.Lock()

    def done(self, delivered: bool) -> None:
        with self.lock:
            self.left -= 1
            self.ok = self.ok and delivered
            if self.left:
                return
        with contextlib.suppress(Exception):  # the stream may be closing: Pub/Sub redelivers
            (self.message.ack if self.ok else self.message.nack)()


class NotificationForwarder:
    """Storage notifications (a Pub/Sub subscription) -> CloudEvents POSTed to the functions.

    ``routes``: bucket -> URL of the function its finalize events go to.
    """

    def __init__(self, settings: Settings, routes: dict[str, str], duplicate: bool = False,
                 max_age: float = 3600.0, workers: int = 8,
                 subscription: str | None = None, topic: str = STORAGE_EVENTS_TOPIC,
                 on_delivered: Callable[[BlobInfo, int], None] | None = None) -> None:
        if not settings.pubsub_emulator_host:
            raise ValueError("the notification forwarder runs on the Pub/Sub emulator only")
        self.routes = dict(routes)
        self.duplicate = duplicate
        self.max_age = max_age
        self.workers = workers
        self.on_delivered = on_delivered
        self.subscriber = subscriber_client(settings.pubsub_emulator_host)
        self.topic_path = self.subscriber.topic_path(settings.project, topic)
        self.subscription_path = self.subscriber.subscription_path(
            settings.project, subscription or subscription_for(settings))
        self.stop_event = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=2 * workers, thread_name_prefix="forwarder")
        self.future: Any = None
        self.counts_lock = threading.Lock()
        self.delivered = 0  # POSTs answered 2xx (two per event with ``duplicate``)
        self.dropped = 0    # notifications of other buckets or events, acknowledged unsent

    def start(self, timeout: float = ADMIN_TIMEOUT) -> NotificationForwarder:
        """Create the subscription (events from now on; an existing one is kept) and pull."""
        buckets = " OR ".join(f'attributes.bucketId = "{b}"' for b in sorted(self.routes))
        try:
            self.subscriber.create_subscription(request={
                "name": self.subscription_path, "topic": self.topic_path,
                "ack_deadline_seconds": 60,
                "filter": f'attributes.eventType = "{FINALIZE}" AND ({buckets})'},
                timeout=timeout, retry=_admin_retry(timeout))
        except gexc.AlreadyExists:
            pass
        flow = pubsub_v1.types.FlowControl(max_messages=self.workers,
                                           max_lease_duration=self.max_age + 600)
        self.future = self.subscriber.subscribe(self.subscription_path, self._on_message,
                                                flow_control=flow)
        self.future.add_done_callback(self._stream_ended)
        return self

    def _stream_ended(self, future: Any) -> None:
        """The client retries a stream that breaks off; one that ends anyway (the emulator lost
        the subscription: it was restarted) ends the forwarding, loudly."""
        if not self.stop_event.is_set():
            log.error("forwarder: pulling %s stopped (%s); storage events are no longer "
                      "delivered: restart the stack", self.subscription_path,
                      future.exception() if not future.cancelled() else "cancelled")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop pulling and delivering (unacknowledged notifications go back to Pub/Sub), delete
        the subscription (it would keep every later notification of a shared emulator)."""
        self.stop_event.set()
        if self.future is not None:
            self.future.cancel()
            with contextlib.suppress(Exception):
                self.future.result(timeout=timeout)
        self.pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(gexc.GoogleAPICallError, gexc.RetryError):
            self.subscriber.delete_subscription(
                request={"subscription": self.subscription_path}, timeout=5.0,
                retry=_admin_retry(5.0))
        self.subscriber.close()

    def _on_message(self, message: Any) -> None:
        attributes = dict(message.attributes)
        url = self.routes.get(attributes.get("bucketId", ""))
        if attributes.get("eventType") != FINALIZE or url is None:
            with self.counts_lock:
                self.dropped += 1
            message.ack()
            return
        try:
            resource = json.loads(message.data)
            info = object_info(resource, attributes)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("forwarder: dropping a notification it cannot read (%s): %s %r", exc,
                      attributes, message.data[:200])
            message.ack()
            return
        copies = 2 if self.duplicate else 1
        outstanding = _Outstanding(message, copies)
        for _ in range(copies):
            self.pool.submit(self._deliver, outstanding, url, info, resource,
                             attributes.get("eventTime"))

    def _deliver(self, outstanding: _Outstanding, url: str, info: BlobInfo,
                 resource: dict[str, Any], event_time: str | None) -> None:
        attempt = None
        try:
            headers, body = cloudevent_for(info, resource, event_time)
            attempt = post_event(url, headers, body, self.stop_event, self.max_age,
                                 f"gs://{info.bucket}/{info.name}#{info.generation}")
            if attempt is not None:
                with self.counts_lock:
                    self.delivered += 1
                if self.on_delivered:
                    self.on_delivered(info, attempt)
        finally:
            outstanding.done(attempt is not None)
