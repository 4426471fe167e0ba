"""Numeric targets leave classification alone: a classification upload's shards,
holdout, statistics and class counts are, array for array and byte for byte within the arrays,
what the code wrote before regression existed. The digests below hash each part's arrays (names,
dtypes, shapes, bytes) and its name without the extension, not the object's bytes, so that the
container (safetensors now, ``.npz`` before) is not what is compared; they were
computed with this function on commit 4c86960, the last to store ``.npz``, whose parts this test
had until then compared byte for byte with those of commit 4486f22, the code before regression."""

from __future__ import annotations

import hashlib
import json

import pytest

from bucketlearn import layout
from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.ingest.parts import decode_part, read_part
from bucketlearn.ingest.split import split_upload
from bucketlearn.options import NONE, JobOptions
from bucketlearn.usecases.train_local import local_source
from tests.unit.helpers import REPO_DIR, csv_bytes, write_blobs_csv

# manifest fields that existed before regression (new fields are allowed, these must not change)
FIELDS = ("feature_names", "label_column", "classes", "label_kind", "class_counts", "rows",
          "train_rows", "holdout_rows", "mean", "variance", "holdout_part_rows", "columns",
          "dropped", "train_class_counts")


def _arrays(data: bytes) -> bytes:
    """A part's arrays as training reads them (``decode_part``: features as float32, however
    they are stored), in name order: each one's name, dtype, shape and bytes."""
    x, y = decode_part(data, "part")
    arrays = {"x": x, "y": y}
    return b"".join(f"{name}:{a.dtype.str}:{a.shape}:".encode() + a.tobytes()
                    for name, a in sorted(arrays.items()))


def split_digest(path, **options) -> str:
    store = MemoryBlobStore()
    manifest = split_upload(local_source(str(path)), store, "work", "job-000000000000",
                            JobOptions(**{"validation_fraction": NONE, **options}), Limits())
    digest = hashlib.sha256()
    data = json.loads(manifest.to_json())
    digest.update(json.dumps({k: data[k] for k in FIELDS}, sort_keys=True).encode())
    for shard in manifest.shards:
        # the names the parts had as objects of their own (they are packed since): the same
        # parts of the same shards
        stems = [layout.shard_part_path(manifest.job_id, shard.index, n).rsplit(".", 1)[0]
                 for n in range(len(shard.parts))]
        digest.update(f"{shard.index}:{shard.rows}:{stems}".encode())
        for part in shard.parts:
            digest.update(_arrays(read_part(store, "work", part)))
    for part in manifest.holdout_parts:
        digest.update(_arrays(read_part(store, "work", part)))
    return digest.hexdigest()


def integer_classes_csv(path, classes: int = 20, rows: int = 400):
    """Integer labels 0..classes-1 (20 distinct numbers: still classes under task=auto)."""
    path.write_bytes(csv_bytes(["a", "b", "label"],
                               [[i % 7, (i * 13) % 11, i % classes] for i in range(rows)]))
    return path


EXPECTED = {
    "blobs": "855ee6c272a65379cbb33899e47092a369115c13dde4aa1321987542cdb0b12a",
    "penguins": "8aaa269a7fd83e9445e973ce76c0e372464c6f9cab16fe1d9a8a267877dca019",
    "twenty_integers": "5b9a2ce28d5eed4bb018fdb8413535e087c216a2f84f7d7aba4f0a577551a72d",
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
