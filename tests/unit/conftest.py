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
