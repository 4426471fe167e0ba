"""What a function is handed and what it answers: storage events, outcomes, safe object names."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

MAX_OBJECT_NAME = 1024
_SHOWN_NAME = 200


def is_control(ch: str) -> bool:
    """A control character (C0, DEL, C1, or a Unicode line/paragraph separator)."""
    code = ord(ch)
    return code < 32 or 127 <= code < 160 or code in (0x2028, 0x2029)


def _escaped(ch: str) -> str:
    if not is_control(ch):
        return ch
    return f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}"


def display_uri(bucket: str, name: str) -> str:
    """``gs://bucket/name`` for messages and logs: control characters escaped, long names cut.

    An object name is user input; a newline in it must not forge a log line or a second line
    in a job's error.
    """
    shown = "".join(_escaped(ch) for ch in name)
    if len(name) > MAX_OBJECT_NAME:
        shown = f"{shown[:_SHOWN_NAME]}…({len(name)} characters)"
    return f"gs://{bucket}/{shown}"


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    FAILED = "failed"
    IGNORED = "ignored"
    CANCELLED = "cancelled"  # the job was cancelled while its upload was being split
    BUSY = "busy"


@dataclass(frozen=True)
class StorageEvent:
    """The fields of an Eventarc ``object.finalized`` event that bucketlearn uses."""

    bucket: str
    name: str
    generation: int
    size: int = 0
    event_time: float | None = None

    @classmethod
    def from_cloudevent_data(cls, data: dict[str, Any], event_time: float | None = None
                             ) -> StorageEvent:
        return cls(bucket=str(data["bucket"]), name=str(data["name"]),
                   generation=int(data.get("generation") or 0), size=int(data.get("size") or 0),
                   event_time=event_time)


def skipped(event: StorageEvent, now: float, max_age_seconds: float) -> str | None:
    """Why an uploads-bucket event is acknowledged and left alone (IGNORED): not a ``.csv``
    object, or older than ``max_age_seconds`` (Eventarc's retries of a lost event); None when it
    is to be handled."""
    if not event.name.lower().endswith(".csv"):
        return "not a .csv object"
    if event.event_time and now - event.event_time > max_age_seconds:
        return f"an event older than {max_age_seconds}s"
    return None
