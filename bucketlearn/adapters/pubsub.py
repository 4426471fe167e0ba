"""Pub/Sub adapter: publish task messages, pull one at a time (also serves the emulator)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.cloud import pubsub_v1

from bucketlearn.config import Settings
from bucketlearn.errors import TransientError
from bucketlearn.ports import TaskMessage

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT = 60.0
RPC_TIMEOUT = 30.0


def _admin_retry(seconds: float) -> Retry:
    """Retries of an admin call (create a topic or a subscription) that give up ``seconds``
    after the first attempt; the client's own default keeps retrying an unreachable server for
    600 s."""
    return Retry(initial=0.25, maximum=5.0, multiplier=2.0, timeout=seconds,
                 predicate=if_exception_type(gexc.ServiceUnavailable, gexc.DeadlineExceeded))


def _clients(settings: Settings) -> tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient]:
    if settings.pubsub_emulator_host:
        import grpc  # noqa: PLC0415
        from google.pubsub_v1.services.publisher.transports import (  # noqa: PLC0415
            PublisherGrpcTransport,
        )
        from google.pubsub_v1.services.subscriber.transports import (  # noqa: PLC0415
            SubscriberGrpcTransport,
        )

        host = settings.pubsub_emulator_host
        # Reconnect quickly after the emulator (or the network to it) comes back.
        options = [("grpc.initial_reconnect_backoff_ms", 250),
                   ("grpc.max_reconnect_backoff_ms", 2000)]
        publisher = pubsub_v1.PublisherClient(
            transport=PublisherGrpcTransport(channel=grpc.insecure_channel(host, options)))
        subscriber = pubsub_v1.SubscriberClient(
            transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(host, options)))
        return publisher, subscriber
    return pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()


class PulledTask:
    def __init__(self, queue: PubSubQueue, ack_id: str, raw: bytes,
                 delivery_attempt: int | None) -> None:
        self._queue, self.ack_id, self.raw = queue, ack_id, raw
        self.delivery_attempt = delivery_attempt
        try:
            self.message: TaskMessage | None = TaskMessage.from_dict(json.loads(raw))
        except (ValueError, KeyError, TypeError):
            self.message = None

    def ack(self) -> None:
        self._queue.subscriber.acknowledge(
            request={"subscription": self._queue.subscription_path, "ack_ids": [self.ack_id]},
            timeout=RPC_TIMEOUT)

    def nack(self) -> None:
        self.extend(0)

    def extend(self, seconds: int) -> None:
        self._queue.subscriber.modify_ack_deadline(
            request={"subscription": self._queue.subscription_path, "ack_ids": [self.ack_id],
                     "ack_deadline_seconds": seconds}, timeout=RPC_TIMEOUT)


class PubSubQueue:
    """The task topic and a pull subscription on it (the workers'; or another, e.g. the
    dead-letter sink the watchdog drains)."""

    def __init__(self, settings: Settings, subscription: str | None = None) -> None:
        self.settings = settings
        self.publisher, self.subscriber = _clients(settings)
        self.topic_path = self.publisher.topic_path(settings.project, settings.tasks_topic)
        self.subscription_path = self.subscriber.subscription_path(
            settings.project, subscription or settings.tasks_subscription)

    def publish(self, messages: Sequence[TaskMessage]) -> None:
        if "queue.duplicate_publish" in self.settings.faults:  # fault injection: every time
            messages = [m for m in messages for _ in range(2)]
        futures = [self.publisher.publish(self.topic_path, json.dumps(m.to_dict()).encode(),
                                          job_id=m.job_id, task_id=m.task_id)
                   for m in messages]
        try:
            for future in futures:
                future.result(timeout=PUBLISH_TIMEOUT)
        except (gexc.GoogleAPICallError, TimeoutError) as exc:
            raise TransientError(f"publishing {len(messages)} tasks failed: {exc}") from exc

    def pull(self, timeout: float) -> PulledTask | None:
        try:
            response = self.subscriber.pull(
                request={"subscription": self.subscription_path, "max_messages": 1},
                timeout=max(1.0, timeout))
        except (gexc.DeadlineExceeded, gexc.RetryError):
            return None
        except (gexc.ServiceUnavailable, gexc.InternalServerError) as exc:
            raise TransientError(f"pull failed: {exc}") from exc
        for received in response.received_messages:
            attempt = received.delivery_attempt or None
            return PulledTask(self, received.ack_id, received.message.data, attempt)
        return None

    def ensure_topology(self, timeout: float = RPC_TIMEOUT) -> None:
        """Create the topic and pull subscription if missing (local stack; Terraform in the cloud).

        Raises:
            TransientError: Pub/Sub did not answer within ``timeout`` seconds, retries included.
        """
        try:
            self.publisher.create_topic(request={"name": self.topic_path}, timeout=timeout,
                                        retry=_admin_retry(timeout))
        except gexc.AlreadyExists:
            pass
        except gexc.RetryError as exc:
            raise self._unanswered("create topic", exc, timeout) from exc
        try:
            self.subscriber.create_subscription(request={
                "name": self.subscription_path, "topic": self.topic_path,
                "ack_deadline_seconds": self.settings.ack_deadline_seconds},
                timeout=timeout, retry=_admin_retry(timeout))
        except gexc.AlreadyExists:
            pass
        except gexc.RetryError as exc:
            raise self._unanswered("create subscription", exc, timeout) from exc

    def _unanswered(self, what: str, exc: Exception, timeout: float) -> TransientError:
        where = self.settings.pubsub_emulator_host or "Pub/Sub"
        return TransientError(f"pubsub {what}: {where} did not answer within {timeout:.0f} s "
                              f"(expected a Pub/Sub server there); last error: {exc}")

    def backlog_estimate(self) -> int | None:
        """Unacked messages, where the backend can say cheaply (not on the emulator)."""
        return None
