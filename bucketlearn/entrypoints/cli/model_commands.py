"""The model commands: ``download`` (a job's model as .keras), ``train-local`` (the serial
baseline, in one process), ``predict`` (a .keras model over a CSV's rows)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bucketlearn.config import load_settings
from bucketlearn.domain.lifecycle import DONE
from bucketlearn.domain.metrics import regression_headline
from bucketlearn.domain.recipe import Score, selection_sentence
from bucketlearn.domain.target import REGRESSION
from bucketlearn.entrypoints.cli import common
from bucketlearn.entrypoints.cli.common import (
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    emit,
    option_overrides,
)
from bucketlearn.entrypoints.cli.quiet import load_tensorflow, tensorflow_quietly
from bucketlearn.options import SEARCH_AUTO, resolve_options


def cmd_download(args: argparse.Namespace) -> int:
    from bucketlearn.usecases.model_files import model_bytes  # noqa: PLC0415

    svc = common.services(args)
    with tensorflow_quietly(args.verbose):  # (only a model built from weights loads it)
        data, version = model_bytes(svc, args.job, args.version)
    out = Path(args.output or f"{args.job}.keras")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    print(f"wrote {out} (job {args.job}, version {version})")
    return EXIT_OK


def _train_or_search(path: str, options: Any) -> tuple[Any, Any]:
    """``train_local``'s or, with a search, ``search_local``'s result for ``path``, on in-memory
    services of its own (the split stays in this process), and the options it ran with
    (``search=auto`` resolved by the split)."""
    from bucketlearn.bootstrap import memory_services  # noqa: PLC0415
    from bucketlearn.usecases.train_local import split_locally, train_local  # noqa: PLC0415

    svc, limits, split = memory_services(), load_settings().limits, None
    if options.search == SEARCH_AUTO:  # how many candidates is the split's to say
        split = split_locally(path, options, limits, svc)
        options = dataclasses.replace(options, search=split[1].search)
    if not options.search:
        return train_local(path, options, limits, svc=svc, split=split), options
    from bucketlearn.usecases.local_search import search_local  # noqa: PLC0415

    return search_local(path, options, options.search, limits, svc=svc, split=split), options


def cmd_train_local(args: argparse.Namespace) -> int:
    load_tensorflow(args.verbose)
    from bucketlearn.usecases.model_files import serial_sidecar  # noqa: PLC0415

    options = resolve_options(overrides=option_overrides(args))
    result, options = _train_or_search(args.file, options)
    count = options.search
    if args.output:
        from bucketlearn.ml.model import export_keras  # noqa: PLC0415

        sidecar = serial_sidecar(result.manifest, result.options if count else options,
                                 result.accuracy, result.report)
        if count:  # what the model is: the mean of which candidates, and why
            sidecar["search"] = result.selected
        Path(args.output).write_bytes(export_keras(result.model, sidecar))
    regression = result.manifest.task == REGRESSION
    report = {"accuracy": result.accuracy, "loss": result.loss, "seconds": result.seconds,
              "train_rows": result.manifest.train_rows,
              "holdout_rows": result.manifest.holdout_rows, "options": options.to_dict(),
              "task": result.manifest.task, "task_reason": result.manifest.task_reason,
              **{key: result.report.get(key) for key in (
                  ("rmse", "mae", "r2") if regression else
                  ("macro_f1", "majority_accuracy", "roc_auc"))}}
    if args.output:
        report["model"] = args.output
    if result.selection:  # the best epoch by validation, where training stopped (no scores)
        report["selection"] = {k: v for k, v in result.selection.items() if k != "scores"}
    if count:
        report.update(search=_search_report(result))
    if args.json:
        emit(report)
        return EXIT_OK
    if regression:
        print(f"numeric target '{result.manifest.label_column}' ({result.manifest.task_reason})")
        print(f"holdout {regression_headline(report['rmse'], report['mae'], report['r2'])} "
              f"(MSE {result.loss:.4g}) on {result.manifest.holdout_rows} rows; trained in "
              f"{result.seconds:.1f}s")
    else:
        print(f"holdout accuracy {result.accuracy:.4f} (loss {result.loss:.4f}) on "
              f"{result.manifest.holdout_rows} rows; trained in {result.seconds:.1f}s")
    if count:
        _print_search(result)
    elif result.selection:
        chosen = selection_sentence({"selection": result.selection, "status": DONE,
                                     "model_version": (result.selection.get("best") or {}).get(
                                         "version")})
        if chosen:
            print(f"selected: {chosen}")
    if args.output:
        print(f"model: {args.output}")
    return EXIT_OK


def _search_report(result: Any) -> dict[str, Any]:
    """A search's candidates, rungs and selection, for ``--json``."""
    return {"candidates": result.candidates, "selected": result.selected,
            "rungs": result.rungs, "cost": result.cost}


