"""Security checks: no unpickling, no code in models, object names that steer nothing, no client
access to Firestore.

* Planted pickle payloads (an .npz holding a pickled object array, a raw pickle and a
  safetensors header declaring an object dtype over a pickle) in the deltas, work and models
  buckets are refused by ``codec`` and by the aggregator and worker paths, and never executed: unpickling the payload would create a marker file, which must never
  appear (a control test shows it does appear when the bytes *are* unpickled).
* A ``.keras`` with a Lambda layer is refused by ``bucketlearn predict`` with a clear message and
  a non-zero exit, without running the lambda (it would create a marker file too).
* Object names with '../', absolute paths, backslashes, unicode or newlines never become a local
  path or a write outside ``jobs/<job>/`` (work) and ``weights/<job>/`` (models).
* infra/firestore.rules denies every client read and write.
* The installed Keras is one whose safe mode holds (3.14.0 or later: CVE-2025-1550 and the
  bypasses fixed since), pyproject.toml and the functions' requirements require it, and a
  ``.keras`` whose members declare more than they may unpack to is refused before it is read.
"""

from __future__ import annotations

import builtins
import importlib.metadata
import io
import json
import os
import pathlib
import pickle
import re
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketlearn import codec, layout
from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.aggregation import writer as aggregator
from bucketlearn.bootstrap import memory_services
from bucketlearn.codec import CorruptObjectError
from bucketlearn.domain import task as attempt
from bucketlearn.domain.lifecycle import QUEUED
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.loops.learner import Decision, Learner
from bucketlearn.ports import TaskMessage
from bucketlearn.services import task_messages
from bucketlearn.usecases import upload as upload_service
from bucketlearn.usecases.upload import Outcome, StorageEvent, handle_upload
from tests.conftest import overwrite_packed_part
from tests.unit.helpers import REPO_DIR, csv_bytes, safetensors_bytes, write_blobs_csv

# --- payloads ----------------------------------------------------------------------------------

class Payload:
    """Unpickling this calls ``Path.touch(marker)``: the marker file proves code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def pickled_npz(marker: Path, members: tuple[str, ...] = ("w0000",)) -> bytes:
    """An .npz whose members are object arrays saved with allow_pickle=True."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member in members:
            with archive.open(f"{member}.npy", "w") as handle:
                np.save(handle, np.array([Payload(marker), 1], dtype=object), allow_pickle=True)
    return buffer.getvalue()


def raw_pickle(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker), protocol=pickle.HIGHEST_PROTOCOL)


def object_dtype_safetensors(marker: Path) -> bytes:
    """A safetensors object whose arrays declare a (numpy) object dtype over a pickle."""
    body = raw_pickle(marker)
    entry = {"dtype": "O", "shape": [len(body)], "data_offsets": [0, len(body)]}
    return safetensors_bytes({"w0000": entry}, body)


PAYLOADS = {
    "npz-object-array": lambda marker: pickled_npz(marker, ("w0000", "x", "y")),
    "raw-pickle": raw_pickle,
    "safetensors-object-dtype": object_dtype_safetensors,
}


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "PWNED"


def test_payloads_run_code_when_unpickled(marker: Path) -> None:
    """Control: the planted bytes are live; unpickling them does create the marker."""
    # Execute
    pickle.loads(raw_pickle(marker))  # noqa: S301 - deliberately, to prove the payload works
    created_by_pickle = marker.exists()
    marker.unlink()
    with np.load(io.BytesIO(pickled_npz(marker)), allow_pickle=True) as archive:
        archive["w0000"]
    # Assert
    assert created_by_pickle
    assert marker.exists()


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
@pytest.mark.parametrize("decode", [codec.decode_arrays, codec.decode_weights],
                         ids=["decode_arrays", "decode_weights"])
