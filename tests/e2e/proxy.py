"""A TCP proxy in front of an emulator, for outage injection without losing the emulator's state.

``outage(seconds)`` drops every open connection and refuses new ones for that long: to the
clients it looks like the backend went away and came back (the emulators keep their data in
memory, so stopping them would also wipe every job).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any


class TcpProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, 0))
        self.listener.listen(128)
        self.listener.settimeout(0.2)
        self.port = int(self.listener.getsockname()[1])
        self.down_until = 0.0
        self.stopped = threading.Event()
        self.sockets: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.refused = 0

    def start(self) -> TcpProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        self._drop_all()
        self.listener.close()

    def outage(self, seconds: float) -> None:
        """Drop all connections now and refuse new ones for ``seconds`` (returns immediately)."""
        self.down_until = time.monotonic() + seconds
        self._drop_all()

    def _drop_all(self) -> None:
        with self.lock:
            for sock in list(self.sockets):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
            self.sockets.clear()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if time.monotonic() < self.down_until:
                self.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self.lock:
                self.sockets.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with self.lock:
                    self.sockets.discard(sock)


@dataclass
class ProxiedEmulators:
    """The session's emulators seen through proxies (same data, switchable outages)."""

    real: Any
    proxies: dict[str, TcpProxy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("pubsub", "firestore", "storage"):
            self.proxies[name] = TcpProxy(self.real.ports[name]).start()

    @property
    def urls(self) -> dict[str, str]:
        return {name: f"http://127.0.0.1:{proxy.port}" for name, proxy in self.proxies.items()}

    def settings(self, prefix: str) -> Any:
        import dataclasses

        base = self.real.settings(prefix)
        return dataclasses.replace(
            base,
            storage_emulator_host=f"http://127.0.0.1:{self.proxies['storage'].port}",
            pubsub_emulator_host=f"127.0.0.1:{self.proxies['pubsub'].port}",
            firestore_emulator_host=f"127.0.0.1:{self.proxies['firestore'].port}")

    def stop(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()
