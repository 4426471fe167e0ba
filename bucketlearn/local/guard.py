"""Run a command so that it cannot outlive its guard, nor the guard outlive whoever started it.

``python -m bucketlearn.local.guard CMD...`` (the local stack starts every process this way):

- CMD leads a session and process group of its own, so everything it starts stays in that one
  group: gcloud would otherwise move itself into a new group (it does unless it leads its
  session), taking the Java emulator it starts out of reach; functions-framework's master and its
  workers; a shell and its children.
- CMD gets a parent-death signal (SIGKILL; Linux ``prctl``): a guard killed outright (SIGKILL by
  a user, the OOM killer) takes CMD with it. The stack's supervisor stops what CMD left behind.
- The guard watches its own parent: when the starter goes, even by SIGKILL, the guard stops the
  whole group (SIGTERM, then SIGKILL after ``GRACE_SECONDS``) and exits.
- SIGTERM and SIGINT to the guard go to the whole group, and when CMD exits, whatever is left in
  its group is stopped before the guard exits: nothing outlives the guard.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from bucketlearn.local.processes import group_members, set_parent_death_signal

GRACE_SECONDS = 10.0       # SIGTERM to SIGKILL, when the starter is gone
LEFTOVER_SECONDS = 5.0     # the same, for what CMD left in its group when it exited
PARENT_POLL_SECONDS = 0.2


class _Group:
    """CMD's process group. Signalled only while CMD is not yet reaped: its pid (the group's id)
    cannot be given to another process before that, so a signal never reaches a stranger."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.lock = threading.RLock()  # re-entrant: a signal handler may run inside ``reap``
        self.reaped = False

    def signal(self, signum: int) -> None:
        with self.lock:
            if not self.reaped:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pgid, signum)

    def stop(self, grace: float) -> None:
        """SIGTERM every member; SIGKILL whatever is left after ``grace`` seconds."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while group_members(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if group_members(self.pgid):
            self.signal(signal.SIGKILL)

    def reap(self, child: subprocess.Popen[bytes]) -> int:
        with self.lock:
            self.reaped = True
            return child.wait()


def _wait_exited(pid: int) -> None:
    """Block until ``pid`` has exited, leaving it unreaped (its zombie holds the group id)."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m bucketlearn.local.guard CMD [ARGS...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    guard = os.getpid()

    def die_with_the_guard() -> None:  # runs in the child, between fork and exec
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != guard:  # the guard died before the signal was armed
            os._exit(1)

    early: list[int] = []  # SIGTERM/SIGINT that came before CMD was started
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: early.append(received))
    child = subprocess.Popen(argv, start_new_session=True,  # before any thread: preexec is safe
                             preexec_fn=die_with_the_guard)
    group = _Group(child.pid)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: group.signal(received))
    for signum in early:
        group.signal(signum)

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        group.stop(GRACE_SECONDS)

    threading.Thread(target=watch_parent, name="watch-parent", daemon=True).start()
    _wait_exited(child.pid)
    group.stop(LEFTOVER_SECONDS)
    return group.reap(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
