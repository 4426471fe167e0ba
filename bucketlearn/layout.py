"""Names: job ids, task ids and every object path bucketlearn writes.

Object names written by bucketlearn are built only from job ids, numbers and random nonces, never
from a user's object name, so nothing a user uploads can steer a write elsewhere.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

_SLUG_RE = re.compile(r"[^a-z0-9]+")
JOB_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}-[0-9a-f]{12}$")
DELTA_RE = re.compile(
    r"^(?P<job>[a-z0-9-]+)/e(?P<epoch>\d{4,})/t(?P<task>\d{5,})/(?P<nonce>[0-9a-f]{16})"
    r"(?P<kind>\.safetensors|\.failed\.json)$"
)
SEGMENT_RE = re.compile(
    r"^(?P<job>[a-z0-9-]+)/search/c(?P<candidate>\d{3,})/r(?P<rung>\d{2,})/"
    r"(?P<nonce>[0-9a-f]{16})\.safetensors$")


def job_id_for(bucket_name: str, object_name: str, generation: int | str) -> str:
    """Derive the job id of one upload: the same (bucket, object, generation) gives the same id.

    Returns:
        ``<slug>-<12 hex>``, e.g. ``digits-3f2a9c1b7e4d``; the slug is for people, the hash for
        uniqueness.
    """
    base = object_name.rsplit("/", 1)[-1]
    if base.lower().endswith(".csv"):
        base = base[:-4]
    slug = _SLUG_RE.sub("-", base.lower()).strip("-")[:28].strip("-") or "upload"
    digest = hashlib.sha256(f"{bucket_name}\x00{object_name}\x00{generation}".encode()).hexdigest()
    return f"{slug}-{digest[:12]}"


def is_job_id(text: str) -> bool:
    return bool(JOB_ID_RE.match(text))


def task_id_for(job_id: str, epoch: int, task_index: int) -> str:
    return f"{job_id}:e{epoch:04d}:t{task_index:05d}"


def new_nonce() -> str:
    return secrets.token_hex(8)


# --- work bucket -------------------------------------------------------------------------------

def shard_part_path(job_id: str, task_index: int, part: int) -> str:
    return f"jobs/{job_id}/shards/t{task_index:05d}/part-{part:04d}.safetensors"


def holdout_part_path(job_id: str, part: int) -> str:
    return f"jobs/{job_id}/holdout/part-{part:04d}.safetensors"


def validation_part_path(job_id: str, part: int) -> str:
    return f"jobs/{job_id}/validation/part-{part:04d}.safetensors"


def pack_prefix(job_id: str) -> str:
    """The prefix of the objects a job's parts (its shards' and its holdout's) are packed into
    (``parts.PartWrites``)."""
    return f"jobs/{job_id}/shards/pack-"


def manifest_path(job_id: str) -> str:
    return f"jobs/{job_id}/manifest.json"


def kept_manifest_path(job_id: str) -> str:
    """An ended job's manifest, kept in the models bucket beside its model (the work bucket's
    copy is deleted when the job is wound up): what a job continued from it reads."""
    return f"models/{job_id}/manifest.json"


def kept_weights_path(job_id: str, version: int) -> str:
    """An ended job's exported version's training state, kept beside its model: what a job
    continued from it starts from (the upload function reads ``models/``, not ``weights/``)."""
    return f"models/{job_id}/v{version:06d}.safetensors"


def job_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/"


# --- models bucket -----------------------------------------------------------------------------

def weights_path(job_id: str, version: int, nonce: str) -> str:
    """Write-once name of a version's weights; the nonce makes a crashed attempt's object unique."""
    return f"weights/{job_id}/v{version:06d}-{nonce}.safetensors"


def model_path(job_id: str, version: int | None = None) -> str:
    """The exported Keras model: ``models/<job>/latest.keras`` or ``models/<job>/v000012.keras``."""
    if version is None:
        return f"models/{job_id}/latest.keras"
    return f"models/{job_id}/v{version:06d}.keras"


def predictions_path(job_id: str, name: str) -> str:
    """A batch prediction's output: ``predictions/<job>/<name>.csv`` (``name`` as
    ``parse_predict_name`` checked it: one path segment of the request's object name)."""
    return f"predictions/{job_id}/{name}.csv"


PREDICTION_PARTS_PREFIX = "predictions/.parts/"  # a lifecycle rule deletes what is left here


