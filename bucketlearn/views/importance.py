"""The Model tab's "What the model looks at": the exported model's permutation importance of
each original column (``domain.importance``), as rows to draw and a sentence on what they
are."""

from __future__ import annotations

from typing import Any

import pandas as pd

from bucketlearn.domain.job import Job

METRIC_WORDS = {"accuracy": "accuracy", "r2": "R²"}


def importance_view(job: Job) -> tuple[pd.DataFrame, str]:
    """(column, importance) rows, most important first, and the note under them; no rows and
    no note for a job without a ranking (not DONE, or exported before rankings were made), a
    note alone for one whose ranking was not computed."""
    found: Any = job.feature_importance or {}
    if not found:
        return pd.DataFrame(columns=["column", "importance"]), ""
    if found.get("skipped"):
        return pd.DataFrame(columns=["column", "importance"]), f"Column ranking {found['skipped']}."
    frame = pd.DataFrame(found.get("columns") or [], columns=["column", "importance"])
    frame["importance"] = frame["importance"].astype("float64")
    metric = METRIC_WORDS.get(found.get("metric"), str(found.get("metric")))
    note = (f"How much the holdout {metric} falls when a column's values are shuffled across "
            f"{found.get('rows')} holdout rows (the mean of {found.get('repeats')} shuffles), "
            f"from {found.get('baseline'):.4g}: near 0, the model does not use the column; "
            "below 0, noise.")
    return frame, note
