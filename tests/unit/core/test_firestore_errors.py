"""How the Firestore registry turns a Google error into the project's (``_translated``)."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc

from bucketlearn.adapters.firestore import _translated
from bucketlearn.errors import BackendRejectedError, TransientError


def raising(exc: BaseException):
    def commit_version() -> None:
        raise exc

    return _translated(commit_version)


@pytest.mark.parametrize("message", ["Transaction is invalid or closed.",
                                     "The referenced transaction has expired or is no longer valid."])
def test_a_transaction_the_backend_lost_is_worth_retrying(message: str) -> None:
    """After an outage mid-commit the backend answers InvalidArgument about the transaction:
    running the method again begins a new one."""
    with pytest.raises(TransientError, match="commit version"):
        raising(gexc.InvalidArgument(message))()


def test_any_other_invalid_argument_is_a_permanent_answer() -> None:
    with pytest.raises(BackendRejectedError, match="over 1 MiB"):
        raising(gexc.InvalidArgument("document over 1 MiB"))()
