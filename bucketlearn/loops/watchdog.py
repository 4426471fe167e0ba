"""The watchdog: one pass over the active jobs that finds the stalled ones and gets them moving.

Run periodically: in the cloud by ``bucketlearn autoscale`` (the Cloud Run job Cloud Scheduler
starts every minute), locally by the stack's supervisor. What to do is decided by
``domain.watchdog.decide``; this module reads what it needs and acts:

* a round never published, a complete round never folded, an export that stopped: publish a
  *nudge* on the results topic, which makes the aggregator read the job again and hear the
  deltas bucket's listing (the backstop for a result whose message was lost);
* tasks of the round without a result for too long (a lost or dead-lettered message, a chain
  whose learner died): publish them again (a task trained twice is applied once);
* a split that never finished: end the job FAILED;
* a searched job's segments without a result for too long: publish them again.

It looks at every job that has not ended (``list_active_jobs``), however many newer ones exist.
``drain_dead_letters`` turns task messages Pub/Sub gave up on (the dead-letter sink) into failure
markers, so the round folds without them and the job's ``max_failed_tasks`` decides its fate; a
batch prediction's part it gives up on ends its request FAILED naming it. Fanned-out batch
predictions that stand still get their unrecorded parts published again
(``usecases.predict_parts.sweep_predictions``).
"""

from __future__ import annotations

import logging
from typing import Any

from bucketlearn.domain.job import Job, done_tasks, fail_fields
from bucketlearn.domain.lifecycle import TRAINING
from bucketlearn.domain.search import outstanding_pairs
from bucketlearn.domain.watchdog import AGGREGATE, FAIL, PUBLISH, REPUBLISH, WatchdogAction, decide
from bucketlearn.ports import NUDGE, ResultMessage, Services, TaskQueue
from bucketlearn.prediction_ports import PredictPart
from bucketlearn.services import endings, task_messages
from bucketlearn.services.caches import job_runtime
from bucketlearn.services.results import list_deltas
from bucketlearn.usecases.predict_parts import give_up_part, sweep_predictions
from bucketlearn.usecases.publish import announce_failure
from bucketlearn.usecases.search_publish import republish_outstanding

log = logging.getLogger(__name__)


def watchdog_pass(svc: Services, now: float | None = None) -> list[dict[str, Any]]:
    """Look at every active job once; act on the stalled ones. Returns what was done."""
    now = svc.clock() if now is None else now
    actions = []
    for job in svc.registry.list_active_jobs():
        if job.is_terminal:
            continue
        try:
            decided = _decide(svc, job, now)
            if decided is not None:
                _act(svc, job, decided, now)
                actions.append({"job_id": job.job_id, "action": decided.action,
                                "tasks": decided.tasks, "reason": decided.reason})
        except Exception:  # noqa: BLE001 - one job's trouble must not stop the others'
            log.exception("watchdog: could not look after job %s", job.job_id)
    try:
        actions.extend(sweep_predictions(svc, now))
    except Exception:  # noqa: BLE001 - the jobs were looked after; the requests next time
        log.exception("watchdog: could not look after the batch predictions")
    return actions


def _decide(svc: Services, job: Job, now: float) -> WatchdogAction | None:
    activity = [job.updated_at or 0.0, job.published_at or 0.0, job.watchdog_at or 0.0,
                job.created_at]
    if job.search:
        return _search_stalled(svc, job, activity, now)
    round_tasks: list[int] = []
    with_result: set[int] = set()
    if job.phase == TRAINING and job.plan is not None:
        epoch = job.epoch
        round_tasks = list(task_messages.current_round_tasks(job))
        with_result = {ref.task_index for ref in list_deltas(svc, job.job_id, epoch)}
        for task_index in round_tasks:
            task = svc.registry.get_task(job.job_id,
                                         task_messages.task_doc_id(job.job_id, epoch, task_index))
            if task is not None:
                activity += [task.started_at or 0.0, task.finished_at or 0.0]
    return decide(job, round_tasks, done_tasks(job), with_result, max(activity), now,
                  svc.settings.stall_seconds, svc.settings.max_event_age_seconds)


