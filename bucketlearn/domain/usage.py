"""What a job used, and what that costs at list prices. Pure.

A job's usage (``Job.usage``) is what its processes counted while serving it
(``adapters.metered``): Firestore document reads and writes, Cloud Storage operations by class
and bytes written, Pub/Sub messages and bytes, the seconds learners spent on its tasks, the
aggregator on its folds, and the upload function's invocations. ``estimate_cost`` prices it with
``PRICES``: one table, dated, with where each price comes from. It is an estimate of what the
job *added*: instances that idle between jobs, storage kept over time, network egress and free
tiers are not in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# the quantities a job's usage counts (``adapters.metered``, the learners' and the aggregator's
# seconds, the function's invocations): what a job document's ``usage`` may hold
USAGE_KEYS = frozenset({
    "firestore_reads", "firestore_writes", "firestore_deletes", "storage_class_a",
    "storage_class_b", "storage_bytes_written", "storage_bytes_read", "storage_deletes",
    "pubsub_messages", "pubsub_bytes", "pubsub_pulled", "worker_seconds", "worker_cpu_seconds",
    "aggregator_seconds", "function_invocations"})

PRICES_AS_OF = "2026-11-25"
PRICES_SOURCE = ("list prices in USD as published on cloud.google.com/firestore/pricing "
                 "(regional location), /storage/pricing (Standard class, regional), "
                 "/pubsub/pricing and /run/pricing (tier 1 region, instance-based billing); "
                 "copied from those pages as known to the team, not fetched on that date "
                 "(this workplace has no internet): check them before relying on a figure")


@dataclass(frozen=True)
class Prices:
    """Unit prices (USD) and the instance sizes they are multiplied by."""

    firestore_read: float = 0.03 / 100_000
    firestore_write: float = 0.09 / 100_000
    firestore_delete: float = 0.01 / 100_000
    storage_class_a: float = 0.005 / 1_000  # writes, listings
    storage_class_b: float = 0.0004 / 1_000  # reads, metadata
    pubsub_byte: float = 40.0 / 1024**4  # $40 per TiB of throughput
    pubsub_min_message_bytes: int = 1000  # each message counts at least 1 kB
    vcpu_second: float = 0.000018
    gib_second: float = 0.000002
    invocation: float = 0.40 / 1_000_000
    # the deployment's sizes (infra/modules/bucketlearn/variables.tf defaults)
    worker_vcpu: float = 2.0
    worker_gib: float = 4.0
    aggregator_vcpu: float = 1.0
    aggregator_gib: float = 2.0


PRICES = Prices()


def estimate_cost(usage: Mapping[str, float], prices: Prices = PRICES) -> dict[str, float]:
    """Dollars by item and in total for a job's ``usage`` (keys as ``adapters.metered``
    counts them; a missing key counts as 0).

    Returns:
        {"firestore", "storage", "pubsub", "learners", "aggregator", "functions", "total"},
        each rounded to a millionth of a dollar.
    """
    def get(key: str) -> float:
        value = usage.get(key) or 0.0
        return float(value) if isinstance(value, (int, float)) else 0.0

    messages = get("pubsub_messages")
    pubsub_bytes = max(get("pubsub_bytes"), messages * prices.pubsub_min_message_bytes)
    items = {
        "firestore": (get("firestore_reads") * prices.firestore_read
                      + get("firestore_writes") * prices.firestore_write
                      + get("firestore_deletes") * prices.firestore_delete),
        "storage": (get("storage_class_a") * prices.storage_class_a
                    + get("storage_class_b") * prices.storage_class_b),
        "pubsub": pubsub_bytes * prices.pubsub_byte,
        "learners": get("worker_seconds") * (prices.worker_vcpu * prices.vcpu_second
                                             + prices.worker_gib * prices.gib_second),
        "aggregator": get("aggregator_seconds") * (prices.aggregator_vcpu * prices.vcpu_second
                                                   + prices.aggregator_gib * prices.gib_second),
        "functions": get("function_invocations") * prices.invocation,
    }
    items["total"] = sum(items.values())
    return {k: round(v, 6) for k, v in items.items()}


def summary(usage: Mapping[str, float]) -> dict[str, object]:
    """The usage and its cost, as ``status --json`` and the dashboard show them."""
    return {"usage": {k: v for k, v in sorted(usage.items())},
            "cost_usd": estimate_cost(usage), "prices_as_of": PRICES_AS_OF}


def added(before: Any, more: Mapping[str, float]) -> dict[str, float]:
    """A job's usage ``before`` (its stored ``usage``; what is not a number is dropped) with
    ``more`` added to it."""
    total = {k: float(v) for k, v in (before or {}).items() if isinstance(v, (int, float))}
    for key, value in more.items():
        total[key] = round(total.get(key, 0.0) + value, 6)
    return total


def task_usage(stats: Mapping[str, Any]) -> dict[str, float]:
    """What a learner used for one task, as its result's ``stats`` say: its ``usage`` (the
    quantities of ``USAGE_KEYS``) and its CPU seconds as ``worker_cpu_seconds``."""
    used = {k: float(v) for k, v in (stats.get("usage") or {}).items()
            if k in USAGE_KEYS and isinstance(v, (int, float))}
    cpu = stats.get("cpu_seconds")
    if isinstance(cpu, (int, float)):
        used["worker_cpu_seconds"] = used.get("worker_cpu_seconds", 0.0) + float(cpu)
    return used
