"""Keeping TensorFlow's start-up lines out of what the CLI prints, unless ``--verbose``.

TensorFlow's C++ libraries write to the process's stderr file descriptor as they load, beneath
Python: absl's "WARNING: All log messages before absl::InitializeLog() is called are written to
STDERR" and oneDNN's "I0000 ... port.cc:153] oneDNN custom operations are on ..." (twice: two
libraries). Neither Python's logging nor ``TF_CPP_MIN_LOG_LEVEL`` (even 3) keeps them out, and
``TF_ENABLE_ONEDNN_OPTS=0`` would change the numbers (training is bit-identical between
processes only with the same kernels). So the commands that load TensorFlow import it first,
here, with file descriptor 2 pointed at /dev/null for the import alone (``load_tensorflow``;
``download``, which loads it only to build a model, for that call: ``tensorflow_quietly``);
what Python writes to ``sys.stderr`` is flushed before and after, and anything written after
(warnings, errors, tracebacks) reaches the user as before. ``--verbose`` leaves them be.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

STDERR_FD = 2


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 pointed at /dev/null for the block, then back where it was."""
    sys.stderr.flush()
    saved = os.dup(STDERR_FD)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, STDERR_FD)
        finally:
            os.close(null)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, STDERR_FD)
    finally:
        os.close(saved)


@contextlib.contextmanager
def tensorflow_quietly(verbose: bool = False) -> Iterator[None]:
    """A block that may load TensorFlow (``download`` builds a cancelled job's model from its
    weights): its start-up lines silenced unless ``verbose`` or it is loaded already. Errors
    raised in the block are printed after it, by the CLI, as ever."""
    if verbose or "tensorflow" in sys.modules:
        yield
        return
    with native_stderr_silenced():
        yield


def load_tensorflow(verbose: bool = False) -> None:
    """Import TensorFlow and Keras now (a command that uses them would a moment later), with
    their start-up lines silenced unless ``verbose``, and TensorFlow's Python warnings too (a
    search builds many models, and TensorFlow warns of the retracing that takes)."""
    from bucketlearn.ml.model import keras_module  # noqa: PLC0415 - TensorFlow: seconds

    with tensorflow_quietly(verbose):
        keras_module()
    if not verbose:
        logging.getLogger("tensorflow").setLevel(logging.ERROR)
