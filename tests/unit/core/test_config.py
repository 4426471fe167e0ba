"""config.py: option precedence, metadata key folding, error messages, settings from a dict."""

from __future__ import annotations

import pytest

from bucketlearn.config import Limits, Settings, load_settings
from bucketlearn.errors import ConfigError, PermanentError
from bucketlearn.options import (
    AUTO,
    JobOptions,
    normalize_option_key,
    parse_option,
    resolve_options,
)


def test_defaults_when_nothing_is_given():
    """No metadata, overrides or environment: the built-in defaults."""
    # Prepare / Execute
    options = resolve_options(metadata={}, overrides={}, environ={})
    # Assert
    assert options == JobOptions()
    assert options.epochs == AUTO and options.batch_size == AUTO and options.model == "auto"
    assert options.to_metadata()["epochs"] == "auto"  # decided for the job's size


def test_precedence_overrides_metadata_environment_default():
    """CLI overrides > metadata > BUCKETLEARN_DEFAULT_* > built-in default, key by key."""
    # Prepare
    environ = {
        "BUCKETLEARN_DEFAULT_EPOCHS": "5",
        "BUCKETLEARN_DEFAULT_BATCH_SIZE": "64",
        "BUCKETLEARN_DEFAULT_SEED": "3",
    }
    metadata = {"epochs": "7", "batch_size": "16"}
    overrides = {"epochs": 9, "seed": None}
    # Execute
    options = resolve_options(metadata=metadata, overrides=overrides, environ=environ)
    # Assert
    assert options.epochs == 9             # override beats metadata and environment
    assert options.batch_size == 16        # metadata beats environment
    assert options.seed == 3               # environment beats default (override None = not given)
    assert options.learning_rate == AUTO  # default


def test_empty_environment_value_is_ignored():
    """BUCKETLEARN_DEFAULT_EPOCHS='' means unset."""
    # Prepare / Execute
    options = resolve_options(environ={"BUCKETLEARN_DEFAULT_EPOCHS": ""})
    # Assert
    assert options.epochs == AUTO


@pytest.mark.parametrize("key, option", [
    ("Batch-Size", "batch_size"),
    ("x-goog-meta-epochs", "epochs"),
    ("X-Goog-Meta-Learning-Rate", "learning_rate"),
    ("  rows_per_shard ", "rows_per_shard"),
])
def test_metadata_key_folding(key, option):
    """Metadata spellings fold onto option names."""
    # Prepare / Execute
    folded = normalize_option_key(key)
    # Assert
    assert folded == option


def test_folded_metadata_keys_are_applied():
    """'Batch-Size' and 'x-goog-meta-epochs' reach the options; unrelated keys are ignored."""
    # Prepare
    metadata = {"Batch-Size": "128", "x-goog-meta-epochs": "3", "uploader": "ci", "Model": "MLP"}
    # Execute
    options = resolve_options(metadata=metadata, environ={})
    # Assert
    assert options.batch_size == 128
    assert options.epochs == 3
    assert options.model == "mlp"


@pytest.mark.parametrize("metadata, key, expected, found", [
    ({"epochs": "-1"}, "epochs", "a whole number from 1 to 1000", "'-1'"),
    ({"epochs": "0"}, "epochs", "a whole number from 1 to 1000", "'0'"),
    ({"model": "resnet"}, "model", "one of auto, mlp, cnn", "'resnet'"),
    ({"batch_size": "lots"}, "batch_size", "a whole number from 1 to 8192", "'lots'"),
    ({"epochs": "2.5"}, "epochs", "a whole number", "'2.5'"),
    ({"learning_rate": "fast"}, "learning_rate", "a number from 1e-07 to 1", "'fast'"),
    ({"learning_rate": "nan"}, "learning_rate", "a finite number", "'nan'"),
    ({"holdout_fraction": "0.9"}, "holdout_fraction", "a number from 0.01 to 0.5", "'0.9'"),
    ({"label_column": "   "}, "label_column", "a non-empty name", "'   '"),
    ({"class_weight": "inverse"}, "class_weight", "one of none, balanced", "'inverse'"),
], ids=["negative-epochs", "zero-epochs", "unknown-model", "string-for-int", "float-for-int",
        "string-for-float", "nan-float", "out-of-range-float", "blank-label-column",
        "unknown-class-weight"])
