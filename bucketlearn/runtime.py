"""Per-process caches of per-job things: manifest, compiled model, holdout, head weights."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from bucketlearn import codec, layout
from bucketlearn.bootstrap import Services
from bucketlearn.ingest import Manifest, load_parts
from bucketlearn.model import ModelSpec, build_model

MAX_JOBS_CACHED = 2


class JobRuntime:
    """What a process needs to train or evaluate one job; built lazily, reused across tasks."""

    def __init__(self, svc: Services, job: dict[str, Any]) -> None:
        self.svc = svc
        self.job_id = job["job_id"]
        self.spec = ModelSpec.from_dict(job["model"])
        self._manifest: Manifest | None = None
        self._model: Any = None
        self._holdout: tuple[np.ndarray, np.ndarray] | None = None
        self._state: tuple[str, list[np.ndarray], list[np.ndarray]] | None = None

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
            self._model = build_model(self.spec, self.manifest.mean, self.manifest.variance)
        return self._model

    def holdout(self, max_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The holdout rows; with ``max_rows``, a fixed random subset (all classes represented)."""
        if self._holdout is None:
            self._holdout = load_parts(self.svc.store, self.svc.settings.work_bucket,
                                       self.manifest.holdout_parts)
        x, y = self._holdout
        if max_rows is None or len(y) <= max_rows:
            return x, y
        pick = np.sort(np.random.default_rng([self.spec.seed, 31]).choice(len(y), max_rows,
                                                                          replace=False))
        return x[pick], y[pick]

    def state(self, weights_path: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """A version's weights and optimizer state (the last one read is kept: workers mostly
        ask for the version their round trains from)."""
        if self._state is None or self._state[0] != weights_path:
            raw = self.svc.store.read_bytes(self.svc.settings.models_bucket, weights_path)
            weights, optimizer, _ = codec.decode_state(raw, weights_path)
            self._state = (weights_path, weights, optimizer)
        return self._state[1], self._state[2]

    def weights(self, weights_path: str) -> list[np.ndarray]:
        """A version's weights."""
        return self.state(weights_path)[0]


def job_runtime(svc: Services, job: dict[str, Any]) -> JobRuntime:
    cache: OrderedDict[str, JobRuntime] = svc.cache.setdefault("runtimes", OrderedDict())
    runtime = cache.get(job["job_id"])
    if runtime is None:
        runtime = JobRuntime(svc, job)
        cache[job["job_id"]] = runtime
        while len(cache) > MAX_JOBS_CACHED:
            cache.popitem(last=False)
    cache.move_to_end(job["job_id"])
    return runtime
