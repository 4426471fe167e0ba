"""Typed configuration in one place. Nothing else in bucketlearn reads ``os.environ``.

Precedence for a job's options (documented in the README):

    CLI flag  >  object metadata  >  environment (BUCKETLEARN_DEFAULT_<KEY>)  >  built-in default

The CLI turns its flags into object metadata when it uploads, so inside the upload function the
order is metadata > environment > default. Deployment settings (bucket names, topic, limits) come
from the environment only; Terraform's ``env_vars`` output and the local stack set them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bucketlearn.domain.columns import (
    DEFAULT_MISSING_VALUES,
    FORCEABLE_KINDS,
    parse_list,
    parse_pairs,
)
from bucketlearn.domain.plan import CLASS_WEIGHTS
from bucketlearn.domain.target import TASKS
from bucketlearn.errors import ConfigError

DEFAULT_OPTION_PREFIX = "BUCKETLEARN_DEFAULT_"
MODEL_KINDS = ("auto", "mlp", "cnn")
LR_SCHEDULES = ("wsd", "cosine", "constant")
AUTO = 0  # parallel_tasks: the plan decides (bucketlearn.domain.plan)
# TensorFlow on one thread: the local stack's functions and learners share the machine's cores.
# The thread count fixes the order of TensorFlow's sums, so whatever is compared with them to the
# bit (the parity benchmark, the test process) runs with the same.
SINGLE_THREADED_TF: Mapping[str, str] = {"TF_NUM_INTRAOP_THREADS": "1",
                                         "TF_NUM_INTEROP_THREADS": "1"}
FAULT_POINTS = frozenset({
    "aggregator.before_commit",   # weights written, version not committed: the process dies
    "aggregator.after_commit",    # version committed, next round not published: dies
    "aggregator.holding_lease",   # dies right after taking a job's lease, results unsettled
    "learner.before_publish",     # result written, not announced: the learner dies
    "learner.before_ack",         # result announced, task message not acked: dies
    "queue.duplicate_publish",    # every task (and result) message is published twice
})


@dataclass(frozen=True)
class OptionSpec:
    """How one upload option is parsed and bounded."""

    name: str
    kind: type
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    auto: bool = False  # a whole number that also takes "auto" (stored as AUTO = 0)
    items: bool = False  # a comma-separated list of names (may be empty; stored as the text)
    # with items: each item is ``name=value``, the value one of these
    pairs: tuple[str, ...] | None = None


OPTION_SPECS: tuple[OptionSpec, ...] = (
    OptionSpec("label_column", str, None,
               "name of the label column; default 'label' if present, else the last column"),
    OptionSpec("epochs", int, 10, "passes over the training rows", 1, 1000),
    OptionSpec("batch_size", int, 32, "rows per gradient step", 1, 8192),
    OptionSpec("learning_rate", float, 0.001,
               "Adam learning rate at the start (see lr_schedule)", 1e-7, 1.0),
    OptionSpec("lr_schedule", str, "wsd",
               "wsd: constant, then down to 0 over the last fifth of the job; cosine: down to 0 "
               "along a half cosine; constant: no decay", choices=LR_SCHEDULES),
    OptionSpec("rows_per_shard", int, 256, "training rows per shard", 8, 1_000_000),
    OptionSpec("holdout_fraction", float, 0.2,
               "share of every class kept out of training for evaluation", 0.01, 0.5),
    OptionSpec("model", str, "auto", "model family: auto, mlp or cnn", choices=MODEL_KINDS),
    OptionSpec("parallel_tasks", int, AUTO,
               "tasks trained at once from one version: auto (as many as keep serial "
               "accuracy, from the job's size) or a number", 1, 64, auto=True),
    OptionSpec("seed", int, 0, "seed for the split, initial weights and shuffling", 0, 2**31 - 1),
    OptionSpec("max_failed_tasks", int, 0,
               "tasks that may fail for good before the job is FAILED (0: any failure fails it)",
               0, 1_000_000),
    OptionSpec("missing_values", str, ",".join(DEFAULT_MISSING_VALUES),
               "cell values read as missing, comma-separated (an empty cell always is)",
               items=True),
    OptionSpec("max_categories", int, 1000,
               "a text column's vocabulary: its most frequent values up to this many; the rest "
               "share one out-of-vocabulary code", 1, 100_000),
    OptionSpec("drop_columns", str, "", "feature columns to leave out, comma-separated",
               items=True),
    OptionSpec("column_kinds", str, "",
               "a kind for named feature columns instead of the detected one, comma-separated "
               "name=kind (numeric, category or date), e.g. zip=category",
               items=True, pairs=FORCEABLE_KINDS),
    OptionSpec("class_weight", str, "none",
               "none: every row counts once; balanced: each class's rows weigh n_rows / "
               "(n_classes * rows of the class) in the loss, from the training rows per class",
               choices=CLASS_WEIGHTS),
    OptionSpec("task", str, "auto",
               "auto: a numeric target when every label in the file's first block is a number "
               "and there are more than 20 distinct ones, else classes; classification; "
               "regression", choices=TASKS),
)
OPTION_NAMES = tuple(spec.name for spec in OPTION_SPECS)
_SPEC_BY_NAME = {spec.name: spec for spec in OPTION_SPECS}


@dataclass(frozen=True)
class JobOptions:
    """The options one job trains with; every field is validated."""

    # every default comes from OPTION_SPECS (one table; tests/unit/test_config.py checks it)
    label_column: str | None = _SPEC_BY_NAME["label_column"].default
    epochs: int = _SPEC_BY_NAME["epochs"].default
    batch_size: int = _SPEC_BY_NAME["batch_size"].default
    learning_rate: float = _SPEC_BY_NAME["learning_rate"].default
    lr_schedule: str = _SPEC_BY_NAME["lr_schedule"].default
    rows_per_shard: int = _SPEC_BY_NAME["rows_per_shard"].default
    holdout_fraction: float = _SPEC_BY_NAME["holdout_fraction"].default
    model: str = _SPEC_BY_NAME["model"].default
    parallel_tasks: int = _SPEC_BY_NAME["parallel_tasks"].default
    seed: int = _SPEC_BY_NAME["seed"].default
    max_failed_tasks: int = _SPEC_BY_NAME["max_failed_tasks"].default
    missing_values: str = _SPEC_BY_NAME["missing_values"].default
    max_categories: int = _SPEC_BY_NAME["max_categories"].default
    drop_columns: str = _SPEC_BY_NAME["drop_columns"].default
    column_kinds: str = _SPEC_BY_NAME["column_kinds"].default
    class_weight: str = _SPEC_BY_NAME["class_weight"].default
    task: str = _SPEC_BY_NAME["task"].default

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> JobOptions:
        return cls(**{k: v for k, v in values.items() if k in OPTION_NAMES})

    @property
    def missing_markers(self) -> list[str]:
        """The values read as missing besides an empty cell."""
        return parse_list(self.missing_values)

    @property
    def dropped_columns(self) -> list[str]:
        return parse_list(self.drop_columns)

    @property
    def forced_kinds(self) -> dict[str, str]:
        """``column_kinds`` as {column: kind} (validated when the option was parsed)."""
        return {column: kind.lower() for column, kind in parse_pairs(parse_list(self.column_kinds))}

    def with_overrides(self, **overrides: Any) -> JobOptions:
        """Return a copy with the non-None overrides applied (after validation)."""
        parsed = {k: parse_option(k, v, "override") for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **parsed)

    def to_metadata(self, only: Mapping[str, Any] | None = None) -> dict[str, str]:
        """Object metadata (strings) for the options in ``only`` (all when None)."""
        values = self.to_dict() if only is None else dict(only)
        return {k: option_text(k, v) for k, v in values.items() if v is not None}


def option_text(name: str, value: Any) -> str:
    """An option's value as a user writes it (``auto`` for an automatic whole number)."""
    spec = _SPEC_BY_NAME.get(name)
    if spec is not None and spec.auto and value == AUTO:
        return "auto"
    return str(value)


