"""Real CSVs exactly as published, from packages that ship them: they split without
editing, with the kinds and the notes a user would expect."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.domain.columns import CATEGORY, DATE, NUMERIC
from bucketlearn.ingest.split import split_upload
from bucketlearn.options import JobOptions
from bucketlearn.usecases.train_local import local_source


def packaged(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"{package} is not installed (make install installs it with the dev extra)")
    return Path(list(spec.submodule_search_locations)[0], *parts)


def split(path: Path, **options):
    return split_upload(local_source(str(path)), MemoryBlobStore(), "work", "job-000000000000",
                        JobOptions(**options), Limits())


def test_penguins_raw_with_dates_ids_comments_and_na():
    manifest = split(packaged("palmerpenguins", "data", "penguins-raw.csv"),
                     label_column="Species")
    kinds = {c.name: c.kind for c in manifest.schema}
    assert kinds["Date Egg"] == DATE
    assert kinds["Island"] == CATEGORY and kinds["Culmen Length (mm)"] == NUMERIC
    assert kinds["Comments"] == CATEGORY  # mostly NA: missing is a value of its own
    dropped = {d["name"]: d["reason"] for d in manifest.dropped}
    assert dropped["Region"] == "constant: every row is 'Anvers'"
    assert dropped["Stage"] == "constant: every row is 'Adult, 1 Egg Stage'"
    missing = {c.name: c.missing for c in manifest.schema}
    assert missing["Delta 15 N (o/oo)"] == 14 and missing["Sex"] == 11
    assert manifest.rows == 344 and len(manifest.classes) == 3


def test_seattle_weather_with_a_non_iso_date_column():
    """``2012/01/01`` is not an ISO date: the column is text with a value per row, left out as
    identifier-like, and the job trains on the four numbers."""
    manifest = split(packaged("vega_datasets", "_data", "seattle-weather.csv"))
    assert manifest.label_column == "weather" and len(manifest.classes) == 5
    assert [c.name for c in manifest.schema] == ["precipitation", "temp_max", "temp_min", "wind"]
    assert manifest.dropped[0]["name"] == "date"
    assert manifest.dropped[0]["reason"].startswith("identifier-like: 1461 distinct values")


def test_seattle_temp_max_is_a_numeric_target_learned_from_the_other_columns():
    """Numeric targets: vega's Seattle weather as published, predicting temp_max
    (°C, 67 distinct values in the first block) from temp_min, precipitation, wind and the
    weather's text; train-local's holdout R² is that of a learned model."""
    from bucketlearn.bootstrap import memory_services
    from bucketlearn.usecases.train_local import train_local

    path = packaged("vega_datasets", "_data", "seattle-weather.csv")
    options = {"label_column": "temp_max", "epochs": 4, "rows_per_shard": 128}
    manifest = split(path, **options)
    assert manifest.task == "regression" and manifest.classes == []
    assert manifest.task_reason.startswith("auto: ") and manifest.missing_targets == 0
    assert len(manifest.bin_counts) == 10 and manifest.rows == 1461
    assert {c.name: c.kind for c in manifest.schema}["weather"] == CATEGORY
    result = train_local(str(path), JobOptions(**options), svc=memory_services())
    assert result.accuracy is None and result.report["r2"] > 0.7
    assert result.report["rmse"] < 0.6 * result.manifest.target_std
