"""How the dashboard writes a value: numbers, percentages, durations, dollars and times read
off documents (an em dash when missing), and a user's string made safe for Markdown (``plain``).
No I/O: a plain function of its argument each."""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

_MARKDOWN_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character


def as_float(value: Any) -> float | None:
    """A document's value as a finite float (None when missing, not a number, or infinite)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def as_int(value: Any) -> int:
    """A document's value as an int (0 when it is not a number)."""
    number = as_float(value)
    return int(number) if number is not None else 0


def timestamp(value: Any) -> pd.Timestamp | None:
    """Float epoch seconds -> a UTC timestamp (None when missing)."""
    seconds = as_float(value)
    return None if seconds is None else pd.Timestamp(seconds, unit="s", tz="UTC")


def format_duration(seconds: float | None) -> str:
    """'45s', '3m 20s', '2h 05m', '1d 3h'; an em dash when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    total = max(0, round(seconds))
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m {total % 60:02d}s"
    if total < 86400:
        return f"{total // 3600}h {total % 3600 // 60:02d}m"
    return f"{total // 86400}d {total % 86400 // 3600}h"


def format_percent(value: Any) -> str:
    number = as_float(value)
    return "—" if number is None else f"{number:.1%}"


def format_number(value: Any, digits: int = 4) -> str:
    number = as_float(value)
    return "—" if number is None else f"{number:.{digits}f}"


def format_cost(usd: Any) -> str:
    """Dollars for the page: '$0.0123', '< $0.000001' for a trace, '—' when unknown."""
    value = as_float(usd)
    if value is None:
        return "—"
    if value == 0:
        return "$0"
    if value < 0.000001:
        return "< $0.000001"
    return f"${value:.2f}" if value >= 1 else f"${value:.6f}".rstrip("0")


def format_cost_short(usd: Any) -> str:
    """Dollars for a headline figure, to two significant digits at most: '$0.0012', '$0.05',
    '$12', '< $0.0001' for a trace, '—' when unknown (tables keep ``format_cost``)."""
    value = as_float(usd)
    if value is None:
        return "—"
    if value == 0:
        return "$0"
    if value < 0.0001:
        return "< $0.0001"
    if value >= 10:
        return f"${value:,.0f}"
    return f"${value:.2g}"


def plain(value: Any) -> str:
    """A string from users (object, column and class names, reasons, a URL parameter, an
    error's text) made safe to put into Markdown (``st.error``, ``st.caption``, ...): every
    ASCII punctuation character backslash-escaped (CommonMark allows it for each), so the
    string shows as the text it is, never as a link, an image, emphasis or a directive, and
    line breaks as spaces, so it opens no block."""
    text = re.sub(r"\s*[\r\n]+\s*", " ", str(value))
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)
