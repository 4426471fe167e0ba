"""Fault injection: failpoints for the reliability suite, and faulty ports for the tests.

``crash_point`` kills the process on the spot (``os._exit``: no cleanup, no ``finally``), the way
an OOM kill or a lost instance would, once per fault directory; off unless BUCKETLEARN_FAULTS
names the point. ``Faulty`` and ``inject`` wrap a port of a ``Services`` (the in-memory
adapters' or any other) so that a test fails, delays or interleaves named calls of it without
patching the port object.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bucketlearn.config import Settings

if TYPE_CHECKING:
    from bucketlearn.ports import Services

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


# a replaced call: handed the port's own bound method first, then the call's arguments
Fault = Callable[..., Any]


class Faulty:
    """A port with some of its calls replaced (``inject`` puts one into a ``Services``).

    Contract: ``Faulty(port, name=fault, ...)`` answers every attribute of ``port`` by reading
    through to it (the port's state stays the port's: a test reads ``published``, ``leases`` or
    any document through either), except each method named: calling it calls
    ``fault(real, *args, **kwargs)`` with ``real`` the port's own bound method, and answers what
    the fault answers. A fault may raise (a backend refusing or failing), wait, act in between
    (a cancel landing) and call ``real`` or not. Only calls made through the wrapper are
    replaced (not those the port makes on itself). Setting an attribute sets it on the port. A
    name the port has no callable for is refused at construction.
    """

    def __init__(self, port: Any, **faults: Fault) -> None:
        for name in faults:
            if not callable(getattr(port, name, None)):
                raise AttributeError(f"{type(port).__name__} has no call {name!r} to replace")
        object.__setattr__(self, "_port", port)
        object.__setattr__(self, "_faults", dict(faults))

    @property
    def port(self) -> Any:
        """The wrapped port."""
        return self._port

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._port, name)
        fault = self._faults.get(name)
        if fault is None:
            return real
        return lambda *args, **kwargs: fault(real, *args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._port, name, value)


def inject(svc: Services, port: str, **faults: Fault) -> Services:
    """``svc`` with its ``port`` (``"store"``, ``"queue"``, ``"registry"``, ``"results"``)
    wrapped in a ``Faulty`` replacing the calls named; ``svc`` itself is left as it is (the
    same ports underneath: what either writes, both read).

    Raises:
        AttributeError: ``svc`` has no such port, or the port no such call.
    """
    return dataclasses.replace(svc, **{port: Faulty(getattr(svc, port), **faults)})
