"""The Training tab of a searched job: its candidates as a leaderboard, best first, and a
sentence on what was selected, what the search cost and what it gained."""

from __future__ import annotations

from typing import Any

import pandas as pd

from bucketlearn.domain.job import Job
from bucketlearn.domain.search import standings
from bucketlearn.domain.usage import estimate_cost

COLUMNS = ["candidate", "configuration", "state", "rung", "epochs", "validation", "seconds",
           "why"]


def leaderboard(job: Job) -> tuple[pd.DataFrame, str]:
    """A row a candidate (best first: finalists, those training, pruned, dropped) and the note
    under them; nothing for a job that searches nothing."""
    record: Any = job.search
    if not record:
        return pd.DataFrame(columns=COLUMNS), ""
    rows = []
    for row in standings(record):
        best = row["best"] or {}
        figure = best.get("rmse") if best.get("rmse") is not None else best.get("accuracy")
        rows.append({"candidate": row["index"], "configuration": row["configuration"],
                     "state": row["state"], "rung": row["rung"], "epochs": row["epochs"],
                     "validation": figure, "seconds": row["seconds"], "why": row["reason"]})
    usage = dict(job.usage or {})
    cost = estimate_cost(usage)["total"]
    spent = (f"{float(usage.get('worker_seconds') or 0):,.0f} learner vCPU-seconds, "
             f"${cost:.4f} in all (the job's estimate)")
    selected = record.get("selected")
    if not selected:
        return pd.DataFrame(rows, columns=COLUMNS), (
            f"{record['count']} candidates by successive halving on the validation rows; "
            f"so far {spent}.")
    alone = (selected.get("alone") or {}).get("score") or {}
    together = selected.get("score") or {}
    gain = ""
    if alone.get("accuracy") is not None and together.get("accuracy") is not None:
        gain = (f"; the mean against the best candidate alone: "
                f"{100 * (together['accuracy'] - alone['accuracy']):+.2f} points on the "
                "validation rows")
    return pd.DataFrame(rows, columns=COLUMNS), (
        f"Selected: {selected['reason']}{gain}. The search cost {spent}.")
