"""Numeric targets (issue #15) leave classification alone: a classification upload's shards,
holdout, statistics and class counts are byte for byte what the code wrote before regression
existed. The digests below were computed by that code (commit 4486f22) on the same files."""

from __future__ import annotations

import hashlib
import json

import pytest

from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.ingest.split import split_upload
from bucketlearn.options import JobOptions
from bucketlearn.services.serial import local_source
from tests.unit.helpers import REPO_DIR, csv_bytes, write_blobs_csv

# manifest fields that existed before regression (new fields are allowed, these must not change)
FIELDS = ("feature_names", "label_column", "classes", "label_kind", "class_counts", "rows",
          "train_rows", "holdout_rows", "mean", "variance", "holdout_part_rows", "columns",
          "dropped", "train_class_counts")


def split_digest(path, **options) -> str:
    store = MemoryBlobStore()
    manifest = split_upload(local_source(str(path)), store, "work", "job-000000000000",
                            JobOptions(**options), Limits())
    digest = hashlib.sha256()
    data = json.loads(manifest.to_json())
    digest.update(json.dumps({k: data[k] for k in FIELDS}, sort_keys=True).encode())
    for shard in manifest.shards:
        digest.update(f"{shard.index}:{shard.rows}:{shard.parts}".encode())
        for part in shard.parts:
            digest.update(store.read_bytes("work", part))
    for part in manifest.holdout_parts:
        digest.update(store.read_bytes("work", part))
    return digest.hexdigest()


def integer_classes_csv(path, classes: int = 20, rows: int = 400):
    """Integer labels 0..classes-1 (20 distinct numbers: still classes under task=auto)."""
    path.write_bytes(csv_bytes(["a", "b", "label"],
                               [[i % 7, (i * 13) % 11, i % classes] for i in range(rows)]))
    return path


EXPECTED = {
    "blobs": "24bd7d8a05a033309dbb170a4e6c885cb457d2b836aa7040694a4a5a9ea3a98b",
    "penguins": "fbf0f2f583936a11efe98dcc7eb77c01e6dd4f58cd2d344e0045e40b824d3c78",
    "twenty_integers": "6bfb8bf877cbbe8dc0f971ccc2a3eeb55ea596af288410d892eed78b54342615",
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_classification_split_is_byte_for_byte_as_before(tmp_path, case):
    if case == "blobs":
        found = split_digest(write_blobs_csv(tmp_path / "b.csv", 500, 3, 4), rows_per_shard=64)
    elif case == "penguins":
        found = split_digest(REPO_DIR / "data" / "penguins.csv", label_column="species",
                             rows_per_shard=32)
    else:
        found = split_digest(integer_classes_csv(tmp_path / "i.csv"), rows_per_shard=50)
    assert found == EXPECTED[case]
