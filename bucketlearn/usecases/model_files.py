"""Getting models out: download any version as ``.keras``, and predict original label values
(a batch at a time: ``prediction_rows``)."""

from __future__ import annotations

import csv
import dataclasses
import os
from typing import Any

import numpy as np

from bucketlearn import layout
from bucketlearn.config import Limits
from bucketlearn.domain.lifecycle import DONE
from bucketlearn.domain.target import REGRESSION
from bucketlearn.errors import JobStateError, NotFoundError, PermanentError
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.options import JobOptions
from bucketlearn.ports import Services
from bucketlearn.usecases.prediction_rows import (
    LoadedModel,
    RowBatch,
    predicted_labels,
    predicted_rows,
    unbounded,
)


def model_bytes(svc: Services, job_id: str, version: int | None) -> tuple[bytes, int]:
    """The ``.keras`` bytes of a job's model: latest (default) or a given version.

    Exported files are used when they exist (a DONE job's ``latest.keras``, ``v<N>.keras``); any
    other version, e.g. the head of a CANCELLED job, is built from its stored weights and the
    job's manifest (this needs TensorFlow, as the CLI and the dashboard have).
    """
    from bucketlearn.ml.model import export_keras  # noqa: PLC0415
    from bucketlearn.services.caches import JobRuntime  # noqa: PLC0415
    from bucketlearn.services.export import model_sidecar  # noqa: PLC0415

    job = svc.registry.get_job(job_id)
    if job is None:
        raise NotFoundError(f"job {job_id}: no such job")
    if job.version is None:
        when = "it ended before its first version" if job.is_terminal else \
            "it has no model version yet"
        raise JobStateError(f"job {job_id} is {job.status}: {when}"
                            + (f" ({job.error})" if job.error else ""))
    newest = int(job.version)
    # a DONE job's model is the version it exported (the best by validation: its head)
    kept = job.head.version if job.status == DONE and job.head is not None else newest
    wanted = kept if version is None else version
    if not 0 <= wanted <= newest:
        raise JobStateError(f"job {job_id}: expected a version from 0 to {newest}; found "
                            f"{wanted}")
    bucket = svc.settings.models_bucket
    exported = layout.model_path(job_id) if (version is None and job.status == DONE) \
        else layout.model_path(job_id, wanted)
    try:
        return svc.store.read_bytes(bucket, exported), wanted
    except NotFoundError:
        pass
    found = svc.registry.get_version(job_id, wanted)
    if found is None:
        raise NotFoundError(f"job {job_id}: version {wanted} has no document")
    runtime = JobRuntime(svc, job)
    try:
        weights = runtime.weights(found.weights_path)
        model = runtime.model
    except NotFoundError:
        if not job.is_terminal:
            raise
        raise JobStateError(f"job {job_id} has ended and only the version it exported is kept: "
                            f"expected a version with an exported model (v{kept}); found "
                            f"v{wanted}, whose weights were deleted when the job ended") from None
    model.set_weights(weights)
    sidecar = model_sidecar(dataclasses.replace(job, version=wanted), runtime.manifest,
                            found.holdout_accuracy, dict(found.figures))
    return export_keras(model, sidecar), wanted


def serial_sidecar(manifest: Any, options: JobOptions, accuracy: float | None,
                   report: dict[str, Any] | None = None) -> dict[str, Any]:
    from bucketlearn.domain.metrics import regression_fields  # noqa: PLC0415
    from bucketlearn.ml.model import model_inputs  # noqa: PLC0415
    from bucketlearn.services.export import target_sidecar  # noqa: PLC0415

    figures = regression_fields(report) if report and manifest.target is not None else None
    return {"format": 1, "job_id": None, "version": None, "trained_by": "train-local",
            "feature_names": manifest.feature_names, "label_column": manifest.label_column,
            "class_names": manifest.classes, "label_kind": manifest.label_kind,
            "holdout_accuracy": accuracy, "options": options.to_dict(),
            "source": manifest.source,
            **model_inputs(manifest.columns, manifest.missing_values),
            **target_sidecar(manifest, figures)}


def _normalize_label(value: Any, kind: str) -> str:
    text = str(value).strip()
    if kind == "int":
        try:
            return str(int(float(text)))
        except ValueError:
            return text
    return text


def predict_file(model_path: str, csv_path: str, output: str | None) -> dict[str, Any]:
    """Predict every row of a CSV; return predictions (original label values) and, when the
    file has the label column, the figures against it (accuracy; a numeric target's RMSE, MAE,
    R²). Read a batch at a time (``prediction_rows``); the predictions are kept in memory (or
    written to ``output`` as ``row,prediction`` lines) and the figures tallied batch by batch.

    Raises:
        InvalidInputError: a row that cannot be read (its row and column named), or missing
            feature columns (named).
    """
    from bucketlearn.domain.metrics import RegressionTally  # noqa: PLC0415

    loaded = LoadedModel.load(model_path)
    size = os.path.getsize(csv_path)
    source = SourceFile(display_name=csv_path, size=size,
                        opener=lambda: open(csv_path, "rb"))  # noqa: SIM115 - closed by ingest
    header, batches = predicted_rows(source, loaded, unbounded(Limits()))
    label = loaded.label if loaded.label in header else None
    predicted: list[Any] = []
    hits, tally = 0, RegressionTally()
    for batch in batches:
        values = predicted_labels(loaded, batch.outputs)
        predicted.extend(values)
        if label is not None and loaded.regression:
            truth, scored = _numeric_truth(batch, label, loaded.markers, values)
            tally.add(np.asarray(scored), np.asarray(truth))
        elif label is not None:
            kind = loaded.sidecar.get("label_kind", "str")
            hits += sum(p == _normalize_label(t, kind) for p, t in zip(
                values, batch.cells.column(label).to_pylist(), strict=True))
    result: dict[str, Any] = {"rows": len(predicted), "label_column": loaded.label}
    if loaded.regression:
        result.update(task=REGRESSION, rmse=None, mae=None, r2=None, scored_rows=0)
        if tally.rows:
            report = tally.report()
            result.update(rmse=report["rmse"], mae=report["mae"], r2=report["r2"],
                          scored_rows=tally.rows)
    else:
        result["accuracy"] = hits / len(predicted) if label is not None and predicted else None
    if output:
        with open(output, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["row", "prediction"])
            writer.writerows((i + 1, p) for i, p in enumerate(predicted))
        result["output"] = output
    else:
        result["predictions"] = predicted
    return result


def _numeric_truth(batch: RowBatch, label: str, markers: list[str], predicted: list[float]
                   ) -> tuple[list[float], list[float]]:
    """A numeric target's values in the label column and the predictions of those rows; an
    empty cell or a missing value is left out, as at training.

    Raises:
        PermanentError: a label cell that is neither a number nor missing (row and column).
    """
    truth, scored = [], []
    for i, value in enumerate(batch.cells.column(label).to_pylist()):
        text = (value or "").strip()
        if not text or value in markers:
            continue
        try:
            truth.append(float(text))
        except ValueError:
            raise PermanentError(f"row {batch.first_row + i}, column {label!r}: expected a "
                                 f"number (or a missing value); found {text[:60]!r}") from None
        scored.append(predicted[i])
    return truth, scored
