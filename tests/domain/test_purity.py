"""The domain loads without TensorFlow, Keras, pyarrow or a Google client."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("tensorflow", "keras", "pyarrow", "google.cloud.", "google.api_core", "streamlit")
# (the bare ``google`` and ``google.cloud`` namespace packages are loaded at start-up by the
# google-cloud packages' .pth files, before any import of ours)


def test_the_domain_imports_nothing_heavy() -> None:
    """Importing every domain module in a fresh interpreter loads none of the heavy libraries."""
    # Prepare
    code = ("import pkgutil, sys, importlib, bucketlearn.domain as d\n"
            "[importlib.import_module(f'bucketlearn.domain.{m.name}') "
            "for m in pkgutil.iter_modules(d.__path__)]\n"
            f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))")
    # Execute
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=False)
    # Assert
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]", result.stdout