def _print_search(result: Any) -> None:
    """A search's leaderboard, best first, and what was selected."""
    rungs, cost = result.rungs, result.cost
    print(f"search: {len(result.candidates)} candidates over {len(rungs)} rungs (epochs "
          f"{', '.join(str(r['epochs']) for r in rungs)}); at most "
          f"{cost['candidate_epochs']} candidate-epochs, {cost['candidate_epochs'] / cost['epochs']:.1f}x "
          "one model's")
    best = {c["index"]: Score.from_dict(c["best"]) if c["best"] else None
            for c in result.candidates}

    def rank(c: dict[str, Any]) -> tuple[float, float, int]:
        """The furthest rung first, then the better score (its first figure), then the index."""
        score = best[c["index"]]
        return (-c["rung"] if c["state"] != "dropped" else 1,
                -score.key()[0] if score is not None else math.inf, c["index"])

    for c in sorted(result.candidates, key=rank):
        score = best[c["index"]]
        figure = score.figure() if score is not None else "no score"
        print(f"  #{c['index']:<2} {figure:>12}  {c['state']:<8} rung {c['rung']}, "
              f"{c['epochs']} epochs  {c['configuration']}")
    print(f"selected: {result.selected['reason']}")


# predicts for every row of a CSV with a .keras model: ``usecases.model_files.predict_file``'s contract
Predictor = Callable[[str, str, str | None], dict[str, Any]]


def cmd_predict(args: argparse.Namespace, predict: Predictor | None = None) -> int:
    """Print (or write to ``args.output``) the predictions ``predict`` makes for ``args.file``
    with ``args.model``, and the figures against its label column; None: ``predict_file``,
    imported here so that the CLI starts without TensorFlow (a test hands in its own). With
    ``--job``: ``cmd_predict_job``."""
    if args.job is not None or args.file is None:
        return cmd_predict_job(args)
    load_tensorflow(args.verbose)
    if predict is None:
        from bucketlearn.usecases.model_files import predict_file as predict  # noqa: PLC0415

    result = predict(args.model, args.file, args.output)
    if args.json:
        emit(result)
        return EXIT_OK
    if args.output:
        print(f"wrote {result['rows']} predictions to {args.output}")
    else:
        for value in result["predictions"]:  # (a numeric target's to 6 significant digits)
            print(f"{value:.6g}" if isinstance(value, float) else value)
    if result.get("accuracy") is not None:
        print(f"accuracy {result['accuracy']:.4f} against column '{result['label_column']}'",
              file=sys.stderr)
    if result.get("rmse") is not None:
        print(f"{regression_headline(result['rmse'], result['mae'], result['r2'])} against "
              f"column '{result['label_column']}' ({result['scored_rows']} rows with a number "
              "there)", file=sys.stderr)
    return EXIT_OK


def cmd_predict_job(args: argparse.Namespace) -> int:
    """``predict --job JOB FILE.csv [-o OUT.csv]``: upload FILE to ``predict/JOB/``, wait for the
    predictions (the upload function's, or its learners' for a large file; ``args.timeout``),
    download them. Exit codes: 0 DONE, 1 the
    request FAILED or was REJECTED (the reason on stderr), 2 a usage error, 3 a timeout."""
    from bucketlearn.usecases import predict_requests as requests  # noqa: PLC0415

    if args.job is None or args.file is not None:
        print("error: expected `predict MODEL.keras FILE.csv` or `predict --job JOB FILE.csv`",
              file=sys.stderr)
        return EXIT_USAGE
    path = args.model  # (with --job, the one positional is the CSV)
    if not Path(path).is_file():
        print(f"error: {path}: no such file", file=sys.stderr)
        return EXIT_USAGE
    svc, target = common.connect(args)
    submitted = requests.submit_prediction(svc, args.job, path)
    print(f"uploaded {path} to predict/{args.job}/ (request {submitted.request_id}); waiting "
          f"up to {args.timeout:.0f}s", file=sys.stderr)
    record = requests.wait_prediction(svc, submitted, args.timeout,
                                      check=common.stack_check(target))
    if record is None:
        print(f"timed out after {args.timeout:.0f}s waiting for request {submitted.request_id} "
              f"of job {args.job} (is the upload function running?)", file=sys.stderr)
        return EXIT_TIMEOUT
    if record.state != "DONE":
        if args.json:
            emit(record.status())
        print(f"request {record.request_id} {record.state}: {record.error}", file=sys.stderr)
        return EXIT_JOB_FAILED
    out = args.output or f"{Path(requests.request_name(path)).stem}.predictions.csv"
    requests.download_predictions(svc, record, out)
    if args.json:
        emit({**record.status(), "downloaded_to": out})
    else:
        rate = record.rows / record.seconds if record.seconds else float("nan")
        spread = f"; {record.parts} parts on the learners" if record.parts else ""
        print(f"wrote {record.rows} predictions to {out} in {record.seconds:.1f}s "
              f"({rate:,.0f} rows/s{spread}; job {args.job}, "
              f"gs://{svc.settings.models_bucket}/{record.output})")
    return EXIT_OK
