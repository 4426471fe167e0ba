"""One classification of retryable errors: the core's, extended by the adapters'."""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions as gexc

from bucketlearn import errors
from bucketlearn.adapters import google_errors
from bucketlearn.bootstrap import memory_services


@pytest.mark.parametrize(("exc", "core", "google"), [
    (errors.TransientError("x"), True, True),
    (ConnectionResetError("reset"), True, True),
    (gexc.ServiceUnavailable("down"), False, True),
    (gexc.DeadlineExceeded("slow"), False, True),
    (gexc.TooManyRequests("429"), False, True),
    (gexc.InvalidArgument("too big"), False, False),
    (errors.BackendRejectedError("refused"), False, False),
    (ValueError("a bug"), False, False),
    # requests' errors are OSErrors (the core's network errors); the storage adapter's retry and
    # its streamed reads test the adapters' list, which must hold them too
    (requests.exceptions.ConnectionError("('Connection aborted.', ConnectionResetError(104))"),
     True, True),
    (requests.exceptions.ChunkedEncodingError("cut off"), True, True),
], ids=["transient", "network", "unavailable", "deadline", "429", "invalid", "rejected", "bug",
        "http-reset", "http-cut-off"])
def test_transient_errors_are_classified_once(exc: BaseException, core: bool,
                                              google: bool) -> None:
    """The core knows its own errors and the network's; the Google adapters add their
    retryable API errors, and never call a permanent answer transient."""
    # Execute / Assert
    assert errors.is_transient(exc) is core
    assert google_errors.is_transient(exc) is google
    assert isinstance(exc, google_errors.TRANSIENT) is (google and not isinstance(
        exc, errors.TransientError))


def test_services_carry_the_classification_of_their_backends() -> None:
    """In-memory services need only the core's classification; the worker asks the services."""
    # Execute
    svc = memory_services()
    # Assert
    assert svc.transient is errors.is_transient
    assert not set(google_errors.PERMANENT) & set(google_errors.TRANSIENT)
