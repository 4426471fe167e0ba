"""A finished job's export: its head evaluated on the whole holdout and written as
``models/<job>/latest.keras`` (and ``v<N>.keras``) with the ``bucketlearn.json`` sidecar
(``model_sidecar``), then the job marked DONE; a degenerate final model ends the job FAILED
instead (``domain.health``). Run by the job's ``JobAggregator`` once the job's last round is
folded (its phase is then ``exporting``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from bucketlearn import layout
from bucketlearn.domain import health, importance
from bucketlearn.domain.head import Head
from bucketlearn.domain.job import Job, ending_fields, fail_fields
from bucketlearn.domain.lifecycle import DONE
from bucketlearn.domain.recipe import Selection
from bucketlearn.domain.target import REGRESSION
from bucketlearn.domain.usage import added
from bucketlearn.ml.importance import permutation_importance
from bucketlearn.ml.model import export_keras, model_inputs
from bucketlearn.ml.training import evaluate_parts
from bucketlearn.ports import Services
from bucketlearn.services import endings
from bucketlearn.services.caches import JobRuntime, job_runtime
from bucketlearn.services.evaluate import headline, holdout_figures
from bucketlearn.services.selection import complete

log = logging.getLogger(__name__)


def export_final(svc: Services, job: Job, state: Selection | None = None,
                 evaluate: Callable[..., Any] = evaluate_parts) -> None:
    """Export the job's model as ``models/<job>/latest.keras`` (and ``v<N>.keras``), then mark
    DONE; a degenerate final model ends the job FAILED instead (``domain.health``).

    The model is the best checkpoint by validation (``selection.complete``, from ``state``,
    what the aggregator's selection knew), or the head for a job that selects nothing; the
    job's ``head`` at DONE is that version, with its figures on the whole holdout, measured
    by ``evaluate`` (``ml.training.evaluate_parts``'s contract; the aggregator's ``Scoring``).
    """
    started = time.perf_counter()
    runtime = job_runtime(svc, job)
    assert job.head is not None
    final, best = complete(svc, job, state or Selection.from_dict(job.selection))
    head = job.head if best is None else Head(best.version, best.weights_path,
                                              best.checksum or "", digest=best.digest)
    weights = runtime.state(head.weights_path, head.digest)[0]
    with runtime.lock:
        # the whole holdout, one part at a time: never all of it in memory
        found = evaluate(runtime.model, weights, runtime.holdout_parts(),
                         runtime.spec.task)
        model_data = _export_bytes(job, runtime, found, head.version)
        ranked = column_importance(job, runtime, weights)
        parent = parent_on_holdout(svc, job, runtime, evaluate)
    now = svc.clock()
    problem = degenerate(job, runtime, found)
    if problem is not None:
        if endings.end_job(svc.registry, job.job_id, fail_fields(now, problem))[0]:
            log.error("job %s: %s", job.job_id, problem)
        return
    current = svc.registry.get_job(job.job_id)
    if current is not None and current.is_terminal:
        log.info("job %s ended during its final evaluation: not exported", job.job_id)
        return
    figures = holdout_figures(found, runtime.spec.regression)
    version = head.version
    write_model(svc, job.job_id, version, model_data)
    keep_for_continuing(svc, job.job_id, head, runtime.manifest.to_json())
    head = head.evaluated(found.accuracy, found.loss, figures)  # the whole holdout's
    used = {**svc.usage(job.job_id), "aggregator_seconds": round(time.perf_counter() - started,
                                                                 6)}
    selected = {"selection": final.to_dict(int(job.options.get("patience") or 0))
                } if best is not None else {}
    ended, current = endings.end_job(svc.registry, job.job_id, ending_fields(
        DONE, now, model_path=layout.model_path(job.job_id), head=head.to_doc(),
        final_holdout_rows=found.rows, usage=added(job.usage, used),  # the export's too
        feature_importance=ranked, **selected, **parent))
    if not ended:  # cancelled during the export: it stays so (the files are its head version)
        log.info("job %s ended (%s) during its export: not marked DONE", job.job_id,
                 current.status if current is not None else None)
        return
    log.info("job %s: DONE at v%d, holdout %s", job.job_id, version, headline(found))


def parent_on_holdout(svc: Services, job: Job, runtime: JobRuntime,
                      evaluate: Callable[..., Any]) -> dict[str, Any]:
    """A continued job's ``continued_from`` with its parent's model's figures on this job's
    whole holdout beside its own (``parent_holdout``: accuracy, loss, macro-F1, or RMSE, MAE
    and R²), measured on its version 0, which holds the parent's weights as they were; {} for a
    job continued from none. A failure is logged, never the export's (no figures then)."""
    if not job.continued_from:
        return {}
    try:
        first = svc.registry.get_version(job.job_id, 0)
        assert first is not None
        found = evaluate(runtime.model, runtime.state(first.weights_path)[0],
                         runtime.holdout_parts(), runtime.spec.task)
    except Exception:  # noqa: BLE001 - the model is exported without the comparison
        log.warning("job %s: its parent's model was not evaluated", job.job_id, exc_info=True)
        return {}
    figures = holdout_figures(found, runtime.spec.regression)
    compared = ({k.removeprefix("holdout_"): figures[k] for k in ("holdout_rmse", "holdout_mae",
                                                                   "holdout_r2")}
                if runtime.spec.regression else
                {"accuracy": found.accuracy, "macro_f1": figures["holdout_macro_f1"]})
    return {"continued_from": {**job.continued_from, "parent_holdout": {
        **compared, "loss": found.loss, "rows": found.rows}}}


def degenerate(job: Job, runtime: JobRuntime, found: Any) -> str | None:
    """Why the final model, with its holdout figures ``found``, must not be exported
    (``domain.health``); None when it may be."""
    rate = float(job.options["learning_rate"])
    if runtime.spec.regression:
        return health.degenerate_regression(found.loss, rate)
    return health.degenerate_model(found.predicted_counts, found.true_counts,
                                   runtime.manifest.classes, found.loss, rate)


def write_model(svc: Services, job_id: str, version: int, data: bytes) -> None:
    """A job's exported ``.keras`` as ``models/<job>/v<N>.keras`` and ``latest.keras``."""
    for path in (layout.model_path(job_id, version), layout.model_path(job_id)):
        svc.store.write_bytes(svc.settings.models_bucket, path, data,
                              "application/octet-stream")


def keep_for_continuing(svc: Services, job_id: str, head: Head, manifest: bytes) -> None:
    """What a job continued from this one reads, kept beside its exported model (the models
    bucket's ``models/``, which the upload function reads, unlike ``weights/`` and a wound-up
    job's work prefix): the ``manifest`` (``layout.kept_manifest_path``) and ``head``'s state
    (``layout.kept_weights_path``), in that order: the state kept says both are. Written
    again the same when called again."""
    bucket = svc.settings.models_bucket
    state = svc.store.read_bytes(bucket, head.weights_path)
    svc.store.write_bytes(bucket, layout.kept_manifest_path(job_id), manifest,
                          "application/json")
    svc.store.write_bytes(bucket, layout.kept_weights_path(job_id, head.version), state,
                          "application/octet-stream")


def column_importance(job: Job, runtime: JobRuntime, weights: Any,
                      model: Any = None) -> dict[str, Any]:
    """The exported model's permutation importance of each original column
    (``domain.importance``) on a fixed sample of the holdout, or why there is none; a failure
    is logged and said, never the export's. ``model``: the job's own when None."""
    schema = runtime.manifest.schema
    reason = importance.skipped(len(schema))
    if reason is not None:
        return {"skipped": reason}
    try:
        x, y = runtime.holdout(importance.SAMPLE_ROWS)
        return permutation_importance(runtime.model if model is None else model, weights, x, y,
                                      importance.spans(schema),
                                      runtime.spec.task, int(job.options.get("seed") or 0))
    except Exception as exc:  # noqa: BLE001 - the model is exported without its ranking
        log.warning("job %s: no feature importance", job.job_id, exc_info=True)
        return {"skipped": f"failed: {type(exc).__name__}"}


def _export_bytes(job: Job, runtime: JobRuntime, found: Any, version: int) -> bytes:
    """The ``.keras`` archive of the model as evaluated (its weights are ``version``'s)."""
    figures = holdout_figures(found, runtime.spec.regression)
    return export_keras(runtime.model, model_sidecar(job, runtime.manifest, found.accuracy,
                                                     figures, version))


def model_sidecar(job: Job, manifest: Any, accuracy: float | None,
                  figures: dict[str, Any] | None = None, version: int | None = None
                  ) -> dict[str, Any]:
    """What ``bucketlearn.json`` in the exported archive says about the model: its columns,
    classes (or numeric target: ``task``, the target's training mean and std) and figures;
    ``version``: the version exported (the job's newest when None)."""
    return {
        "format": 1,
        "job_id": job.job_id,
        "version": int(job.version or 0) if version is None else version,
        "feature_names": manifest.feature_names,
        "label_column": manifest.label_column,
        "class_names": manifest.classes,
        "label_kind": manifest.label_kind,
        "holdout_accuracy": accuracy,
        "options": job.options,
        "source": manifest.source,
        **model_inputs(manifest.columns, manifest.missing_values),
        **target_sidecar(manifest, figures),
    }


def target_sidecar(manifest: Any, figures: dict[str, Any] | None) -> dict[str, Any]:
    """A regression model's part of the sidecar (nothing for classes, as before)."""
    if manifest.target is None:
        return {}
    return {"task": REGRESSION, "target_mean": manifest.target_mean,
            "target_std": manifest.target_std,
            **{k: (figures or {}).get(k) for k in ("holdout_rmse", "holdout_mae", "holdout_r2")}}
