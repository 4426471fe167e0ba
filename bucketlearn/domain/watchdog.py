"""What to do about a job that has stopped moving (invariant 8: every job ends).

Every step of a job is started by an event: a finished upload starts the split, a task result
starts a fold, a fold publishes the next round. Events are delivered at least once, but a
message can still be lost for good (Pub/Sub dead-letters a task after its deliveries; a function
dies between a commit and the publish that follows it, and no later event comes to finish the
work). A periodic controller asks ``decide`` about every active job and does what it says. Each
action is idempotent: a task published twice is applied once, a fold started twice commits once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from bucketlearn.domain.job import Job
from bucketlearn.domain.lifecycle import EXPORTING, SPLITTING, TERMINAL, TRAINING

PUBLISH, REPUBLISH, AGGREGATE, FAIL = "publish", "republish", "aggregate", "fail"


@dataclass(frozen=True)
class WatchdogAction:
    """One action for a stalled job: what, which tasks (for REPUBLISH) and why."""

    action: str
    reason: str
    tasks: list[int] = field(default_factory=list)


def decide(job: Job, round_tasks: Iterable[int], done: Iterable[int],
           with_result: Iterable[int], last_activity: float, now: float, stall_seconds: float,
           split_seconds: float) -> WatchdogAction | None:
    """The action a stalled job needs, or None when it is moving (or has ended).

    Args:
        job: the job document.
        round_tasks: the task indices of its current round.
        done: task indices of the current epoch applied or failed for good.
        with_result: tasks of the round with a result object or a failure marker waiting.
        last_activity: the newest timestamp that shows the job moving (job update, round
            publish, a task of the round starting or finishing).
        now: the current time.
        stall_seconds: how long without activity counts as stalled.
        split_seconds: how long a split may stay unfinished before the job fails.
    """
    status, phase = job.status, job.phase
    if status in TERMINAL:
        return None
    quiet = now - last_activity
    if phase == SPLITTING:  # timed from the upload: a retried split does not reset it
        started = float(job.created_at or job.claimed_at or now)
        if now - started > split_seconds:
            return WatchdogAction(FAIL, f"the split of the upload did not finish within "
                                 f"{split_seconds:.0f} s of the upload ({now - started:.0f} s, "
                                 f"{max(1, job.split_attempts)} attempt(s)); upload the "
                                 "file again")
        return None
    if quiet <= stall_seconds:
        return None
    if phase == EXPORTING:
        return WatchdogAction(AGGREGATE, f"the export made no progress for {quiet:.0f} s")
    if phase != TRAINING:
        return None
    key = job.round_key
    if not job.is_published:
        return WatchdogAction(PUBLISH, f"round {key} was never published ({quiet:.0f} s quiet)")
    finished = set(done) | set(with_result)
    missing = [t for t in round_tasks if t not in finished]
    if missing:
        return WatchdogAction(REPUBLISH, f"round {key}: {len(missing)} task(s) without a result after "
                                  f"{quiet:.0f} s quiet", missing)
    if any(t not in set(done) for t in round_tasks):
        return WatchdogAction(AGGREGATE, f"round {key} is complete but was not folded "
                                  f"({quiet:.0f} s quiet)")
    return None
