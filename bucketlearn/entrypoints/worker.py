"""The learner worker's processes (the container's command, ``bucketlearn worker``, the local
stack's workers): a small parent that keeps one learner process running (``run_learners``), and
that learner process (``learner_main``: ``python -m bucketlearn.entrypoints.worker --learner``).

TensorFlow keeps memory for every model a process builds and trains, and gives it back only when
the process ends (tensorflow/tensorflow#62854; neither ``keras.backend.clear_session()`` nor
dropping the model's traced functions frees it). Measured here: 4 to 15 MB per model. So a
learner that has built ``worker_max_models`` models (``BUCKETLEARN_WORKER_MAX_MODELS``, default
20; one per job it trains, again when a job left its runtime cache; 0: never) acks its task and
exits with ``RECYCLE_EXIT``, and this parent starts a fresh one: the memory a worker holds is
bounded, whatever it runs for. Nothing is lost: the learner stops only between tasks.

The parent imports neither TensorFlow nor the Google clients (the learner imports them inside
``learner_main``). SIGTERM and SIGINT are passed to the learner, which finishes its task and
exits; the parent then exits with the learner's code. The learner gets SIGTERM if the parent
dies (Linux ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from bucketlearn.local.processes import set_parent_death_signal
from bucketlearn.loops.learner_process import LEARNER_CHILD_ENV, RECYCLE_EXIT

log = logging.getLogger("bucketlearn.worker")

LEARNER_FLAG = "--learner"  # the command line of the learner process (the parent's has none)
LEARNER = [sys.executable, "-m", "bucketlearn.entrypoints.worker", LEARNER_FLAG]


def _child_setup() -> None:  # runs in the child between fork and exec
    set_parent_death_signal(signal.SIGTERM)


def run_learners(command: Sequence[str] = LEARNER) -> int:
    """Run the learner, again each time it exits with ``RECYCLE_EXIT``; return its exit code
    otherwise (128 + the signal's number when a signal ended it, as a shell reports it)."""
    environment = {**os.environ, LEARNER_CHILD_ENV: "1"}
    stopping = threading.Event()
    current: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: Any) -> None:
        stopping.set()
        for child in current:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        generation = 0
        while True:
            child = subprocess.Popen(list(command), env=environment,  # noqa: S603 - our own
                                     preexec_fn=_child_setup)  # noqa: PLW1509 - prctl only
            current[:] = [child]
            if stopping.is_set():  # a signal that came while the learner was being started
                child.send_signal(signal.SIGTERM)
            code = child.wait()
            if code != RECYCLE_EXIT or stopping.is_set():
                return code if code >= 0 else 128 - code
            generation += 1
            log.info("learner %d recycled (its memory is given back); starting a fresh one",
                     generation)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def learner_main() -> None:
    """The learner process (started by ``run_learners``, which replaces it when it exits with
    ``RECYCLE_EXIT``)."""
    from bucketlearn.bootstrap import process_services  # noqa: PLC0415
    from bucketlearn.logs import setup_logging  # noqa: PLC0415
    from bucketlearn.loops.learner import Learner  # noqa: PLC0415

    svc = process_services()
    setup_logging(svc.settings.log_format)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # recycling needs the parent that starts a fresh process (run_learners)
    max_models = svc.settings.worker_max_models if os.environ.get(LEARNER_CHILD_ENV) else 0
    learner = Learner(svc, max_models=max_models, chain=True)
    log.info("worker %s started", learner.worker_id)
    learner.run(stop)
    if learner.recycle and not stop.is_set():
        sys.exit(RECYCLE_EXIT)


def main() -> None:
    """The parent (``run_learners``); the learner process with ``--learner``."""
    if sys.argv[1:] == [LEARNER_FLAG]:
        learner_main()
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.exit(run_learners())


if __name__ == "__main__":
    main()
