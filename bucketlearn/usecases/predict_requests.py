"""A batch prediction asked for through the buckets (``bucketlearn predict --job JOB FILE``): the
file uploaded to ``predict/<JOB>/<NAME>.csv``, its status record waited for, the predictions
downloaded. The work itself is the upload function's (``usecases.batch_predict``)."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from bucketlearn import layout
from bucketlearn.domain.prediction import PredictionRecord
from bucketlearn.errors import ConfigError
from bucketlearn.ports import Services

_UNUSABLE = re.compile(r"[^A-Za-z0-9._ -]+")


@dataclass(frozen=True)
class Submitted:
    """A request made: where its input went (name and generation) and its record's id."""

    job_id: str
    object_name: str
    generation: int
    request_id: str


def request_name(path: str) -> str:
    """The object name's last part for a local file: its name with any character the function
    does not take in an output name replaced by ``_``, ending in ``.csv``."""
    stem = os.path.basename(path)
    stem = stem[:-4] if stem.lower().endswith(".csv") else stem
    stem = _UNUSABLE.sub("_", stem).strip(" .")[:200] or "predict"
    return f"{stem}.csv"


def submit_prediction(svc: Services, job_id: str, path: str) -> Submitted:
    """Upload ``path`` to ``predict/<job_id>/<name>.csv`` in the uploads bucket (a new
    generation: a new request, even for the same name).

    Raises:
        ConfigError: ``job_id`` is not a job id.
    """
    if not layout.is_job_id(job_id):
        raise ConfigError("--job", "a job id (as `bucketlearn status` lists them)", job_id)
    name = layout.predict_object_name(job_id, request_name(path))
    info = svc.store.write_file(svc.settings.uploads_bucket, name, path, "text/csv")
    return Submitted(job_id, name, info.generation,
                     layout.prediction_id_for(name, info.generation))


def wait_prediction(svc: Services, submitted: Submitted, timeout: float, poll: float = 0.5,
                    check: Callable[[], None] | None = None) -> PredictionRecord | None:
    """The request's record once it has ended; None when ``timeout`` seconds pass first (the
    record may not exist yet: the function had not taken the event). ``check`` runs between
    reads (the local stack's watch: a stopped stack ends the wait with its error)."""
    end = time.monotonic() + timeout
    while True:
        record = svc.registry.get_prediction(submitted.job_id, submitted.request_id)
        if record is not None and record.ended:
            return record
        if time.monotonic() >= end:
            return None
        if check is not None:
            check()
        time.sleep(max(0.0, min(poll, end - time.monotonic())))


def download_predictions(svc: Services, record: PredictionRecord, out: str) -> None:
    """Copy a DONE request's predictions to ``out``, a stream at a time (any size)."""
    assert record.output is not None
    folder = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)
    with svc.store.open_read(svc.settings.models_bucket, record.output) as source, \
            open(out, "wb") as target:
        shutil.copyfileobj(source, target, 1 << 20)
