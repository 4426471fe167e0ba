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
    from bucketlearn.options import JobOptions
    from bucketlearn.services.serial import sample_figures, train_local

    svc = memory_services()
    started = time.perf_counter()
    result = train_local(path, JobOptions(**json.loads(options)), svc=svc)
    seconds = time.perf_counter() - started
    # after the clock: the final model on the versions' evaluation sample (the stack's default)
    sample = sample_figures(result, svc, svc.settings.eval_max_rows)
    print(json.dumps({"seconds": seconds, "accuracy": result.accuracy, "loss": result.loss,
                      "rmse": result.report.get("rmse"), "sample": sample}))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m benchmarks.tools.train_local PATH OPTIONS_JSON")
    main(sys.argv[1], sys.argv[2])