def test_codec_refuses_planted_pickles_without_running_them(kind: str, decode: Any,
                                                            marker: Path) -> None:
    """CorruptObjectError naming the object; the marker never appears."""
    # Prepare
    data = PAYLOADS[kind](marker)
    # Execute
    with pytest.raises(CorruptObjectError) as excinfo:
        decode(data, "planted/t00000/0000000000000000.safetensors")
    # Assert
    assert str(excinfo.value).startswith("planted/t00000/0000000000000000.safetensors: expected")
    assert not marker.exists()


# --- the services ------------------------------------------------------------------------------

def start_job(tmp_path: Path, **metadata: str) -> tuple[Any, str]:
    """A training job on the in-memory ports (epoch 1 published)."""
    svc = memory_services()
    path = write_blobs_csv(tmp_path / "blobs.csv", n_rows=300)
    info = svc.store.write_bytes(svc.settings.uploads_bucket, "blobs.csv", path.read_bytes(),
                                 "text/csv", {"epochs": "1", "rows_per_shard": "64", **metadata})
    outcome, job_id = handle_upload(svc, StorageEvent(info.bucket, info.name, info.generation,
                                                      info.size))
    assert outcome is Outcome.ACCEPTED and job_id is not None
    return svc, job_id


def record_attempt(svc: Any, job_id: str, task_index: int, key: str) -> None:
    """Count an attempt at task ``task_index`` of epoch 1 under ``key``, as a learner would."""
    task_id = layout.task_id_for(job_id, 1, task_index)
    svc.registry.record_attempt(job_id, task_messages.task_doc_id(job_id, 1, task_index),
                                attempt.started(task_id, 1, task_index, 0, 64, "w", 0.0, None,
                                                None), key)


def task_message(svc: Any, job_id: str, task_index: int) -> TaskMessage:
    return next(m for m in svc.queue.published
                if m.job_id == job_id and m.task_index == task_index)


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_aggregator_requeues_the_task_of_a_planted_delta(kind: str, tmp_path: Path,
                                                         marker: Path) -> None:
    """A pickle in the deltas bucket, named like a delta of an attempt the registry recorded
    (a learner's account gone bad): not applied, its task retrained."""
    # Prepare
    svc, job_id = start_job(tmp_path, parallel_tasks="1")
    published_before = len(svc.queue.published)
    record_attempt(svc, job_id, 0, "ab" * 8)
    name = layout.delta_path(job_id, 1, 0, "ab" * 8)
    svc.store.write_bytes(svc.settings.deltas_bucket, name, PAYLOADS[kind](marker),
                          "application/octet-stream",
                          metadata={"base_version": "0", "examples": "64"})
    # Execute
    outcome = aggregator.aggregate_job(svc, job_id)
    # Assert
    assert outcome is Outcome.ACCEPTED
    job = svc.registry.get_job(job_id)
    assert job.version == 0 and job.status == QUEUED
    assert [v.version for v in svc.registry.list_versions(job_id)] == [0]
    assert [t for v in svc.registry.list_versions(job_id) for t in v.tasks_applied] == []
    requeued = svc.queue.published[published_before:]
    assert [(m.job_id, m.epoch, m.task_index) for m in requeued] == [(job_id, 1, 0)]
    assert svc.store.stat(svc.settings.deltas_bucket, name) is None  # the planted object is gone
    assert not marker.exists()


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
@pytest.mark.parametrize("where", ["work-shard-part", "models-head-weights"])
def test_worker_counts_and_nacks_a_planted_pickle_then_fails_the_task(
        kind: str, where: str, tmp_path: Path, marker: Path) -> None:
    """A pickle as a shard part (work) or as the head weights (models): each attempt is counted
    and nacked; after max_task_attempts the task is FAILED with a marker for the aggregator."""
    # Prepare: shards of 128 rows, so that every payload fits in a part's byte range
    svc, job_id = start_job(tmp_path, rows_per_shard="128")
    task = task_message(svc, job_id, 0)
    if where == "work-shard-part":
        # the part is a byte range of its pack: the pickle goes in that range, padded to its
        # length (a pickle ignores what follows its STOP), the pack's other parts as they were
        name = overwrite_packed_part(svc.store, svc.settings.work_bucket, task.parts[0],
                                     PAYLOADS[kind](marker), b"\0")
    else:
        name = svc.registry.get_job(job_id).head.weights_path
        svc.store.write_bytes(svc.settings.models_bucket, name, PAYLOADS[kind](marker),
                              "application/octet-stream")
    learner = Learner(svc, "w-security")
    # Execute
    first = learner.process(task)
    after_first = {t.task_id: t for t in svc.registry.list_tasks(job_id)}[task.task_id]
    later = [learner.process(task) for _ in range(svc.settings.max_task_attempts)]
    # Assert
    assert first is Decision.NACK
    assert after_first.attempts == 1 and after_first.state == "RETRYING"
    assert "CorruptObjectError" in after_first.error and name in after_first.error
    assert later == [Decision.NACK] * (svc.settings.max_task_attempts - 1) + [Decision.ACK]
    final = {t.task_id: t for t in svc.registry.list_tasks(job_id)}[task.task_id]
    assert final.state == "FAILED"
    markers = [i.name for i in svc.store.list(svc.settings.deltas_bucket, f"{job_id}/")
               if layout.parse_delta_path(i.name) and layout.parse_delta_path(i.name).failed]
    assert len(markers) == 1
    assert not [i for i in svc.store.list(svc.settings.deltas_bucket, f"{job_id}/")
                if i.name.endswith(".safetensors")], "no delta may come out of a planted input"
    assert not marker.exists()


