"""The Pub/Sub adapter against a server that is not Pub/Sub: its admin calls give up.

Found when two local stacks picked the same free port: the topic's creation met an HTTP/1 server
and the client's default retry kept at it for 600 s. A real gRPC client against a real socket;
only the call's deadline is shortened for the test.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from bucketlearn.adapters import pubsub
from bucketlearn.config import Settings
from bucketlearn.errors import TransientError

pytestmark = pytest.mark.integration


@pytest.fixture
def not_pubsub() -> Iterator[str]:
    """A TCP server on a free port that answers every connection with an HTTP/1 error."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


def test_ensure_topology_gives_up_on_a_server_that_is_not_pubsub(
        not_pubsub: str) -> None:
    """create_topic against a non-gRPC server ends in a TransientError naming the address
    within the adapter's deadline, not after the client's default 600 s."""
    # Prepare
    queue = pubsub.PubSubQueue(Settings(project="p", pubsub_emulator_host=not_pubsub))
    # Execute
    started = time.monotonic()
    with pytest.raises(TransientError) as excinfo:
        queue.ensure_topology(timeout=3.0)
    # Assert
    assert f"{not_pubsub} did not answer within 3 s" in str(excinfo.value)
    assert time.monotonic() - started < 30, "gave up only after the client's own retries"
