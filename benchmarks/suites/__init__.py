"""The benchmarks, one module each; no suite imports another or the runner (what two share is in
``benchmarks.harness`` or ``benchmarks.report``).

``SUITES`` registers the ones ``python -m benchmarks.run`` runs, in order, with the title of
their section in docs/BENCHMARKS.md. A registered suite provides ``FULL`` and ``SMOKE`` (its
parameters), ``run(out, smoke=False, params=None)`` returning its result
(``report.results.new_result`` filled), and its tables: ``tables(result)`` (title, header, rows
each) or ``TABLE_HEADER`` with ``table_rows(result)``, optionally ``extra_tables(result)``
(markdown). ``STANDALONE`` are run on their own: ``python -m benchmarks.suites.<name>``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

SUITES = {"ingest": "1. Ingestion", "parity": "2. Accuracy parity",
          "roundtrip": "3. The round trip and the pipeline's overhead",
          "scale": "4. Control-plane scale",
          "methods": "5. Choosing the aggregation (tuning datasets only)",
          "schedules": "6. Choosing the learning-rate schedule (tuning datasets only)",
          "speedup": "7. Time to an accurate model with more workers"}
NAMES = tuple(SUITES)
STANDALONE = ("rate_rule", "round_cause", "regression_folds", "storage_emulators", "codec",
              "batch_predict", "continued")


def load(name: str) -> ModuleType:
    """The suite module ``name``."""
    return importlib.import_module(f"{__name__}.{name}")
