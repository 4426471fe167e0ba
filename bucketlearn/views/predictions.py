"""The Batch predictions tab: a job's newest batch prediction requests (``jobs/<job>/
predictions/<request>``, read by ``reads.job_bundle``) as a table, and a sentence on how many
there are and how to predict another file."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from bucketlearn.domain.prediction import (
    PredictionRecord,
    RequestState,
    error_text,
    rows_per_second,
    source_file,
)
from bucketlearn.views.formats import timestamp

COLUMNS = ["when", "file", "state", "rows", "seconds", "rows_per_s", "parts", "result"]


def prediction_frame(records: Iterable[PredictionRecord],
                     models_bucket: str | None = None) -> pd.DataFrame:
    """A row a request, as read (newest first): when it was made (UTC), its file, state, rows
    (so far, while RUNNING), seconds (once ended) and rows/s (once DONE), parts (none: the
    function alone predicted it), and its output (``gs://`` given the bucket) or why it failed
    or was refused."""
    rows = []
    for record in records:
        output = record.output
        if output and models_bucket:
            output = f"gs://{models_bucket}/{output}"
        rate = rows_per_second(record.rows, record.seconds)
        rows.append({
            "when": timestamp(record.created_at or None), "file": source_file(record.source),
            "state": str(record.state), "rows": record.rows_so_far, "seconds": record.seconds,
            "rows_per_s": (round(rate, 1) if rate is not None
                           and record.state == RequestState.DONE else None),
            "parts": record.parts or None,
            "result": (error_text(record.error, record.source) if record.error
                       else output or ("" if record.ended else "running")),
        })
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for name in ("seconds", "rows_per_s", "parts"):  # None (unknown) is NaN: an empty cell
        frame[name] = frame[name].astype("float64")
    return frame


def prediction_note(shown: int, count: int, job_id: str) -> str:
    """How many of the job's ``count`` requests the table shows, and how to add one."""
    told = (f"The newest {shown} of the job's {count:,} requests" if count > shown
            else f"The job's {count:,} request{'s' if count != 1 else ''}")
    return (f"{told}. To predict another file: bucketlearn predict --job {job_id} FILE.csv, or "
            f"put it at predict/{job_id}/NAME.csv in the uploads bucket.")
