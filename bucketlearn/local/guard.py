"""Run a command so that it cannot outlive whoever started it.

``python -m bucketlearn.local.guard CMD...`` runs CMD in the guard's own process group (the local
stack starts the guard as a session leader) and watches its parent. When the parent goes away,
even by SIGKILL, which leaves no chance to clean up, the guard takes the whole group down: gcloud
*and* the Java emulator it started, a functions-framework master *and* its workers. A SIGTERM to
the group (``local down``, a test fixture) reaches every member directly, as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

GRACE_SECONDS = 10.0


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m bucketlearn.local.guard CMD [ARGS...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    child = subprocess.Popen(argv)  # same process group as the guard
    teardown = threading.Event()

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        teardown.set()
        os.killpg(0, signal.SIGTERM)  # every member of the group, the guard included
        time.sleep(GRACE_SECONDS)
        os.killpg(0, signal.SIGKILL)  # whatever ignored SIGTERM (this ends the guard too)

    watcher = threading.Thread(target=watch_parent, daemon=True)
    watcher.start()

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    if teardown.is_set():
        watcher.join()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
