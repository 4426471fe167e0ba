"""Which Google API errors are worth retrying: the one list every adapter and the worker use.

The adapters translate what they catch into the project's own errors (``TransientError``,
``BackendRejectedError``); whatever escapes untranslated (a streamed read, a client library's
own retry giving up) is classified by ``is_transient``, which ``bootstrap.google_services``
hands to the services as ``Services.transient``.
"""

from __future__ import annotations

import requests
from google.api_core import exceptions as gexc

from bucketlearn import errors

# Unavailable, overloaded, timed out, contended or cut off: the same request may succeed later.
# The Cloud Storage client talks HTTP through requests, whose connection errors are not the
# built-in ConnectionError: a connection reset by the server mid-download (seen with
# fake-gcs-server under 55 concurrent uploads) must be retried like any other.
TRANSIENT: tuple[type[BaseException], ...] = (
    gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.InternalServerError,
    gexc.TooManyRequests, gexc.GatewayTimeout, gexc.Aborted, gexc.RetryError, ConnectionError,
    requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError,
    requests.exceptions.Timeout)
# Answers that sending the same request again cannot change (a document over 1 MiB is
# InvalidArgument). An adapter method's own handling comes first (e.g. FailedPrecondition on a
# conditional update means "someone else wrote first").
PERMANENT: tuple[type[BaseException], ...] = (
    gexc.InvalidArgument, gexc.BadRequest, gexc.OutOfRange, gexc.FailedPrecondition,
    gexc.LengthRequired, gexc.MethodNotAllowed, gexc.RequestRangeNotSatisfiable)


def is_transient(exc: BaseException) -> bool:
    """The project's own transient errors, network errors, and ``TRANSIENT`` Google errors."""
    return errors.is_transient(exc) or isinstance(exc, TRANSIENT)
