"""Structured logging: JSON lines with ``severity`` in the cloud (Cloud Logging reads them)."""

from __future__ import annotations

import json
import logging
import sys
import time

_LEVELS = {"WARNING": "WARNING", "ERROR": "ERROR", "CRITICAL": "CRITICAL", "INFO": "INFO",
           "DEBUG": "DEBUG"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"severity": _LEVELS.get(record.levelname, "DEFAULT"),
                 "message": record.getMessage(), "logger": record.name,
                 "time": self.formatTime(record)}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(log_format: str = "text", level: int = logging.INFO) -> None:
    """Configure the root logger once per process."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("urllib3", "google", "absl", "tensorflow", "werkzeug"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class Stopwatch:
    """Seconds between successive ``lap`` calls, by name (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 6)
        self._last = now
