"""The whole local stack (functions, relay, workers) on the session's emulators."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import unique_prefix


@pytest.fixture
def make_stack(emulators: Any, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Callable[..., Any]]:
    """Start LocalStacks sharing the emulators, each with its own names; stop them when the test
    ends (a stack left running would take CPU from every later test)."""
    from bucketlearn.local.stack import LocalStack

    stacks: list[Any] = []

    def start(label: str = "e2e", **kwargs: Any) -> Any:
        home = Path(tmp_path_factory.mktemp(f"stack-{label}"))
        stack = LocalStack(home=home, emulators=kwargs.pop("emulators", emulators),
                           name_prefix=unique_prefix(label),
                           dashboard=kwargs.pop("dashboard", False), **kwargs)
        stacks.append(stack)
        return stack.start(timeout=180)

    try:
        yield start
    finally:
        for stack in stacks:
            stack.stop()
