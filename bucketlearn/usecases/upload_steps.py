"""The collaborators an upload's split is made of (``upload.handle_upload``), named so that a
test hands in its own instead of patching the upload service's module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ingest.split import split_upload
from bucketlearn.ml.model import build_model


@dataclass(frozen=True)
class UploadSteps:
    """What ``upload.handle_upload`` splits an upload and builds its job's model with.

    ``split`` keeps ``ingest.split.split_upload``'s signature and contract: it reads the upload
    (``source``), writes the job's shard and holdout parts and manifest, and returns the
    ``Manifest``; a bad or replaced upload raises ``InvalidInputError`` or
    ``ObjectChangedError``, and what its ``progress`` or ``check`` raise ends it. ``build``
    keeps ``ml.model.build_model``'s: the job's compiled Keras model, asked for only once the
    upload passed every cheap check (a rejected upload builds none). The defaults are
    production's.
    """

    split: Callable[..., Manifest] = split_upload
    build: Callable[..., Any] = build_model
