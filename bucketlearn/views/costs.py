"""The Usage & cost tab: what the job used (``status --json``'s ``usage``) and its estimated
cost in dollars (``cost_usd``), with where the dollars come from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bucketlearn.views.formats import as_float, format_cost

# what each counted quantity of ``Job.usage`` (``domain.usage.USAGE_KEYS``) is called on the
# page, in this order
USAGE_LABELS = {
    "worker_seconds": "Learner seconds (on its tasks)",
    "worker_cpu_seconds": "Learner CPU seconds",
    "aggregator_seconds": "Aggregator seconds (folds)",
    "function_invocations": "Upload function invocations",
    "firestore_reads": "Firestore reads",
    "firestore_writes": "Firestore writes",
    "firestore_deletes": "Firestore deletes",
    "storage_class_a": "Storage writes and listings (class A)",
    "storage_class_b": "Storage reads (class B)",
    "storage_bytes_written": "Storage bytes written",
    "storage_bytes_read": "Storage bytes read",
    "storage_deletes": "Storage deletes",
    "pubsub_messages": "Pub/Sub messages published",
    "pubsub_pulled": "Pub/Sub messages delivered",
    "pubsub_bytes": "Pub/Sub bytes (published and delivered)",
}
COST_LABELS = {"learners": "Learners", "aggregator": "Aggregator", "functions": "Functions",
               "firestore": "Firestore", "storage": "Cloud Storage", "pubsub": "Pub/Sub"}


def usage_rows(summary: Mapping[str, Any]) -> list[dict[str, str]]:
    """What the job used (``status --json``'s ``usage``), one row per counted quantity: the
    known ones first, in ``USAGE_LABELS``' order, then any other under its own key."""
    usage = summary.get("usage") or {}
    keys = [k for k in USAGE_LABELS if k in usage] + sorted(k for k in usage
                                                            if k not in USAGE_LABELS)
    rows = []
    for key in keys:
        value = as_float(usage[key])
        shown = "—" if value is None else (f"{value:,.1f}" if key.endswith("seconds")
                                           else f"{value:,.0f}")
        rows.append({"used": USAGE_LABELS.get(key, key), "amount": shown})
    return rows


def cost_rows(summary: Mapping[str, Any]) -> list[dict[str, str]]:
    """The estimated cost by item, then the total (``status --json``'s ``cost_usd``)."""
    cost = summary.get("cost_usd") or {}
    rows = [{"item": label, "usd": format_cost(cost.get(key))}
            for key, label in COST_LABELS.items() if key in cost]
    if "total" in cost:
        rows.append({"item": "Total", "usd": format_cost(cost["total"])})
    return rows


def cost_note(summary: Mapping[str, Any]) -> str:
    """Where the dollars come from, said under the table."""
    return (f"An estimate at list prices as of {summary.get('prices_as_of') or 'an unknown date'}"
            " of what this job added: idle instances, storage kept over time, network egress "
            "and free tiers are not in it. The counts come from the job's own processes.")
