"""How a job's training is laid out: tasks, rounds, how many tasks train at once, learning rates.

Training runs in **synchronous rounds**. Every epoch deals the job's shards into tasks in a
seeded order; consecutive tasks form rounds of ``parallel_tasks`` (R) tasks. Every task of a
round trains from the same version, on its own rows, with the version's optimizer state; when
all of them are in, the aggregator folds them into the next version. Nothing here depends on how
many workers there are or how their timing interleaves: the same upload with the same options
gives the same sequence of versions on 1 worker or 16 (invariant 10 by construction), and with
R = 1 the pipeline takes serial training's steps (up to float32 rounding).

How many tasks may train from one version is what decides whether parallel training keeps serial
accuracy. Local SGD (R workers, H local steps each, then a model fold) converges like serial SGD
once H·R stays within a constant times the square root of the number of steps (Stich, "Local
SGD Converges Fast and Communicates Little", ICLR 2019: linear speedup for H = O(√(T/R)), T the
steps per worker; with T = S/R for S serial steps, R·H ≤ c·√S). ``auto`` therefore takes the
largest R with ``R * H <= PARALLEL_C * sqrt(S)``, S being the job's serial steps (epochs × batches
per epoch) and H a shard's steps. The constant, 0.25, keeps two public tables (flights,
diamonds) within a point of serial training under the fold's rule; at 0.5 they lost 1.6 and
1.9 points (docs/TRAINING.md).

A job that trains one task at a time (R = 1) groups several shards into a task
(``serial_task_shards``: 4, up to 64 where the job keeps 8 tasks an epoch): the steps are the
same, one after another, and the pipeline pays for fewer versions.

The bound says how many tasks a round may have and keep serial accuracy, not whether rounds end
sooner: once the model is built, an automatic plan keeps its rounds only where the job's
forecast says so (``domain.forecast.choose_layout``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PARALLEL_C = 0.25
MAX_PARALLEL_TASKS = 64
SERIAL_TASK_SHARDS = 4
# A job with shards to spare chains larger tasks: up to this many shards, keeping at least
# CHAIN_TASKS_PER_EPOCH tasks an epoch (progress, evaluations and retries stay fine-grained).
# 64 rather than 16: a chained version costs its learner, the aggregator and the emulators
# about 45 ms of CPU on the stack, so fewer, larger tasks end a large job sooner
CHAIN_TASK_SHARDS = 64
CHAIN_TASKS_PER_EPOCH = 8
SCHEDULES = ("flat_cosine", "wsd", "cosine", "constant")
RATES_SCALED = "scaled"
RATES_FAMILY = "family"
WSD_DECAY = 0.2  # "wsd": constant, then a linear decay to 0 over the last fifth of the job
# How ``TrainingPlan.decided`` begins for each way R is chosen (``forecast.plan_sentence`` says
# each in words; a chained layout chosen over rounds: ``forecast.DECIDED_FORECAST``)
DECIDED_OPTION = "option parallel_tasks"
DECIDED_NUMERIC = "auto: one task at a time for a numeric target"
DECIDED_BOUND = "auto: R*H <= "


@dataclass(frozen=True)
class TrainingPlan:
    """Plans a job's training: its tasks, rounds and learning rates, decided once at the split.

    Its shards are the ``SplitPlan``'s; the objects a round's tasks left are sorted by
    ``domain.rounds.sort_round`` (``RoundObjects``).

    Attributes:
        parallel_tasks: tasks per round (R), trained from the same version.
        shards_per_task: shards a task trains, one after another.
        tasks_per_epoch: tasks in every epoch.
        epochs: passes over the training rows.
        serial_steps: optimizer steps of serial training on the same rows (S).
        decided: how ``parallel_tasks`` was chosen: the rule and its numbers ("auto: ...",
            "option ..."; ``status --json`` and the docs show it, ``forecast.plan_sentence``
            says it in words).
        rates: how a round of several tasks is trained and folded: ``RATES_SCALED`` (every
            task of a round of k steps at k times the job's learning rate; the fold is the
            mean), or ``RATES_FAMILY`` (jobs planned before it: the job's rate; the fold is the
            sum for an MLP, the mean for a CNN). See ``task_rate_scale``.
    """

    parallel_tasks: int
    shards_per_task: int
    tasks_per_epoch: int
    epochs: int
    serial_steps: int
    decided: str
    rates: str = RATES_SCALED

    @property
    def rounds_per_epoch(self) -> int:
        return math.ceil(self.tasks_per_epoch / self.parallel_tasks)

    @property
    def total_tasks(self) -> int:
        return self.tasks_per_epoch * self.epochs

    def to_dict(self) -> dict[str, int | str]:
        return {"parallel_tasks": self.parallel_tasks, "shards_per_task": self.shards_per_task,
                "tasks_per_epoch": self.tasks_per_epoch, "epochs": self.epochs,
                "serial_steps": self.serial_steps, "decided": self.decided,
                "rates": self.rates}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> TrainingPlan:
        return cls(parallel_tasks=int(data["parallel_tasks"]),  # type: ignore[arg-type]
                   shards_per_task=int(data["shards_per_task"]),  # type: ignore[arg-type]
                   tasks_per_epoch=int(data["tasks_per_epoch"]),  # type: ignore[arg-type]
                   epochs=int(data["epochs"]),  # type: ignore[arg-type]
                   serial_steps=int(data["serial_steps"]),  # type: ignore[arg-type]
                   decided=str(data.get("decided", "")),
                   rates=str(data.get("rates", RATES_FAMILY)))

    def task_rate_scale(self, round_index: int) -> float:
        """The factor on the job's learning rate for the steps of a task of round
        ``round_index``: the number of tasks in that round when rates are ``RATES_SCALED``,
        else 1 (so one task at a time is serial training exactly).

        Why (docs/TRAINING.md): a round of k tasks from one version takes k·b rows
        per step, and its fold is the mean of k Adam updates. Adam scales every update by the
        root of its own small-batch second moment, so where the batch noise dominates (most
        weights, most of the job) the mean of k updates is about 1/√k of one update on the
        k·b rows, while Adam's square-root scaling rule for a k-times larger batch (Malladi et
        al., NeurIPS 2022) asks for √k times the rate: k times the rate in all. On a public
        53,940-row table a round of 5 one-shard tasks at the job's rate ended 5.1 points
        below serial training, and at 5 times its rate 1.0 point below.
        """
        if self.rates != RATES_SCALED or self.parallel_tasks <= 1:
            return 1.0
        return float(len(self.round_range(round_index)))

    def round_range(self, round_index: int) -> range:
        """The task indices (within an epoch) of one round."""
        start = round_index * self.parallel_tasks
        return range(start, min(self.tasks_per_epoch, start + self.parallel_tasks))

    def round_of(self, task_index: int) -> int:
        return task_index // self.parallel_tasks

    def progress(self, epoch: int, round_index: int) -> float:
        """Share of the job's tasks done before this round starts (0 at the start, <1)."""
        done = (epoch - 1) * self.tasks_per_epoch + round_index * self.parallel_tasks
        return min(1.0, done / max(1, self.total_tasks))

    def span(self, epoch: int, round_index: int) -> tuple[float, float]:
        """The share of the job done when this round starts and when it ends."""
        start = self.progress(epoch, round_index)
        tasks = len(self.round_range(round_index))
        return start, min(1.0, start + tasks / max(1, self.total_tasks))


