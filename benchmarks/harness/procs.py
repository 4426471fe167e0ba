"""Processes: the log line, a clean environment for children, memory and CPU read from /proc.

Standard library only: ``tools/ingest_worker.py`` imports this in the process whose RSS it
measures.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from benchmarks.harness.paths import MB

TICK = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def bench_env(**extra: str) -> dict[str, str]:
    """This process's environment without bucketlearn's settings or an emulator's address,
    TensorFlow's C++ log quiet, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUCKETLEARN_")}
    for key in ("STORAGE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST"):
        env.pop(key, None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def proc_status_mb(key: str, pid: int | str = "self") -> float | None:
    """A ``/proc/<pid>/status`` memory field (VmRSS, VmHWM) in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024 / MB
    except (OSError, ValueError):
        return None
    return None


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (threads included)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(f"/proc/{pid}/stat").read_text()
            fields = text[text.rfind(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds so far) for every live process."""
    table: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw.rsplit(")", 1)[1].split()
        table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    return table


def tree_cpu(root: int, table: dict[int, tuple[int, float]],
             children: dict[int, list[int]]) -> float:
    """CPU seconds of ``root`` and all its descendants in ``table`` (``process_table``)."""
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += table.get(pid, (0, 0.0))[1]
        todo.extend(children.get(pid, []))
    return total
