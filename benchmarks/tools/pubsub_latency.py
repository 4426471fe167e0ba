"""How long the Pub/Sub emulator takes to hand a published message to a subscriber: the floor
of each Pub/Sub hop on a round's critical path on the local stack.

``python -m benchmarks.tools.pubsub_latency [N]`` starts the emulators on free ports, publishes
N small messages one at a time (with the adapters' batch settings, ``adapters.pubsub.BATCH``) and times, for each, from the
publish call to the message in hand:

* a unary pull already waiting (how a learner takes a task, ``max_messages=1``), issued a
  random 0-100 ms before the publish: the emulator answers a waiting pull on a cycle of about
  50 ms from when it came, so the wait depends on that offset;
* a streaming pull's callback (how the aggregator takes results).

and, for a unary pull issued a fixed 0-300 ms before the publish, the median wait at each
offset (the cycle shows there). It prints the figures and writes them, with every sample, to
``benchmarks/results/pubsub_latency.json``; the emulators are stopped at the end.
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

from benchmarks.harness.paths import RESULTS
from benchmarks.report.results import new_result, write_result
from bucketlearn.adapters.pubsub import BATCH
from bucketlearn.local.emulators import PROJECT, Emulators

PAYLOAD = b"x" * 200  # about a task or result message
OFFSETS = (0.0, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.3)  # pull issued this long before


def stats(seconds: list[float]) -> dict[str, float]:
    """Median, 90th percentile, least and most, in ms."""
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return {"median_ms": round(1000 * statistics.median(ordered), 1),
            "p90_ms": round(1000 * p90, 1), "min_ms": round(1000 * ordered[0], 1),
            "max_ms": round(1000 * ordered[-1], 1), "n": len(ordered)}


def unary(pub, sub, topic: str, subscription: str, n: int, offset: float | None = None
          ) -> tuple[list[float], list[float]]:
    """Publish-to-received with a unary pull already waiting (issued ``offset`` seconds before
    the publish; None: a random 0-100 ms), and the publish call itself."""
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
        time.sleep(random.uniform(0.0, 0.1) if offset is None else offset)  # pull waiting
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
    result = new_result("pubsub_latency", False, {"messages": n, "payload_bytes": len(PAYLOAD),
                                                  "offsets_s": list(OFFSETS)})
    with tempfile.TemporaryDirectory(prefix="pubsub-latency-") as logs:
        emulators = Emulators(logs=Path(logs)).start()
        try:
            os.environ["PUBSUB_EMULATOR_HOST"] = f"127.0.0.1:{emulators.ports['pubsub']}"
            from google.cloud import pubsub_v1  # noqa: PLC0415 - after the emulator's address

            pub = pubsub_v1.PublisherClient(batch_settings=BATCH)  # as the adapters publish
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
            streamed = streaming(pub, sub, *paths["latency-stream"], n)
            by_offset = {f"{1000 * o:.0f}": stats(unary(pub, sub, *paths["latency-unary"],
                                                        max(5, n // 4), o)[0])
                         for o in OFFSETS}
        finally:
            emulators.stop()
    result["figures"] = {"unary_waiting": stats(received), "publish_call": stats(calls),
                         "streaming": stats(streamed), "unary_by_offset_ms": by_offset,
                         "samples_ms": {"unary_waiting": [round(1000 * x, 2) for x in received],
                                        "streaming": [round(1000 * x, 2) for x in streamed]}}
    print(f"unary pull, waiting (random 0-100 ms): {result['figures']['unary_waiting']}")
    print(f"the publish call: {result['figures']['publish_call']}")
    print(f"streaming pull: {result['figures']['streaming']}")
    for offset, figure in by_offset.items():
        print(f"unary pull issued {offset} ms before the publish: {figure}")
    print(write_result(RESULTS, "pubsub_latency", result))


if __name__ == "__main__":
    main(int(sys.argv[1]) if sys.argv[1:] else 40)
