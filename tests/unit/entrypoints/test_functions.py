"""The upload entry point with built CloudEvents: what reaches Eventarc as 200 (ack) or 503
(retry), and how backend errors are classified at the Firestore adapter.

Events are built as the local relay sends them (``relay.cloudevent_for``, binary mode) and
parsed by the CloudEvents SDK, as the functions framework does. A write that
Firestore refuses for good (InvalidArgument, e.g. a document over 1 MiB) used to escape as an
exception (HTTP 500), so Eventarc retried the event for a day.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from typing import Any

import pytest
from cloudevents.http import from_http
from google.api_core import exceptions as gexc

from bucketlearn import layout
from bucketlearn.adapters.firestore import FirestoreRegistry
from bucketlearn.adapters.memory import FIRESTORE_MAX_DOCUMENT_BYTES, MemoryRegistry
from bucketlearn.bootstrap import memory_services
from bucketlearn.config import Limits, Settings
from bucketlearn.domain.lifecycle import FAILED
from bucketlearn.entrypoints import functions as entrypoints
from bucketlearn.errors import BackendRejectedError, TransientError
from bucketlearn.local.relay import cloudevent_for
from tests.unit.helpers import csv_bytes


def built_event(svc: Any, name: str, data: bytes, metadata: dict[str, str] | None = None) -> Any:
    """Upload ``data`` as ``name`` and build the finalize CloudEvent the trigger would send."""
    info = svc.store.write_bytes(svc.settings.uploads_bucket, name, data, "text/csv",
                                 metadata=metadata)
    headers, body = cloudevent_for(info)
    return from_http(headers, json.dumps(body))


def many_long_labels_csv(classes: int, label_bytes: int) -> bytes:
    """Two rows of each of ``classes`` classes whose labels are ``label_bytes`` long."""
    labels = [f"{c:05d}".ljust(label_bytes, "x") for c in range(classes)]
    return csv_bytes(["f", "label"], [[i % 7, label] for label in labels for i in range(2)])


def test_document_over_1_mib_fails_the_job_and_acks_the_event(caplog):
    """5,000 classes with 250-byte names (a deployment that raised max_classes): the job
    document with the dataset summary is over 1 MiB, which Firestore refuses for good. The job
    ends FAILED saying so, its shards are removed, and the function returns (HTTP 200)."""
    # Prepare
    svc = memory_services(Settings(limits=Limits(max_classes=6_000)))
    event = built_event(svc, "many-classes.csv", many_long_labels_csv(5_000, 250),
                        {"epochs": "1", "rows_per_shard": "1000"})
    job_id = layout.job_id_for(event.data["bucket"], event.data["name"],
                               int(event.data["generation"]))
    # Execute
    with caplog.at_level(logging.ERROR, logger="bucketlearn"):
        answer = entrypoints.handle_upload_event(event, svc)
    # Assert
    job = svc.registry.get_job(job_id)
    assert answer == "failed"
    assert job.status == FAILED and job.is_terminal
    assert job.error.startswith(f"gs://{svc.settings.uploads_bucket}/many-classes.csv: a "
                                   "backend refused to store the job's state")
    assert f"expected a document of at most {FIRESTORE_MAX_DOCUMENT_BYTES} bytes" in job.error
    assert len(job.error) <= 2000
    assert list(svc.store.list(svc.settings.work_bucket, layout.job_prefix(job_id))) == []
    assert svc.queue.published == []
    assert any("failed" in r.getMessage() for r in caplog.records)


class RefusingRegistry(MemoryRegistry):
    """create_job raises what it is given (a backend that is down, or refuses the document)."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def create_job(self, job: Any) -> bool:
        raise self.error


class RefusingByName(MemoryRegistry):
    """create_job refuses the job of an upload named permanent.csv for good (Firestore's
    InvalidArgument) and that of outage.csv for now (ServiceUnavailable)."""

    def create_job(self, job: Any) -> bool:
        raise {"permanent.csv": BackendRejectedError("firestore create job: InvalidArgument"),
               "outage.csv": TransientError("firestore create job: ServiceUnavailable"),
               }[job.source["name"]]


def refusing_services() -> Any:
    """In-memory Services whose registry is a ``RefusingByName``: the factory the framework
    test's function is built on (``FUNCTION_SOURCE``)."""
    return dataclasses.replace(memory_services(), registry=RefusingByName())


# A function source as functions/main.py is, built on the factory above: the framework loads a
# source file by path, so the test hands the handler its Services in the file it loads.
FUNCTION_SOURCE = '''
import functions_framework

from bucketlearn.entrypoints import functions as entrypoints
from tests.unit.entrypoints.test_functions import refusing_services

on_upload = functions_framework.cloud_event(entrypoints.upload_handler(refusing_services))
'''


def test_permanent_refusal_of_the_job_document_is_acked():
    """create_job refused for good: there is no job to end; the function logs and returns."""
    # Prepare
    svc = memory_services()
    svc.registry = RefusingRegistry(BackendRejectedError("firestore create job: InvalidArgument"))
    event = built_event(svc, "a.csv", csv_bytes(["x", "label"], [[i, i % 2] for i in range(20)]))
    # Execute
    answer = entrypoints.handle_upload_event(event, svc)
    # Assert
    assert answer == "failed"
    assert svc.registry.jobs == {}


