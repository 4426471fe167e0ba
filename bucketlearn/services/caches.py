"""Per-process caches of per-job things: manifest, compiled model, holdout sample, the last
training state read or made; and of shard parts (``PartCache``), which never change once the
split has written them.

The holdout is never held whole: it can be as large as half an upload (1 GB of arrays for a
2 GiB file). Versions are evaluated on a fixed random sample of it (``holdout``), read part by
part; the export evaluates on all of it, one part at a time (``holdout_parts``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from bucketlearn import codec, layout
from bucketlearn.codec import CorruptObjectError
from bucketlearn.domain.deal import holdout_sample
from bucketlearn.domain.job import Job
from bucketlearn.domain.recipe import VALIDATION_MAX_ROWS
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ingest.parts import load_part
from bucketlearn.ml.model import ModelSpec, build_model
from bucketlearn.ports import Services

# Jobs whose runtime (model, manifest, last version) a process keeps. Workers serve jobs that
# run at the same time in turns: with fewer entries than such jobs, every task rebuilt its
# job's model (a second or two of tracing each, and memory TensorFlow keeps until the process
# exits: 5.6 GB per learner after 27 minutes of three concurrent jobs with 2 entries).
MAX_JOBS_CACHED = 8
# One user of TensorFlow at a time in a process, whatever the job: the aggregator evaluates in
# a thread of its own and exports in each job's thread, and Keras builds and traces a model's
# predict function unguarded: five concurrent jobs can hang with an evaluation and five exports
# in TensorFlow at once. One call at a time costs nothing on 2 cores, where those calls compete
# for the CPU anyway.
MODEL_LOCK = threading.RLock()
# shard parts a learner reads at a time (``PartCache``)
PARALLEL_READS = 4
AHEAD = "parts-ahead"  # the thread that reads a learner's next task's parts


class JobRuntime:
    """What a process needs to train or evaluate one job; built lazily, reused across tasks."""

    lock = MODEL_LOCK  # one user of TensorFlow at a time (training, evaluation, export)

    def __init__(self, svc: Services, job: Job) -> None:
        self.svc = svc
        self.job_id = job.job_id
        self.job = job  # as first read here: what the split decided (options, plan, model)
        self.spec = ModelSpec.from_dict(job.model)
        self._manifest: Manifest | None = None
        self._model: Any = None
        self._holdout: tuple[int, np.ndarray, np.ndarray] | None = None  # (max_rows, x, y)
        self._validation: tuple[np.ndarray, np.ndarray] | None = None
        self._part_rows: list[int] | None = None
        self._state: tuple[str, list[np.ndarray], list[np.ndarray]] | None = None
        # the last state this process made or read, by its digest (``codec.state_digest``)
        self._kept: tuple[str, list[np.ndarray], list[np.ndarray]] | None = None

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            raw = self.svc.store.read_bytes(self.svc.settings.work_bucket,
                                            layout.manifest_path(self.job_id))
            self._manifest = Manifest.from_json(raw)
        return self._manifest

    @property
    def model(self) -> Any:
        if self._model is None:
            self._model = build_model(self.spec, self.manifest.mean, self.manifest.variance,
                                      self.manifest.schema, self.manifest.preprocessing)
            self.svc.cache.models_built += 1
        return self._model

    def holdout_parts(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The holdout's parts as (x, y), one at a time: memory for one part (~16 MiB), whatever
        the size of the holdout."""
        bucket = self.svc.settings.work_bucket
        for path in self.manifest.holdout_parts:
            x, y = load_part(self.svc.store, bucket, path)
            yield x, y
            del x, y  # released before the next part is read

    def holdout_part_rows(self) -> list[int]:
        """Rows of each holdout part: from the manifest, or (a manifest written before it
        recorded them) by reading each part once, one at a time."""
        if self._part_rows is None:
            rows = list(self.manifest.holdout_part_rows)
            if len(rows) != len(self.manifest.holdout_parts):
                rows = [len(y) for _, y in self.holdout_parts()]
            self._part_rows = rows
        return self._part_rows

    def holdout(self, max_rows: int) -> tuple[np.ndarray, np.ndarray]:
        """A fixed random sample of at most ``max_rows`` holdout rows (``read_holdout_sample``),
        kept for the next version's evaluation."""
        if self._holdout is not None and self._holdout[0] == max_rows:
            return self._holdout[1], self._holdout[2]
        self._holdout = None
        x, y = read_holdout_sample(self.svc, self.manifest, self.holdout_part_rows(), self.spec,
                                   max_rows)
        self._holdout = (max_rows, x, y)
        return x, y

    def validation(self) -> tuple[np.ndarray, np.ndarray]:
        """The validation sample checkpoints are scored on (``read_validation_sample``), kept."""
        if self._validation is None:
            self._validation = read_validation_sample(self.svc, self.manifest, self.spec)
        return self._validation

    def state(self, weights_path: str, digest: str = ""
              ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """A version's weights and optimizer state: the one kept in memory when ``digest``
        names it (the state this process's last task ended with, or the aggregator's last
        fold), else the last one read from ``weights_path``, else read now."""
        if digest and self._kept is not None and self._kept[0] == digest:
            return self._kept[1], self._kept[2]
        if self._state is None or self._state[0] != weights_path:
            raw = self.svc.store.read_bytes(self.svc.settings.models_bucket, weights_path)
            weights, optimizer, _ = codec.decode_state(raw, weights_path)
            self._state = (weights_path, weights, optimizer)
        return self._state[1], self._state[2]

    def keep(self, digest: str, weights: list[np.ndarray], optimizer: list[np.ndarray],
             weights_path: str = "") -> None:
        """Keep a state this process made (a task's end state; a fold it wrote to
        ``weights_path``), so the next task or fold from it reads nothing."""
        self._kept = (digest, weights, optimizer)
        if weights_path:
            self._state = (weights_path, weights, optimizer)

    def weights(self, weights_path: str) -> list[np.ndarray]:
        """A version's weights."""
        return self.state(weights_path)[0]


class PartCache:
    """Decoded shard parts by path, the most recently used kept up to ``max_bytes``: a part is
    written once by the split and never changes, and a learner trains the same job's shards
    every epoch (a 12,000-row image job read 38 MB of parts per task without it).

    Parts it lacks are read ``PARALLEL_READS`` at a time, and a learner that knows its next task
    reads that task's parts ahead (``prefetch``, one at a time on a thread of its own) while it
    trains the current one. One after another on the learner's thread, a 120,000-row table's
    first-epoch part reads took 1.9-2.4 s of its 10-second job on the local stack; in the cloud
    each is a storage round trip. A part being read is read once: ``rows`` waits for a read
    already under way (and reads the part again once if that read failed).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = 0
        self._parts: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._reading: dict[str, Future[tuple[np.ndarray, np.ndarray]]] = {}
        self._lock = threading.Lock()
        # their threads start with the first read each is given
        self._pool = ThreadPoolExecutor(PARALLEL_READS, thread_name_prefix="parts")
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix=AHEAD)

    def rows(self, svc: Services, paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The parts' rows, concatenated (x, y)."""
        wanted = [self._get(svc, path) for path in paths]
        loaded = [self._wait(svc, path, part) for path, part in zip(paths, wanted, strict=True)]
        if len(loaded) == 1:
            return loaded[0]
        return (np.concatenate([x for x, _ in loaded]), np.concatenate([y for _, y in loaded]))

    def _wait(self, svc: Services, path: str,
              part: tuple[np.ndarray, np.ndarray] | Future[tuple[np.ndarray, np.ndarray]],
              retry: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The part, once read; a read that failed (perhaps a read ahead, whose failure
        nobody was waiting for) is tried once more before its error is raised."""
        if not isinstance(part, Future):
            return part
        try:
            return part.result()
        except Exception:
            if not retry:
                raise
            return self._wait(svc, path, self._get(svc, path), retry=False)

    def prefetch(self, svc: Services, paths: Sequence[str]) -> None:
        """Start reading the parts not held or being read, one at a time (a read ahead that
        failed is forgotten: ``rows`` reads the part again)."""
        for path in paths:
            self._get(svc, path, ahead=True)

    def _get(self, svc: Services, path: str, ahead: bool = False
             ) -> tuple[np.ndarray, np.ndarray] | Future[tuple[np.ndarray, np.ndarray]]:
        """The part held, or the read under way (started here when there is none)."""
        with self._lock:
            found = self._parts.get(path)
            if found is not None:
                self._parts.move_to_end(path)
                if not ahead:
                    self.hits += 1
                return found
            reading = self._reading.get(path)
            if reading is None:
                pool = self._ahead if ahead else self._pool
                reading = self._reading[path] = pool.submit(self._read, svc, path)
            return reading

    def _read(self, svc: Services, path: str) -> tuple[np.ndarray, np.ndarray]:
        part = None
        try:
            part = load_part(svc.store, svc.settings.work_bucket, path)
            return part
        finally:
            with self._lock:  # held or being read, never neither: a part is read once
                self._reading.pop(path, None)
                if part is not None:
                    self._keep(path, part)

    def _keep(self, path: str, part: tuple[np.ndarray, np.ndarray]) -> None:
        """Count a read part and hold it, evicting the least recently used (under the lock)."""
        self.misses += 1
        size = part[0].nbytes + part[1].nbytes
        if size <= self.max_bytes and path not in self._parts:
            self._parts[path] = part
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (x, y) = self._parts.popitem(last=False)
                self.bytes -= x.nbytes + y.nbytes


def read_holdout_sample(svc: Services, manifest: Manifest, part_rows: list[int],
                        spec: ModelSpec, max_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed random sample of at most ``max_rows`` holdout rows a job's versions are
    evaluated on (``read_sample`` of the holdout's parts)."""
    return read_sample(svc, manifest.holdout_parts, part_rows, spec, max_rows)


def read_validation_sample(svc: Services, manifest: Manifest, spec: ModelSpec
                           ) -> tuple[np.ndarray, np.ndarray]:
    """The fixed sample of at most ``recipe.VALIDATION_MAX_ROWS`` validation rows a job's
    checkpoints are scored on (``read_sample`` of the validation parts): the same rows in
    ``train-local`` and in the pipeline."""
    return read_sample(svc, manifest.validation_parts, manifest.validation_part_rows, spec,
                       VALIDATION_MAX_ROWS)


def read_sample(svc: Services, parts: list[str], part_rows: list[int], spec: ModelSpec,
                max_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed random sample of at most ``max_rows`` rows of ``parts`` (``holdout_sample``:
    the same rows for the same ``part_rows`` and seed).

    Only the parts the sample draws from are read, one at a time, into arrays of the sample's
    size: memory is about ``max_rows`` rows and one part, whatever the size of the holdout.

    Raises:
        CorruptObjectError: a part has fewer rows than the manifest says.
    """
    picks = holdout_sample(part_rows, max_rows, spec.seed)
    rows = sum(len(pick) for pick in picks)
    x = np.empty((rows, spec.n_features), dtype=np.float32)
    y = np.empty(rows, dtype=np.float32 if spec.regression else np.int32)
    filled = 0
    bucket = svc.settings.work_bucket
    for path, pick in zip(parts, picks, strict=True):
        if len(pick) == 0:
            continue
        part_x, part_y = load_part(svc.store, bucket, path)
        if len(part_y) <= int(pick[-1]) or part_x.shape[1:] != x.shape[1:]:
            raise CorruptObjectError(
                f"{path}: expected a holdout part of at least {int(pick[-1]) + 1} rows of "
                f"{spec.n_features} features; found {len(part_y)} rows of shape "
                f"{part_x.shape[1:]}")
        x[filled:filled + len(pick)] = part_x[pick]
        y[filled:filled + len(pick)] = part_y[pick]
        filled += len(pick)
        del part_x, part_y
    return x, y


def part_cache(svc: Services) -> PartCache:
    """The process's shard-part cache (``Settings.worker_cache_bytes``)."""
    cache = svc.cache
    if cache.parts is None:
        cache.parts = PartCache(svc.settings.worker_cache_bytes)
    parts: PartCache = cache.parts
    return parts


def models_built(svc: Services) -> int:
    """Models this process has built (TensorFlow keeps some memory for each until exit)."""
    return svc.cache.models_built


def job_runtime(svc: Services, job: Job) -> JobRuntime:
    cache: OrderedDict[str, JobRuntime] = svc.cache.runtimes
    runtime = cache.get(job.job_id)
    if runtime is None:
        runtime = JobRuntime(svc, job)
        cache[job.job_id] = runtime
        while len(cache) > MAX_JOBS_CACHED:
            cache.popitem(last=False)
    cache.move_to_end(job.job_id)
    return runtime
