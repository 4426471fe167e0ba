"""How long the Pub/Sub emulator takes to hand a published message to a subscriber: the floor
of each Pub/Sub hop on a round's critical path on the local stack (issue #24).

``python -m benchmarks.tools.pubsub_latency [N]`` starts the emulators on free ports, publishes
N small messages one at a time (the adapters' 1 ms batch latency) and times, for each, from the
publish call to the message in hand:

* a unary pull already waiting (how a learner takes a task, ``max_messages=1``), issued a
  random 0-100 ms before the publish: the emulator answers a waiting pull on a cycle of about
  50 ms from when it came, so the wait depends on that offset;
* a streaming pull's callback (how the aggregator takes results).

It prints the medians and 90th percentiles; the emulators are stopped at the end.
"""

from __future__ import annotations

import os
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bucketlearn.local.emulators import PROJECT, Emulators

PAYLOAD = b"x" * 200  # about a task or result message


def _quantiles(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {1000 * statistics.median(ordered):.1f} ms, p90 {1000 * p90:.1f} ms"


def unary(pub, sub, topic: str, subscription: str, n: int) -> tuple[list[float], list[float]]:
    """Publish-to-received with a unary pull already waiting, and the publish call itself."""
    received, calls = [], []
    for _ in range(n):
        box: dict[str, float] = {}

        def pull(box: dict[str, float] = box) -> None:
            answer = sub.pull(request={"subscription": subscription, "max_messages": 1},
                              timeout=10)
            box["at"] = time.perf_counter()
            sub.acknowledge(request={"subscription": subscription,
                                     "ack_ids": [m.ack_id for m in answer.received_messages]})

        puller = threading.Thread(target=pull)
        puller.start()
        time.sleep(random.uniform(0.0, 0.1))  # the pull is waiting at the emulator
        started = time.perf_counter()
        pub.publish(topic, PAYLOAD).result(timeout=10)
        calls.append(time.perf_counter() - started)
        puller.join(timeout=15)
        received.append(box["at"] - started)
    return received, calls


def streaming(pub, sub, topic: str, subscription: str, n: int) -> list[float]:
    """Publish-to-callback on a streaming pull."""
    arrivals: queue.Queue[float] = queue.Queue()

    def callback(message) -> None:
        arrivals.put(time.perf_counter())
        message.ack()

    future = sub.subscribe(subscription, callback=callback)
    try:
        time.sleep(1.0)  # the stream is open
        out = []
        for _ in range(n):
            started = time.perf_counter()
            pub.publish(topic, PAYLOAD)
            out.append(arrivals.get(timeout=10) - started)
            time.sleep(0.02)
        return out
    finally:
        future.cancel()


def main(n: int = 40) -> None:
    random.seed(0)
    with tempfile.TemporaryDirectory(prefix="pubsub-latency-") as logs:
        emulators = Emulators(logs=Path(logs)).start()
        try:
            os.environ["PUBSUB_EMULATOR_HOST"] = f"127.0.0.1:{emulators.ports['pubsub']}"
            from google.cloud import pubsub_v1  # noqa: PLC0415 - after the emulator's address

            pub = pubsub_v1.PublisherClient(
                batch_settings=pubsub_v1.types.BatchSettings(max_latency=0.001))
            sub = pubsub_v1.SubscriberClient()
            paths = {}
            for name in ("latency-unary", "latency-stream"):
                topic = pub.topic_path(PROJECT, name)
                pub.create_topic(name=topic, timeout=30)
                subscription = sub.subscription_path(PROJECT, name)
                sub.create_subscription(name=subscription, topic=topic,
                                        ack_deadline_seconds=60, timeout=30)
                paths[name] = (topic, subscription)
            received, calls = unary(pub, sub, *paths["latency-unary"], n)
            print(f"unary pull, waiting: publish to received {_quantiles(received)}; "
                  f"the publish call {_quantiles(calls)}")
            print(f"streaming pull: publish to callback "
                  f"{_quantiles(streaming(pub, sub, *paths['latency-stream'], n))}")
        finally:
            emulators.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if sys.argv[1:] else 40)
