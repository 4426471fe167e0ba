"""The whole local stack (the upload function, its event forwarder, the aggregator, workers) on the session's emulators."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import unique_prefix
from tests.e2e.helpers import DIGITS

LOG_TAIL_LINES = 60


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[pytest.TestReport]:
    """Keep each phase's report on the test (``report_call``), so a fixture's teardown can tell
    whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def print_log_tails(stacks: list[Any]) -> None:
    """The last lines of every process log of ``stacks``, printed: pytest shows them under the
    failed test's teardown output, where a CI log keeps them after the temp dirs are gone."""
    for stack in stacks:
        for name, proc in list(stack.procs.items()):
            print(f"----- {name}: last {LOG_TAIL_LINES} lines of {proc.log_path} -----")
            print(proc.tail(LOG_TAIL_LINES))


@contextlib.contextmanager
def stack_factory(emulators: Any, tmp_path_factory: pytest.TempPathFactory,
                  failed: Callable[[], bool] = lambda: False) -> Iterator[Callable[..., Any]]:
    """Start LocalStacks sharing the emulators, each with its own names; stop them all on exit,
    printing their logs' tails first when ``failed()`` says the test failed."""
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
        if failed():
            print_log_tails(stacks)
        for stack in stacks:
            stack.stop()


@pytest.fixture
def make_stack(emulators: Any, tmp_path_factory: pytest.TempPathFactory,
               request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """Stacks stopped when the test ends (a stack left running would take CPU from every later
    test); when the test failed, their processes' logs end its report."""

    def failed() -> bool:
        report = getattr(request.node, "report_call", None)
        return bool(report is not None and report.failed)

    with stack_factory(emulators, tmp_path_factory, failed) as start:
        yield start


@pytest.fixture(scope="module")
def make_module_stack(emulators: Any, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[Callable[..., Any]]:
    """Stacks shared by a module's tests, stopped when the module ends."""
    with stack_factory(emulators, tmp_path_factory) as start:
        yield start


@pytest.fixture(scope="module")
def proxied(emulators: Any) -> Iterator[Any]:
    """The session's emulators behind TCP proxies that can drop and refuse connections."""
    from tests.e2e.proxy import ProxiedEmulators

    proxies = ProxiedEmulators(emulators)
    try:
        yield proxies
    finally:
        proxies.stop()


@pytest.fixture(scope="module")
def small_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 900 rows of digits (3 shards): enough tasks to inject faults into, quickly."""
    path = tmp_path_factory.mktemp("data") / "digits900.csv"
    lines = DIGITS.read_text().splitlines()
    path.write_text("\n".join(lines[:901]) + "\n")
    return path
