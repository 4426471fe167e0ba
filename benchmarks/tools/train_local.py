"""``train-local`` on one file in this process, timed: prints one JSON line (seconds, accuracy,
loss, and the same on the versions' evaluation sample); with ``search`` among the options,
``train-local --search`` (its candidates, rungs and selection too). Started by ``benchmarks.harness.serial.serial_seconds`` with the thread settings to
measure in its environment.

    python -m benchmarks.tools.train_local PATH OPTIONS_JSON
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(path: str, options: str) -> None:
    import keras  # noqa: F401 - imported before the clock starts, as the learners have it

    from bucketlearn.bootstrap import memory_services
    from bucketlearn.domain.recipe import RECIPE
    from bucketlearn.options import JobOptions
    from bucketlearn.usecases.train_local import sample_figures, train_local

    svc = memory_services()
    given = json.loads(options)
    recipe = given.pop("recipe", RECIPE)  # 1: the model before recipe 2
    traced: list[tuple[int, float, list]] | None = [] if given.pop("trace", False) else None
    on_epoch = (lambda e, s, w: traced.append((e, s, [a.copy() for a in w]))) if traced is not None else None
    count = given.pop("search", 0)  # candidates of a search (0: one model)
    started = time.perf_counter()
    if count:
        from bucketlearn.usecases.local_search import search_local

        result = search_local(path, JobOptions(**given), count, svc=svc, recipe=recipe)
    else:
        result = train_local(path, JobOptions(**given), svc=svc, recipe=recipe,
                             on_epoch=on_epoch)
    seconds = time.perf_counter() - started
    # after the clock: the final model on the versions' evaluation sample (the stack's default)
    sample = sample_figures(result, svc, svc.settings.eval_max_rows)
    selection = result.selection
    print(json.dumps({"seconds": seconds, "accuracy": result.accuracy, "loss": result.loss,
                      "rmse": result.report.get("rmse"), "r2": result.report.get("r2"),
                      "mae": result.report.get("mae"), "sample": sample,
                      "best_seconds": selection.get("best_seconds"),
                      "best_epoch": (selection.get("best") or {}).get("epoch"),
                      "stop_epoch": selection.get("stop_epoch"),
                      "epochs": result.epochs, "tasks": result.tasks,
                      **({"candidates": result.candidates, "selected": result.selected,
                          "rungs": result.rungs, "cost": result.cost} if count else {}),
                      "trace": trace(result, svc, traced) if traced is not None else None}))


def trace(result, svc, traced: list) -> list[dict]:
    """Each epoch's last state on the whole holdout, after the clock: its time since the start
    (the split included, as ``seconds``) and its accuracy, or R² for a numeric target."""
    from bucketlearn.ingest.parts import load_parts
    from bucketlearn.ml.training import evaluate_detail

    x, y = load_parts(svc.store, svc.settings.work_bucket, result.manifest.holdout_parts)
    rows = []
    for epoch, seconds, weights in traced:
        found = evaluate_detail(result.model, weights, x, y, result.spec.task)
        rows.append({"epoch": epoch, "seconds": seconds, "accuracy": found.accuracy,
                     "r2": found.report.get("r2")})
    return rows


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m benchmarks.tools.train_local PATH OPTIONS_JSON")
    main(sys.argv[1], sys.argv[2])
