"""What arrives on a topic, checked at the edge: every field of a task or result message.

A message on the tasks or results topic can come from any account allowed to publish there, so
nothing in it is trusted: ``decode`` parses its bytes (at most ``MAX_MESSAGE_BYTES``, strict
JSON: no ``NaN`` or ``Infinity``) and the fields are checked one by one (an id of the form the
split gives jobs, integers in range, finite numbers, bounded text, digests of their form).
What fails raises ``MessageError`` naming the field, what was expected and what was found; the
entry point logs it and acknowledges the message, so a bad message is dropped once and never
stops the loop that pulled it.

A result's ``stats`` (what its learner measured) keep only the keys listed here, each a finite
number in range; its ``usage`` only the quantities ``domain.usage.USAGE_KEYS`` prices. A key
this code does not know is dropped (a newer learner's), a known key of the wrong type refuses
the message.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from bucketlearn.domain.usage import USAGE_KEYS
from bucketlearn.layout import JOB_ID_RE

MAX_MESSAGE_BYTES = 64 * 1024  # a task or result message is well under 4 KiB
MAX_INDEX = 10_000_000  # epochs, rounds, task indices, versions
MAX_TEXT = 2000  # a failure's reason
MAX_NAME = 200  # a worker id
MAX_PARTS = 4096  # shard parts a task names
MAX_COUNT = 1e15  # a usage quantity, a number of examples or bytes
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_PRINTABLE_NAME = re.compile(r"^[\w.:@/+-]*$")

# a result's stats: the key and the range of its number
_STAT_RANGES: dict[str, tuple[float, float]] = {
    **{key: (0.0, 1e7) for key in ("fetch_seconds", "train_seconds", "write_seconds",
                                    "cpu_seconds")},
    **{key: (0.0, 1e11) for key in ("finished_at", "train_started_at", "train_ended_at")},
    "examples": (0.0, MAX_COUNT),
    "result_bytes": (0.0, MAX_COUNT),
    "train_loss": (-1e30, 1e30),
}
STAT_KEYS = frozenset(_STAT_RANGES) | {"usage"}


class MessageError(ValueError):
    """A message is not one this project sends: which field, what was expected, what was
    found."""

    def __init__(self, field: str, expected: str, found: Any) -> None:
        self.field = field
        shown = repr(found)
        shown = shown if len(shown) <= 80 else shown[:80] + "…"
        super().__init__(f"{field}: expected {expected}; found {shown}")


def _no_constant(name: str) -> Any:
    raise MessageError("body", "strict JSON (no NaN or Infinity)", name)


def decode(raw: bytes) -> dict[str, Any]:
    """A message's JSON object.

    Raises:
        MessageError: the bytes are too many, not UTF-8 JSON, or not an object.
    """
    if len(raw) > MAX_MESSAGE_BYTES:
        raise MessageError("body", f"at most {MAX_MESSAGE_BYTES} bytes", f"{len(raw)} bytes")
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except MessageError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise MessageError("body", "a JSON object", f"unreadable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise MessageError("body", "a JSON object", type(data).__name__)
    return data


def job_id(value: Any, field: str = "job_id") -> str:
    """A job id as the split makes them (``layout.job_id_for``)."""
    if not isinstance(value, str) or not JOB_ID_RE.match(value):
        raise MessageError(field, "a job id such as 'digits-3f2a9c1b7e4d'", value)
    return value


def integer(value: Any, field: str, low: int = 0, high: int = MAX_INDEX) -> int:
    """A whole number from ``low`` to ``high`` (JSON's 3 or 3.0; never a bool or a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise MessageError(field, f"a whole number from {low} to {high}", value)
    if not low <= value <= high:
        raise MessageError(field, f"a whole number from {low} to {high}", value)
    return int(value)


def number(value: Any, field: str, low: float, high: float) -> float:
    """A finite number from ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and low <= value <= high):
        raise MessageError(field, f"a finite number from {low:g} to {high:g}", value)
    return float(value)


def text(value: Any, field: str, limit: int = MAX_TEXT, pattern: re.Pattern[str] | None = None
         ) -> str:
    """A string of at most ``limit`` characters (matching ``pattern``, where given)."""
    if not isinstance(value, str) or len(value) > limit or (
            pattern is not None and value and not pattern.match(value)):
        what = f"a string of at most {limit} characters" + (
            f" matching {pattern.pattern}" if pattern is not None else "")
        raise MessageError(field, what, value)
    return value


def digest(value: Any, field: str) -> str:
    """A state digest (``codec.state_digest``), or empty."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not DIGEST_RE.match(value):
        raise MessageError(field, "'sha256:' and 64 hex digits", value)
    return value


def flag(value: Any, field: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise MessageError(field, "true or false", value)
    return value


def worker_name(value: Any, field: str = "worker_id") -> str:
    """A worker's id (host name, pid, a prefix): letters, digits and ``.:@/+-_``."""
    return text(value if value is not None else "", field, MAX_NAME, _PRINTABLE_NAME)


def get(data: Mapping[str, Any], key: str, default: Any) -> Any:
    """``data[key]``, or ``default`` where it is missing or null."""
    value = data.get(key)
    return default if value is None else value


def stats(value: Any) -> dict[str, Any]:
    """A result's stats: the known keys, each a finite number in its range; ``usage`` a mapping
    of known quantities. Unknown keys are dropped.

    Raises:
        MessageError: ``stats`` or ``usage`` is not an object, or a known key holds what it
            cannot.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MessageError("stats", "an object", value)
    kept: dict[str, Any] = {}
    for key, (low, high) in _STAT_RANGES.items():
        if value.get(key) is not None:
            kept[key] = number(value[key], f"stats.{key}", low, high)
    if value.get("usage") is not None:
        kept["usage"] = usage(value["usage"], "stats.usage")
    return kept


def usage(value: Any, field: str) -> dict[str, float]:
    """What a process used for a job: known quantities, each a number from 0 to 10^15."""
    if not isinstance(value, Mapping):
        raise MessageError(field, "an object", value)
    return {key: number(value[key], f"{field}.{key}", 0.0, MAX_COUNT)
            for key in sorted(USAGE_KEYS) if value.get(key) is not None}


def span(value: Any) -> tuple[float, float]:
    """A task's share of its job's schedule: (start, end) within [0, 1], start <= end; (0, 0)
    when it has none."""
    if value is None:
        return (0.0, 0.0)
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise MessageError("span", "[start, end]", value)
    start, end = (number(v, "span", 0.0, 1.0) for v in value)
    if start > end:
        raise MessageError("span", "start <= end", value)
    return (start, end)


def decoder(kind: Any) -> Callable[[bytes], tuple[Any, str | None]]:
    """A message's bytes to ``kind`` (``ports.TaskMessage`` or ``ports.ResultMessage``, whose
    ``from_dict`` checks every field): (the message, None), or (None, why it is not one of
    ours), never an exception."""
    def decode_as(raw: bytes) -> tuple[Any, str | None]:
        try:
            return kind.from_dict(decode(raw)), None
        except (ValueError, KeyError, TypeError) as exc:  # MessageError is a ValueError
            return None, str(exc)[:500]
    return decode_as


def encode(message: Any) -> bytes:
    """A message's bytes as published: its ``to_dict`` as strict JSON, a number that is not
    finite (a diverging task's loss) sent as null, which reads as not measured."""
    return json.dumps(_finite(message.to_dict()), allow_nan=False).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
