"""A job's upload-time options: what each may be (``OPTION_SPECS``), the typed ``JobOptions``,
and how a value is read from where the user gave it.

Precedence (documented in the README):

    CLI flag  >  object metadata  >  environment (BUCKETLEARN_DEFAULT_<KEY>)  >  built-in default

The CLI turns its flags into object metadata when it uploads, so inside the upload function the
order is metadata > environment > default. A value of the wrong type or range is a
``ConfigError`` naming the key, what was expected and what was found.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bucketlearn.domain.columns import (
    DEFAULT_MISSING_VALUES,
    FORCEABLE_KINDS,
    parse_list,
    parse_pairs,
)
from bucketlearn.domain.plan import CLASS_WEIGHTS
from bucketlearn.domain.search import SEARCH_MAX, SEARCH_MIN
from bucketlearn.domain.target import TASKS
from bucketlearn.errors import ConfigError

DEFAULT_OPTION_PREFIX = "BUCKETLEARN_DEFAULT_"
MODEL_KINDS = ("auto", "mlp", "cnn")
LR_SCHEDULES = ("flat_cosine", "wsd", "cosine", "constant")
NONE = -1  # validation_fraction: no validation rows (the option's "none")
OFF = 0  # search: one configuration, no candidates
SEARCH_AUTO = -1  # search: as many candidates as the job's size calls for (``auto_as``)
CONTINUE_PATTERN = r"[a-z0-9][a-z0-9-]{0,60}(@[0-9]{1,9})?"  # continue_from: JOB[@VERSION]
AUTO = 0  # an option the job decides for its size (parallel_tasks: bucketlearn.domain.plan;
# epochs, batch_size, learning_rate, validation_fraction, patience: bucketlearn.domain.recipe)


@dataclass(frozen=True)
class OptionSpec:
    """How one upload option is parsed and bounded, and what people call it."""

    name: str
    kind: type
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    auto: bool = False  # a number that also takes "auto" (stored as ``auto_as``)
    auto_as: int = AUTO
    none: bool = False  # a number that also takes "none" (stored as NONE = -1)
    off: bool = False  # a number that also takes "off" (stored as OFF = 0)
    items: bool = False  # a comma-separated list of names (may be empty; stored as the text)
    # with items: each item is ``name=value``, the value one of these
    pairs: tuple[str, ...] | None = None
    label: str = ""  # the option in words (the dashboard's form); its name when empty
    # the default in words when it is no value a user could type (``default_text``)
    default_words: str | None = None
    # a text value must match this (``re.fullmatch``); ``pattern_words`` says it in words
    pattern: str | None = None
    pattern_words: str = ""

    @property
    def title(self) -> str:
        """The option in words, e.g. 'Rows per shard'."""
        return self.label or self.name.replace("_", " ").capitalize()


OPTION_SPECS: tuple[OptionSpec, ...] = (
    OptionSpec("label_column", str, None,
               "name of the label column; default 'label' if present, else the last column",
               default_words="'label' or last column"),
    OptionSpec("epochs", int, AUTO,
               "passes over the training rows at most (training stops earlier once validation "
               "stops improving): auto (from the job's size) or a number", 1, 1000, auto=True),
    OptionSpec("batch_size", int, AUTO,
               "rows per gradient step: auto (256, more for large tables) or a number", 1,
               8192, auto=True),
    OptionSpec("learning_rate", float, AUTO,
               "Adam's peak learning rate (see lr_schedule): auto (scaled with the batch) or a "
               "number", 1e-7, 1.0, auto=True),
    OptionSpec("lr_schedule", str, "flat_cosine",
               "flat_cosine: constant for half the job, then down to 0 along a half cosine; "
               "wsd: constant, then down to 0 over the last fifth; cosine: a half cosine from "
               "the start; constant: no decay", choices=LR_SCHEDULES,
               label="Learning-rate schedule"),
    OptionSpec("validation_fraction", float, AUTO,
               "share of every class's training rows held out to pick the best version and "
               "stop early: auto (0.1; none below 100 training rows), none (train on every "
               "row, export the last version) or a number", 0.02, 0.5, auto=True, none=True),
    OptionSpec("patience", int, AUTO,
               "epochs without a better validation score before training stops: auto (a "
               "quarter of the epochs, at least 5) or a number", 1, 1000, auto=True),
    OptionSpec("rows_per_shard", int, 256, "training rows per shard", 8, 1_000_000),
    OptionSpec("holdout_fraction", float, 0.2,
               "share of every class kept out of training for evaluation", 0.01, 0.5),
    OptionSpec("model", str, "auto", "model family: auto, mlp or cnn", choices=MODEL_KINDS,
               label="Model family"),
    OptionSpec("parallel_tasks", int, AUTO,
               "tasks trained at once from one version: auto (as many as keep serial "
               "accuracy, from the job's size) or a number", 1, 64, auto=True,
               label="Tasks trained at once"),
    OptionSpec("seed", int, 0, "seed for the split, initial weights and shuffling", 0, 2**31 - 1,
               label="Random seed"),
    OptionSpec("max_failed_tasks", int, 0,
               "tasks that may fail for good before the job is FAILED (0: any failure fails it)",
               0, 1_000_000, label="Failed tasks allowed"),
    OptionSpec("missing_values", str, ",".join(DEFAULT_MISSING_VALUES),
               "cell values read as missing, comma-separated (an empty cell always is)",
               items=True, label="Cells read as missing"),
    OptionSpec("max_categories", int, 1000,
               "a text column's vocabulary: its most frequent values up to this many; the rest "
               "share one out-of-vocabulary code", 1, 100_000,
               label="Most categories per text column"),
    OptionSpec("drop_columns", str, "", "feature columns to leave out, comma-separated",
               items=True, label="Columns to leave out", default_words="none"),
    OptionSpec("column_kinds", str, "",
               "a kind for named feature columns instead of the detected one, comma-separated "
               "name=kind (numeric, category or date), e.g. zip=category",
               items=True, pairs=FORCEABLE_KINDS, label="Column kinds",
               default_words="as detected"),
    OptionSpec("class_weight", str, "none",
               "none: every row counts once; balanced: each class's rows weigh n_rows / "
               "(n_classes * rows of the class) in the loss, from the training rows per class",
               choices=CLASS_WEIGHTS, label="Class weights"),
    OptionSpec("task", str, "auto",
               "auto: a numeric target when every label in the file's first block is a number "
               "and there are more than 20 distinct ones, else classes; classification; "
               "regression", choices=TASKS, label="Task (classes or a numeric target)"),
    OptionSpec("search", int, OFF,
               "off (one configuration), N candidate configurations trained side by side, "
               "pruned by successive halving on the validation rows (the model is the mean of "
               "the best four), or auto (8 from 20,000 training rows, else off)", SEARCH_MIN,
               SEARCH_MAX, off=True, auto=True, auto_as=SEARCH_AUTO,
               label="Candidates searched"),
    OptionSpec("continue_from", str, None,
               "JOB or JOB@VERSION: start from that finished job's model (its latest version, "
               "or the one named) and keep its columns, vocabularies and scaling; the file "
               "needs the job's columns and labels it saw (docs/CONTINUED.md)",
               pattern=CONTINUE_PATTERN, pattern_words="JOB or JOB@VERSION, e.g. "
               "digits-3f2a9c1b7e4d@12", label="Continue from job",
               default_words="none (a new model)"),
)
OPTION_NAMES = tuple(spec.name for spec in OPTION_SPECS)
_SPEC_BY_NAME = {spec.name: spec for spec in OPTION_SPECS}


@dataclass(frozen=True)
class JobOptions:
    """The options one job trains with; every field is validated."""

    # every default comes from OPTION_SPECS (one table; tests/unit/core/test_config.py checks it)
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
    validation_fraction: float = _SPEC_BY_NAME["validation_fraction"].default
    patience: int = _SPEC_BY_NAME["patience"].default
    search: int = _SPEC_BY_NAME["search"].default
    continue_from: str | None = _SPEC_BY_NAME["continue_from"].default

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> JobOptions:
        return cls(**{k: v for k, v in values.items() if k in OPTION_NAMES})

    @property
    def validation_share(self) -> float | None:
        """``validation_fraction`` as the split takes it: None for auto, 0 for none."""
        if self.validation_fraction == AUTO:
            return None
        return 0.0 if self.validation_fraction == NONE else float(self.validation_fraction)

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

    @property
    def parent(self) -> tuple[str, int | None] | None:
        """``continue_from`` as (job id, version; None: the job's latest), or None."""
        if not self.continue_from:
            return None
        job_id, _, version = self.continue_from.partition("@")
        return job_id, int(version) if version else None

    def with_overrides(self, **overrides: Any) -> JobOptions:
        """Return a copy with the non-None overrides applied (after validation)."""
        parsed = {k: parse_option(k, v, "override") for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **parsed)

    def to_metadata(self, only: Mapping[str, Any] | None = None) -> dict[str, str]:
        """Object metadata (strings) for the options in ``only`` (all when None)."""
        values = self.to_dict() if only is None else dict(only)
        return {k: option_text(k, v) for k, v in values.items() if v is not None}


def default_text(name: str) -> str:
    """An option's built-in default as people read it: the value a user would type for it
    (``auto`` for an automatic whole number), or words when it is no value (no label column
    given: 'label' if present, else the last column)."""
    spec = _SPEC_BY_NAME[name]
    if spec.default_words is not None:
        return spec.default_words
    return option_text(name, spec.default)


def option_text(name: str, value: Any) -> str:
    """An option's value as a user writes it (``auto`` for an automatic number, ``none``)."""
    spec = _SPEC_BY_NAME.get(name)
    if spec is not None and spec.auto and value == spec.auto_as:
        return "auto"
    if spec is not None and spec.none and value == NONE:
        return "none"
    if spec is not None and spec.off and value == OFF:
        return "off"
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
        elif spec.pattern is not None and not re.fullmatch(spec.pattern, value):
            raise ConfigError(name, spec.pattern_words, raw, source)
        return value
    if spec.auto and isinstance(raw, str) and raw.strip().lower() == "auto":
        return spec.auto_as
    if spec.none and isinstance(raw, str) and raw.strip().lower() == "none":
        return NONE
    if spec.off and isinstance(raw, str) and raw.strip().lower() == "off":
        return OFF
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
    words = [w for w, flag in (("'auto'", spec.auto), ("'none'", spec.none),
                               ("'off'", spec.off)) if flag]
    return f"{', '.join(words)} or {text}" if words else text


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
