"""Batch prediction by upload on the local stack (1 and 2 learners) against ``bucketlearn predict
MODEL FILE`` in one process, on the same file and model, in one run.

    python -m benchmarks.suites.batch_predict [--smoke] [--rows N] [--part-bytes B] [--out DIR]

One job is trained on a table (``params["table"]``, the repository's penguins by default) on the
local stack; its exported model is downloaded. The prediction file is ``params["rows"]`` of the
table's rows drawn with replacement (seeded), the label column dropped, written once into the
scratch directory. Then:

* **the command** — ``bucketlearn predict MODEL FILE -o OUT`` in a child process on one
  TensorFlow thread and one BLAS thread, as one learner runs (``config.SINGLE_THREADED_TF``,
  ``ONE_THREAD_BLAS``): the child's wall, TensorFlow's import and the model's load included
  (the same command on the small warm-up file says how much of it that is); run between the
  two stacks, with only the idle emulators beside it;
* **the stack, 1 and then 2 learners** — the file uploaded to ``predict/<JOB>/<name>.csv``
  (``usecases.predict_requests``, as ``bucketlearn predict --job`` does) and the request's
  record waited for: the time from the upload's start to the record's DONE (its
  ``updated_at``); the upload, the wait for the function to claim the request and the
  request's own ``seconds`` beside it, and each process's CPU seconds meanwhile. The 2-learner
  stack is started on the same emulators under the same prefix, so it finds the job and its
  model (and trains the 200-row warm-up job first: TensorFlow imported in its new learners).
  Each stack first predicts the small warm-up file (the function's TensorFlow and first call).

Every stack process has ``BUCKETLEARN_PREDICT_PART_BYTES`` = ``params["part_bytes"]``: with
the learner pool's fan-out of large files, a file larger than a part is split into parts the
learners predict; ``parts`` is the record's own count (1 when the record has none: before the
fan-out, the upload function predicts the whole file). Every output is downloaded after its
clock stopped and its rows (and predictions) checked against the input's (and the command's).

``params["stages"]``: after the 1-learner request, ``tools/predict_stages.py`` times the
request's steps one by one in the stack's environment (model load, read + type + model, the
model alone and in calls of 8,192 rows, the output's CSV, the storage emulator's read and
write): where its time goes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import tables as public_tables
from benchmarks.harness.data import scratch_dir
from benchmarks.harness.paths import CACHE, MB, REPO, RESULTS
from benchmarks.harness.procs import bench_env, log
from benchmarks.harness.stack import (
    cpu_snapshot,
    emulators,
    local_stack,
    submit,
    unique_prefix,
    wait_ended,
    warm_up,
)
from benchmarks.report.markdown import md_table
from benchmarks.report.results import goal, new_result, print_goals, write_result
from bucketlearn.config import ONE_THREAD_BLAS, SINGLE_THREADED_TF

NAME = "batch_predict"
PART_BYTES_ENV = "BUCKETLEARN_PREDICT_PART_BYTES"
FULL: dict[str, Any] = {"table": "penguins", "rows": 1_000_000, "seed": 0,
                        "part_bytes": 16 * 2**20, "warm_rows": 2_000, "learners": [1, 2],
                        "stages": True, "timeout": 1800}
SMOKE: dict[str, Any] = {**FULL, "rows": 20_000, "part_bytes": 256 * 2**10, "warm_rows": 500,
                         "timeout": 600}


# --- pure helpers --------------------------------------------------------------------------------

def write_prediction_file(source: Path, label: str, rows: int, seed: int, out: Path) -> int:
    """``rows`` data rows of ``source`` (a CSV with a header) drawn with replacement, seeded,
    without the ``label`` column, cells as they were (quoted only where CSV needs it), written to
    ``out``; returns its bytes."""
    import numpy as np  # noqa: PLC0415 - numpy only for the draw

    with open(source, encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        body = [row for row in reader if row]
    if label not in header:
        raise ValueError(f"{source}: expected a column {label!r}; found {header}")
    keep = [i for i, column in enumerate(header) if column != label]
    lines = [_csv_line([row[i] for i in keep]) for row in body]
    drawn = np.random.default_rng(seed).integers(0, len(lines), rows)
    with open(out, "w", encoding="utf-8", newline="") as handle:
        handle.write(_csv_line([header[i] for i in keep]))
        for start in range(0, rows, 100_000):
            handle.write("".join(lines[i] for i in drawn[start:start + 100_000]))
    return out.stat().st_size


def _csv_line(cells: list[str]) -> str:
    import io  # noqa: PLC0415

    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerow(cells)
    return text.getvalue()


def read_predictions(path: Path, column: str = "prediction") -> list[str]:
    """The ``column`` cells of a CSV with a header, one a data row (blank lines skipped; quoted
    cells as their text): a batch prediction's output or ``bucketlearn predict -o``'s."""
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        index = next(reader).index(column)
        return [row[index] for row in reader if row]


def parts_of(record: Any) -> int:
    """The parts a request was predicted in: the record's ``parts`` (an int) if it has one, else
    1 (one invocation predicted the whole file)."""
    parts = getattr(record, "parts", None)
    if parts is None and hasattr(record, "status"):
        parts = record.status().get("parts")
    return parts if isinstance(parts, int) and not isinstance(parts, bool) and parts > 0 else 1


def rate(rows: int, seconds: float | None) -> float | None:
    """Rows a second (None without a positive time)."""
    return rows / seconds if seconds else None


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds per process between two ``cpu_snapshot``s, rounded (processes in both)."""
    return {k: round(after[k] - before[k], 2) for k in after if k in before}


