"""Shared fixtures: environment isolation and one set of real emulators per test session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bucketlearn.config import SINGLE_THREADED_TF

# TensorFlow in the test process computes as the local stack's learners and functions do (one
# thread), so a job on the stack and train-local here can be compared to the bit. TensorFlow
# fixes its threads when it starts: this runs before any test module imports it.
for _key, _value in SINGLE_THREADED_TF.items():
    os.environ.setdefault(_key, _value)

REPO = Path(__file__).resolve().parents[1]
ISOLATED_PREFIXES = ("BUCKETLEARN_",)
ISOLATED_KEYS = ("STORAGE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST",
                 "GOOGLE_CLOUD_PROJECT")


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the developer's bucketlearn settings or a running local stack."""
    for key in list(os.environ):
        if key.startswith(ISOLATED_PREFIXES) or key in ISOLATED_KEYS:
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("BUCKETLEARN_HOME", str(tmp_path / "bucketlearn-home"))


@pytest.fixture(scope="session")
def emulators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The real Pub/Sub, Firestore and Storage emulators on free ports, stopped at the end."""
    from bucketlearn.local.emulators import Emulators

    logs = tmp_path_factory.mktemp("emulator-logs")
    emus = Emulators(logs).start(timeout=180)
    try:
        yield emus
    finally:
        emus.stop()


def unique_prefix(label: str) -> str:
    return f"t{uuid.uuid4().hex[:8]}-{label}"[:30]


def overwrite_packed_part(store: Any, bucket: str, address: str, payload: bytes,
                          fill: bytes) -> str:
    """Put ``payload`` (padded with ``fill`` to the part's length) in the byte range a packed
    part's address names (``<object>#<offset>:<length>``), the pack's other parts as they were:
    how a test breaks or poisons one part of a split. Returns the pack's name."""
    from bucketlearn.ingest.parts import split_address

    packed = split_address(address)
    assert packed is not None, f"precondition: {address} is a packed part"
    name, offset, length = packed
    assert len(payload) <= length, "precondition: the payload fits in the part's range"
    pack = bytearray(store.read_bytes(bucket, name))
    pack[offset:offset + length] = payload.ljust(length, fill)
    store.write_bytes(bucket, name, bytes(pack), "application/octet-stream")
    return name


@pytest.fixture
def cloud(emulators: object) -> object:
    """Google-adapter Services on the emulators, with fresh buckets, topic and subscription."""
    from bucketlearn.bootstrap import google_services
    from bucketlearn.config import export_emulator_env

    settings = emulators.settings(unique_prefix("it"))  # type: ignore[attr-defined]
    export_emulator_env(settings)
    svc = google_services(settings)
    svc.store.ensure_bucket(settings.uploads_bucket, versioned=True)  # as Terraform creates it
    for bucket in (settings.work_bucket, settings.deltas_bucket, settings.models_bucket):
        svc.store.ensure_bucket(bucket)
    svc.queue.ensure_topology()
    svc.results.ensure_topology()
    return svc
