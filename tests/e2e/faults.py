"""What the fault-injection files share: the supervisor thread, uploads, waits, and the record
each scenario leaves in ``tests/artifacts/reliability-<file>.json`` (docs/RELIABILITY.md's table
reproduces them)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bucketlearn import layout
from tests.e2e.helpers import DIGITS

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def reliability_summary(name: str, results: list[dict[str, Any]]) -> Callable[..., Any]:
    """A module-scoped autouse fixture writing ``results`` to ``reliability-<name>.json``."""

    @pytest.fixture(scope="module", autouse=True)
    def summary() -> Iterator[None]:
        yield
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / f"reliability-{name}.json").write_text(json.dumps(results, indent=2))

    return summary


def record(results: list[dict[str, Any]], scenario: str, injected: str, checked: str,
           **figures: Any) -> None:
    results.append({"scenario": scenario, "injected": injected, "checked": checked,
                    "result": "pass", **figures})


class Supervisor:
    """Runs the stack's supervise loop (restarts crashed functions and workers) in a thread."""

    def __init__(self, stack: Any) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=stack.supervise,
                                       kwargs={"stop": self.stop, "interval": 0.5}, daemon=True)

    def __enter__(self) -> Supervisor:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def submit(svc: Any, name: str, metadata: dict[str, str], path: Path = DIGITS) -> str:
    info = svc.store.write_file(svc.settings.uploads_bucket, name, str(path), "text/csv",
                                metadata)
    return layout.job_id_for(info.bucket, info.name, info.generation)


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