# --- measuring -----------------------------------------------------------------------------------

def train(svc: Any, path: Path, given: dict[str, Any], seed: int, model: Path) -> dict[str, Any]:
    """The job predictions are made with, trained on the stack; its model written to ``model``."""
    from bucketlearn.options import JobOptions  # noqa: PLC0415

    log(f"batch-predict: training {path.name} on the stack")
    job_id, started = submit(svc, path, JobOptions(**{**given, "seed": seed}))
    job = wait_ended(svc, job_id, timeout=1800)
    if job.status != "DONE" or not job.model_path:
        raise RuntimeError(f"job {job_id} ended {job.status} without a model: {job.error}")
    model.write_bytes(svc.store.read_bytes(svc.settings.models_bucket, job.model_path))
    return {"job_id": job_id, "seconds": float(job.finished_at or time.time()) - started,
            "accuracy": job.head.holdout_accuracy if job.head else None,
            "model_bytes": model.stat().st_size}


def stack_request(svc: Any, job_id: str, path: Path, out: Path, timeout: float,
                  processes: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """``path`` predicted by upload, as ``bucketlearn predict --job`` does: the time from the
    upload's start to the record's DONE, its parts; the output downloaded to ``out`` after."""
    from bucketlearn.usecases import predict_requests as requests  # noqa: PLC0415

    before = cpu_snapshot(*processes) if processes else {}
    started = time.time()
    submitted = requests.submit_prediction(svc, job_id, str(path))
    uploaded = time.time()
    record = requests.wait_prediction(svc, submitted, timeout)
    polled = time.time()
    after = cpu_snapshot(*processes) if processes else {}
    if record is None:
        raise TimeoutError(f"request {submitted.request_id} did not end in {timeout:.0f}s")
    if record.state != "DONE":
        raise RuntimeError(f"request {record.request_id} {record.state}: {record.error}")
    ended = record.updated_at or polled
    requests.download_predictions(svc, record, str(out))
    return {"request_id": record.request_id, "rows": record.rows, "seconds": ended - started,
            "upload_seconds": uploaded - started,
            "to_claim_seconds": record.created_at - uploaded,
            "request_seconds": record.seconds, "polled_seconds": polled - started,
            "parts": parts_of(record), "parts_recorded": hasattr(record, "parts"),
            "input": {"name": submitted.object_name, "generation": submitted.generation,
                      "bytes": path.stat().st_size},
            "output": str(out), "output_bytes": out.stat().st_size,
            "cpu_seconds": cpu_delta(before, after)}


def local_command(model: Path, path: Path, out: Path, timeout: float) -> dict[str, Any]:
    """``bucketlearn predict MODEL FILE -o OUT`` in a child on one TensorFlow (and BLAS)
    thread: its wall and CPU seconds."""
    argv = [str(Path(sys.executable).parent / "bucketlearn"), "predict", str(model), str(path),
            "-o", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=bench_env(**SINGLE_THREADED_TF, **ONE_THREAD_BLAS))
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"bucketlearn predict failed ({done.returncode}): "
                           f"{done.stderr[-2000:]}")
    return {"seconds": seconds, "output": str(out), "output_bytes": out.stat().st_size,
            "cpu_seconds": round(after.ru_utime + after.ru_stime
                                 - before.ru_utime - before.ru_stime, 2)}


