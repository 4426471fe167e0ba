"""Unit-suite fixtures (in-memory ports only, no emulators)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@pytest.fixture(autouse=True, scope="session")
def _no_bucketlearn_environment_in_shared_fixtures():
    """Keep the developer's BUCKETLEARN_* variables away from module-scoped fixtures too.

    tests/conftest.py isolates each test, but module-scoped fixtures (which call code that reads
    os.environ, e.g. handle_upload -> resolve_options) are set up before that function fixture.
    """
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("BUCKETLEARN_"):
                mp.delenv(key)
        yield


@pytest.fixture
def run_cli(monkeypatch):
    """``run_cli(svc, *argv)``: ``bucketlearn *argv`` with ``svc`` as the Services of every
    command, handed to ``cli.main`` as its factory (in place of ``bootstrap.google_services``).
    The CLI still resolves its target first: here a project the environment names."""
    from bucketlearn.entrypoints import cli

    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "bucketlearn-test")

    def run(svc, *argv: str) -> int:
        return cli.main(list(argv), services=lambda settings: svc)

    return run
