"""Errors: one base class, narrow subclasses, messages that say what was expected and found.

Entry points map these to outcomes: a ``PermanentError`` rejects (ack, record the reason),
a ``TransientError`` retries (nack / non-2xx), anything else is a bug and is retried too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class BucketlearnError(Exception):
    """Base class for every error bucketlearn raises on purpose."""


class PermanentError(BucketlearnError):
    """Retrying cannot help: the input or the job is wrong."""


class TransientError(BucketlearnError):
    """A backend was unavailable or contended; the same call may succeed later."""


class UnreachableError(TransientError):
    """A backend has not answered for longer than the caller was prepared to wait."""


class NoTargetError(BucketlearnError):
    """The CLI has nothing to talk to: no local stack runs here (or the one recorded here has
    stopped) and no cloud project is configured, or no credentials are."""


class ConfigError(PermanentError):
    """A setting or an upload option has a value bucketlearn cannot use."""

    def __init__(self, key: str, expected: str, found: Any, source: str = "") -> None:
        self.key = key
        self.expected = expected
        self.found = found
        self.source = source
        where = f" (from {source})" if source else ""
        super().__init__(f"option '{key}'{where}: expected {expected}; found: {found!r}")


MAX_REASON_CHARS = 1000  # each text of a reason (file, message, column, expected, found)


def is_transient(exc: BaseException) -> bool:
    """Trouble that retrying may cure: a ``TransientError`` or a network error (``OSError``).

    Backend-specific errors are added by the adapters (``adapters.google_errors.is_transient``,
    injected as ``Services.transient``)."""
    return isinstance(exc, TransientError | OSError)


def bounded(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis and the full length mark a cut)."""
    if len(text) <= limit:
        return text
    suffix = f"…({len(text)} characters)"
    return text[: max(0, limit - len(suffix))] + suffix


@dataclass
class InputProblem:
    """Where and why an uploaded file is unusable; travels into the REJECTED job document.

    Every text is bounded (``MAX_REASON_CHARS``): parts of it come from the upload, and the
    job document that stores it holds at most 1 MiB.
    """

    file: str
    message: str
    row: int | None = None
    column: str | None = None
    expected: str | None = None
    found: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.file = bounded(self.file)
        self.message = bounded(self.message)
        self.column = None if self.column is None else bounded(self.column)
        self.expected = None if self.expected is None else bounded(self.expected)
        self.found = None if self.found is None else bounded(self.found)

    def describe(self) -> str:
        """One sentence naming the file, the row and column, what was expected and found."""
        where = [self.file]
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.column is not None:
            where.append(f"column '{self.column}'")
        text = ", ".join(where) + ": " + self.message
        if self.expected is not None:
            text += f"; expected {self.expected}"
        if self.found is not None:
            text += f"; found: {self.found}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "row": self.row,
            "column": self.column,
            "message": self.message,
            "expected": self.expected,
            "found": self.found,
        }


class InvalidInputError(PermanentError):
    """The uploaded CSV cannot be trained on; ``problem`` says where and why."""

    def __init__(self, problem: InputProblem) -> None:
        self.problem = problem
        super().__init__(problem.describe())


class BackendRejectedError(PermanentError):
    """A backend refused a request as invalid (e.g. a Firestore document over 1 MiB).

    Sending the same request again cannot succeed: the adapters raise this for a backend's
    permanent answers (InvalidArgument and the like), the in-memory registry for a document
    Firestore would refuse.
    """


class NotFoundError(BucketlearnError):
    """A blob, job or version that was asked for does not exist."""


class ObjectChangedError(PermanentError):
    """The generation of an object that was asked for is gone: replaced or deleted.

    Raised when a read is pinned to a generation (an upload is read at its event's generation)
    and the object is no longer that generation, before or while it is read.
    """

    def __init__(self, bucket: str, name: str, expected_generation: int,
                 found_generation: int | None) -> None:
        self.bucket = bucket
        self.name = name
        self.expected_generation = expected_generation
        self.found_generation = found_generation
        shown = name if len(name) <= 200 else name[:200] + "…"
        super().__init__(f"gs://{bucket}/{shown!r}: expected generation {expected_generation}; "
                         f"found {self.found}")

    @property
    def found(self) -> str:
        """What the object is now, for a reason: 'generation N' or 'no object'."""
        if self.found_generation is None:
            return "no object"
        return f"generation {self.found_generation}"


class JobStateError(PermanentError):
    """An operation does not fit the job's current state (e.g. download before any version)."""