def test_bad_metadata_raises_config_error_naming_key_expected_found(metadata, key, expected,
                                                                     found):
    """A bad value raises ConfigError whose message names the key, the expectation and the value."""
    # Prepare / Execute
    with pytest.raises(ConfigError) as excinfo:
        resolve_options(metadata=metadata, environ={})
    # Assert
    error = excinfo.value
    message = str(error)
    assert error.key == key
    assert f"'{key}'" in message
    assert expected in message
    assert f"found: {found}" in message
    assert "object metadata" in message
    assert isinstance(error, PermanentError)


def test_bad_environment_default_names_the_variable():
    """A bad BUCKETLEARN_DEFAULT_* value names the environment variable as the source."""
    # Prepare
    environ = {"BUCKETLEARN_DEFAULT_EPOCHS": "many"}
    # Execute
    with pytest.raises(ConfigError) as excinfo:
        resolve_options(environ=environ)
    # Assert
    assert "environment BUCKETLEARN_DEFAULT_EPOCHS" in str(excinfo.value)
    assert "found: 'many'" in str(excinfo.value)


def test_bad_override_names_the_command_line():
    """A bad override is reported as coming from the command line."""
    # Prepare / Execute
    with pytest.raises(ConfigError) as excinfo:
        resolve_options(overrides={"batch_size": 0}, environ={})
    # Assert
    assert "command line" in str(excinfo.value)
    assert excinfo.value.key == "batch_size"


def test_unknown_override_key_is_refused():
    """An override that is not an option raises ConfigError listing the options."""
    # Prepare / Execute
    with pytest.raises(ConfigError) as excinfo:
        resolve_options(overrides={"epoch": 3}, environ={})
    # Assert
    assert excinfo.value.key == "epoch"
    assert "epochs" in excinfo.value.expected


def test_bool_is_not_a_whole_number():
    """True is not accepted as epochs."""
    # Prepare / Execute
    with pytest.raises(ConfigError):
        parse_option("epochs", True, "test")
    # Assert
    assert parse_option("epochs", 4, "test") == 4


def test_with_overrides_and_metadata_round_trip():
    """to_metadata then resolve_options gives the same options back."""
    # Prepare
    options = JobOptions().with_overrides(epochs=3, learning_rate="0.01", label_column="y",
                                          model=None)
    # Execute
    again = resolve_options(metadata=options.to_metadata(), environ={})
    # Assert
    assert options.epochs == 3 and options.learning_rate == 0.01 and options.model == "auto"
    assert again == options
    assert JobOptions.from_dict({**options.to_dict(), "extra": 1}) == options


def test_load_settings_from_dict():
    """Buckets, limits and emulator hosts are read from the given mapping."""
    # Prepare
    environ = {
        "GOOGLE_CLOUD_PROJECT": "proj-a",
        "BUCKETLEARN_UPLOADS_BUCKET": "up",
        "BUCKETLEARN_WORK_BUCKET": "work",
        "BUCKETLEARN_DELTAS_BUCKET": "deltas",
        "BUCKETLEARN_MODELS_BUCKET": "models",
        "BUCKETLEARN_MAX_TASK_ATTEMPTS": "7",
        "BUCKETLEARN_LEASE_SECONDS": "12.5",
        "BUCKETLEARN_MAX_COLUMNS": "50",
        "BUCKETLEARN_MAX_FILE_BYTES": "1000",
        "BUCKETLEARN_LOG_FORMAT": "json",
        "STORAGE_EMULATOR_HOST": "http://localhost:9023",
        "PUBSUB_EMULATOR_HOST": "",
    }
    # Execute
    settings = load_settings(environ)
    # Assert
    assert settings.project == "proj-a"
    assert (settings.uploads_bucket, settings.work_bucket, settings.deltas_bucket,
            settings.models_bucket) == ("up", "work", "deltas", "models")
    assert settings.max_task_attempts == 7
    assert settings.lease_seconds == 12.5
    assert settings.limits == Limits(max_columns=50, max_file_bytes=1000)
    assert settings.log_format == "json"
    assert settings.storage_emulator_host == "http://localhost:9023"
    assert settings.pubsub_emulator_host is None
    assert settings.uses_emulators is True


def test_load_settings_empty_gives_defaults():
    """An empty environment gives the default Settings."""
    # Prepare / Execute
    settings = load_settings({})
    # Assert
    assert settings == Settings()
    assert settings.uses_emulators is False


def test_bucketlearn_project_beats_google_cloud_project():
    """BUCKETLEARN_PROJECT wins over GOOGLE_CLOUD_PROJECT."""
    # Prepare / Execute
    settings = load_settings({"BUCKETLEARN_PROJECT": "mine", "GOOGLE_CLOUD_PROJECT": "theirs"})
    # Assert
    assert settings.project == "mine"


