"""The Model tab: a job's exported ``.keras`` models in the models bucket, and which versions
can be downloaded (and why the others cannot)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from bucketlearn import layout
from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import CANCELLED, FAILED, REJECTED
from bucketlearn.domain.version import Version
from bucketlearn.ports import BlobStore

_MODEL_FILE_RE = re.compile(r"^v(?P<version>\d{6})\.keras$")


@dataclass(frozen=True)
class ModelFile:
    """One exported ``.keras`` model in the models bucket."""

    path: str
    version: int | None  # None: latest.keras
    size: int

    @property
    def label(self) -> str:
        return "latest" if self.version is None else f"v{self.version}"

    @property
    def file_name(self) -> str:
        job_id = self.path.split("/")[1] if self.path.count("/") >= 2 else "model"
        return f"{job_id}-{self.label}.keras"


def model_files(store: BlobStore, models_bucket: str, job_id: str) -> list[ModelFile]:
    """Exported models of a job: latest first, then numbered versions, newest first."""
    latest = layout.model_path(job_id)
    prefix = latest.rsplit("/", 1)[0] + "/"
    found = []
    for info in store.list(models_bucket, prefix):
        base = info.name[len(prefix):]
        if info.name == latest:
            found.append(ModelFile(info.name, None, info.size))
        elif (match := _MODEL_FILE_RE.match(base)) is not None:
            found.append(ModelFile(info.name, int(match["version"]), info.size))
    return sorted(found, key=lambda f: (f.version is not None, -(f.version or 0)))


def download_note(job: Job, versions: Iterable[Version],
                  files: list[ModelFile]) -> str:
    """Which versions can be downloaded, and why the others cannot."""
    exported = {f.version for f in files if f.version is not None}
    numbers = (list(range(job.version + 1)) if job.version is not None  # versions are dense
               else sorted(v.version for v in versions))
    missing = [n for n in numbers if n not in exported]
    if job.status == CANCELLED and not files:
        if job.version is None:
            return "This job was cancelled before its first version: there is no model."
        return (f"This job was cancelled at v{job.version}. Its model is built from that "
                "version's stored weights when you download it (or run `bucketlearn download "
                f"{job.job_id}`).")
    if not any(f.version is None for f in files):
        if job.status in (REJECTED, FAILED):
            return "This job ended without a model, so there is nothing to download."
        return ("No model exported yet: the final version is exported as "
                f"{layout.model_path(job.job_id)} when training finishes.")
    if not missing:
        return ""
    span = f"v{missing[0]}" if len(missing) == 1 else f"v{missing[0]}–v{missing[-1]}"
    if len(missing) != missing[-1] - missing[0] + 1:
        span = f"{len(missing)} versions"
    return (f"Only exported versions can be downloaded; {span} exist only as internal "
            "training weights (no .keras export), so only the latest model is offered for them.")
