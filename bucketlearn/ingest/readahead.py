"""A bounded read-ahead for pyarrow's streaming CSV reader.

``pyarrow.csv.open_csv`` reads its input from a background thread that runs up to ~32 blocks ahead
of the batches the caller has taken (Arrow's background generator queue; pyarrow has no option
for it), so with large blocks the memory held grows with the file. ``BoundedReader`` wraps the
source stream: its ``read()`` — one call per block, from that background thread — waits while
``ahead`` blocks have been read whose batches the consumer has not finished with, and
``BoundedReader.batches`` counts the batches as the caller takes them (pyarrow turns each block
into exactly one batch, empty or not).

No wait can outlive the reader: ``close()`` (called when ``batches`` ends, however it ends)
releases every waiting read, and reads after it see the end of the stream. A read also goes
through when the consumer has been waiting on pyarrow for ``stall_seconds``: pyarrow needed more
than was counted (it does when opening fails: it then waits for its reading thread to stop), so
one more block is read per stall, never a deadlock. While the consumer processes a batch, reads
wait however long that takes.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

log = logging.getLogger(__name__)

DEFAULT_AHEAD_BLOCKS = 3
DEFAULT_STALL_SECONDS = 0.5
_POLL_SECONDS = 1.0  # a waiting read re-checks its conditions at least this often


class BoundedReader(io.RawIOBase):
    """A read-only stream over ``raw`` whose reads wait while ``ahead`` blocks are not consumed.

    Every ``read(n)`` returns ``n`` bytes unless the stream ends (it reads ``raw`` until it has
    them), so a short read from a network stream never makes a short pyarrow block.
    """

    def __init__(self, raw: IO[bytes], ahead: int = DEFAULT_AHEAD_BLOCKS,
                 stall_seconds: float = DEFAULT_STALL_SECONDS) -> None:
        super().__init__()
        self._raw = raw
        self.ahead = ahead
        self.stall_seconds = stall_seconds
        self._cond = threading.Condition()
        self._io_lock = threading.Lock()  # a close waits for a read of ``raw`` in progress
        self._reads = 0  # reads let through (blocks handed to pyarrow)
        self._consumed = 0  # batches the consumer has finished with
        self._consumer_waiting_since: float | None = None
        self._closing = False
        self.waiting = 0  # reads waiting for room now (tests: 0 once closed)
        self.stalls = 0  # reads let through because the consumer was stuck waiting
        self.bytes_read = 0
        if ahead < 1:
            raise ValueError("ahead must be at least 1 (pyarrow reads the first block on open)")

    def readable(self) -> bool:
        return True

    def _wait_for_room(self) -> bool:
        """Wait until a block may be read; False when the stream was closed meanwhile."""
        with self._cond:
            self.waiting += 1
            try:
                while not self._closing and self._reads - self._consumed >= self.ahead:
                    since = self._consumer_waiting_since
                    now = time.monotonic()
                    if since is not None and now - since >= self.stall_seconds:
                        self.stalls += 1
                        self._consumer_waiting_since = now  # one more block per stall
                        log.debug("read-ahead: consumer waited %.1f s, reading block %d",
                                  now - since, self._reads)
                        break
                    timeout = _POLL_SECONDS if since is None else min(
                        _POLL_SECONDS, since + self.stall_seconds - now)
                    self._cond.wait(timeout=max(timeout, 0.001))
                if self._closing:
                    return False
                self._reads += 1
                return True
            finally:
                self.waiting -= 1

    def read(self, size: int | None = -1) -> bytes:
        if not self._wait_for_room():
            return b""
        with self._io_lock:
            if self._closing:
                return b""
            if size is None or size < 0:
                data = self._raw.read()
            else:
                data = self._raw.read(size)
                if data and len(data) < size:  # a short read: fill the block
                    chunks, got = [data], len(data)
                    while got < size and (more := self._raw.read(size - got)):
                        chunks.append(more)
                        got += len(more)
                    data = b"".join(chunks)
            self.bytes_read += len(data)
            return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def consumed(self) -> None:
        """The consumer has finished with one more batch: one more block may be read."""
        with self._cond:
            self._consumed += 1
            self._cond.notify_all()

    def _consumer_waiting(self, waiting: bool) -> None:
        with self._cond:
            self._consumer_waiting_since = time.monotonic() if waiting else None
            if waiting:
                self._cond.notify_all()

    def batches(self, open_reader: Callable[[BoundedReader], Any]) -> Iterator[Any]:
        """The batches of ``open_reader(self)``'s reader, counted; closes this stream after.

        The reader is opened here because pyarrow reads while it opens, and when opening fails
        it waits for its reading thread to stop, i.e. for a read held here: the stall release
        lets that read through. A batch counts as consumed when the next one is asked for.
        """
        try:
            self._consumer_waiting(True)
            try:
                reader = open_reader(self)
            finally:
                self._consumer_waiting(False)
            while True:
                self._consumer_waiting(True)
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                finally:
                    self._consumer_waiting(False)
                yield batch
                self.consumed()
        finally:
            self.close()

    def close(self) -> None:
        """Release every waiting read (they return end of stream) and close the source."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        with self._io_lock:  # after a read of the source in progress, never during it
            if not self.closed:
                try:
                    self._raw.close()
                finally:
                    super().close()
