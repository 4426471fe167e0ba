"""``faults.Faulty`` and ``faults.inject``: a port with named calls replaced, the rest its own."""

from __future__ import annotations

from typing import Any

import pytest

from bucketlearn.bootstrap import memory_services
from bucketlearn.errors import TransientError
from bucketlearn.faults import Faulty, inject


def test_a_replaced_call_gets_the_real_one_and_the_rest_reads_through():
    # Prepare
    svc = memory_services()
    bucket = svc.settings.work_bucket
    calls: list[str] = []

    def noted(real: Any, bucket: str, name: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real(bucket, name, *args, **kwargs)

    # Execute
    faulty = inject(svc, "store", write_bytes=noted)
    faulty.store.write_bytes(bucket, "a", b"1", "text/plain")
    svc.store.write_bytes(bucket, "b", b"2", "text/plain")
    # Assert: only calls through the wrapper are replaced; both see the same objects
    assert calls == ["a"]
    assert isinstance(faulty.store, Faulty) and faulty.store.port is svc.store
    assert faulty.store.read_bytes(bucket, "b") == b"2" and svc.store.read_bytes(bucket, "a") == b"1"
    assert faulty.registry is svc.registry and faulty.settings is svc.settings


def test_a_fault_may_fail_the_call_without_calling_the_port():
    # Prepare
    svc = memory_services()

    def down(real: Any, *args: Any, **kwargs: Any) -> Any:
        raise TransientError("unreachable (injected)")

    faulty = inject(svc, "registry", get_job=down)
    # Execute / Assert
    with pytest.raises(TransientError, match="injected"):
        faulty.registry.get_job("nope-000000000000")
    assert svc.registry.get_job("nope-000000000000") is None


def test_a_call_the_port_does_not_have_is_refused():
    with pytest.raises(AttributeError, match="no call 'comit_version'"):
        inject(memory_services(), "registry", comit_version=lambda real, commit: True)