# --- models with code ----------------------------------------------------------------------------

def lambda_model(path: Path, marker: Path) -> Path:
    """A .keras (with bucketlearn's sidecar) whose Lambda layer touches ``marker`` when run."""
    import keras

    from bucketlearn.ml.model import SIDECAR_NAME

    touch = eval(  # noqa: S307 - a lambda with the marker path as a constant (no closure)
        f"lambda x: (__import__('pathlib').Path({str(marker)!r}).touch(), x)[1]")
    inputs = keras.Input((2,))
    keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Lambda(touch)(inputs))).save(path)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(SIDECAR_NAME, json.dumps({
            "feature_names": ["a", "b"], "label_column": "label", "class_names": ["0", "1"],
            "label_kind": "int"}))
    if marker.exists():
        marker.unlink()  # building the model ran the lambda once; loading must not
    return path


def test_predict_refuses_a_model_with_a_lambda_layer(tmp_path: Path, marker: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`bucketlearn predict` exits non-zero naming the file and the reason; the lambda never runs."""
    from bucketlearn.entrypoints import cli

    # Prepare
    model = lambda_model(tmp_path / "evil.keras", marker)
    data = tmp_path / "rows.csv"
    data.write_bytes(csv_bytes(["a", "b", "label"], [[1, 2, 0], [3, 4, 1]]))
    # Execute
    code = cli.main(["predict", str(model), str(data), "--json"])
    # Assert
    err = capsys.readouterr().err
    assert code != 0
    assert str(model) in err and "refused to load the model in safe mode" in err
    assert "Lambda" in err
    assert "Traceback" not in err and "safe_mode=False" not in err
    assert not marker.exists()


def test_the_lambda_marker_would_fire_outside_safe_mode(tmp_path: Path, marker: Path) -> None:
    """Control: loading the same file with safe mode off does run the lambda."""
    import keras

    # Prepare
    model = lambda_model(tmp_path / "evil.keras", marker)
    # Execute
    keras.models.load_model(model, safe_mode=False, compile=False)
    # Assert
    assert marker.exists()


# Keras 3.14.0 closes every safe-mode bypass known when this floor was set: CVE-2025-1550 (3.9),
# CVE-2025-8747 and CVE-2025-9906 (3.11.0), CVE-2025-12058 (3.12.0), CVE-2026-1462 (the
# TFSMLayer bypass) and GHSA-hqp4-2352-xf5r (path traversal on archive extraction, 3.14.0).
KERAS_SAFE_MODE_FIXED = (3, 14, 0)


def _release(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string such as '3.15.1', '3.9' or '3.9.0rc1'."""
    parts = tuple(int(re.match(r"\d+", part).group()) for part in version.split(".")[:3]
                  if re.match(r"\d+", part))
    return parts + (0,) * (3 - len(parts))


def _keras_floors(requirements: list[str]) -> list[tuple[int, ...]]:
    found = [re.fullmatch(r"keras\s*>=\s*([\d.]+)", req.split(";")[0].split("#")[0].strip())
             for req in requirements]
    return [_release(m.group(1)) for m in found if m]


def test_installed_keras_has_the_safe_mode_fix() -> None:
    """Keras >= 3.14.0 is installed (earlier releases let a crafted .keras run code or write
    outside its folder even in safe mode), and both pyproject.toml and the functions'
    requirements.txt require it rather than relying on tensorflow's range."""
    # Prepare
    pyproject = tomllib.loads((REPO_DIR / "pyproject.toml").read_text(encoding="utf-8"))
    functions = (REPO_DIR / "functions" / "requirements.txt").read_text(encoding="utf-8")
    # Execute
    installed = importlib.metadata.version("keras")
    declared = _keras_floors(pyproject["project"]["dependencies"])
    deployed = _keras_floors(functions.splitlines())
    # Assert
    assert _release(installed) >= KERAS_SAFE_MODE_FIXED, installed
    assert declared and declared[0] >= KERAS_SAFE_MODE_FIXED, pyproject["project"]["dependencies"]
    assert deployed and deployed[0] >= KERAS_SAFE_MODE_FIXED, functions


# --- a .keras that unpacks to more than it may (a zip bomb) ---------------------------------------

def _declare_size(archive_bytes: bytes, member: str, size: int) -> bytes:
    """The archive with ``member``'s declared uncompressed size set to ``size`` in its central
    directory entry (what ``zipfile`` reads), its bytes unchanged."""
    data = bytearray(archive_bytes)
    name = member.encode()
    at = data.index(b"PK\x01\x02")
    while True:
        name_length = int.from_bytes(data[at + 28:at + 30], "little")
        if data[at + 46:at + 46 + name_length] == name:
            data[at + 24:at + 28] = size.to_bytes(4, "little")
            return bytes(data)
        at = data.index(b"PK\x01\x02", at + 46)


def _keras_like(path: Path, sidecar: bytes, members: dict[str, bytes] | None = None) -> Path:
    """A zip laid out as a .keras with bucketlearn's sidecar (deflated)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("config.json", b"{}")
        for name, data in (members or {"model.weights.h5": b"\0" * 1024}).items():
            archive.writestr(name, data)
        archive.writestr("bucketlearn.json", sidecar)
    return path


def test_a_sidecar_that_unpacks_past_its_bound_is_refused_before_it_is_read(tmp_path: Path
                                                                            ) -> None:
    """A 64 MiB sidecar that deflates to ~64 KiB: refused from its declared size, naming the
    member, the bound and what it declares."""
    from bucketlearn.errors import PermanentError
    from bucketlearn.ml.model import MAX_SIDECAR_BYTES, load_model

    # Prepare
    big = b'{"pad": "' + b" " * (64 * 1024**2) + b'"}'
    bomb = _keras_like(tmp_path / "bomb.keras", big)
    assert bomb.stat().st_size < 1024**2
    # Execute
    with pytest.raises(PermanentError) as refused:
        load_model(str(bomb))
    # Assert
    message = str(refused.value)
    assert str(bomb) in message and "'bucketlearn.json'" in message
    assert f"at most {MAX_SIDECAR_BYTES} bytes" in message and f"found {len(big)} bytes" in message


def test_an_archive_whose_members_declare_too_much_is_refused_before_predict_reads_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A .keras whose weights member declares 4 GiB - 1 uncompressed: `bucketlearn predict`
    exits non-zero naming the file, the member, the bound and the total found, before the
    sidecar or the model is read."""
    from bucketlearn.entrypoints import cli
    from bucketlearn.ml.model import MAX_ARCHIVE_BYTES

    # Prepare
    sidecar = json.dumps({"feature_names": ["a", "b"], "label_column": "label",
                          "class_names": ["0", "1"], "label_kind": "int"}).encode()
    plain = _keras_like(tmp_path / "plain.keras", sidecar)
    model = tmp_path / "bomb.keras"
    model.write_bytes(_declare_size(plain.read_bytes(), "model.weights.h5", 2**32 - 1))
    data = tmp_path / "rows.csv"
    data.write_bytes(csv_bytes(["a", "b", "label"], [[1, 2, 0]]))
    # Execute
    code = cli.main(["predict", str(model), str(data), "--json"])
    # Assert
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert str(model) in err and "'model.weights.h5'" in err
    assert f"at most {MAX_ARCHIVE_BYTES} bytes in all" in err
    total = 2**32 - 1 + len(b"{}") + len(sidecar)
    assert f"found {total} bytes" in err


# --- object names --------------------------------------------------------------------------------

SAFE_PATH = re.compile(r"^[a-z0-9][a-z0-9/._-]*$")


@settings(max_examples=300, deadline=None)
@given(name=st.text(max_size=300), bucket=st.text(min_size=1, max_size=30),
       generation=st.integers(0, 2**63 - 1), epoch=st.integers(1, 9999),
       task=st.integers(0, 99999), version=st.integers(0, 999_999))
def test_any_object_name_gives_a_slug_job_id_and_contained_paths(name, bucket, generation, epoch,
                                                                 task, version) -> None:
    """Whatever the name ('../', '/abs', '\\\\', unicode, newlines), ids and paths stay inside."""
    # Execute
    job_id = layout.job_id_for(bucket, name, generation)
    nonce = layout.new_nonce()
    paths = {
        "work": [layout.shard_part_path(job_id, task, 0), layout.holdout_part_path(job_id, 0),
                 layout.manifest_path(job_id)],
        "models": [layout.weights_path(job_id, version, nonce), layout.model_path(job_id),
                   layout.model_path(job_id, version)],
        "deltas": [layout.delta_path(job_id, epoch, task, nonce),
                   layout.failure_marker_path(job_id, epoch, task, nonce)],
    }
    # Assert
    assert layout.is_job_id(job_id)
    prefixes = {"work": f"jobs/{job_id}/", "models": ("weights/", "models/"),
                "deltas": f"{job_id}/"}
    for kind, names in paths.items():
        for path in names:
            assert SAFE_PATH.match(path), path
            assert ".." not in path and "//" not in path and not path.startswith("/")
            assert path.startswith(prefixes[kind]), path
            assert job_id in path.split("/")
    parsed = layout.parse_delta_path(paths["deltas"][0])
    assert parsed is not None and (parsed.job_id, parsed.epoch, parsed.task_index) == (
        job_id, epoch, task)


@pytest.mark.parametrize("name", ["line\nbreak.csv", "ünïcødé/データ.csv", 'a b"%.csv',
                                  "tab\there\r.csv"])
def test_relay_event_headers_carry_any_object_name(name: str) -> None:
    """The local Eventarc stand-in percent-encodes ce-subject (HTTP headers cannot hold a newline
    or non-Latin-1 text); the JSON body keeps the exact name."""
    from urllib.parse import unquote

    from bucketlearn.local.relay import cloudevent_for
    from bucketlearn.ports import BlobInfo

    # Prepare
    info = BlobInfo(bucket="uploads", name=name, size=1, generation=7)
    # Execute
    headers, body = cloudevent_for(info)
    # Assert
    for value in headers.values():
        assert all("!" <= ch <= "~" for ch in value), value
    assert unquote(headers["ce-subject"]) == f"objects/{name}"
    assert body["name"] == name


class RecordingStore(MemoryBlobStore):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[tuple[str, str]] = []

    def write_bytes(self, bucket: str, name: str, data: bytes, content_type: str,
                    metadata: dict[str, str] | None = None) -> Any:
        self.written.append((bucket, name))
        return super().write_bytes(bucket, name, data, content_type, metadata)


NASTY_NAMES = [
    "../../etc/passwd.csv",
    "/absolute/root/data.csv",
    "..\\..\\windows\\system32\\data.csv",
    "ünïcødé/データ/表.csv",
    "a/./b/../../c.csv",
    "%2e%2e%2fencoded.csv",
    "gs:/other-bucket/x.csv",
    "line\nbreak.csv",
]


@pytest.mark.parametrize("name", NASTY_NAMES)
def test_nasty_object_names_never_reach_a_local_path_or_another_bucket(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The upload is handled (trained or rejected); every write stays under the job's prefix."""
    # Prepare
    svc = memory_services()
    svc.store = store = RecordingStore()
    data = write_blobs_csv(tmp_path / "data.csv", n_rows=60).read_bytes()
    info = store.write_bytes(svc.settings.uploads_bucket, name, data, "text/csv",
                             {"epochs": "1", "rows_per_shard": "16"})
    store.written.clear()
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def recording_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.fsdecode(file) if isinstance(file, (str, bytes, os.PathLike)) else "")
        return real_open(file, *args, **kwargs)

    def recording_os_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.fsdecode(path))
        return real_os_open(path, *args, **kwargs)

    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(builtins, "open", recording_open)
    monkeypatch.setattr(os, "open", recording_os_open)
    # Execute
    outcome, job_id = handle_upload(svc, StorageEvent(info.bucket, info.name, info.generation,
                                                      info.size))
    monkeypatch.undo()
    # Assert
    assert job_id is not None and layout.is_job_id(job_id)
    assert outcome is (Outcome.REJECTED if "\n" in name else Outcome.ACCEPTED)
    job = svc.registry.get_job(job_id)
    assert job.source["name"] == name  # kept as data, exactly
    assert job.file == upload_service.display_uri(info.bucket, name)
    for bucket, written in store.written:
        assert bucket in (svc.settings.work_bucket, svc.settings.models_bucket), bucket
        prefix = f"jobs/{job_id}/" if bucket == svc.settings.work_bucket else f"weights/{job_id}/"
        assert written.startswith(prefix) and ".." not in written, written
    if outcome is Outcome.ACCEPTED:
        manifest = Manifest.from_json(store.read_bytes(svc.settings.work_bucket,
                                                       layout.manifest_path(job_id)))
        assert all(p.startswith(f"jobs/{job_id}/") for s in manifest.shards for p in s.parts)
        assert all(p.startswith(f"jobs/{job_id}/") for m in svc.queue.published for p in m.parts)
    fragments = [part for part in re.split(r"[/\\\n]", name) if len(part) > 3
                 and part not in ("data.csv",)]
    assert not [p for p in opened if any(f in p for f in fragments)], opened
    assert list(workdir.iterdir()) == []


# --- Firestore rules ----------------------------------------------------------------------------

def test_firestore_rules_deny_every_client_read_and_write() -> None:
    """infra/firestore.rules: one catch-all match, `allow read, write: if false`, nothing else."""
    # Prepare
    text = (REPO_DIR / "infra" / "firestore.rules").read_text()
    code = "\n".join(line.split("//", 1)[0] for line in text.splitlines())
    # Assert
    assert "rules_version = '2'" in code
    assert re.search(r"service\s+cloud\.firestore\s*\{", code)
    assert re.search(r"match\s+/databases/\{database\}/documents\s*\{", code)
    assert re.search(r"match\s+/\{document=\*\*\}\s*\{", code)
    allows = re.findall(r"allow\s+([^;]*);", code)
    assert allows == ["read, write: if false"], allows
    assert "if true" not in code and "request.auth" not in code
    assert code.count("{") == code.count("}")
