"""How long a job should train, and on how many learners: the plan's forecast. Pure.

A round of k tasks costs its **critical path** (the last result's delivery, the fold and commit,
the next round's publish and pull: the round-trip benchmark's "round trip") plus ``ceil(k / W)``
waves of one task's compute on W learners. One task's compute is a fixed part (the learner's
bookkeeping, loading the version and writing its result: the version's weights and Adam
moments, three arrays per parameter, read once and written once) plus its steps' overhead plus
its rows' floating-point operations at a learner's rate. A job that trains one task at a time
(R = 1) chains: its learner starts the next task from its own end state while the aggregator
commits behind it, so a version costs one task's compute (no read of the version) plus what is
left of its path. One process (``train-local``) pays only the steps and the rows.

Every constant is a measurement, stated with where it comes from (docs/TRAINING.md, "The
forecast"); they were set on the synthetic tuning tables blobs and trips and a 3,000-row image
set (one TensorFlow thread on the project's 2-core machine) and checked on others. The forecast is made
once, when the job is planned; what the job then measures (``actual``) is shown beside it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bucketlearn.domain.plan import DECIDED_BOUND, DECIDED_NUMERIC, DECIDED_OPTION, TrainingPlan

# One learner on one TensorFlow thread, fitted in process (docs/TRAINING.md, "The forecast"):
# its FLOP rate (``ml.model.training_flops_per_row``), a step's fixed overhead and a per-layer
# part, a task's fixed part. 20 GFLOP/s rather than the 26 fitted: a learner shares its machine,
# and a forecast a little long misleads less.
LEARNER_FLOPS = 20e9
STEP_SECONDS = 0.0001
LAYER_STEP_SECONDS = 0.00003
TASK_SECONDS = 0.015  # a task's fixed part in process
STATE_BYTES_PER_SECOND = 100e6  # one stream to or from Cloud Storage, about
STATE_ARRAYS = 3  # weights, and Adam's two moments
# The critical path of a parallel round, projected for the cloud with stated latencies by the
# round-trip benchmark (docs/BENCHMARKS.md, section 3). A chained version's path overlaps its
# successor's training: what is left of it.
ROUND_SECONDS = 0.37
CHAINED_VERSION_SECONDS = 0.05
WORKER_CHOICES = (1, 2, 4, 8, 16, 32, 64)
DECIDED_FORECAST = "auto: one task at a time, forecast"  # ``choose_layout``'s ``decided``
SUGGEST_WITHIN = 1.1  # the fewest learners within 10 % of the fastest forecast


@dataclass(frozen=True)
class Forecast:
    """A job's forecast training time (the split done), by the number of learners.

    Attributes:
        task_seconds: one task's compute on one learner (a version read, steps, result write).
        steps_per_task: a task's optimizer steps (H), on average.
        round_seconds: a round's critical path beside its tasks' compute.
        rounds: rounds (versions) over the whole job.
        seconds: forecast seconds of training with W learners, for each W in ``workers``.
        workers: the numbers of learners forecast (more than R never helps: a round has R
            tasks).
        one_process_seconds: the same rows and steps in one process (``train-local``), without
            rounds.
        suggested_workers: the fewest learners whose forecast is within ``SUGGEST_WITHIN`` of
            the fastest.
    """

    task_seconds: float
    steps_per_task: int
    round_seconds: float
    rounds: int
    workers: tuple[int, ...]
    seconds: tuple[float, ...]
    one_process_seconds: float
    suggested_workers: int

    def at(self, workers: int) -> float:
        """The forecast with ``workers`` learners (those beyond the last forecast add nothing)."""
        known = [s for w, s in zip(self.workers, self.seconds, strict=True) if w <= workers]
        return known[-1] if known else self.seconds[0]

    @property
    def best_seconds(self) -> float:
        return min(self.seconds)

    @property
    def pays(self) -> bool:
        """Whether the pipeline is forecast to finish before one process would."""
        return self.best_seconds < self.one_process_seconds

    def summary(self) -> str:
        """One sentence for people: the suggestion, and whether distributing pays."""
        best = self.at(self.suggested_workers)
        text = (f"about {duration_text(best)} on {self.suggested_workers} learner"
                f"{'' if self.suggested_workers == 1 else 's'} ({self.rounds:,} rounds of "
                f"{self.round_seconds:g} s + tasks of {self.task_seconds:.3g} s); one process: "
                f"about {duration_text(self.one_process_seconds)}")
        if not self.pays:
            text += ("; too small to gain from distributing: train-local would end sooner")
        return text

    def to_dict(self) -> dict[str, object]:
        return {"task_seconds": self.task_seconds, "steps_per_task": self.steps_per_task,
                "round_seconds": self.round_seconds,
                "rounds": self.rounds,
                "by_workers": [{"workers": w, "seconds": s}
                               for w, s in zip(self.workers, self.seconds, strict=True)],
                "one_process_seconds": self.one_process_seconds,
                "suggested_workers": self.suggested_workers, "summary": self.summary()}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Forecast:
        rows = list(data["by_workers"])  # type: ignore[call-overload]
        return cls(task_seconds=float(data["task_seconds"]),  # type: ignore[arg-type]
                   steps_per_task=int(data.get("steps_per_task") or 0),  # type: ignore[call-overload]
                   round_seconds=float(data["round_seconds"]),  # type: ignore[arg-type]
                   rounds=int(data["rounds"]),  # type: ignore[call-overload]
                   workers=tuple(int(r["workers"]) for r in rows),
                   seconds=tuple(float(r["seconds"]) for r in rows),
                   one_process_seconds=float(data["one_process_seconds"]),  # type: ignore[arg-type]
                   suggested_workers=int(data["suggested_workers"]))  # type: ignore[call-overload]


def duration_text(seconds: float) -> str:
    """A duration for people: '4.2 s', '45 s', '3.5 min', '1.6 h'."""
    if seconds >= 5400:
        return f"{seconds / 3600:,.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


@dataclass(frozen=True)
class ModelCost:
    """What the forecast needs of a model: a training row's floating-point operations
    (``ml.model.training_flops_per_row``), its parameters and its layers."""

    flops_per_row: float
    parameters: int
    layers: int

    def step_seconds(self, rows: float) -> float:
        """One optimizer step over ``rows`` rows."""
        return (STEP_SECONDS + LAYER_STEP_SECONDS * self.layers
                + rows * self.flops_per_row / LEARNER_FLOPS)

    def to_dict(self) -> dict[str, float | int]:
        return {"flops_per_row": self.flops_per_row, "parameters": self.parameters,
                "layers": self.layers}


def task_seconds(rows: float, batch_size: int, model: ModelCost,
                 reads_version: bool = True) -> float:
    """One task's compute on one learner: ``rows`` training rows in batches of
    ``batch_size``; the version's state read first unless the learner holds it
    (``reads_version``: a chain), the result written after."""
    steps = math.ceil(rows / max(1, batch_size))
    state = STATE_ARRAYS * 4 * model.parameters / STATE_BYTES_PER_SECOND
    return (TASK_SECONDS + steps * model.step_seconds(0)
            + rows * model.flops_per_row / LEARNER_FLOPS + state * (2 if reads_version else 1))


def forecast_plan(plan: TrainingPlan, train_rows: int, batch_size: int, model: ModelCost
                  ) -> Forecast:
    """The forecast of a job planned as ``plan`` (see the module's docstring).

    Args:
        plan: the job's plan (tasks, rounds, R, epochs).
        train_rows: the job's training rows (one epoch).
        batch_size: rows per optimizer step.
        model: what the model costs to train.

    Returns:
        The forecast with 1 to R learners (one only, at R = 1), the suggestion among them and
        the same steps in one process.
    """
    rows_per_task = train_rows / max(1, plan.tasks_per_epoch)
    rounds = plan.rounds_per_epoch * plan.epochs
    one_process = plan.epochs * (train_rows * model.flops_per_row / LEARNER_FLOPS + math.ceil(
        train_rows / max(1, batch_size)) * model.step_seconds(0))
    if plan.parallel_tasks <= 1:
        task = task_seconds(rows_per_task, batch_size, model, False)
        per_round, workers = CHAINED_VERSION_SECONDS, (1,)
        seconds: tuple[float, ...] = (rounds * (per_round + task),)
    else:
        task = task_seconds(rows_per_task, batch_size, model)
        per_round = ROUND_SECONDS
        sizes = [len(plan.round_range(r)) for r in range(plan.rounds_per_epoch)]
        workers = tuple(sorted({w for w in WORKER_CHOICES if w < plan.parallel_tasks}
                               | {plan.parallel_tasks}))
        seconds = tuple(plan.epochs * sum(per_round + math.ceil(k / w) * task for k in sizes)
                        for w in workers)
    fastest = min(seconds)
    suggested = next(w for w, s in zip(workers, seconds, strict=True)
                     if s <= SUGGEST_WITHIN * fastest)
    return Forecast(task_seconds=round(task, 6),
                    steps_per_task=math.ceil(rows_per_task / max(1, batch_size)),
                    round_seconds=per_round, rounds=rounds,
                    workers=workers, seconds=tuple(round(s, 6) for s in seconds),
                    one_process_seconds=round(one_process, 6), suggested_workers=suggested)


def actual(forecast_doc: Mapping[str, Any], until: float | None, versions_done: int,
           worker_seconds: float, tasks_applied: int, ended: bool) -> dict[str, Any]:
    """What the job measured, to show beside its forecast.

    Args:
        forecast_doc: the job's stored forecast (``made_at``: when training started; ``rounds``).
        until: the job's end, or its last update while it runs (None: unknown).
        versions_done: versions committed so far.
        worker_seconds: learner seconds counted on its applied tasks (``Job.usage``).
        tasks_applied: tasks folded into versions so far.
        ended: the job has ended.

    Returns:
        ``training_seconds`` from ``made_at`` to ``until``; ``seconds_left`` at the pace so far
        (its versions against the forecast's rounds; None before the first version and once
        it ended); ``versions``; ``task_seconds``, a task's measured learner seconds (None
        until a learner's seconds are counted).
    """
    made = forecast_doc.get("made_at")
    rounds = int(forecast_doc.get("rounds") or 0)
    elapsed = (max(0.0, float(until) - float(made)) if until is not None and made is not None
               else None)
    left = None
    if not ended and elapsed is not None and versions_done > 0 and rounds > 0:
        left = round(max(0.0, elapsed / versions_done * (rounds - versions_done)), 3)
    return {"training_seconds": None if elapsed is None else round(elapsed, 3),
            "seconds_left": left, "versions": versions_done,
            "task_seconds": (round(worker_seconds / tasks_applied, 6)
                             if tasks_applied > 0 and worker_seconds > 0 else None)}


def plan_lines(plan: Mapping[str, Any] | None, forecast_doc: Mapping[str, Any] | None,
               measured: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """What the CLI's ``status`` and the dashboard say of a job's plan, forecast and actual, in
    words (the rule and the forecast's parts are in ``status --json``: ``plan.decided``,
    ``forecast.summary``).

    Args:
        plan: the job's plan document (None before the split).
        forecast_doc: its forecast (None for a job planned before forecasts).
        measured: ``actual`` of it (None without a forecast).

    Returns:
        (label, text) lines: ``plan``, then ``forecast`` and ``actual`` where known; none
        before the job is planned.
    """
    if not plan:
        return []
    steps = (forecast_doc or {}).get("steps_per_task")
    lines = [("plan", f"{plan_sentence(plan)}; {plan.get('tasks_per_epoch')} tasks an epoch"
                      + (f" of about {steps} steps each" if steps else "")
                      + f", {plan.get('epochs')} epochs")]
    if forecast_doc:
        lines.append(("forecast", forecast_sentence(forecast_doc)))
    if measured and measured.get("training_seconds") is not None:
        text = f"{duration_text(float(measured['training_seconds']))} of training"
        if measured.get("seconds_left") is not None:
            text += f", about {duration_text(float(measured['seconds_left']))} left at this pace"
        if measured.get("task_seconds") is not None:
            text += (f"; a task took {float(measured['task_seconds']):.3g} s of learner time"
                     + (f" (forecast {float(forecast_doc['task_seconds']):.3g} s)"
                        if forecast_doc and forecast_doc.get("task_seconds") else ""))
        lines.append(("actual", text))
    return lines


def plan_sentence(plan: Mapping[str, Any]) -> str:
    """What a plan decided and why, for people: "trains one task at a time: this job is too
    small for parallel rounds to finish sooner". ``plan["decided"]`` keeps the rule and its
    numbers (docs/TRAINING.md explains them)."""
    parallel = int(plan.get("parallel_tasks") or 1)
    decided = str(plan.get("decided") or "")
    what = ("trains one task at a time" if parallel <= 1 else
            f"trains {parallel} tasks at a time, each from the same version")
    if decided.startswith(DECIDED_OPTION):
        why = "as its parallel_tasks option asks"
    elif decided.startswith(DECIDED_NUMERIC):
        why = ("a numeric target loses accuracy in parallel rounds (parallel_tasks trades "
               "some for speed)")
    elif decided.startswith(DECIDED_FORECAST):
        why = "this job is too small for parallel rounds to finish sooner"
    elif decided.startswith(DECIDED_BOUND) and parallel <= 1:
        why = "this job is too small to train tasks side by side without losing accuracy"
    elif decided.startswith(DECIDED_BOUND):
        why = "the most that keep the accuracy of one at a time, for a job of this size"
    else:
        return what
    return f"{what}: {why}"


def forecast_sentence(forecast_doc: Mapping[str, Any]) -> str:
    """A job's forecast for people: how long on the suggested number of learners, how long in
    one process, and whether distributing pays ("about 4.8 s on 1 learner; about 0.7 s in one
    process (train-local): too small to gain from distributing")."""
    try:
        found = Forecast.from_dict(dict(forecast_doc))
    except (KeyError, TypeError, ValueError):  # a document of another shape: its own words
        return str(forecast_doc.get("summary") or "")
    workers = found.suggested_workers
    text = (f"about {duration_text(found.at(workers))} on {workers} learner"
            f"{'' if workers == 1 else 's'}; about {duration_text(found.one_process_seconds)} in "
            "one process (train-local)")
    return text if found.pays else text + ": too small to gain from distributing"


def choose_layout(parallel: TrainingPlan, chained: TrainingPlan, train_rows: int,
                  batch_size: int, model: ModelCost) -> TrainingPlan:
    """The layout an automatic plan trains with: rounds of ``parallel``'s R one-shard tasks
    only when their forecast with R learners (their fastest) ends sooner than ``chained``'s
    one task at a time; else ``chained``, which is serial training's steps exactly.

    Why (docs/TRAINING.md "One task at a time when rounds do not pay"): a parallel
    round pays its critical path (0.37 s projected in the cloud) for tasks of one 256-row
    shard, tens of milliseconds of a table's compute, where a chained version costs about
    0.05 s for a task of 4 to 64 shards; and the bound that keeps rounds accurate
    (``plan.PARALLEL_C``) keeps R small. On the speed-up benchmark's public tables the chain
    ended sooner, at train-local's accuracy, than rounds at the bound's R on 1 or 2 learners.

    Args:
        parallel: the automatic plan (R by the bound, one shard a task).
        chained: the same job one task at a time (``plan_training(..., requested=1)``).
        train_rows, batch_size, model: what ``forecast_plan`` prices them with.

    Returns:
        ``parallel`` itself, or ``chained`` with both forecasts in its ``decided``.
    """
    if parallel.parallel_tasks <= 1:
        return parallel
    rounds = forecast_plan(parallel, train_rows, batch_size, model)
    one = forecast_plan(chained, train_rows, batch_size, model)
    if rounds.best_seconds < one.best_seconds:
        return parallel
    r = parallel.parallel_tasks
    return dataclasses.replace(chained, decided=(
        f"{DECIDED_FORECAST} {one.best_seconds:,.1f} s; rounds of {r} tasks "
        f"(the most the bound allows: {parallel.decided.removeprefix('auto: ')}) were "
        f"forecast {rounds.best_seconds:,.1f} s on {r} learners"))