def parse_option(name: str, raw: Any, source: str) -> Any:
    """Parse one option value; raise ConfigError naming the key, the expectation and the value."""
    spec = _SPEC_BY_NAME.get(name)
    if spec is None:
        raise ConfigError(name, "one of " + ", ".join(OPTION_NAMES), name, source)
    if raw is None:
        return None
    if spec.kind is str:
        value = str(raw).strip()
        if spec.items:
            if len(value) > 4096:
                raise ConfigError(name, "a comma-separated list of at most 4096 characters",
                                  _short_text(value), source)
            items = parse_list(value)
            if spec.pairs is not None:
                items = _checked_pairs(name, spec.pairs, items, source)
            return ",".join(items)
        if spec.choices is not None:
            value = value.lower()
            if value not in spec.choices:
                raise ConfigError(name, "one of " + ", ".join(spec.choices), raw, source)
        elif not value or len(value) > 256:
            raise ConfigError(name, "a non-empty name of at most 256 characters", raw, source)
        return value
    if spec.auto and (raw == AUTO or str(raw).strip().lower() == "auto"):
        return AUTO
    if spec.kind is int:
        if isinstance(raw, bool):
            raise ConfigError(name, "a whole number", raw, source)
        try:
            value = int(str(raw).strip()) if not isinstance(raw, int) else raw
        except ValueError:
            raise ConfigError(name, _range_text("a whole number", spec), raw, source) from None
    else:
        try:
            value = float(str(raw).strip()) if not isinstance(raw, (int, float)) else float(raw)
        except ValueError:
            raise ConfigError(name, _range_text("a number", spec), raw, source) from None
        if not math.isfinite(value):
            raise ConfigError(name, _range_text("a finite number", spec), raw, source)
    if (spec.minimum is not None and value < spec.minimum) or (
        spec.maximum is not None and value > spec.maximum
    ):
        noun = "a whole number" if spec.kind is int else "a number"
        raise ConfigError(name, _range_text(noun, spec), raw, source)
    return value


