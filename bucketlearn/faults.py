"""Failpoints for the reliability suite: off unless BUCKETLEARN_FAULTS names them.

``crash_point`` kills the process on the spot (``os._exit``: no cleanup, no ``finally``), the way
an OOM kill or a lost instance would, once per fault directory.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from bucketlearn.config import Settings

log = logging.getLogger(__name__)


def armed(settings: Settings, point: str) -> bool:
    """True if ``point`` is enabled and has not fired yet (then marks it fired)."""
    if point not in settings.faults:
        return False
    if settings.fault_dir is None:
        return True
    marker = Path(settings.fault_dir) / f"{point}.fired"
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        with open(marker, "x", encoding="utf-8") as handle:
            handle.write(str(os.getpid()))
    except FileExistsError:
        return False
    return True


def crash_point(settings: Settings, point: str) -> None:
    if armed(settings, point):
        log.error("fault injection: crashing at %s", point)
        logging.shutdown()
        os._exit(137)
