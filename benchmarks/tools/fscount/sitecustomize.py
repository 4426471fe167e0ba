"""Firestore RPC counter for benchmark child processes (workers, functions).

``benchmarks.suites.scale`` puts this directory on PYTHONPATH and sets BUCKETLEARN_BENCH_FS_COUNT_DIR for
the local stack's processes; Python then imports this module at start-up. It wraps the Firestore
GAPIC client's ``commit`` (every document write goes through it: ``set``/``create``/``update``/
``delete`` as a one-write batch, transactions as one commit of all their writes),
``batch_get_documents`` and ``run_query``, counts writes per collection, and rewrites
``<dir>/<pid>.json`` after every call. Without the variable it does nothing.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

_DIR = os.environ.get("BUCKETLEARN_BENCH_FS_COUNT_DIR")


def _collection(path: str) -> str:
    """'projects/p/databases/d/documents/jobs/J/tasks/T' -> 'jobs/tasks'."""
    tail = path.split("/documents/", 1)[-1].split("/")
    return "/".join(tail[0::2])


def _cmdline() -> str:
    """The process's command line (``sys.argv`` is not final yet when sitecustomize runs)."""
    try:
        with open("/proc/self/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return " ".join(sys.argv)[:300]


_LOCK = threading.Lock()
_COUNTS: dict[str, Any] = {}


def _reset() -> None:
    _COUNTS.clear()
    _COUNTS.update(pid=os.getpid(), argv=_cmdline(), commits=0,
                   commits_failed=0, writes=0, writes_failed=0, writes_by_collection={},
                   writes_failed_by_collection={}, transactional_commits=0,
                   lookups=0, documents_looked_up=0, queries=0)


def _dump(directory: str) -> None:
    path = os.path.join(directory, f"{os.getpid()}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(_COUNTS, handle)
    os.replace(tmp, path)


def _names(request: object) -> list[str]:
    """The documents a commit request writes."""
    writes = request.get("writes", []) if isinstance(request, dict) else getattr(
        request, "writes", [])
    out = []
    for write in writes:
        pb = type(write).pb(write) if hasattr(type(write), "pb") else write
        which = pb.WhichOneof("operation")
        if which == "update":
            out.append(pb.update.name)
        elif which == "delete":
            out.append(pb.delete)
        elif which == "transform":
            out.append(pb.transform.document)
        else:
            out.append("?")
    return out


def _tally(directory: str, docs: list[str], transactional: bool, failed: bool) -> None:
    """Count one commit of ``docs`` (landed, or failed) and rewrite the file."""
    with _LOCK:
        if failed:
            _COUNTS["commits_failed"] += 1
            _COUNTS["writes_failed"] += len(docs)
            by = _COUNTS["writes_failed_by_collection"]
        else:
            _COUNTS["commits"] += 1
            _COUNTS["writes"] += len(docs)
            _COUNTS["transactional_commits"] += int(transactional)
            by = _COUNTS["writes_by_collection"]
        for doc in docs:
            by[_collection(doc)] = by.get(_collection(doc), 0) + 1
        _dump(directory)


def _counted_commit(original: Any, directory: str) -> Any:
    def commit(self: object, request: object = None, *args: object, **kwargs: object) -> object:
        docs = _names(request)
        transactional = bool(request.get("transaction") if isinstance(request, dict)
                             else getattr(request, "transaction", b""))
        try:
            response = original(self, request, *args, **kwargs)
        except Exception:
            _tally(directory, docs, transactional, failed=True)
            raise
        _tally(directory, docs, transactional, failed=False)
        return response

    return commit


def _counted_reads(original_get: Any, original_query: Any, directory: str) -> tuple[Any, Any]:
    def batch_get(self: object, request: object = None, *args: object, **kwargs: object) -> object:
        docs = request.get("documents", []) if isinstance(request, dict) else getattr(
            request, "documents", [])
        with _LOCK:
            _COUNTS["lookups"] += 1
            _COUNTS["documents_looked_up"] += len(docs)
            _dump(directory)
        return original_get(self, request, *args, **kwargs)

    def query(self: object, request: object = None, *args: object, **kwargs: object) -> object:
        with _LOCK:
            _COUNTS["queries"] += 1
            _dump(directory)
        return original_query(self, request, *args, **kwargs)

    return batch_get, query


def _install(directory: str) -> None:
    from google.cloud.firestore_v1.services.firestore import client as gapic

    client = gapic.FirestoreClient
    commit = _counted_commit(client.commit, directory)
    batch_get, query = _counted_reads(client.batch_get_documents, client.run_query, directory)
    _reset()
    os.register_at_fork(after_in_child=_reset)  # gunicorn forks its worker from the arbiter
    client.commit = commit
    client.batch_get_documents = batch_get
    client.run_query = query


if _DIR and "bucketlearn.local.guard" not in _cmdline():  # the stack's guard makes no calls
    try:
        _install(_DIR)
    except Exception as exc:  # never break the process being measured
        print(f"fscount: not installed: {exc}", file=sys.stderr)
