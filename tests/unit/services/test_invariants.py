"""The invariants of docs/DESIGN.md ("Correctness under at-least-once delivery"), each pinned
by a test that fails if it breaks.

1 one job per upload ........ test_upload_service.py (duplicate event), e2e duplicate events
2 each task applied once .... test_aggregator_service.py (duplicate delta), e2e ledgers
3 dense versions, weights
  before commit ............. here: crash between weights write and commit
4 nothing lost .............. here: aggregator crash and rerun; e2e: worker SIGKILL
5 bounded memory ............ here: shard buffers and reads bounded, same for 1x and 4x the rows
6 no pickle ................. here: Keras safe mode; ../core/test_codec.py: pickled arrays refused
7 clear answer on bad input . ../ingest/test_ingest_validation.py, test_upload_service.py,
                              e2e rejection
"""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

from bucketlearn import layout
from bucketlearn.aggregation import writer as aggregator
from bucketlearn.bootstrap import memory_services
from bucketlearn.config import Limits
from bucketlearn.domain.head import Head
from bucketlearn.domain.job import Job
from bucketlearn.faults import inject
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ingest.parts import ShardWriter, read_part
from bucketlearn.ingest.split import split_upload
from bucketlearn.ingest.stream import SourceFile
from bucketlearn.options import JobOptions
from bucketlearn.ports import BlobInfo
from bucketlearn.services import export
from tests.unit.helpers import blobs_rows, csv_bytes
from tests.unit.steps import run_rounds, start_job, train_pending


def weight_objects(svc: Any, job_id: str) -> set[str]:
    return {i.name for i in svc.store.list(svc.settings.models_bucket, f"weights/{job_id}/")}


def test_crash_between_weights_write_and_commit_leaves_no_dangling_pointer(
        tmp_path: Path) -> None:
    """Invariants 3 and 4: the crash leaves an unreferenced object; the rerun applies everything."""
    # Prepare
    svc, job_id = start_job(tmp_path)
    train_pending(svc, 2)
    before = weight_objects(svc, job_id)

    def crash(real: Any, commit: Any) -> bool:
        raise RuntimeError("killed between the weights write and the commit")

    # Execute
    with pytest.raises(RuntimeError):
        aggregator.aggregate_job(inject(svc, "registry", commit_version=crash), job_id)
    # Assert: an orphan weights object, the head still on v0 and pointing at v0's object
    orphans = weight_objects(svc, job_id) - before
    assert len(orphans) == 1
    job = svc.registry.get_job(job_id)
    assert job.version == 0 and job.head.weights_path in before
    assert [v.version for v in svc.registry.list_versions(job_id)] == [0]
    # Execute: the lease expires, the event is retried (commits work again)
    svc.registry.leases.clear()
    aggregator.aggregate_job(svc, job_id)
    run_rounds(svc, job_id)
    # Assert: everything applied exactly once, versions dense, head never points at the orphan
    job = svc.registry.get_job(job_id)
    versions = svc.registry.list_versions(job_id)
    assert job.status == "DONE"
    assert [v.version for v in versions] == list(range(job.version + 1))
    applied = [t for v in versions for t in v.tasks_applied]
    assert sorted(applied) == sorted(set(applied)) and len(applied) == job.tasks_planned
    assert all(v.weights_path not in orphans for v in versions)


def test_rerun_after_commit_changes_nothing(tmp_path: Path) -> None:
    """Invariant 2: a crash after the commit (before cleanup/ack) is retried without effect."""
    # Prepare
    svc, job_id = start_job(tmp_path, epochs=2)
    train_pending(svc, 2)

    def keep_deltas(real: Any, bucket: str, name: str) -> None:
        if bucket != svc.settings.deltas_bucket:  # the results stay after their commit
            real(bucket, name)

    svc = inject(svc, "store", delete=keep_deltas)
    aggregator.aggregate_job(svc, job_id)
    after_first = svc.registry.get_job(job_id)
    assert list(svc.store.list(svc.settings.deltas_bucket)), "the deltas were deleted"
    # Execute: the same event delivered again, the deltas still in the bucket
    aggregator.aggregate_job(svc, job_id)
    aggregator.aggregate_job(svc, job_id)
    # Assert
    job = svc.registry.get_job(job_id)
    assert job.version == after_first.version == 1
    assert job.tasks_applied == 2
    assert len(svc.registry.list_versions(job_id)) == 2


