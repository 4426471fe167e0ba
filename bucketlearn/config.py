"""Deployment settings, typed, in one place: where state lives (``Settings``), what one upload
may be and cost (``Limits``), the autoscaler's policy, and which backend the CLI talks to.

They come from the environment only; Terraform's ``env_vars`` output and the local stack set
them. A job's upload-time options are ``bucketlearn.options``. Nothing else in bucketlearn reads
``os.environ``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bucketlearn.errors import ConfigError

# TensorFlow on one thread: the local stack's functions and learners share the machine's cores.
# The thread count fixes the order of TensorFlow's sums, so whatever is compared with them to the
# bit (the parity benchmark, the test process) runs with the same.
SINGLE_THREADED_TF: Mapping[str, str] = {"TF_NUM_INTRAOP_THREADS": "1",
                                         "TF_NUM_INTEROP_THREADS": "1"}
# BLAS on one thread in the pipeline's processes (learners, aggregator, functions; the local
# stack sets it, and so do the worker image and the deployment's environment): OpenBLAS (numpy's)
# starts a thread per core whose spinning after each call took about a core of the aggregator on a
# chained job of tiny arrays. Set before numpy loads: it reads it once.
ONE_THREAD_BLAS: Mapping[str, str] = {"OPENBLAS_NUM_THREADS": "1"}
FAULT_POINTS = frozenset({
    "aggregator.before_commit",   # weights written, version not committed: the process dies
    "aggregator.after_commit",    # version committed, next round not published: dies
    "aggregator.holding_lease",   # dies right after taking a job's lease, results unsettled
    "learner.before_publish",     # result written, not announced: the learner dies
    "learner.before_ack",         # result announced, task message not acked: dies
    "queue.duplicate_publish",    # every task (and result) message is published twice
    "predict.mid_part",           # a part of a batch prediction half done: the learner dies
    "predict.before_record",      # a part's object written, not recorded: dies
    "predict.before_ack",         # a part recorded (the request ended if it was the last): dies
})


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
    # feature columns of a table with text, dates or missing cells, each of which takes layers
    # of its own in the model the upload function builds (checked after pass 1)
    max_model_columns: int = 2_000
    # distinct values pass 1 holds while it counts text columns, all columns together (each
    # column alone keeps at most ingest.columns.COUNT_BOUND)
    max_counted_values: int = 2_000_000
    # an upload whose parsed rows stay within this many bytes (held compact where they would
    # not fit as parsed) is parsed once: the split's pass 2 takes pass 1's batches instead of
    # reading it again (``ingest.scan.ParsedBatches``); what a split may hold beside its
    # buffers (and up to two 64 MiB groups while it compacts them). An upload over 4 times it
    # is not tried. Raise it with the function's memory (the 373 MB image CSV holds in 113 MB
    # compact, 452 MB as parsed)
    keep_parsed_bytes: int = 256 * 1024**2
    # the split packs its parts into objects of about this many bytes of rows, each part a byte
    # range of its pack (``ingest.parts.PartWrites``): a write per pack instead of per part
    # (0: every part written as a pack of its own, as soon as it is complete)
    pack_bytes: int = 4 * 1024**2
    # the work bucket's lifecycle rule deletes shards this many days old (infra's
    # work_retention_days): a job predicted to train longer than half of it is refused
    work_retention_days: int = 7
    # the floating-point operations per second one learner is assumed to train at, for that
    # prediction (domain.plan.predict_seconds); low on purpose
    worker_flops: int = 1_000_000_000
    # a batch prediction request's input (``predict/<job>/<name>.csv``): it is streamed in
    # bounded batches, so this bounds the function's time (its timeout), not its memory
    max_predict_bytes: int = 1024**3
    # prediction requests a job may have had (every state), each a status record of its own
    max_predict_requests: int = 1_000
    # a prediction request larger than this is fanned out over the learners in parts of about
    # this many bytes (at most 32, Cloud Storage's compose limit); 0: always in the function
    predict_part_bytes: int = 16 * 1024**2


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
    # The synchronous aggregation pass (``aggregation.writer.aggregate_job``: the tests and the
    # in-process simulation) starts no fold or export after this many seconds.
    aggregate_budget_seconds: float = 420.0
    # R = 1: how long the aggregator waits for a chained round's result beyond what the chain's
    # last task took, before it publishes the round for any learner (the chain's learner died)
    chain_grace_seconds: float = 10.0
    # a fold's deadline: a result not read and checked this long after the fold began is
    # refused (its task trains again), so no object can hold a job's aggregation for ever
    result_read_seconds: float = 120.0
    # an evaluation not carried by a commit within this many seconds is written on its own
    eval_flush_seconds: float = 2.0
    # the share of one core the aggregator's evaluator may take: after an evaluation of e
    # seconds it rests e * (1 / share - 1) before the next (1: evaluate back to back). An
    # evaluation is off the fold's path, but on a machine it shares with learners (the local
    # stack; an aggregator sized small) its CPU is theirs; the final model is evaluated by the
    # export whatever this is.
    eval_cpu_share: float = 0.25
    # shard parts a learner keeps decoded in memory (they never change once written)
    worker_cache_bytes: int = 512 * 1024**2
    # BUCKETLEARN_CALL_LOG: a directory where each process writes every remote call it made
    # (kind, job, start, end), for the round-trip benchmark; empty: calls are only counted
    call_log_dir: str = ""
    # which process of a deployment this is (the local stack names its processes; the call
    # log's file is named after it); not exported by ``to_env``
    process_name: str | None = None
    # The watchdog (``bucketlearn watchdog``): a job with no sign of progress for this long gets its
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
    "BUCKETLEARN_EVAL_CPU_SHARE": ("eval_cpu_share", float),
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
    "BUCKETLEARN_MAX_MODEL_COLUMNS": "max_model_columns",
    "BUCKETLEARN_MAX_COUNTED_VALUES": "max_counted_values",
    "BUCKETLEARN_KEEP_PARSED_BYTES": "keep_parsed_bytes",
    "BUCKETLEARN_PACK_BYTES": "pack_bytes",
    "BUCKETLEARN_WORK_RETENTION_DAYS": "work_retention_days",
    "BUCKETLEARN_MAX_PREDICT_BYTES": "max_predict_bytes",
    "BUCKETLEARN_MAX_PREDICT_REQUESTS": "max_predict_requests",
    "BUCKETLEARN_PREDICT_PART_BYTES": "predict_part_bytes",
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
    if settings.eval_cpu_share > 1:
        raise ConfigError("BUCKETLEARN_EVAL_CPU_SHARE", "a share of one core, above 0 and at "
                          "most 1", str(settings.eval_cpu_share), "environment")
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
