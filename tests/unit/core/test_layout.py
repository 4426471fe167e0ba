"""layout.py: job ids and object names."""

from __future__ import annotations

import re

import pytest

from bucketlearn import layout


def test_job_id_is_deterministic():
    """The same (bucket, object, generation) always gives the same job id."""
    # Prepare / Execute
    first = layout.job_id_for("uploads", "data/digits.csv", 1712)
    second = layout.job_id_for("uploads", "data/digits.csv", "1712")
    # Assert
    assert first == second
    assert first.startswith("digits-")
    assert layout.is_job_id(first)


@pytest.mark.parametrize("other", [
    ("uploads", "data/digits.csv", 1713),
    ("uploads-2", "data/digits.csv", 1712),
    ("uploads", "other/digits.csv", 1712),
    ("uploads", "data/digits2.csv", 1712),
], ids=["generation", "bucket", "prefix", "name"])
def test_job_id_differs_per_generation_bucket_and_name(other):
    """Any change of bucket, object name or generation gives a different job id."""
    # Prepare
    base = layout.job_id_for("uploads", "data/digits.csv", 1712)
    # Execute
    changed = layout.job_id_for(*other)
    # Assert
    assert changed != base


@pytest.mark.parametrize("name, slug", [
    ("my data.csv", "my-data"),
    ("données été.csv", "donn-es-t"),
    ("../../etc/passwd.csv", "passwd"),
    ("..", "upload"),
    ("ÄÖÜ.CSV", "upload"),
    ("dir/sub/Mixed_Case.File.CSV", "mixed-case-file"),
    ("---.csv", "upload"),
    ("a" * 100 + ".csv", "a" * 28),
    ("x/.csv", "upload"),
    ("semi;colon$and`back`tick\n.csv", "semi-colon-and-back-tick"),
])
def test_job_id_slug_is_safe_for_odd_names(name, slug):
    """Odd object names give a safe slug: lowercase letters, digits, dashes, no path parts."""
    # Prepare / Execute
    job_id = layout.job_id_for("uploads", name, 1)
    # Assert
    assert layout.is_job_id(job_id)
    assert re.fullmatch(r"[a-z0-9-]+", job_id)
    assert job_id.rsplit("-", 1)[0] == slug
    for path in (layout.shard_part_path(job_id, 0, 0), layout.manifest_path(job_id),
                 layout.delta_path(job_id, 1, 0, "0" * 16), layout.model_path(job_id)):
        assert ".." not in path and "//" not in path and path.count(job_id) == 1


def test_is_job_id_rejects_foreign_text():
    """Ids bucketlearn did not make are not job ids."""
    # Prepare
    samples = ["", "Digits-3f2a9c1b7e4d", "digits", "../x-3f2a9c1b7e4d", "digits-3F2A9C1B7E4D"]
    # Execute
    results = [layout.is_job_id(s) for s in samples]
    # Assert
    assert results == [False] * len(samples)


def test_task_id_format():
    """Task ids read job:eEEEE:tTTTTT."""
    # Prepare / Execute
    task_id = layout.task_id_for("digits-3f2a9c1b7e4d", 3, 42)
    # Assert
    assert task_id == "digits-3f2a9c1b7e4d:e0003:t00042"


def test_parse_delta_path_round_trips_delta():
    """delta_path -> parse_delta_path gives the parts back."""
    # Prepare
    job_id = layout.job_id_for("uploads", "digits.csv", 9)
    nonce = layout.new_nonce()
    path = layout.delta_path(job_id, 12, 345, nonce)
    # Execute
    parsed = layout.parse_delta_path(path)
    # Assert
    assert parsed == layout.DeltaName(job_id=job_id, epoch=12, task_index=345, nonce=nonce,
                                      failed=False)
    assert path.startswith(layout.epoch_delta_prefix(job_id, 12))


def test_parse_delta_path_round_trips_failure_marker():
    """failure_marker_path -> parse_delta_path marks it failed."""
    # Prepare
    job_id = layout.job_id_for("uploads", "digits.csv", 9)
    nonce = layout.new_nonce()
    path = layout.failure_marker_path(job_id, 1, 0, nonce)
    # Execute
    parsed = layout.parse_delta_path(path)
    # Assert
    assert parsed is not None
    assert (parsed.job_id, parsed.epoch, parsed.task_index, parsed.nonce, parsed.failed) == (
        job_id, 1, 0, nonce, True)


@pytest.mark.parametrize("name", [
    "",
    "digits-3f2a9c1b7e4d/e0001/t00001/0123456789abcdef.json",
    "digits-3f2a9c1b7e4d/e0001/t00001/0123456789abcdef.safetensors.tmp",
    "digits-3f2a9c1b7e4d/e0001/t00001/0123456789ABCDEF.safetensors",
    "digits-3f2a9c1b7e4d/e0001/t00001/0123456789abcde.safetensors",
    "digits-3f2a9c1b7e4d/e1/t00001/0123456789abcdef.safetensors",
    "digits-3f2a9c1b7e4d/e0001/t1/0123456789abcdef.safetensors",
    "Digits/e0001/t00001/0123456789abcdef.safetensors",
    "../e0001/t00001/0123456789abcdef.safetensors",
    "prefix/digits-3f2a9c1b7e4d/e0001/t00001/0123456789abcdef.safetensors",
    "digits-3f2a9c1b7e4d/e0001/t00001/0123456789abcdef.safetensors/extra",
    "weights/digits-3f2a9c1b7e4d/v000001-0123456789abcdef.safetensors",
])
def test_parse_delta_path_rejects_foreign_names(name):
    """Objects bucketlearn did not write parse to None."""
    # Prepare / Execute
    parsed = layout.parse_delta_path(name)
    # Assert
    assert parsed is None


def test_nonces_are_unique_hex():
    """new_nonce gives 16 lowercase hex characters, different every time."""
    # Prepare / Execute
    nonces = {layout.new_nonce() for _ in range(200)}
    # Assert
    assert len(nonces) == 200
    assert all(re.fullmatch(r"[0-9a-f]{16}", n) for n in nonces)


def test_object_paths():
    """Work, models and deltas bucket names are built from ids and numbers only."""
    # Prepare
    job_id = "digits-3f2a9c1b7e4d"
    # Execute
    paths = [layout.shard_part_path(job_id, 3, 2), layout.holdout_part_path(job_id, 1),
             layout.manifest_path(job_id), layout.weights_path(job_id, 12, "ab"),
             layout.model_path(job_id), layout.model_path(job_id, 12), layout.job_prefix(job_id)]
    # Assert
    assert paths == [
        "jobs/digits-3f2a9c1b7e4d/shards/t00003/part-0002.safetensors",
        "jobs/digits-3f2a9c1b7e4d/holdout/part-0001.safetensors",
        "jobs/digits-3f2a9c1b7e4d/manifest.json",
        "weights/digits-3f2a9c1b7e4d/v000012-ab.safetensors",
        "models/digits-3f2a9c1b7e4d/latest.keras",
        "models/digits-3f2a9c1b7e4d/v000012.keras",
        "jobs/digits-3f2a9c1b7e4d/",
    ]
