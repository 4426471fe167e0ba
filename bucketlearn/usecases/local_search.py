"""``train-local --search N``: a job's search (``domain.search``) in one process.

The split, the budget and the validation rows are the unsearched job's; each candidate is a
``line.TrainingLine`` with its own seed, rate, batch and model, so candidate 0 takes exactly
the steps ``train-local`` takes. The rungs are trained in order, the candidates of a rung in
index order; promotions follow the scores alone (``domain.search.settle``). At the end the
mean of the finalists is the model, evaluated once on the holdout. A candidate whose training
loss is no longer a number is dropped with its reason. On the learner pool the same search is
cut into segments (``usecases.search_publish``) and selects the same model.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from bucketlearn.config import Limits
from bucketlearn.domain.recipe import RECIPE
from bucketlearn.domain.search import (
    Line,
    candidate_epochs,
    draw_candidates,
    rungs,
    settle,
)
from bucketlearn.errors import ConfigError, PermanentError
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ml.model import spec_for
from bucketlearn.options import JobOptions
from bucketlearn.ports import Services
from bucketlearn.services.caches import read_validation_sample
from bucketlearn.services.candidates import Standing, candidate_line, mean_of, train_to
from bucketlearn.usecases.train_local import (
    SerialResult,
    TrainingLine,
    evaluate_holdout,
    local_source,
    split_locally,
)


@dataclass
class SearchResult(SerialResult):
    """``train_local``'s result for the selected model (``spec``: the job's; ``selection``:
    empty, the model being no one checkpoint; ``epochs``: the most a finalist trained;
    ``tasks``: every candidate's), with every candidate's standing, what was selected
    (``selected``: the candidates whose mean is the model, its validation score and why), the
    rungs, and what the search costs at most (``cost``: candidate-epochs, one model's epochs)."""

    candidates: list[dict[str, Any]] = field(default_factory=list)
    selected: dict[str, Any] = field(default_factory=dict)
    rungs: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, int] = field(default_factory=dict)


def search_local(path: str, options: JobOptions, count: int, limits: Limits | None = None, *,
                 svc: Services, recipe: int = RECIPE,
                 split: tuple[Manifest, JobOptions] | None = None) -> SearchResult:
    """Search ``count`` candidates for ``path`` in one process and return the selected model,
    evaluated on the job's holdout. ``split``: ``split_locally``'s answer, made already on
    ``svc``.

    Raises:
        ConfigError: the job holds no validation rows to select on.
        PermanentError: every candidate diverged.
    """
    started = time.perf_counter()
    limits = limits or Limits()
    manifest, options = split or split_locally(path, options, limits, svc)
    spec = spec_for(manifest, options, local_source(path).display_name, recipe)
    if not manifest.validation_rows:
        raise ConfigError("search", "validation rows to select on (at least 100 training "
                          "rows and validation_fraction not none)",
                          f"{manifest.train_rows} training rows, none held out for validation",
                          "option")
    sample = read_validation_sample(svc, manifest, spec)
    image = spec.kind == "cnn"
    drawn = draw_candidates(count, options.seed, options.batch_size, options.learning_rate,
                            image, spec.regression)
    standings = {c.index: Standing(c) for c in drawn}
    lines: dict[int, TrainingLine] = {}
    plan = rungs(count, options.epochs)
    alive: tuple[int, ...] = tuple(c.index for c in drawn)
    for rung in plan:
        for index in alive:
            line = lines.get(index) or lines.setdefault(index, candidate_line(
                svc, manifest, options, spec, limits, sample, standings[index].candidate))
            train_to(line, rung, standings[index])
        # every candidate has a line: rung 0 trains them all
        verdict = settle(plan, {i: _known(lines[i], s) for i, s in standings.items()}
                         )[rung.index]
        for index in verdict.trained:
            if index not in verdict.kept and standings[index].state != "dropped":
                standings[index].state = "pruned"
                standings[index].reason = (f"rung {rung.index}: not among the best "
                                           f"{rung.keep} of {len(verdict.trained)}")
        alive = verdict.kept
    if not alive:
        reasons = "; ".join(f"candidate {i}: {s.reason}" for i, s in standings.items())
        raise PermanentError(f"search: expected a candidate that trains; found every one "
                             f"dropped ({reasons})")
    for index in alive:
        standings[index].state = "finalist"
    model, selected = _select(lines, standings, list(alive), sample, spec)
    found = evaluate_holdout(svc, manifest, model, None, spec.task)
    return SearchResult(
        found.accuracy, found.loss, time.perf_counter() - started, manifest, model,
        model.get_weights(), found.report, spec, {},
        max(lines[i].epoch for i in alive), options,
        sum(sum(s.rung_tasks) for s in standings.values()),
        candidates=[s.to_dict() for s in standings.values()], selected=selected,
        rungs=[dataclasses.asdict(r) for r in plan],
        cost={"candidate_epochs": candidate_epochs(plan), "epochs": options.epochs})


def _known(line: TrainingLine, standing: Standing) -> Line:
    """What the search knows of a candidate's line (``domain.search.Line``)."""
    return Line(standing.candidate.index, tuple(line.checkpoints.scores), line.finished,
                standing.dropped_at)


def _select(lines: dict[int, TrainingLine], standings: dict[int, Standing],
            finalists: list[int], sample: tuple[Any, Any],
            spec: Any) -> tuple[Any, dict[str, Any]]:
    """The model (``candidates.mean_of``) from the finalists' best checkpoints."""
    single = standings[finalists[0]].best
    assert single is not None
    for index in finalists:
        lines[index].model.set_weights(list(lines[index].final_weights))
    return mean_of([lines[i].model for i in finalists], finalists, single, sample, spec)