def prediction_part_path(job_id: str, request_id: str, part: int) -> str:
    """One part of a fanned-out request's output, composed into ``predictions_path`` and then
    deleted: ``predictions/.parts/<job>/<request>/<part>.csv``."""
    return f"{PREDICTION_PARTS_PREFIX}{job_id}/{request_id}/{part:03d}.csv"


# --- uploads bucket: batch prediction requests --------------------------------------------------

PREDICT_PREFIX = "predict/"  # an object here is a request to predict, not an upload to train on
PREDICT_NAME_RE = re.compile(r"^predict/(?P<job>[^/]+)/(?P<name>[^/]+)\.csv$", re.IGNORECASE)
_PREDICT_NAME_CHARS = re.compile(r"^[A-Za-z0-9._ -]{1,200}$")


def predict_object_name(job_id: str, file_name: str) -> str:
    """Where a file is uploaded to be predicted with ``job_id``'s model."""
    return f"predict/{job_id}/{file_name}"


def parse_predict_name(object_name: str) -> tuple[str, str] | None:
    """(job id, name without ``.csv``) of ``predict/<JOB>/<NAME>.csv``; None for any other
    name, or when JOB is not a job id or NAME holds characters other than letters, digits,
    ``.``, ``_``, ``-`` and spaces (it names the output object)."""
    found = PREDICT_NAME_RE.match(object_name)
    if found is None or not is_job_id(found["job"]) or found["name"] in (".", "..") \
            or not _PREDICT_NAME_CHARS.match(found["name"]):
        return None
    return found["job"], found["name"]


def prediction_id_for(object_name: str, generation: int | str) -> str:
    """The id of the request one generation of a ``predict/`` object makes: the same object
    and generation (a re-delivered event) give the same id, a new generation a new one.

    Returns:
        ``<slug>-<generation>-<8 hex>``: the slug and generation for people, the hash for
        uniqueness.
    """
    base = object_name.rsplit("/", 1)[-1]
    base = base[:-4] if base.lower().endswith(".csv") else base
    slug = _SLUG_RE.sub("-", base.lower()).strip("-")[:28].strip("-") or "predict"
    digest = hashlib.sha256(f"{object_name}\x00{generation}".encode()).hexdigest()
    return f"{slug}-{generation}-{digest[:8]}"


# --- deltas bucket -----------------------------------------------------------------------------

def job_delta_prefix(job_id: str) -> str:
    """Everything of one job in the deltas bucket: results and failure markers."""
    return f"{job_id}/"


def epoch_delta_prefix(job_id: str, epoch: int) -> str:
    return f"{job_id}/e{epoch:04d}/"


def delta_path(job_id: str, epoch: int, task_index: int, nonce: str) -> str:
    """Write-once name of one training attempt's delta."""
    return f"{job_id}/e{epoch:04d}/t{task_index:05d}/{nonce}.safetensors"


def failure_marker_path(job_id: str, epoch: int, task_index: int, nonce: str) -> str:
    """Written when a task failed for good, so that the aggregator hears about it."""
    return f"{job_id}/e{epoch:04d}/t{task_index:05d}/{nonce}.failed.json"


def segment_prefix(job_id: str) -> str:
    """A searched job's segment results (``loops.segment``), apart from any round's."""
    return f"{job_id}/search/"


def segment_path(job_id: str, candidate: int, rung: int, nonce: str) -> str:
    """Write-once name of one segment's end state: candidate ``candidate`` through rung
    ``rung``."""
    return f"{job_id}/search/c{candidate:03d}/r{rung:02d}/{nonce}.safetensors"


def parse_segment_path(name: str) -> tuple[str, int, int] | None:
    """(job, candidate, rung) of a segment result's name; None for any other name."""
    match = SEGMENT_RE.match(name)
    return (match["job"], int(match["candidate"]), int(match["rung"])) if match else None


@dataclass(frozen=True)
class DeltaName:
    job_id: str
    epoch: int
    task_index: int
    nonce: str
    failed: bool


def parse_delta_path(name: str) -> DeltaName | None:
    """Parse a deltas-bucket object name; None for objects bucketlearn did not write."""
    match = DELTA_RE.match(name)
    if not match:
        return None
    return DeltaName(
        job_id=match["job"],
        epoch=int(match["epoch"]),
        task_index=int(match["task"]),
        nonce=match["nonce"],
        failed=match["kind"] == ".failed.json",
    )