def test_aggregator_refuses_to_fold_when_the_lease_is_held(tmp_path: Path) -> None:
    """One writer per job: a second invocation returns BUSY and changes nothing."""
    # Prepare
    svc, job_id = start_job(tmp_path)
    train_pending(svc, 2)
    assert svc.registry.acquire_lease(f"aggregate-{job_id}", "someone-else", 60)
    # Execute
    outcome = aggregator.aggregate_job(svc, job_id)
    # Assert
    assert outcome.value == "busy"
    assert svc.registry.get_job(job_id).version == 0


class CountingStream(io.BytesIO):
    """Records the largest single read, to show the reader streams."""

    largest_read = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        CountingStream.largest_read = max(CountingStream.largest_read, len(data))
        return data


class DiscardingStore:
    """Accepts writes and keeps nothing, so only the ingester's own memory is traced."""

    def write_bytes(self, bucket: str, name: str, data: bytes, content_type: str,
                    metadata: Any = None) -> BlobInfo:
        return BlobInfo(bucket, name, len(data), 1)


def split_rows(n_rows: int, buffer_bytes: int) -> tuple[int, int, int]:
    data = csv_bytes([f"f{j}" for j in range(16)] + ["label"],
                     sorted(blobs_rows(n_rows, 5, 16), key=lambda r: r[-1]))
    source = SourceFile("sorted.csv", len(data), lambda: CountingStream(data))
    peaks: list[int] = []
    real = ShardWriter.close

    def close(self: Any) -> Any:
        peaks.append(self.peak_bytes)
        return real(self)

    ShardWriter.close = close  # type: ignore[method-assign]
    try:
        tracemalloc.start()
        split_upload(source, DiscardingStore(), "work", "job", JobOptions(rows_per_shard=64),
                     Limits(max_line_bytes=64 * 1024), buffer_bytes=buffer_bytes)
        _, traced_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        ShardWriter.close = real  # type: ignore[method-assign]
    return peaks[0], traced_peak, len(data)


def test_ingest_memory_does_not_grow_with_the_file() -> None:
    """Invariant 5: shard buffers stay under budget and the file is read in blocks, 1x or 4x rows.

    A label-sorted file is the worst case for buffering (every shard waits for every class).
    Peak RSS against file size is measured in benchmarks/ (ingestion), not here.
    """
    # Prepare
    budget = 256 * 1024
    CountingStream.largest_read = 0
    # Execute
    peak_small, traced_small, size_small = split_rows(4_000, budget)
    peak_large, traced_large, size_large = split_rows(16_000, budget)
    # Assert
    assert size_large > 3.5 * size_small
    assert peak_small <= budget + 256 * 1024 and peak_large <= budget + 256 * 1024
    assert CountingStream.largest_read <= 2 * 1024 * 1024  # read in blocks, never whole


def test_keras_safe_mode_refuses_code_in_a_model(tmp_path: Path) -> None:
    """Invariant 6: a .keras carrying a Lambda (arbitrary code) is refused at load."""
    import keras

    from bucketlearn.errors import PermanentError
    from bucketlearn.ml.model import SIDECAR_NAME, load_model

    # Prepare
    inputs = keras.Input((3,))
    outputs = keras.layers.Lambda(lambda x: x * 2)(inputs)
    path = tmp_path / "evil.keras"
    keras.Model(inputs, outputs).save(path)
    import zipfile

    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(SIDECAR_NAME, '{"feature_names": ["a", "b", "c"], "class_names": []}')
    # Execute / Assert
    with pytest.raises((ValueError, PermanentError)) as excinfo:
        load_model(str(path))
    assert "safe" in str(excinfo.value).lower() or "lambda" in str(excinfo.value).lower()