def _search_stalled(svc: Services, job: Job, activity: list[float], now: float
                    ) -> WatchdogAction | None:
    """A searched job whose segments published and not recorded have shown no activity (a
    record, a publish, an attempt starting or ending) for ``stall_seconds``: publish them again
    (a message lost for good; a second result is dropped by the writer)."""
    pairs = outstanding_pairs(job.search or {})
    for candidate, rung in pairs:
        task = svc.registry.get_task(job.job_id, task_messages.task_doc_id(job.job_id, rung, candidate))
        if task is not None:
            activity += [task.started_at or 0.0, task.finished_at or 0.0]
    quiet = now - max(activity)
    if job.phase != TRAINING or not pairs or quiet <= svc.settings.stall_seconds:
        return None
    return WatchdogAction(REPUBLISH, f"search: {len(pairs)} segment(s) without a result after "
                                     f"{quiet:.0f} s quiet")


def nudge(svc: Services, job_id: str, reason: str) -> None:
    """Ask the aggregator for a fresh look at a job (a message on the results topic)."""
    svc.results.publish([ResultMessage(job_id=job_id, kind=NUDGE, reason=reason[:2000],
                                       sent_at=svc.clock())])
    log.info("job %s: nudged (%s)", job_id, reason)


def _act(svc: Services, job: Job, decided: WatchdogAction, now: float) -> None:
    job_id = job.job_id
    log.warning("watchdog: job %s: %s -> %s %s", job_id, decided.reason, decided.action,
                decided.tasks or "")
    if decided.action in (PUBLISH, AGGREGATE):
        nudge(svc, job_id, decided.reason)
    elif decided.action == REPUBLISH and job.search:
        republish_outstanding(svc, job)
        nudge(svc, job_id, decided.reason)  # a result written but never announced is heard
    elif decided.action == REPUBLISH:
        shards = job_runtime(svc, job).manifest.shards
        svc.queue.publish(task_messages.round_messages(job, shards, decided.tasks))
    elif decided.action == FAIL:
        endings.end_job(svc.registry, job_id, fail_fields(now, decided.reason),
                        expect=job.status_and_phase)
        return
    # while the job stands as read: one that ended meanwhile records nothing more
    svc.registry.update_job_if(job_id, job.status_and_phase, {
        "watchdog_at": now, "watchdog_actions": job.watchdog_actions + 1,
        "last_watchdog_action": decided.reason[:500]})


def drain_dead_letters(svc: Services, dead_letters: TaskQueue, limit: int = 1000) -> int:
    """Announce a failure for every task message in the dead-letter sink (unless its task is
    done already), or give up a batch prediction's part, and acknowledge it; returns how many
    failures were recorded. A letter that cannot be settled now (a backend down) is left for
    the next pass, and the others are still drained."""
    written = 0
    for _ in range(limit):
        received = dead_letters.pull(timeout=1.0)
        if received is None:
            break
        task = received.message
        why = (f"Pub/Sub gave up delivering it (dead-lettered after "
               f"{received.delivery_attempt or 'its'} deliveries)")
        try:
            if isinstance(task, PredictPart):
                give_up_part(svc, task, why)
                written += 1
            elif task is not None and _still_open(svc, task.job_id, task.epoch,
                                                  task.task_index):
                announce_failure(svc, task.job_id, task.epoch, task.task_index,
                                 f"task {task.task_id}: {why}", round_index=task.round)
                written += 1
        except Exception:  # noqa: BLE001 - left unacknowledged: it comes back after its deadline
            log.exception("watchdog: could not settle the dead letter %r", received.raw[:200])
            continue
        received.ack()
    return written


def _still_open(svc: Services, job_id: str, epoch: int, task_index: int) -> bool:
    """The task's job is active and the task is neither applied nor failed in its epoch."""
    job = svc.registry.get_job(job_id)
    if job is None or job.is_terminal or job.epoch != epoch:
        return False
    return task_index not in done_tasks(job)
