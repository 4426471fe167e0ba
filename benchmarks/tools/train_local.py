"""``train-local`` on one file in this process, timed: prints one JSON line (seconds, accuracy,
loss, and the same on the versions' evaluation sample). Started by ``benchmarks.harness.serial.serial_seconds`` with the thread settings to
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
    from bucketlearn.services.serial import sample_figures, train_local

    svc = memory_services()
    given = json.loads(options)
    recipe = given.pop("recipe", RECIPE)  # 1: the model before recipe 2
    started = time.perf_counter()
    result = train_local(path, JobOptions(**given), svc=svc, recipe=recipe)
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
                      "epochs": result.epochs}))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m benchmarks.tools.train_local PATH OPTIONS_JSON")
    main(sys.argv[1], sys.argv[2])
