"""Pub/Sub adapter: the tasks topic (learners pull one task at a time) and the results topic
(the aggregator pulls with streaming pull); the same code serves the emulator.

Learners use unary pull with ``max_messages=1``: a streaming pull hands a subscriber messages
beyond its flow-control limit on the emulator (one learner can hold three of four task
messages while another idles), which would serialise a round's tasks on one learner. A waiting
unary pull is answered as soon as a message arrives.
The aggregator is one consumer that wants every result at once: streaming pull.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.cloud import pubsub_v1

from bucketlearn import messages as wire
from bucketlearn.config import Settings
from bucketlearn.errors import TransientError
from bucketlearn.ports import ResultMessage, TaskMessage

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT = 60.0
RPC_TIMEOUT = 30.0
STREAM_MAX_MESSAGES = 1000  # results a streaming pull holds unsettled (a round is at most 64)


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
            batch_settings=BATCH,
            transport=PublisherGrpcTransport(channel=grpc.insecure_channel(host, options)))
        subscriber = pubsub_v1.SubscriberClient(
            transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(host, options)))
        return publisher, subscriber
    return pubsub_v1.PublisherClient(batch_settings=BATCH), pubsub_v1.SubscriberClient()


# A message is sent at most 1 ms after publish() (the client's default waits 10 ms to batch).
# Every publish here is on a round's critical path and is awaited, so batching across calls
# would only add latency.
BATCH = pubsub_v1.types.BatchSettings(max_latency=0.001)


class PulledTask:
    """A message delivered by a unary pull."""

    def __init__(self, queue: PubSubQueue, ack_id: str, raw: bytes,
                 delivery_attempt: int | None) -> None:
        self._queue, self.ack_id, self.raw = queue, ack_id, raw
        self.delivery_attempt = delivery_attempt
        self.message, self.problem = queue.decode(raw)

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


class StreamedMessage:
    """A message delivered by a streaming pull (its lease is kept by the client library until
    it is acked or nacked)."""

    def __init__(self, message: Any, decode: Callable[[bytes], tuple[Any, str | None]]
                 ) -> None:
        self._message = message
        self.raw: bytes = message.data
        self.delivery_attempt: int | None = message.delivery_attempt or None
        self.message, self.problem = decode(message.data)

    def ack(self) -> None:
        self._message.ack()

    def nack(self) -> None:
        self._message.nack()

    def extend(self, seconds: int) -> None:
        self._message.modify_ack_deadline(seconds)


class PubSubQueue:
    """A topic and a pull subscription on it: the tasks topic and the learners' subscription by
    default; or the results topic, or the dead-letter sink the watchdog drains.

    Args:
        settings: where Pub/Sub is, and the default names.
        subscription: the subscription to pull from (default: the learners' tasks one).
        topic: the topic to publish to (default: the tasks topic).
        kind: the message class (``TaskMessage`` or ``ResultMessage``).
        streaming: pull with a streaming pull (the aggregator) instead of one unary pull per
            message (the learners).
    """

    def __init__(self, settings: Settings, subscription: str | None = None,
                 topic: str | None = None, kind: type = TaskMessage,
                 streaming: bool = False) -> None:
        self.settings = settings
        self.publisher, self.subscriber = _clients(settings)
        self.topic_path = self.publisher.topic_path(settings.project,
                                                    topic or settings.tasks_topic)
        self.subscription_path = self.subscriber.subscription_path(
            settings.project, subscription or settings.tasks_subscription)
        self.decode = wire.decoder(kind)
        self.streaming = streaming
        self._stream: Any = None
        self._stream_lock = threading.Lock()
        self._inbox: queue.Queue[StreamedMessage] = queue.Queue()

    def publish(self, messages: Sequence[Any]) -> None:
        if "queue.duplicate_publish" in self.settings.faults:  # fault injection: every time
            messages = [m for m in messages for _ in range(2)]
        futures = [self.publisher.publish(self.topic_path, wire.encode(m),
                                          job_id=m.job_id, task_id=m.task_id)
                   for m in messages]
        try:
            for future in futures:
                future.result(timeout=PUBLISH_TIMEOUT)
        except (gexc.GoogleAPICallError, TimeoutError) as exc:
            raise TransientError(f"publishing {len(messages)} messages failed: {exc}") from exc

    def pull(self, timeout: float) -> PulledTask | StreamedMessage | None:
        if self.streaming:
            return self._pull_streamed(timeout)
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

    def _pull_streamed(self, timeout: float) -> StreamedMessage | None:
        with self._stream_lock:
            if self._stream is None or self._stream.done():
                if self._stream is not None:  # the stream ended (an outage): say why, reopen
                    log.warning("streaming pull on %s ended (%s); reopening",
                                self.subscription_path, self._stream.exception(timeout=0))
                self._stream = self.subscriber.subscribe(
                    self.subscription_path,
                    lambda message: self._inbox.put(StreamedMessage(message, self.decode)),
                    flow_control=pubsub_v1.types.FlowControl(
                        max_messages=STREAM_MAX_MESSAGES,
                        # each lease extension asks for at most the aggregator lease (Pub/Sub
                        # takes 10 to 600 s), so what a process that dies was holding comes back
                        # within it, not after the library's 600 s
                        max_duration_per_lease_extension=int(min(600, max(
                            10, self.settings.aggregator_lease_seconds)))))
        try:
            return self._inbox.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def close(self) -> None:
        """Stop a streaming pull (its undelivered messages go back to Pub/Sub)."""
        with self._stream_lock:
            if self._stream is not None:
                self._stream.cancel()
                try:
                    self._stream.result(timeout=10)
                except Exception:  # noqa: BLE001 - cancelled or already failed: either way closed
                    log.debug("streaming pull closed", exc_info=True)
                self._stream = None

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


def results_queue(settings: Settings, streaming: bool = True) -> PubSubQueue:
    """The results topic, with the aggregator's subscription (streaming pull by default)."""
    return PubSubQueue(settings, subscription=settings.results_subscription,
                       topic=settings.results_topic, kind=ResultMessage, streaming=streaming)