@pytest.mark.parametrize("key, raw, expected", [
    ("BUCKETLEARN_MAX_TASK_ATTEMPTS", "five", "a whole number"),
    ("BUCKETLEARN_MAX_TASK_ATTEMPTS", "0", "a positive number"),
    ("BUCKETLEARN_LEASE_SECONDS", "-3", "a positive number"),
    ("BUCKETLEARN_MAX_COLUMNS", "1.5", "a whole number"),
    ("BUCKETLEARN_LOG_FORMAT", "xml", "'text' or 'json'"),
    ("BUCKETLEARN_EVAL_CPU_SHARE", "1.5", "a share of one core, above 0 and at most 1"),
    ("BUCKETLEARN_EVAL_CPU_SHARE", "0", "a positive number"),
])
def test_load_settings_bad_value_names_the_variable(key, raw, expected):
    """A bad variable raises ConfigError naming it, the expectation and the value."""
    # Prepare / Execute
    with pytest.raises(ConfigError) as excinfo:
        load_settings({key: raw})
    # Assert
    message = str(excinfo.value)
    assert key in message and expected in message and repr(raw) in message


def test_settings_to_env_round_trips():
    """load_settings(settings.to_env()) reproduces the settings it exports."""
    # Prepare
    settings = Settings(project="p", uploads_bucket="u", work_bucket="w", deltas_bucket="d",
                        models_bucket="m", tasks_topic="t", tasks_subscription="s",
                        max_task_attempts=3, log_format="json",
                        pubsub_emulator_host="localhost:8085")
    # Execute
    again = load_settings(settings.to_env())
    # Assert
    assert again == settings


def test_job_option_defaults_come_from_the_one_option_table() -> None:
    """Every JobOptions field is an option of OPTION_SPECS with the same default, and every
    option is a field: the table is the only place an option is declared."""
    # Prepare
    import dataclasses

    from bucketlearn.options import OPTION_SPECS, JobOptions
    # Execute
    fields = {f.name: f.default for f in dataclasses.fields(JobOptions)}
    # Assert
    assert fields == {spec.name: spec.default for spec in OPTION_SPECS}


def test_class_weight_from_metadata_environment_and_command_line():
    """class_weight: none by default; 'Balanced' in metadata or the environment is balanced;
    the command line wins; it round-trips through object metadata."""
    # Execute
    default = resolve_options(environ={})
    from_metadata = resolve_options(metadata={"Class-Weight": "Balanced"}, environ={})
    from_env = resolve_options(environ={"BUCKETLEARN_DEFAULT_CLASS_WEIGHT": "balanced"})
    overridden = resolve_options(metadata={"class_weight": "balanced"},
                                 overrides={"class_weight": "none"}, environ={})
    # Assert
    assert default.class_weight == "none"
    assert from_metadata.class_weight == from_env.class_weight == "balanced"
    assert overridden.class_weight == "none"
    assert from_metadata.to_metadata()["class_weight"] == "balanced"
    assert resolve_options(metadata=from_metadata.to_metadata(), environ={}) == from_metadata


def test_column_kinds_is_parsed_into_pairs_and_a_bad_pair_names_itself():
    # Execute
    parsed = parse_option("column_kinds", " zip = Category , opened=date ", "metadata")
    # Assert
    assert parsed == "zip=category,opened=date"
    assert JobOptions(column_kinds=parsed).forced_kinds == {"zip": "category", "opened": "date"}
    for bad, found in (("zip=text", "zip=text"), ("zip", "zip"), ("=date", "=date"),
                       ("zip=date,zip=numeric", "zip")):
        with pytest.raises(ConfigError) as excinfo:
            parse_option("column_kinds", bad, "metadata")
        assert "column_kinds" in str(excinfo.value) and repr(found) in str(excinfo.value)


def test_continue_from_takes_a_job_and_optionally_a_version():
    # Execute
    latest = resolve_options(metadata={"continue-from": "digits-3f2a9c1b7e4d"})
    named = resolve_options(overrides={"continue_from": " digits-3f2a9c1b7e4d@12 "})
    # Assert
    assert latest.parent == ("digits-3f2a9c1b7e4d", None)
    assert named.parent == ("digits-3f2a9c1b7e4d", 12)
    assert JobOptions().parent is None and JobOptions().continue_from is None
    for bad in ("Digits", "digits@", "digits@v3", "digits@1@2", "a b"):
        with pytest.raises(ConfigError) as excinfo:
            parse_option("continue_from", bad, "metadata")
        assert "JOB or JOB@VERSION" in str(excinfo.value)
