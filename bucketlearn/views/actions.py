"""What the dashboard does besides showing: the words and the canceller of its "Cancel job"
button (the cancel itself is the core's ``cancel.cancel_job``, as for the CLI), and its upload
form: the options as object metadata, the object's name, the size limit, and the streamed write
(``upload_csv``). It never writes model state."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import IO, Any

from bucketlearn import layout
from bucketlearn.domain.job import Job
from bucketlearn.options import parse_option
from bucketlearn.ports import Services

IAP_USER_HEADER = "X-Goog-Authenticated-User-Email"  # "accounts.google.com:alice@example.com"
# The upload form: a file of at most UPLOAD_MAX_BYTES (and the deployment's
# max_file_bytes), written under UPLOAD_PREFIX/<random>/ with its base name cut to
# UPLOAD_NAME_CHARS characters.
UPLOAD_MAX_BYTES = 100 * 2**20
UPLOAD_PREFIX = "dashboard/"
UPLOAD_NAME_CHARS = 200


def canceller(headers: Mapping[str, str] | None) -> str:
    """Who cancels a job from the dashboard, as the job records it: the signed-in user when
    Identity-Aware Proxy names one, else just "the dashboard"."""
    found = {k.lower(): v for k, v in (headers or {}).items()}.get(IAP_USER_HEADER.lower())
    user = str(found or "").rsplit(":", 1)[-1].strip()
    user = "".join(ch for ch in user if ch.isprintable())[:200]
    return f"{user} (dashboard)" if user else "the dashboard"


def cancel_prompt(job: Job) -> str:
    """What the confirmation step says will happen."""
    version = job.version
    kept = (f"its last version, v{version}, stays downloadable" if version is not None
            else "it has no model version yet, so it will end without a model")
    return (f"Cancel job `{job.job_id}`? It ends as CANCELLED: workers skip its tasks "
            f"and no new version is made; {kept}. This cannot be undone.")


def option_metadata(raw: Mapping[str, Any]) -> dict[str, str]:
    """Form values -> object metadata. Blank means default (left out); bad values raise
    ConfigError naming the option, as the CLI does."""
    metadata = {}
    for name, value in raw.items():
        if value is None or str(value).strip() == "":
            continue
        metadata[name] = str(parse_option(name, value, "upload form"))
    return metadata


def upload_object_name(file_name: str) -> str:
    """A sanitized base name for an uploaded file: no folders, printable, at most
    ``UPLOAD_NAME_CHARS`` characters, ending in .csv."""
    base = re.split(r"[\\/]", file_name.strip())[-1].strip()
    base = "".join(ch for ch in base if ch.isprintable()) or "upload.csv"
    suffix = base[-4:] if base.lower().endswith(".csv") else ".csv"
    stem = base[:-4] if base.lower().endswith(".csv") else base
    return (stem or "upload")[:UPLOAD_NAME_CHARS - 4] + suffix


def upload_object_path(file_name: str) -> str:
    """Where the upload form writes a file: ``dashboard/<16 random hex>/<sanitized name>``, so
    two people uploading the same name never overwrite each other."""
    return f"{UPLOAD_PREFIX}{layout.new_nonce()}/{upload_object_name(file_name)}"


def upload_limit_bytes(settings: Any) -> int:
    """The largest file the upload form takes: the deployment's ``max_file_bytes``, and at most
    ``UPLOAD_MAX_BYTES`` (Streamlit holds an upload in the dashboard's memory until it is
    written; larger files go through ``bucketlearn submit`` or straight to the bucket)."""
    return min(int(settings.limits.max_file_bytes), UPLOAD_MAX_BYTES)


def upload_limit_mb(settings: Any) -> int:
    """``upload_limit_bytes`` in Streamlit's unit (``max_upload_size``: whole MB of 2**20 bytes,
    rounded down, at least 1)."""
    return max(1, upload_limit_bytes(settings) // 2**20)


def upload_size_problem(settings: Any, size: int) -> str | None:
    """Why the form refuses a file of ``size`` bytes (None: it takes it)."""
    limit = upload_limit_bytes(settings)
    if size <= limit:
        return None
    return (f"expected a file of at most {limit:,} bytes here; found {size:,} bytes. Upload "
            "larger files with `bucketlearn submit` or straight to the uploads bucket.")


def upload_csv(svc: Services, file_name: str, stream: IO[bytes], size: int,
               metadata: Mapping[str, str]) -> tuple[str, str]:
    """Write an uploaded CSV to the uploads bucket with its options, streamed from ``stream``
    (no second copy in memory) under a name of its own (``upload_object_path``); return
    (job id, gs:// uri). The upload function picks the object up from there, exactly as for
    ``bucketlearn submit``.

    Raises:
        ValueError: the file is larger than the form takes (``upload_size_problem``).
    """
    problem = upload_size_problem(svc.settings, size)
    if problem is not None:
        raise ValueError(problem)
    bucket = svc.settings.uploads_bucket
    name = upload_object_path(file_name)
    info = svc.store.write_stream(bucket, name, stream, "text/csv", dict(metadata), size=size)
    return layout.job_id_for(bucket, name, info.generation), f"gs://{bucket}/{name}"