def test_shards_and_deltas_are_pickle_free(tmp_path: Path) -> None:
    """Invariant 6: every stored array object is safetensors of numeric arrays (no pickle can be
    in one)."""
    # Prepare
    svc, job_id = start_job(tmp_path)
    train_pending(svc, 2)
    names = [(b, i.name) for b in (svc.settings.work_bucket, svc.settings.deltas_bucket,
                                   svc.settings.models_bucket)
             for i in svc.store.list(b) if i.name.endswith(".safetensors")]
    manifest = Manifest.from_json(svc.store.read_bytes(svc.settings.work_bucket,
                                                       layout.manifest_path(job_id)))
    parts = [p for shard in manifest.shards for p in shard.parts] + manifest.holdout_parts
    stored = [svc.store.read_bytes(b, n) for b, n in names] + [  # parts: ranges of their packs
        read_part(svc.store, svc.settings.work_bucket, p) for p in parts]
    # Assert
    assert names and len(parts) > 2
    for data in stored:  # read by the library alone, not bucketlearn's codec
        arrays = safetensors.numpy.load(data)
        assert arrays and all(a.dtype.kind in "biuf" for a in arrays.values())
    assert any(layout.parse_delta_path(n) for _, n in names)


# --- bounded evaluation and export memory --------------------------------------------------------

HOLDOUT_FEATURES, HOLDOUT_CLASSES, ROWS_PER_PART = 32, 4, 4096  # 512 KiB of x per part