def serial_steps(shard_rows: Sequence[int], epochs: int, batch_size: int) -> int:
    """Optimizer steps serial training takes over the same rows (batches of ``batch_size``)."""
    return epochs * math.ceil(sum(shard_rows) / max(1, batch_size))


def auto_parallel_tasks(steps: int, shard_steps: int, cap: int = MAX_PARALLEL_TASKS) -> int:
    """The largest R with ``R * shard_steps <= PARALLEL_C * sqrt(steps)`` (at least 1)."""
    budget = PARALLEL_C * math.sqrt(max(0, steps))
    return max(1, min(cap, int(budget // max(1, shard_steps))))


def serial_task_shards(shard_count: int, shard_cells: int = 0, largest_rows: int = 0,
                       max_task_bytes: int = 0) -> int:
    """The shards a task takes when one task trains at a time.

    At least ``SERIAL_TASK_SHARDS`` (as every such job had before), up to ``CHAIN_TASK_SHARDS``
    where the job keeps ``CHAIN_TASKS_PER_EPOCH`` tasks an epoch, and no more than
    ``max_task_bytes`` of arrays in one task (shards of ``largest_rows`` rows of
    ``shard_cells`` cells; 0: no such bound). Why (docs/TRAINING.md): a chained
    version costs about 30 ms on the stack and 50 ms projected in the cloud beside its task's
    compute, and a 4-shard task of a public 336,776-row table computed 92 ms; the steps are
    serial training's whatever the grouping, and ``train-local`` groups the same way.
    """
    wanted = min(CHAIN_TASK_SHARDS, shard_count // CHAIN_TASKS_PER_EPOCH)
    if max_task_bytes and largest_rows and shard_cells:
        wanted = min(wanted, max_task_bytes // shard_bytes(largest_rows, shard_cells))
    return max(1, min(shard_count, max(SERIAL_TASK_SHARDS, wanted)))


def plan_training(shard_rows: Sequence[int], epochs: int, batch_size: int,
                  requested: int | None = None, cap: int = MAX_PARALLEL_TASKS,
                  regression: bool = False, shard_cells: int = 0,
                  max_task_bytes: int = 0) -> TrainingPlan:
    """Decide tasks, rounds and parallelism for a job.

    Args:
        shard_rows: training rows of every shard, in shard order.
        epochs: passes over the training rows.
        batch_size: rows per optimizer step.
        requested: ``parallel_tasks`` from the job's options; None means auto.
        cap: the most tasks a round may have.
        regression: a numeric target. ``auto`` then trains one task at a time: with parallel
            rounds every fold tried lost RMSE against train-local on numeric targets
            (docs/REGRESSION.md, "One task at a time").
        shard_cells, max_task_bytes: a row's matrix cells and the most bytes of arrays a
            task may hold (``serial_task_shards``; 0: not bounded by bytes).

    Returns:
        The plan. With R > 1 a task is one shard; with R = 1 a task is
        ``serial_task_shards`` shards.
    """
    if not shard_rows:
        raise ValueError("a plan needs at least one shard")
    steps = serial_steps(shard_rows, epochs, batch_size)
    largest = max(shard_rows)
    shard_steps = math.ceil(largest / max(1, batch_size))
    if requested is None and regression:
        parallel = 1
        decided = (f"{DECIDED_NUMERIC} (parallel rounds cost RMSE; set parallel_tasks to "
                   "trade it for speed)")
    elif requested is None:
        parallel = auto_parallel_tasks(steps, shard_steps, cap)
        decided = (f"{DECIDED_BOUND}{PARALLEL_C:g}*sqrt(S) with S={steps} serial steps and "
                   f"H={shard_steps} steps per shard")
    else:
        parallel = max(1, min(cap, int(requested)))
        decided = DECIDED_OPTION
    shards = len(shard_rows)
    per_task = 1 if parallel > 1 else serial_task_shards(shards, shard_cells, largest,
                                                         max_task_bytes)
    tasks = math.ceil(shards / per_task)
    parallel = min(parallel, tasks)
    return TrainingPlan(parallel_tasks=parallel, shards_per_task=per_task, tasks_per_epoch=tasks,
                        epochs=epochs, serial_steps=steps, decided=decided)


@dataclass(frozen=True)
class OverLimit:
    """A job over one of the deployment's limits: the texts of its REJECTED reason (what the
    limit allows and what to change, what the job would need)."""

    message: str
    expected: str
    found: str


def check_total_tasks(plan: TrainingPlan, max_total_tasks: int,
                      rows_per_shard: int) -> OverLimit | None:
    """Whether a plan's tasks over all its epochs stay within ``max_total_tasks`` (None) or
    not: then what to change, fewer epochs or larger shards (fewer tasks per epoch)."""
    total = plan.total_tasks
    if total <= max_total_tasks:
        return None
    fixes = []
    most_epochs = max_total_tasks // plan.tasks_per_epoch
    if most_epochs >= 1:
        fixes.append(f"epochs of at most {most_epochs:,}")
    larger = math.ceil(rows_per_shard * total / max_total_tasks)
    fixes.append(f"a rows_per_shard of about {larger:,} or more (now {rows_per_shard:,}; "
                 "fewer shards, so fewer tasks per epoch)")
    return OverLimit(
        message="the job would train too many tasks",
        expected=f"at most {max_total_tasks:,} tasks in all (the deployment's "
                 f"max_total_tasks): {' or '.join(fixes)}",
        found=f"{plan.tasks_per_epoch:,} tasks per epoch × {plan.epochs:,} epochs = "
              f"{total:,} tasks")


# Predicting how long a job trains, to refuse one the work bucket's lifecycle rule would
# outlast: training a model of N parameters on one row costs about 6N
# floating-point operations, forward and backward (Kaplan et al. 2020, "Scaling Laws for Neural
# Language Models", C = 6ND); a round adds its critical path, priced at 1 s (well above the
# round-trip benchmark's cloud projection; docs/BENCHMARKS.md), and a learner trains at
# ``Limits.worker_flops`` (1 GFLOP/s by default, about a quarter of one TensorFlow thread on a
# 2-core machine). Every factor errs long, and a job must fit in half the retention:
# it may wait for workers, retry and be paused by an outage and still end before its shards go.
FLOPS_PER_PARAMETER_ROW = 6
PREDICTED_ROUND_SECONDS = 1.0
RETENTION_SHARE = 0.5


def predict_seconds(plan: TrainingPlan, parameters: int, train_rows: int,
                    worker_flops: float) -> float:
    """Seconds the job is predicted to train at most (see ``FLOPS_PER_PARAMETER_ROW``): its
    compute spread over ``plan.parallel_tasks`` learners, plus every round's critical path."""
    compute = FLOPS_PER_PARAMETER_ROW * parameters * train_rows * plan.epochs / max(
        1.0, worker_flops) / max(1, plan.parallel_tasks)
    return compute + plan.rounds_per_epoch * plan.epochs * PREDICTED_ROUND_SECONDS


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 360 else f"{seconds:,.0f} s"


def check_duration(plan: TrainingPlan, parameters: int, train_rows: int, worker_flops: float,
                   retention_days: int) -> OverLimit | None:
    """Whether the job's predicted training time (``predict_seconds``) fits in
    ``RETENTION_SHARE`` of the work bucket's retention (None), or what to change."""
    predicted = predict_seconds(plan, parameters, train_rows, worker_flops)
    budget = RETENTION_SHARE * retention_days * 86_400
    if predicted <= budget:
        return None
    per_epoch = predicted / plan.epochs
    most_epochs = int(budget // per_epoch)
    fixes = ([f"epochs of at most {most_epochs:,}"] if most_epochs >= 1 else []) + [
        f"a deployment whose work_retention_days is at least "
        f"{math.ceil(predicted / RETENTION_SHARE / 86_400):,}"]
    return OverLimit(
        message="the job is predicted to train longer than the work bucket keeps its shards",
        expected=f"at most {_hours(budget)} of training (half the deployment's "
                 f"work_retention_days of {retention_days:,}; its lifecycle rule deletes older "
                 f"shards): {' or '.join(fixes)}",
        found=f"about {_hours(predicted)}: {FLOPS_PER_PARAMETER_ROW} x {parameters:,} "
              f"parameters x {train_rows:,} training rows x {plan.epochs:,} epochs at "
              f"{worker_flops / 1e9:g} GFLOP/s per learner, {plan.parallel_tasks} at once, "
              f"plus {plan.rounds_per_epoch * plan.epochs:,} rounds at "
              f"{PREDICTED_ROUND_SECONDS:g} s")


CELL_BYTES = 4  # a shard holds float32 cells and one 4-byte label (class id or target) per row


def shard_bytes(rows: int, cells: int) -> int:
    """Bytes of a shard's arrays: ``rows`` rows of ``cells`` matrix cells and a label."""
    return rows * (cells + 1) * CELL_BYTES


def check_shard_bytes(rows: int, cells: int, max_shard_bytes: int,
                      rows_per_shard: int) -> OverLimit | None:
    """Whether the largest shard's arrays (``rows`` rows of ``cells`` cells) stay within
    ``max_shard_bytes``, what a learner holds of one shard (None), or what to change."""
    size = shard_bytes(rows, cells)
    if size <= max_shard_bytes:
        return None
    fitting = max_shard_bytes // shard_bytes(1, cells)
    fix = (f"a smaller rows_per_shard (shards of at most {fitting:,} rows fit) or fewer "
           "columns (drop_columns)" if fitting >= 1 else "fewer columns (drop_columns)")
    return OverLimit(
        message="a shard would not fit in a learner's memory",
        expected=f"shards of at most {max_shard_bytes:,} bytes (the deployment's "
                 f"max_shard_bytes): {fix}",
        found=f"rows_per_shard={rows_per_shard:,} gives shards of up to {rows:,} rows × "
              f"({cells:,} matrix cells + 1 label) × {CELL_BYTES} bytes = {size:,} bytes")


def check_model_columns(columns: int, per_column: bool, max_model_columns: int
                        ) -> OverLimit | None:
    """Whether a table's model stays within ``max_model_columns`` columns that take layers of
    their own (``per_column``: a table of text, dates or missing cells, where each column is
    imputed, scaled or embedded on its own; a matrix of complete numbers takes none), or what
    to change: the model is built in the upload function, and its graph grows with them."""
    if not per_column or columns <= max_model_columns:
        return None
    return OverLimit(
        message="the model would have too many columns of its own",
        expected=f"at most {max_model_columns:,} feature columns in a table with text, dates or "
                 "missing cells (the deployment's max_model_columns; each takes layers of its "
                 "own): drop_columns, or a table of complete numbers",
        found=f"{columns:,} feature columns")


def epoch_tasks(plan: TrainingPlan, shard_count: int, seed: int, epoch: int) -> list[list[int]]:
    """Each task's shard indices for one epoch: shards in a seeded order, dealt into tasks of
    ``shards_per_task`` consecutive shards (the same seed and epoch give the same tasks)."""
    order = np.random.default_rng([seed, epoch, 17]).permutation(shard_count).tolist()
    size = plan.shards_per_task
    tasks = [order[i:i + size] for i in range(0, shard_count, size)]
    if len(tasks) != plan.tasks_per_epoch:
        raise ValueError(f"plan: expected {plan.tasks_per_epoch} tasks per epoch; "
                         f"found {len(tasks)} for {shard_count} shards")
    return tasks


def step_rates(base: float, schedule: str, span: tuple[float, float], steps: int) -> list[float]:
    """The learning rate of each of a task's ``steps`` optimizer steps, its task spanning
    ``span`` of the job: the schedule is followed step by step, not task by task, so a job of a
    few large tasks still decays smoothly."""
    start, end = span
    return [learning_rate(base, schedule, start + (end - start) * k / max(1, steps))
            for k in range(max(1, steps))]


def learning_rate(base: float, schedule: str, progress: float) -> float:
    """The learning rate at ``progress`` (share of the job done, 0..1).

    ``wsd`` (warmup-stable-decay without the warmup; Hägele et al., "Scaling Laws and
    Compute-Optimal Training Beyond Fixed Training Durations", 2024) keeps ``base`` for the first
    80 % of the job and decays linearly to 0 over the last 20 %: the final model does not depend
    on the last few batches it saw (a constant rate's last versions swung 3 points on a CNN),
    and the job keeps nearly a constant rate's progress (a cosine's average rate is half of it,
    which cost an under-trained CNN up to 6 points). ``cosine`` decays along a half cosine;
    ``constant`` keeps ``base``. ``flat_cosine`` (RealMLP's "flat_cos") keeps ``base`` for the
    first half and decays along a half cosine over the second.
    """
    progress = min(1.0, max(0.0, progress))
    if schedule == "constant":
        return float(base)
    if schedule == "flat_cosine":
        late = max(0.0, progress - 0.5) / 0.5
        return float(base) * 0.5 * (1.0 + math.cos(math.pi * late))
    if schedule == "wsd":
        return float(base) * min(1.0, (1.0 - progress) / WSD_DECAY)
    if schedule == "cosine":
        return float(base) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"lr_schedule: expected one of {', '.join(SCHEDULES)}; found {schedule!r}")


CLASS_WEIGHTS = ("none", "balanced")


def class_weights(mode: str, train_counts: Sequence[int]) -> list[float] | None:
    """The weight of each class's rows in the training loss (``class_weight`` option).

    ``none``: None (every row counts once; training takes exactly the steps it took before the
    option existed). ``balanced``: ``n_rows / (n_classes * count_c)`` from the job's training
    rows per class, as scikit-learn's ``balanced``: every class then weighs as much in the loss
    as any other, whatever its share of the rows (a class without training rows gets 1.0; it
    never occurs in a batch). The learners and ``train-local`` ask this with the same manifest's
    counts, so both train with the same weights.
    """
    if mode == "none":
        return None
    if mode != "balanced":
        raise ValueError(f"class_weight: expected one of {', '.join(CLASS_WEIGHTS)}; "
                         f"found {mode!r}")
    present = [int(c) for c in train_counts if int(c) > 0]
    total = sum(present)
    return [total / (len(present) * int(c)) if int(c) > 0 else 1.0 for c in train_counts]