def stages(stack: Any, model: Path, path: Path, cell: dict[str, Any]) -> dict[str, Any]:
    """``tools/predict_stages.py`` on the request's input, in the stack's environment."""
    log("batch-predict: the request's stages, one by one")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.tools.predict_stages", str(model), str(path),
         cell["input"]["name"], str(cell["input"]["generation"])],
        capture_output=True, text=True, timeout=1800, cwd=REPO,
        env=stack.child_env(single_threaded=True))
    if done.returncode != 0:
        raise RuntimeError(f"predict_stages failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def on_stack(figures: dict[str, Any], params: dict[str, Any], stack: Any, svc: Any, emus: Any,
             learners: int, tmp: Path) -> None:
    """On a started stack: the job (trained on the first stack; the warm-up job on a later
    one), the warm-up request, the measured request, and on the first stack the stages."""
    model = tmp / "model.keras"
    if "job" not in figures:
        table = params["table"]
        figures["job"] = train(svc, public_tables.path(table, CACHE),
                               public_tables.options(table), params["seed"], model)
    else:
        warm_up(svc, tmp, f"batch-predict W={learners}")
    job_id = figures["job"]["job_id"]
    log(f"batch-predict: warm-up request, {learners} learner(s)")
    stack_request(svc, job_id, tmp / "warm.csv", tmp / "warm-out.csv", params["timeout"])
    log(f"batch-predict: {figures['rows']:,} rows by upload, {learners} learner(s)")
    cell = stack_request(svc, job_id, tmp / "rows.csv", tmp / f"out-{learners}.csv",
                         params["timeout"], (stack, emus))
    figures[f"stack_{learners}"] = cell
    log(f"batch-predict: {cell['seconds']:.1f} s, {cell['parts']} part(s)")
    if params["stages"] and "stages" not in figures:
        figures["stages"] = stages(stack, model, tmp / "rows.csv", cell)


