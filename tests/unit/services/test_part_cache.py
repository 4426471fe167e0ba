"""The learner's shard-part cache: parts read in parallel, read ahead, and each read once."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import pytest

from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.bootstrap import memory_services
from bucketlearn.faults import inject
from bucketlearn.ingest.parts import encode_part
from bucketlearn.services.caches import AHEAD, PartCache
from tests.unit.helpers import wait_until


class GatedStore(MemoryBlobStore):
    """Counts the reads of each object; holds them while ``gate`` is clear; fails the first
    read of the names in ``fail_once``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.reads: dict[str, int] = {}
        self.fail_once: set[str] = set()
        self._count = threading.Lock()

    def read_bytes(self, bucket: str, name: str) -> bytes:
        with self._count:
            self.reads[name] = self.reads.get(name, 0) + 1
        assert self.gate.wait(10), "a test left its reads held"
        if name in self.fail_once:
            self.fail_once.discard(name)
            raise OSError(f"{name}: read failed")
        return super().read_bytes(bucket, name)


def parts_in(svc: Any, count: int) -> list[str]:
    """``count`` one-row parts whose single feature is the part's number."""
    names = []
    for i in range(count):
        name = f"job/shard-{i}.part"
        data = encode_part(np.full((1, 1), i, np.float32), np.asarray([i], np.int32))
        svc.store.write_bytes(svc.settings.work_bucket, name, data, "application/octet-stream")
        names.append(name)
    return names


def rows_once_reading(svc: Any, cache: PartCache, names: list[str], own: str
                      ) -> tuple[bool, Any]:
    """``cache.rows(names)`` asked for in a thread while the store holds its reads; the reads
    let go once ``rows`` has started its own read of ``own``. Returns whether it had, and the
    rows (the thread is joined)."""
    found: list[Any] = []
    asking = threading.Thread(target=lambda: found.append(cache.rows(svc, names)))
    asking.start()
    asked = wait_until(lambda: svc.store.reads.get(own) == 1, timeout=5)
    svc.store.gate.set()
    asking.join(timeout=10)
    assert not asking.is_alive() and found, "rows did not answer"
    return asked, found[0]


@pytest.fixture
def svc() -> Any:
    return dataclasses.replace(memory_services(), store=GatedStore())


def test_rows_come_in_the_order_asked_for_however_the_reads_end(svc):
    # Prepare
    names = parts_in(svc, 6)
    cache = PartCache(max_bytes=1 << 20)
    # Execute
    x, y = cache.rows(svc, names[::-1])
    again_x, _ = cache.rows(svc, names[::-1])
    # Assert
    assert x[:, 0].tolist() == [5, 4, 3, 2, 1, 0] and y.tolist() == [5, 4, 3, 2, 1, 0]
    assert again_x.tolist() == x.tolist()
    assert svc.store.reads == {name: 1 for name in names}
    assert (cache.misses, cache.hits) == (6, 6)


def test_a_part_being_read_ahead_is_not_read_again(svc):
    # Prepare
    names = parts_in(svc, 3)
    cache = PartCache(max_bytes=1 << 20)
    svc.store.gate.clear()
    cache.prefetch(svc, names[:2])
    assert wait_until(lambda: svc.store.reads.get(names[0]) == 1, timeout=5)
    # Execute: the third part's read starts once ``rows`` holds the other two reads under way
    asked, found = rows_once_reading(svc, cache, names, names[2])
    # Assert
    assert asked
    assert found[1].tolist() == [0, 1, 2]
    assert svc.store.reads == {name: 1 for name in names}


def test_a_read_that_fails_while_asked_for_is_tried_once_more(svc):
    # Prepare
    names = parts_in(svc, 2)
    cache = PartCache(max_bytes=1 << 20)
    svc.store.fail_once.add(names[0])
    svc.store.gate.clear()
    cache.prefetch(svc, names[:1])  # under way, and to fail, when the rows are asked for
    # Execute
    asked, found = rows_once_reading(svc, cache, names, names[1])
    # Assert
    assert asked
    assert found[1].tolist() == [0, 1]
    assert svc.store.reads == {names[0]: 2, names[1]: 1}


def test_a_read_ahead_that_failed_is_read_again_when_asked_for(svc):
    # Prepare
    names = parts_in(svc, 2)
    cache = PartCache(max_bytes=1 << 20)
    svc.store.fail_once.add(names[1])
    cache.prefetch(svc, names)
    assert wait_until(lambda: svc.store.reads.get(names[1]) == 1 and not cache._reading,
                      timeout=5)
    # Execute
    _, y = cache.rows(svc, names)
    # Assert
    assert y.tolist() == [0, 1]
    assert svc.store.reads == {names[0]: 1, names[1]: 2}


def test_reads_ahead_run_on_their_own_thread(svc):
    # Prepare
    names = parts_in(svc, 2)
    cache = PartCache(max_bytes=1 << 20)
    threads: dict[str, str] = {}
    svc = inject(svc, "store", read_bytes=lambda real, b, n: (
        threads.setdefault(n, threading.current_thread().name), real(b, n))[1])
    # Execute
    cache.prefetch(svc, names[:1])
    cache.rows(svc, names)
    # Assert
    assert threads[names[0]].startswith(AHEAD)
    assert not threads[names[1]].startswith(AHEAD)