def _checked_pairs(name: str, values: tuple[str, ...], items: list[str], source: str
                   ) -> list[str]:
    """Each item ``column=value`` with a known value (case folded), each column once; the
    items as ``column=value``, trimmed."""
    pairs: dict[str, str] = {}
    for item, (column, value) in zip(items, parse_pairs(items), strict=True):
        if not column or value.lower() not in values:
            raise ConfigError(name, "comma-separated column=kind pairs, the kind one of "
                              + ", ".join(values), _short_text(item), source)
        if column in pairs:
            raise ConfigError(name, "each column once", _short_text(column), source)
        pairs[column] = value.lower()
    return [f"{column}={value}" for column, value in pairs.items()]


def _short_text(value: str) -> str:
    return value if len(value) <= 60 else value[:60] + "…"


def _range_text(noun: str, spec: OptionSpec) -> str:
    text = f"{noun} from {spec.minimum:g} to {spec.maximum:g}"
    return f"'auto' or {text}" if spec.auto else text


def resolve_options(
    metadata: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> JobOptions:
    """Build JobOptions: overrides (CLI) > metadata > environment defaults > built-in defaults.

    Args:
        metadata: the uploaded object's custom metadata. Keys that are not options are ignored
            (other tools add their own), but a key that looks like ours with a typo is not
            silently dropped: keys are compared with '-' and '_' folded.
        overrides: values given on the command line (None means "not given").
        environ: the environment to read defaults from (``os.environ`` when None).

    Raises:
        ConfigError: a value is of the wrong type or out of range.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for spec in OPTION_SPECS:
        env_key = DEFAULT_OPTION_PREFIX + spec.name.upper()
        if env.get(env_key) not in (None, ""):
            values[spec.name] = parse_option(spec.name, env[env_key], f"environment {env_key}")
    for key, raw in (metadata or {}).items():
        name = normalize_option_key(key)
        if name in _SPEC_BY_NAME:
            values[name] = parse_option(name, raw, "object metadata")
    for key, raw in (overrides or {}).items():
        if raw is not None:
            values[key] = parse_option(key, raw, "command line")
    return JobOptions(**values)


def normalize_option_key(key: str) -> str:
    """Fold metadata spellings ('Batch-Size', 'x-goog-meta-epochs') onto option names."""
    folded = key.strip().lower().replace("-", "_")
    if folded.startswith("x_goog_meta_"):
        folded = folded[len("x_goog_meta_"):]
    return folded


@dataclass(frozen=True)
class Limits:
    """Input limits, enforced before expensive work."""

    max_file_bytes: int = 2 * 1024**3
    max_columns: int = 20_000
    max_classes: int = 1_000
    max_line_bytes: int = 16 * 1024**2
    max_tasks_per_epoch: int = 10_000
    # a job's tasks over all its epochs (tasks per epoch x epochs), checked when it is planned
    max_total_tasks: int = 200_000
    # one shard's arrays (rows x (matrix cells + the label) x 4 bytes), what a learner holds
    max_shard_bytes: int = 256 * 1024**2
    # distinct values pass 1 holds while it counts text columns, all columns together (each
    # column alone keeps at most ingest.columns.COUNT_BOUND)
    max_counted_values: int = 2_000_000
    # the work bucket's lifecycle rule deletes shards this many days old (infra's
    # work_retention_days): a job predicted to train longer than half of it is refused
    work_retention_days: int = 7
    # the floating-point operations per second one learner is assumed to train at, for that
    # prediction (domain.plan.predict_seconds); low on purpose
    worker_flops: int = 1_000_000_000


@dataclass(frozen=True)
class Settings:
    """Where bucketlearn's state lives, and how hard it tries. Read from the environment."""

    project: str = "bucketlearn-local"
    uploads_bucket: str = "bucketlearn-uploads"
    work_bucket: str = "bucketlearn-work"
    deltas_bucket: str = "bucketlearn-deltas"
    models_bucket: str = "bucketlearn-models"
    tasks_topic: str = "bucketlearn-tasks"
    tasks_subscription: str = "bucketlearn-tasks-workers"
    # results: learners (and the watchdog's nudges) -> the long-running aggregator
    results_topic: str = "bucketlearn-results"
    results_subscription: str = "bucketlearn-results-aggregator"
    firestore_database: str = "(default)"
    storage_emulator_host: str | None = None
    pubsub_emulator_host: str | None = None
    firestore_emulator_host: str | None = None
    max_task_attempts: int = 5
    ack_deadline_seconds: int = 60
    lease_seconds: float = 60.0  # a split's claim on its upload (renewed every third of it)
    # A job's aggregation lease: a long-running aggregator renews it every third of this; one
    # that dies holding it is replaced this long after its last renewal.
    aggregator_lease_seconds: float = 15.0
    max_event_age_seconds: float = 24 * 3600.0
    eval_max_rows: int = 5_000
    # The synchronous aggregation pass (``services.aggregate.aggregate_job``: the tests and the
    # in-process simulation) starts no fold or export after this many seconds.
    aggregate_budget_seconds: float = 420.0
    # R = 1: how long the aggregator waits for a chained round's result beyond what the chain's
    # last task took, before it publishes the round for any learner (the chain's learner died)
    chain_grace_seconds: float = 10.0
    # an evaluation not carried by a commit within this many seconds is written on its own
    eval_flush_seconds: float = 2.0
    # shard parts a learner keeps decoded in memory (they never change once written)
    worker_cache_bytes: int = 512 * 1024**2
    # BUCKETLEARN_CALL_LOG: a directory where each process writes every remote call it made
    # (kind, job, start, end), for the round-trip benchmark; empty: calls are only counted
    call_log_dir: str = ""
    # which process of a deployment this is (the local stack names its processes; the call
    # log's file is named after it); not exported by ``to_env``
    process_name: str | None = None
    # The watchdog (``bucketlearn tend``): a job with no sign of progress for this long gets its
    # current round's missing tasks published again, or the aggregator nudged.
    stall_seconds: float = 600.0
    # Dead-lettered task messages (Cloud Pub/Sub's dead-letter sink; empty: none) become failure
    # markers when the watchdog drains them.
    dead_letter_subscription: str = ""
    log_format: str = "text"
    limits: Limits = field(default_factory=Limits)
    # Fault injection for the reliability suite (BUCKETLEARN_FAULTS=point,point…); each point
    # fires once per BUCKETLEARN_FAULT_DIR (a marker file survives the process restart).
    faults: frozenset[str] = frozenset()
    fault_dir: str | None = None
    worker_id: str | None = None  # BUCKETLEARN_WORKER_ID; default <hostname>-<pid>
    # A learner process is replaced by a fresh one once it has built this many models, one per
    # job it trains (0: never): TensorFlow frees a model's memory only at process exit
    # (bucketlearn.entrypoints.worker)
    worker_max_models: int = 20

    @property
    def uses_emulators(self) -> bool:
        return bool(self.storage_emulator_host or self.pubsub_emulator_host
                    or self.firestore_emulator_host)

    def to_env(self) -> dict[str, str]:
        """Environment variables that reproduce these settings in another process
        (``load_settings(s.to_env()) == s``; the worker id is per process and not exported)."""
        env = {"GOOGLE_CLOUD_PROJECT": self.project, "BUCKETLEARN_PROJECT": self.project}
        env.update({key: str(getattr(self, name)) for key, (name, _) in SETTINGS_ENV.items()})
        env.update({key: str(getattr(self.limits, name)) for key, name in LIMITS_ENV.items()})
        if self.faults:
            env["BUCKETLEARN_FAULTS"] = ",".join(sorted(self.faults))
        if self.fault_dir:
            env["BUCKETLEARN_FAULT_DIR"] = self.fault_dir
        env.update({key: getattr(self, name) for key, name in EMULATOR_ENV.items()
                    if getattr(self, name)})
        return env


# Environment variable -> (Settings field, parser). The Terraform env_vars output sets these.
SETTINGS_ENV: dict[str, tuple[str, type]] = {
    "BUCKETLEARN_UPLOADS_BUCKET": ("uploads_bucket", str),
    "BUCKETLEARN_WORK_BUCKET": ("work_bucket", str),
    "BUCKETLEARN_DELTAS_BUCKET": ("deltas_bucket", str),
    "BUCKETLEARN_MODELS_BUCKET": ("models_bucket", str),
    "BUCKETLEARN_TASKS_TOPIC": ("tasks_topic", str),
    "BUCKETLEARN_TASKS_SUBSCRIPTION": ("tasks_subscription", str),
    "BUCKETLEARN_RESULTS_TOPIC": ("results_topic", str),
    "BUCKETLEARN_RESULTS_SUBSCRIPTION": ("results_subscription", str),
    "BUCKETLEARN_CHAIN_GRACE_SECONDS": ("chain_grace_seconds", float),
    "BUCKETLEARN_EVAL_FLUSH_SECONDS": ("eval_flush_seconds", float),
    "BUCKETLEARN_WORKER_CACHE_BYTES": ("worker_cache_bytes", int),
    "BUCKETLEARN_CALL_LOG": ("call_log_dir", str),
    "BUCKETLEARN_FIRESTORE_DATABASE": ("firestore_database", str),
    "BUCKETLEARN_MAX_TASK_ATTEMPTS": ("max_task_attempts", int),
    "BUCKETLEARN_ACK_DEADLINE_SECONDS": ("ack_deadline_seconds", int),
    "BUCKETLEARN_LEASE_SECONDS": ("lease_seconds", float),
    "BUCKETLEARN_AGGREGATOR_LEASE_SECONDS": ("aggregator_lease_seconds", float),
    "BUCKETLEARN_MAX_EVENT_AGE_SECONDS": ("max_event_age_seconds", float),
    "BUCKETLEARN_STALL_SECONDS": ("stall_seconds", float),
    "BUCKETLEARN_DEAD_LETTER_SUBSCRIPTION": ("dead_letter_subscription", str),
    "BUCKETLEARN_EVAL_MAX_ROWS": ("eval_max_rows", int),
    "BUCKETLEARN_AGGREGATE_BUDGET_SECONDS": ("aggregate_budget_seconds", float),
    "BUCKETLEARN_LOG_FORMAT": ("log_format", str),
    "BUCKETLEARN_WORKER_MAX_MODELS": ("worker_max_models", int),
}
# Read by the Google client libraries themselves too (export_emulator_env).
EMULATOR_ENV: dict[str, str] = {
    "STORAGE_EMULATOR_HOST": "storage_emulator_host",
    "PUBSUB_EMULATOR_HOST": "pubsub_emulator_host",
    "FIRESTORE_EMULATOR_HOST": "firestore_emulator_host",
}
LIMITS_ENV: dict[str, str] = {
    "BUCKETLEARN_MAX_FILE_BYTES": "max_file_bytes",
    "BUCKETLEARN_MAX_COLUMNS": "max_columns",
    "BUCKETLEARN_MAX_CLASSES": "max_classes",
    "BUCKETLEARN_MAX_LINE_BYTES": "max_line_bytes",
    "BUCKETLEARN_MAX_TASKS_PER_EPOCH": "max_tasks_per_epoch",
    "BUCKETLEARN_MAX_TOTAL_TASKS": "max_total_tasks",
    "BUCKETLEARN_MAX_SHARD_BYTES": "max_shard_bytes",
    "BUCKETLEARN_MAX_COUNTED_VALUES": "max_counted_values",
    "BUCKETLEARN_WORK_RETENTION_DAYS": "work_retention_days",
    "BUCKETLEARN_WORKER_FLOPS": "worker_flops",
}


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read Settings from the environment; raise ConfigError naming a bad variable."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    project = env.get("BUCKETLEARN_PROJECT") or env.get("GOOGLE_CLOUD_PROJECT")
    if project:
        values["project"] = project
    for key, (name, kind) in SETTINGS_ENV.items():
        raw = env.get(key)
        if raw in (None, ""):
            continue
        values[name] = _parse_env(key, raw, kind)
    limits = {name: _parse_env(key, env[key], int) for key, name in LIMITS_ENV.items()
              if env.get(key) not in (None, "")}
    values["limits"] = Limits(**limits)
    faults = {f.strip() for f in (env.get("BUCKETLEARN_FAULTS") or "").split(",") if f.strip()}
    unknown = faults - FAULT_POINTS
    if unknown:
        raise ConfigError("BUCKETLEARN_FAULTS", "points from " + ", ".join(sorted(FAULT_POINTS)),
                          ",".join(sorted(unknown)), "environment")
    values["faults"] = frozenset(faults)
    values["fault_dir"] = env.get("BUCKETLEARN_FAULT_DIR") or None
    values["worker_id"] = env.get("BUCKETLEARN_WORKER_ID") or None
    values["process_name"] = env.get("BUCKETLEARN_STACK_PROC") or None
    values.update({name: env.get(key) or None for key, name in EMULATOR_ENV.items()})
    settings = Settings(**values)
    if settings.log_format not in ("text", "json"):
        raise ConfigError("BUCKETLEARN_LOG_FORMAT", "'text' or 'json'", settings.log_format,
                          "environment")
    return settings


def _parse_env(key: str, raw: str, kind: type) -> Any:
    if kind is str:
        return raw
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(key, f"a {'whole ' if kind is int else ''}number", raw,
                          "environment") from None
    if value <= 0:
        raise ConfigError(key, "a positive number", raw, "environment")
    return value


def local_state_dir(environ: Mapping[str, str] | None = None) -> str:
    """Directory holding the local stack's state file and logs (BUCKETLEARN_HOME or ./.bucketlearn)."""
    env = os.environ if environ is None else environ
    return env.get("BUCKETLEARN_HOME") or os.path.join(os.getcwd(), ".bucketlearn")


def export_emulator_env(settings: Settings) -> None:
    """Make the emulator hosts in ``settings`` visible to Google client libraries that read them
    from the environment (Firestore's client does); the only place bucketlearn writes os.environ."""
    for key, name in EMULATOR_ENV.items():
        if getattr(settings, name):
            os.environ[key] = getattr(settings, name)


def target_is_cloud(environ: Mapping[str, str] | None = None) -> bool:
    """True when BUCKETLEARN_TARGET=cloud: ignore a running local stack, use the environment."""
    env = os.environ if environ is None else environ
    return env.get("BUCKETLEARN_TARGET", "").lower() == "cloud"


def target_configured(environ: Mapping[str, str] | None = None) -> bool:
    """The environment names a backend of its own: a project (the Terraform output ``env_vars``
    sets one) or emulator hosts (``eval "$(bucketlearn local env)"``)."""
    env = os.environ if environ is None else environ
    return bool(env.get("BUCKETLEARN_PROJECT") or env.get("GOOGLE_CLOUD_PROJECT")
                or any(env.get(key) for key in EMULATOR_ENV))


# Scale-down cool-downs: a Cloud Run instance is slow to start, so the cloud waits longer before
# removing one than the local stack, whose worker processes start in seconds.
SCALE_DOWN_COOLDOWN_SECONDS = 120.0
LOCAL_SCALE_DOWN_COOLDOWN_SECONDS = 30.0


@dataclass(frozen=True)
class AutoscalerSettings:
    """What ``bucketlearn autoscale`` needs: the worker pools and the policy's bounds (the
    aggregator pool is optional: a deployment that runs the aggregator elsewhere leaves
    ``BUCKETLEARN_AGGREGATOR_POOL`` unset)."""

    worker_pool: str
    min_workers: int = 0
    max_workers: int = 4
    scale_down_cooldown_seconds: float = SCALE_DOWN_COOLDOWN_SECONDS
    aggregator_pool: str = ""
    min_aggregators: int = 0
    max_aggregators: int = 1


def load_autoscaler_settings(environ: Mapping[str, str] | None = None) -> AutoscalerSettings:
    """The autoscaler's settings from ``BUCKETLEARN_WORKER_POOL``, ``_MIN_WORKERS``,
    ``_MAX_WORKERS`` and ``_SCALE_DOWN_COOLDOWN_SECONDS``."""
    env = os.environ if environ is None else environ
    pool = env.get("BUCKETLEARN_WORKER_POOL", "")
    if not _is_pool(pool):
        raise ConfigError("BUCKETLEARN_WORKER_POOL",
                          "projects/<p>/locations/<region>/workerPools/<name>", pool, "environment")
    aggregator_pool = env.get("BUCKETLEARN_AGGREGATOR_POOL", "")
    if aggregator_pool and not _is_pool(aggregator_pool):
        raise ConfigError("BUCKETLEARN_AGGREGATOR_POOL",
                          "projects/<p>/locations/<region>/workerPools/<name> (or unset)",
                          aggregator_pool, "environment")
    defaults = AutoscalerSettings(pool)
    values = []
    for key, default in (("BUCKETLEARN_MIN_WORKERS", defaults.min_workers),
                         ("BUCKETLEARN_MAX_WORKERS", defaults.max_workers),
                         ("BUCKETLEARN_SCALE_DOWN_COOLDOWN_SECONDS",
                          defaults.scale_down_cooldown_seconds),
                         ("BUCKETLEARN_MIN_AGGREGATORS", defaults.min_aggregators),
                         ("BUCKETLEARN_MAX_AGGREGATORS", defaults.max_aggregators)):
        raw = env.get(key) or str(default)
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(key, "a number", raw, "environment") from None
        if value < 0:
            raise ConfigError(key, "a number >= 0", raw, "environment")
        values.append(value)
    return AutoscalerSettings(pool, int(values[0]), int(values[1]), values[2], aggregator_pool,
                              int(values[3]), int(values[4]))


def _is_pool(name: str) -> bool:
    return name.startswith("projects/") and "/workerPools/" in name
