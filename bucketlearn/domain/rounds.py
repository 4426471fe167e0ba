"""Which task results a round folds: a pure decision over the listed delta objects
(``sort_round``, into ``RoundObjects``).

Invariant 2 (every planned task applied exactly once) rests on two facts decided here: a task
already applied or failed is never folded again (its late or duplicate results are garbage),
and a round is folded only when every one of its tasks has a result or a failure marker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeltaRef:
    """A task result (or failure marker) object as listed in the deltas bucket."""

    name: str
    task_index: int
    failed: bool


@dataclass
class RoundObjects:
    """A round's listed objects, sorted: what its fold takes, what it waits for, what it drops.

    The round's tasks themselves are the ``TrainingPlan``'s (``round_range``).

    Attributes:
        results: the result object to fold for each task that has one.
        failures: the failure marker of each task that failed for good (and has no result).
        missing: tasks with neither yet; the round waits for them.
        garbage: objects never to fold: results of tasks already done, names of tasks the
            epoch does not have.
        ignored: results of tasks of the epoch outside this round and not done (a chaining
            learner's of a later round; they are left alone).
        spares: the other objects of a task of the round (a task trained twice, a failure
            marker beside a result): kept, not chosen, until the task is done (then garbage),
            so that when the chosen one turns out not to be the job's (no recorded attempt's,
            another base's) another can take its place.
    """

    results: dict[int, DeltaRef] = field(default_factory=dict)
    failures: dict[int, DeltaRef] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    garbage: list[DeltaRef] = field(default_factory=list)
    ignored: list[DeltaRef] = field(default_factory=list)
    spares: list[DeltaRef] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.missing and bool(self.results or self.failures)


def sort_round(round_tasks: Iterable[int], done: Iterable[int],
               refs: Iterable[DeltaRef], planned: int | None = None) -> RoundObjects:
    """Sort the listed objects of the current round: what it folds, what it waits for, what is
    garbage.

    Args:
        round_tasks: the task indices of the round.
        done: task indices of the epoch already applied or failed for good.
        refs: the epoch's listed result objects and failure markers.
        planned: the epoch's task count (None: any index is a task of the epoch).

    A task's result wins over its failure marker (it was trained after all); among several
    results of one task (a redelivered task trained twice) the first by name is chosen, so the
    choice does not depend on listing order; the others are spares.
    """
    finished = set(done)
    wanted = [t for t in round_tasks if t not in finished]
    wanted_set = set(wanted)
    by_task: dict[int, list[DeltaRef]] = {}
    objects = RoundObjects()
    for ref in refs:
        if ref.task_index in wanted_set:
            by_task.setdefault(ref.task_index, []).append(ref)
        elif ref.task_index in finished or ref.task_index < 0 or (
                planned is not None and ref.task_index >= planned):
            objects.garbage.append(ref)
        else:
            objects.ignored.append(ref)
    for task in wanted:
        refs_of_task = sorted(by_task.get(task, []), key=lambda r: r.name)
        trained = [r for r in refs_of_task if not r.failed]
        if trained:
            objects.results[task] = trained[0]
            objects.spares.extend(r for r in refs_of_task if r is not trained[0])
        elif refs_of_task:
            objects.failures[task] = refs_of_task[0]
            objects.spares.extend(refs_of_task[1:])
        else:
            objects.missing.append(task)
    return objects