def test_transient_backend_trouble_is_still_retried():
    """A backend that is down answers 503 (RetryLater): Eventarc retries, nothing is ended."""
    # Prepare
    svc = memory_services()
    svc.registry = RefusingRegistry(TransientError("firestore create job: ServiceUnavailable"))
    event = built_event(svc, "b.csv", csv_bytes(["x", "label"], [[i, i % 2] for i in range(20)]))
    # Execute
    with pytest.raises(entrypoints.RetryLater) as excinfo:
        entrypoints.handle_upload_event(event, svc)
    # Assert
    assert excinfo.value.code == 503
    assert "ServiceUnavailable" in excinfo.value.description


def test_function_answers_200_for_a_permanent_refusal_and_503_for_an_outage(tmp_path):
    """Through the functions framework, as Eventarc sees it: the upload handler built as
    functions/main.py builds it (``upload_handler``), handed ``refusing_services``."""
    # Prepare
    import functions_framework

    source = tmp_path / "upload_function.py"
    source.write_text(FUNCTION_SOURCE, encoding="utf-8")
    client = functions_framework.create_app(target="on_upload", source=str(source),
                                            signature_type="cloudevent").test_client()
    uploads = memory_services()  # the objects the events name (the same bucket as the function's)
    data = csv_bytes(["x", "label"], [[i, i % 2] for i in range(20)])
    answers = []
    for name in ("permanent.csv", "outage.csv"):
        info = uploads.store.write_bytes(uploads.settings.uploads_bucket, name, data, "text/csv")
        headers, body = cloudevent_for(info)
        # Execute
        answers.append(client.post("/", headers=headers, json=body).status_code)
    # Assert
    assert answers == [200, 503]


def test_functions_main_is_the_upload_handler_and_makes_its_services_on_the_first_event():
    """functions/main.py as the framework loads it: ``on_upload`` is a CloudEvent function
    built by ``upload_handler`` on ``bootstrap.process_services``, which loading it does not
    call (no Google client is made before an event comes)."""
    # Prepare
    import functions_framework

    from bucketlearn.bootstrap import process_services
    from tests.unit.helpers import REPO_DIR

    made_before = process_services.cache_info()
    # Execute
    app = functions_framework.create_app(target="on_upload",
                                         source=str(REPO_DIR / "functions" / "main.py"))
    # Assert
    served = sys.modules["main"].on_upload  # the module the framework loaded main.py as
    assert served.__wrapped__.__qualname__ == "upload_handler.<locals>.on_upload"
    assert "cloudevent" in app.view_functions
    assert process_services.cache_info() == made_before


@pytest.mark.parametrize("raised, expected", [
    (gexc.InvalidArgument("Document jobs/x cannot be written because its size (1,148,602 "
                          "bytes) exceeds the maximum allowed size of 1,048,576 bytes."),
     BackendRejectedError),
    (gexc.FailedPrecondition("The Cloud Firestore API is not available for Datastore Mode"),
     BackendRejectedError),
    (gexc.ServiceUnavailable("connection refused"), TransientError),
    (gexc.DeadlineExceeded("deadline"), TransientError),
], ids=["invalid-argument", "failed-precondition", "unavailable", "deadline"])
def test_firestore_adapter_classifies_backend_errors(raised, expected):
    """Whatever escapes a FirestoreRegistry method is TransientError or BackendRejectedError
    (a PermanentError), never a google.api_core exception."""
    # Prepare
    class Client:
        def collection(self, name: str) -> Any:
            return self

        def document(self, name: str) -> Any:
            return self

        def update(self, fields: Any, timeout: float) -> None:
            raise raised

    registry = FirestoreRegistry(Settings(), client=Client())
    # Execute
    with pytest.raises(expected) as excinfo:
        registry.update_job("j-000000000000", {"error": "x"})
    # Assert
    assert type(raised).__name__ in str(excinfo.value)
    assert str(excinfo.value).startswith("firestore update job")


@pytest.mark.parametrize("call", [
    lambda r: r.get_job("j"), lambda r: r.get_version("j", 1), lambda r: r.list_versions("j"),
    lambda r: r.get_task("j", "t"), lambda r: r.list_tasks("j"),
    lambda r: r.list_workers(), lambda r: r.get_control("c"), lambda r: r.heartbeat("w", {}),
    lambda r: r.list_jobs(), lambda r: r.list_active_jobs(),
    lambda r: r.read_for_attempt("j", "t"), lambda r: r.record_attempt("j", "t", {}, "k", []),
    lambda r: r.refund_attempt("j", "t", "k"),
], ids=["get_job", "get_version", "list_versions", "get_task", "list_tasks",
        "list_workers", "get_control", "heartbeat", "list_jobs", "list_active_jobs",
        "read_for_attempt", "record_attempt", "refund_attempt"])
def test_every_firestore_read_turns_an_outage_into_a_transient_error(call):
    """Reads included: a backend that does not answer is a TransientError (retried), whichever
    method met it, not a google.api_core exception that the caller cannot classify."""
    # Prepare
    class Down:
        def __getattr__(self, name: str) -> Any:
            def fail(*args: Any, **kwargs: Any) -> Any:
                if name in ("collection", "document", "order_by", "limit", "where"):
                    return self
                raise gexc.ServiceUnavailable("connection refused")
            return fail

    registry = FirestoreRegistry(Settings(), client=Down())
    # Execute / Assert
    with pytest.raises(TransientError, match="ServiceUnavailable: 503 connection refused"):
        call(registry)
