"""How a learner process and the parent that runs it (``bucketlearn.entrypoints.worker``)
agree that the learner is to be replaced by a fresh process."""

from __future__ import annotations

RECYCLE_EXIT = 75  # EX_TEMPFAIL: "start me again"
LEARNER_CHILD_ENV = "BUCKETLEARN_LEARNER_CHILD"  # set by the parent in the learner's environment
