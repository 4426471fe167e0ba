"""Getting models out: download any version as ``.keras``, and predict original label values."""

from __future__ import annotations

import csv
import dataclasses
from typing import Any

import numpy as np

from bucketlearn import layout
from bucketlearn.domain.lifecycle import DONE
from bucketlearn.domain.target import REGRESSION
from bucketlearn.errors import JobStateError, NotFoundError, PermanentError
from bucketlearn.options import JobOptions
from bucketlearn.ports import Services


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
    """Predict every row of a CSV; return predictions (original label values) and accuracy."""
    from bucketlearn.ml.model import load_model  # noqa: PLC0415

    model, sidecar = load_model(model_path)
    features: list[str] = sidecar["feature_names"]
    label = sidecar.get("label_column")
    classes: list[str] = sidecar["class_names"]
    table, header = _read_for_prediction(csv_path, sidecar, features, label)
    outputs = _model_outputs(model, table, sidecar, features, csv_path)
    if sidecar.get("task") == REGRESSION:
        predicted, result = _regression_result(outputs, table, sidecar, header)
    else:
        predicted = [classes[i] for i in np.argmax(outputs, axis=1)]
        result = {"rows": len(predicted), "label_column": label, "accuracy": None}
        if label in header:
            truth = [_normalize_label(v, sidecar.get("label_kind", "str"))
                     for v in table.column(label).to_pylist()]
            result["accuracy"] = float(np.mean([p == t for p, t in zip(predicted, truth,
                                                                      strict=False)]))
    if output:
        with open(output, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["row", "prediction"])
            writer.writerows((i + 1, p) for i, p in enumerate(predicted))
        result["output"] = output
    else:
        result["predictions"] = predicted
    return result


def _model_outputs(model: Any, table: Any, sidecar: dict[str, Any], features: list[str],
                   csv_path: str) -> np.ndarray:
    """The model's outputs for every row: class probabilities, or a regression's targets."""
    if sidecar.get("inputs"):
        return _predict_raw_rows(model, table, sidecar["inputs"])
    x = np.column_stack([table.column(f).to_numpy(zero_copy_only=False) for f in features])
    if not np.isfinite(x).all():
        row = int(np.nonzero(~np.isfinite(x).all(axis=1))[0][0]) + 1
        raise PermanentError(f"{csv_path}: row {row}: expected finite feature values (this "
                             "model was trained on complete numeric rows)")
    return np.asarray(model.predict(x.astype(np.float32), batch_size=1024, verbose=0))


def _regression_result(outputs: np.ndarray, table: Any, sidecar: dict[str, Any],
                       header: list[str]) -> tuple[list[float], dict[str, Any]]:
    """A numeric target's predictions (floats, in the target's units) and, when the CSV has
    the label column, RMSE, MAE and R² over its rows that have a number there (an empty cell
    or a missing value is left out, as at training)."""
    from bucketlearn.domain.metrics import RegressionTally  # noqa: PLC0415

    predicted = [float(v) for v in np.asarray(outputs, dtype=np.float64).reshape(-1)]
    label = sidecar.get("label_column")
    result: dict[str, Any] = {"rows": len(predicted), "label_column": label, "task": REGRESSION,
                              "rmse": None, "mae": None, "r2": None, "scored_rows": 0}
    if label in header:
        markers = set(sidecar.get("missing_values") or [])
        truth, scored = [], []
        for i, value in enumerate(table.column(label).to_pylist()):
            text = (value or "").strip()
            if not text or value in markers:
                continue
            try:
                truth.append(float(text))
            except ValueError:
                raise PermanentError(f"row {i + 1}, column {label!r}: expected a number (or a "
                                     f"missing value); found {text[:60]!r}") from None
            scored.append(predicted[i])
        tally = RegressionTally()
        tally.add(np.asarray(scored), np.asarray(truth))
        if tally.rows:
            report = tally.report()
            result.update(rmse=report["rmse"], mae=report["mae"], r2=report["r2"],
                          scored_rows=tally.rows)
    return predicted, result


def _read_for_prediction(csv_path: str, sidecar: dict[str, Any], features: list[str],
                         label: str | None) -> tuple[Any, list[str]]:
    """The CSV's feature (and label) columns as pyarrow reads them at ingest: numbers as float32
    (missing markers null), text and dates as strings."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.csv as pacsv  # noqa: PLC0415

    header = pacsv.open_csv(csv_path).schema.names
    missing = [f for f in features if f not in header]
    if missing:
        raise PermanentError(
            f"{csv_path}: expected the model's feature columns; missing: "
            f"{', '.join(missing[:10])}{' …' if len(missing) > 10 else ''}")
    kinds = {c["name"]: c["kind"] for c in sidecar.get("columns", [])}
    types = {f: pa.float32() if kinds.get(f, "numeric") == "numeric" else pa.string()
             for f in features}
    if label in header:
        types[label] = pa.string()
    markers = sidecar.get("missing_values", [])
    try:
        table = pacsv.read_csv(csv_path, convert_options=pacsv.ConvertOptions(
            column_types=types, include_columns=features + ([label] if label in header else []),
            strings_can_be_null=False, null_values=["", *markers]))
    except pa.ArrowInvalid as exc:
        raise PermanentError(f"{csv_path}: expected numeric values in the model's numeric "
                             f"columns (or a missing value: empty, {', '.join(markers)}); "
                             f"found: {exc}") from None
    return table, header


def _predict_raw_rows(model: Any, table: Any, inputs: dict[str, str],
                      batch: int = 1024) -> np.ndarray:
    """Class probabilities from the raw-row model, a batch of rows at a time (Keras's
    ``predict`` does not take string arrays in a dict: the model is called on tensors)."""
    import tensorflow as tf  # noqa: PLC0415

    columns = {name: table.column(name) for name in inputs}
    out = []
    for start in range(0, max(table.num_rows, 1), batch):
        feed = {}
        for name, input_name in inputs.items():
            values = columns[name].slice(start, batch)
            if values.type == "string":
                cells = np.array(values.to_pylist(), dtype=object).reshape(-1, 1)
                feed[input_name] = tf.constant(cells, dtype=tf.string)
            else:
                cells = values.fill_null(np.nan).to_numpy(zero_copy_only=False)
                feed[input_name] = tf.constant(cells.reshape(-1, 1), dtype=tf.float32)
        out.append(np.asarray(model(feed, training=False)))
    return np.concatenate(out)[:table.num_rows]