def measure(params: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """The prediction file, then the stacks one after another and the command between them."""
    source = public_tables.path(params["table"], CACHE)
    label = public_tables.options(params["table"])["label_column"]
    size = write_prediction_file(source, label, params["rows"], params["seed"], tmp / "rows.csv")
    write_prediction_file(source, label, params["warm_rows"], params["seed"] + 1,
                          tmp / "warm.csv")
    figures: dict[str, Any] = {"table": params["table"], "rows": params["rows"], "bytes": size}
    prefix = unique_prefix("predict")  # every stack finds the first one's job and model
    env = {PART_BYTES_ENV: str(params["part_bytes"])}
    with emulators(tmp) as emus:
        for learners in params["learners"]:
            with local_stack(tmp / f"stack-{learners}", learners, emus, "batch-predict",
                             prefix=prefix, extra_env=env) as (stack, svc):
                on_stack(figures, params, stack, svc, emus, learners, tmp)
            if "command" not in figures:
                log("batch-predict: bucketlearn predict MODEL FILE, one TensorFlow thread")
                figures["command"] = local_command(tmp / "model.keras", tmp / "rows.csv",
                                                   tmp / "out-command.csv", params["timeout"])
                figures["command_warm"] = local_command(
                    tmp / "model.keras", tmp / "warm.csv", tmp / "warm-command.csv",
                    params["timeout"])
    return figures


def agreement(found: list[str], expected: list[str]) -> float:
    """The fraction of rows whose prediction is the expected one (rows past the shorter list
    count as different)."""
    longest = max(len(found), len(expected))
    return sum(a == b for a, b in zip(found, expected, strict=False)) / longest if longest else 1.0


def check_outputs(figures: dict[str, Any]) -> None:
    """Each output's data rows, and each stack output's predictions against the command's."""
    command = read_predictions(Path(figures["command"]["output"]))
    figures["command"]["output_rows"] = len(command)
    for key, cell in figures.items():
        if key.startswith("stack_"):
            found = read_predictions(Path(cell.pop("output")))
            cell["output_rows"] = len(found)
            cell["same_as_command"] = agreement(found, command)
    figures["command"].pop("output")
    figures["command_warm"].pop("output")


def judge(result: dict[str, Any]) -> None:
    """Rows a second and the ratios; the goals."""
    f, ratios = result["figures"], result["ratios"]
    rows = f["rows"]
    for cell in (f["command"], *(f[k] for k in stacks(f))):
        cell["rows_per_second"] = rate(rows, cell["seconds"])
    command = f["command"]["rows_per_second"]
    # the command's rate without its start-up (the same command on the warm-up file)
    warm = rate(rows, f["command"]["seconds"] - f["command_warm"]["seconds"])
    for key in stacks(f):
        ratios[f"{key}_over_command"] = f[key]["rows_per_second"] / command
        ratios[f"{key}_over_command_started"] = f[key]["rows_per_second"] / warm if warm else None
    if "stack_1" in f:
        value = ratios["stack_1_over_command"]
        goal(result, "1 learner: rows/s / the command's (one TensorFlow thread)", value,
             ">= 0.8", value >= 0.8)
    if "stack_1" in f and "stack_2" in f:
        value = f["stack_2"]["rows_per_second"] / f["stack_1"]["rows_per_second"]
        ratios["stack_2_over_stack_1"] = value
        goal(result, "2 learners: rows/s / 1 learner's", value, "> 1", value > 1)
    outputs = [f["command"], *(f[k] for k in stacks(f))]
    whole = all(c["output_rows"] == rows for c in outputs) and all(
        f[k]["rows"] == rows for k in stacks(f))
    goal(result, "every output (and record) has the input's rows", float(whole), "1", whole)
    same = min((f[k]["same_as_command"] for k in stacks(f)), default=None)
    goal(result, "the stack's predictions = the command's (fraction of rows)", same, "1",
         same == 1.0)


def stacks(figures: dict[str, Any]) -> list[str]:
    return sorted((k for k in figures if k.startswith("stack_")), key=lambda k: int(k[6:]))


def run(out: Path, smoke: bool = False, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Measure and judge; the result (written by the caller)."""
    params = {**(SMOKE if smoke else FULL), **(params or {})}
    result = new_result(NAME, smoke, params)
    started = time.monotonic()
    CACHE.mkdir(exist_ok=True)
    with scratch_dir("batch-predict") as tmp:
        result["figures"] = measure(params, tmp)
        check_outputs(result["figures"])
    judge(result)
    result["notes"] += [
        "seconds: the command's child wall (TensorFlow's import and the model's load "
        "included; command_warm is the same command on the warm-up file); the stack's from the "
        "upload's start to the record's DONE (updated_at)",
        "the command writes row,prediction; the request writes every input cell (quoted), the "
        "prediction and the probabilities, into the storage emulator",
        f"{PART_BYTES_ENV}={params['part_bytes']} in every stack process; parts = the record's "
        "count, 1 when it has none",
        "one TensorFlow thread in the command, the function and the learners; 2 cores shared by "
        "the whole stack"]
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    result["seconds"] = time.monotonic() - started
    return result


def _s(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def tables(result: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows): the runs; the stages of a request; CPU seconds by process."""
    f = result["figures"]
    command = f["command"]
    started = command["seconds"] - f["command_warm"]["seconds"]
    runs = [["`bucketlearn predict MODEL FILE -o OUT`", "–", _s(command["seconds"], 2),
             _s(command["rows_per_second"], 0), "1.00", "–", "–", "–",
             f"{command['output_rows']:,}"],
            [f"the same on the {result['params']['warm_rows']:,}-row warm-up file (start-up)",
             "–", _s(f["command_warm"]["seconds"], 2), "–", "–", "–", "–", "–", "–"],
            ["the command less its start-up", "–", _s(started, 2), _s(rate(f["rows"], started), 0),
             _s(command["seconds"] / started, 2) if started else "–", "–", "–", "–", "–"]]
    for key in stacks(f):
        c = f[key]
        runs.append([f"by upload, {key[6:]} learner(s)", str(c["parts"]), _s(c["seconds"], 2),
                     _s(c["rows_per_second"], 0), _s(result["ratios"][f"{key}_over_command"], 2),
                     _s(c["upload_seconds"], 2), _s(c["to_claim_seconds"], 2),
                     _s(c["request_seconds"], 2), f"{c['output_rows']:,}"])
    out = [(f"{f['rows']:,} {f['table']} rows ({f['bytes'] / MB:.1f} MB), seconds",
            ["run", "parts", "seconds", "rows/s", "× the command", "upload", "to claim",
             "request's own", "output rows"], runs)]
    if f.get("stages"):
        own = (f.get("stack_1") or {}).get("request_seconds")
        out.append(("The request's steps one by one (one process, one TensorFlow thread), "
                    "seconds (share of the 1-learner request's own seconds)",
                    ["step", "seconds", "share"],
                    [[k, _s(v, 2), _s(100 * v / own, 0) + " %" if own else "–"]
                     for k, v in f["stages"]["seconds"].items()]))
    names = sorted({n for k in stacks(f) for n in f[k]["cpu_seconds"]})
    out.append(("CPU seconds by process during the request (upload to DONE)",
                ["process", *(f"{k[6:]} learner(s)" for k in stacks(f))],
                [[n, *(_s(f[k]["cpu_seconds"].get(n), 1) for k in stacks(f))] for n in names]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="SMOKE sizes (~2 minutes)")
    parser.add_argument("--rows", type=int, help="rows of the prediction file")
    parser.add_argument("--part-bytes", type=int, help=f"{PART_BYTES_ENV} of the stacks")
    parser.add_argument("--table", help="the table trained on and predicted (harness.tables)")
    parser.add_argument("--no-stages", action="store_true", help="skip the steps one by one")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory of batch_predict.json (default: benchmarks/results/; "
                             "with --smoke, a temporary directory's bench/)")
    args = parser.parse_args(argv)
    given = {"rows": args.rows, "part_bytes": args.part_bytes, "table": args.table,
             "stages": False if args.no_stages else None}
    result = run(args.out, smoke=args.smoke,
                 params={k: v for k, v in given.items() if v is not None})
    out = args.out or (Path(os.environ.get("TMPDIR", "/tmp")) / "bench" if args.smoke
                       else RESULTS)
    path = write_result(out, NAME, result)
    for title, header, rows in tables(result):
        print(f"{title}:\n\n{md_table(header, rows)}\n")
    print_goals(result)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