def exporting_job(parts: int) -> tuple[Any, dict[str, Any]]:
    """A job about to export, whose holdout is ``parts`` parts of 4,096 rows (32 features,
    4 well-separated classes), with a head trained on one part; its runtime's model is built and
    has predicted once, so that what is traced afterwards is the evaluation's own memory."""
    from bucketlearn import codec
    from bucketlearn.domain.lifecycle import EXPORTING, RUNNING
    from bucketlearn.ingest.manifest import Manifest
    from bucketlearn.ml.model import ModelSpec, build_model
    from bucketlearn.ml.training import optimizer_state, train_task
    from bucketlearn.services.caches import job_runtime

    svc = memory_services()
    job_id = f"holdout-{parts:04d}-000000000000"
    bucket = svc.settings.work_bucket
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=4.0, size=(HOLDOUT_CLASSES, HOLDOUT_FEATURES))
    paths = []
    for part in range(parts):
        y = (np.arange(ROWS_PER_PART) % HOLDOUT_CLASSES).astype(np.int32)
        x = (centers[y] + rng.normal(size=(ROWS_PER_PART, HOLDOUT_FEATURES))).astype(np.float32)
        paths.append(layout.holdout_part_path(job_id, part))
        svc.store.write_bytes(bucket, paths[-1], codec.encode_arrays({"x": x, "y": y}),
                              "application/octet-stream")
    manifest = Manifest(
        job_id=job_id, source="synthetic.csv",
        feature_names=[f"f{j}" for j in range(HOLDOUT_FEATURES)], label_column="label",
        classes=[str(c) for c in range(HOLDOUT_CLASSES)], label_kind="int",
        class_counts=[parts * ROWS_PER_PART // HOLDOUT_CLASSES] * HOLDOUT_CLASSES,
        rows=parts * ROWS_PER_PART, train_rows=0, holdout_rows=parts * ROWS_PER_PART, shards=[],
        holdout_parts=paths, mean=[0.0] * HOLDOUT_FEATURES, variance=[16.0] * HOLDOUT_FEATURES,
        holdout_part_rows=[ROWS_PER_PART] * parts)
    svc.store.write_bytes(bucket, layout.manifest_path(job_id), manifest.to_json(),
                          "application/json")
    spec = ModelSpec("mlp", HOLDOUT_FEATURES, HOLDOUT_CLASSES, None, 0, 0.01)
    model = build_model(spec, manifest.mean, manifest.variance)
    first = codec.decode_arrays(svc.store.read_bytes(bucket, paths[0]))[0]
    trained = train_task(model, model.get_weights(), optimizer_state(model), first["x"],
                         first["y"], 64, 0.01, 0, 1, 0)
    weights_path = layout.weights_path(job_id, 1, layout.new_nonce())
    svc.store.write_bytes(svc.settings.models_bucket, weights_path,
                          codec.encode_state(trained.weights, trained.optimizer),
                          "application/octet-stream")
    job = Job(job_id, status=RUNNING, phase=EXPORTING, version=1,
              model=spec.to_dict(), options=JobOptions(learning_rate=0.01).to_dict(),
              head=Head(1, weights_path, ""))
    assert svc.registry.create_job(job)
    runtime = job_runtime(svc, job)
    runtime.model.predict_on_batch(first["x"][:1024])  # trace the prediction function now
    return svc, job


def traced_peak(call: Any) -> int:
    """The peak of memory allocated (numpy arrays included) while ``call()`` runs."""
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_evaluation_memory_does_not_grow_with_the_holdout() -> None:
    """Invariant 5 for the aggregator: evaluating a version on a sample of
    2,000 holdout rows reads only the parts the sample draws from, one at a time; 4x the holdout
    rows leave the peak within 1.3x (before: the whole holdout was read and then subsampled,
    so the peak grew with it: 16 -> 64 parts of 512 KiB)."""
    from bucketlearn.services.caches import job_runtime

    # Prepare
    small_svc, small_job = exporting_job(16)
    large_svc, large_job = exporting_job(64)
    # Execute
    small = traced_peak(lambda: job_runtime(small_svc, small_job).holdout(2000))
    large = traced_peak(lambda: job_runtime(large_svc, large_job).holdout(2000))
    # Assert
    x, y = job_runtime(large_svc, large_job).holdout(2000)
    assert x.shape == (2000, HOLDOUT_FEATURES) and len(y) == 2000
    assert large <= 1.3 * small, (small, large)
    assert large < 8 * 2**20  # the 64-part holdout alone is 32 MiB


def test_export_memory_does_not_grow_with_the_holdout() -> None:
    """Invariant 5 for the export: the final evaluation and the health check
    on the whole holdout stream over its parts, one at a time, adding up accuracy, loss and
    class counts; 4x the holdout rows leave the export's peak within 1.3x (before: the whole
    holdout was loaded and concatenated, twice its size at once)."""
    from bucketlearn.domain.lifecycle import DONE

    # Prepare
    small_svc, small_job = exporting_job(16)
    large_svc, large_job = exporting_job(64)
    # Execute
    small = traced_peak(lambda: export.export_final(small_svc, small_job))
    large = traced_peak(lambda: export.export_final(large_svc, large_job))
    # Assert
    done = large_svc.registry.get_job(large_job.job_id)
    assert done.status == DONE, done.error
    assert done.final_holdout_rows == 64 * ROWS_PER_PART
    assert done.head.holdout_accuracy > 0.9
    assert large <= 1.3 * small, (small, large)


def test_holdout_sample_is_uniform_reproducible_and_reads_old_manifests() -> None:
    """The evaluation sample draws ``max_rows`` distinct rows over all parts in proportion to
    their size, the same for the same seed; a manifest without per-part row counts (written
    before they were recorded) gives the same sample, its parts counted one at a time."""
    import dataclasses

    from bucketlearn.domain.deal import holdout_sample
    from bucketlearn.ingest.manifest import Manifest
    from bucketlearn.services.caches import JobRuntime

    # Prepare
    part_rows = [4096, 100, 4096, 0, 2000]
    svc, job = exporting_job(8)
    runtime = JobRuntime(svc, job)
    manifest = runtime.manifest
    old = JobRuntime(svc, job)
    old._manifest = Manifest.from_json(dataclasses.replace(manifest,
                                                           holdout_part_rows=[]).to_json())
    # Execute
    picks = holdout_sample(part_rows, 3000, seed=5)
    again = holdout_sample(part_rows, 3000, seed=5)
    other = holdout_sample(part_rows, 3000, seed=6)
    everything = holdout_sample(part_rows, 20_000, seed=5)
    # Assert
    assert [len(p) for p in picks] == [len(p) for p in again]
    assert all((a == b).all() for a, b in zip(picks, again, strict=True))
    assert any(len(a) != len(b) or (a != b).any() for a, b in zip(picks, other, strict=True))
    assert sum(len(p) for p in picks) == 3000 and len(picks[3]) == 0
    for pick, rows in zip(picks, part_rows, strict=True):
        assert len(np.unique(pick)) == len(pick) and (pick < max(rows, 1)).all()
    assert abs(len(picks[0]) - 3000 * 4096 / 10292) < 100
    assert [len(p) for p in everything] == part_rows
    assert old.holdout_part_rows() == [ROWS_PER_PART] * 8
    np.testing.assert_array_equal(old.holdout(5000)[0], runtime.holdout(5000)[0])
