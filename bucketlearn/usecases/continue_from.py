"""A continued job's parent (the upload option ``continue_from``): found, checked, and what the
new job takes from it: its manifest (columns, vocabularies, scaling, classes: ``ingest.frozen``),
its model spec and the weights of the version it continues from, which become the new job's
version 0 as they are (a fresh optimizer state: the new job's schedule starts from its own
first step).

The parent must be a job that ended DONE, or CANCELLED with a version, trained without a
search (a searched job's model is the mean of several); the version is the one it exported (its
head: a DONE job's best by validation, a cancelled job's last; ``JOB@VERSION`` may name only
that one). Both are read from what the job keeps beside its model (``models/<JOB>/``:
``services.export.keep_for_continuing``, at a DONE job's export, at a cancelled job's wind-up),
which the upload function may read. Each refusal is an
``InvalidInputError`` the upload ends REJECTED with, naming what was expected and found.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from bucketlearn import codec, layout
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import CANCELLED, DONE
from bucketlearn.errors import InputProblem, InvalidInputError, NotFoundError
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ml.model import ModelSpec
from bucketlearn.options import OFF, SEARCH_AUTO, JobOptions
from bucketlearn.ports import Services


@dataclass(frozen=True)
class Parent:
    """What a continued job takes from the job it continues: ``version``'s ``weights``, and the
    parent's ``manifest`` and model ``spec``."""

    job_id: str
    version: int
    manifest: Manifest
    spec: ModelSpec
    weights: list[np.ndarray]

    def record(self) -> dict[str, Any]:
        """The continued job's ``continued_from`` field (its status shows it)."""
        return {"job_id": self.job_id, "version": self.version}

    def child_spec(self, options: JobOptions) -> ModelSpec:
        """The continued job's model spec: the parent's model, with the new job's learning
        rate (its options as budgeted) and seed."""
        return dataclasses.replace(self.spec, learning_rate=float(options.learning_rate),
                                   seed=options.seed)


def _refused(file: str, message: str, expected: str, found: str) -> InvalidInputError:
    return InvalidInputError(InputProblem(file=file, message=message, column=None,
                                          expected=expected, found=found))


def continued_options(options: JobOptions, file: str) -> JobOptions:
    """``options`` for a continued job: ``search=auto`` becomes off (one model continues).

    Raises:
        InvalidInputError: a search of N candidates was asked for.
    """
    if options.parent is None or options.search == OFF:
        return options
    if options.search != SEARCH_AUTO:
        raise _refused(file, "a continued job trains one model: it cannot search",
                       "search=off with continue_from", f"search={options.search}")
    return dataclasses.replace(options, search=OFF)


def find_parent(svc: Services, options: JobOptions, file: str) -> Parent | None:
    """The job ``options.continue_from`` names and what the new job takes from it; None when
    the option is not set.

    Raises:
        InvalidInputError: no such job; one that has not ended DONE (or CANCELLED with a
            version), or was searched; no such version, or its weights were not kept; its
            manifest is gone.
    """
    if options.parent is None:
        return None
    job_id, wanted = options.parent
    job = _finished_job(svc, job_id, file)
    assert job.head is not None and job.version is not None
    number = job.head.version if wanted is None else wanted
    version = svc.registry.get_version(job_id, number) if number <= job.version else None
    if version is None:
        raise _refused(file, f"job {job_id} has no version {number} to continue from",
                       f"a version from 0 to {job.version} (the one it exported: "
                       f"v{job.head.version})", f"v{number}")
    try:
        data = svc.store.read_bytes(svc.settings.models_bucket,
                                    layout.kept_weights_path(job_id, number))
    except NotFoundError:
        raise _refused(file, f"version {number} of job {job_id} is not kept to continue from",
                       f"the version it exported: {job_id}@{job.head.version}",
                       f"v{number}, whose weights went when the job ended"
                       + ("" if number != job.head.version else
                          " (a cancelled job's head is kept once it is wound up)")) from None
    if version.checksum and codec.checksum(data) != version.checksum:
        raise _refused(file, f"the kept state of version {number} of job {job_id} is not the "
                             "one its version document records", version.checksum,
                       codec.checksum(data))
    weights = codec.decode_state(data, f"weights of {job_id} v{number}")[0]
    return Parent(job_id, number, _manifest(svc, job_id, file),
                  ModelSpec.from_dict(dict(job.model or {})), weights)


def _finished_job(svc: Services, job_id: str, file: str) -> Job:
    """The parent's job document, once it is one a job may continue from."""
    job = svc.registry.get_job(job_id)
    if job is None:
        raise _refused(file, "no such job to continue from",
                       "the id of a job that ended DONE (bucketlearn status lists them)",
                       f"no job '{job_id}'")
    if not (job.status == DONE or job.status == CANCELLED) or job.head is None \
            or job.version is None or not job.model:
        raise _refused(file, f"job {job_id} has no finished model to continue from",
                       "a job that is DONE, or CANCELLED with a version",
                       f"{job.status}" + (f" ({job.phase})" if job.phase else "")
                       + ("" if job.head is not None else ", no version"))
    if job.search:
        raise _refused(file, f"job {job_id} was searched: its model is the mean of several",
                       "a job trained without search", f"a search of "
                       f"{job.search.get('count')} candidates")
    return job


def _manifest(svc: Services, job_id: str, file: str) -> Manifest:
    """The parent's manifest, kept beside its model (before its state: see
    ``keep_for_continuing``)."""
    try:
        return Manifest.from_json(svc.store.read_bytes(svc.settings.models_bucket,
                                                       layout.kept_manifest_path(job_id)))
    except NotFoundError:
        raise _refused(file, f"the columns of job {job_id} are not kept",
                       f"{layout.kept_manifest_path(job_id)} in the models bucket",
                       "no such object") from None
