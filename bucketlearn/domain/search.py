"""A job's search: candidate configurations drawn from its seed, trained side by side and pruned
by synchronous successive halving on the validation rows (Jamieson & Talwalkar 2016; Li et al.
2018, Hyperband's inner loop). Pure: numbers in, decisions out.

Every candidate trains the job's whole budget (its epochs, its patience) on its own line of
versions; the search only decides which lines go on. Rung ``r`` trains ``count`` candidates up
to ``epochs`` epochs each; the best ``next count`` by their best validation score so far go on
to the next rung (``promote``). The last rung trains ``FINALISTS`` candidates to the end, which
keeps four learners busy where a halving search idles, and the model is the mean of the four:
an ensemble of networks is more accurate than its members (Lakshminarayanan et al. 2017; TabM,
Gorishniy et al. 2024, builds its default on one), and averaging all four does not choose on
the validation rows a second time (choosing how many to average did, and overfit them; so did
exporting the best finalist alone where it validated better by a standard error).

Promotions depend only on the scores, ties broken by the candidate's index, so the selected
model is the same whatever the number of learners and whichever finished first. Candidate 0 is
the job's default configuration, trained exactly as an unsearched job trains.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bucketlearn.domain.recipe import Score

SEARCH_MIN = 2
SEARCH_MAX = 64
ETA = 3  # a rung keeps a third of its candidates (rounded up)
FINALISTS = 4  # candidates trained to the end (and the ensemble's most members)
# search=auto: the measured search (docs/BENCHMARKS.md, sections 9 and 10) gained nothing on
# tables of a few thousand rows, and 0.1 to 0.7 points from some 50,000 training rows, where 8
# candidates on 8 learners end within about 1.2x a default job's wall for 5.3x its compute
AUTO_SEARCH_ROWS = 20_000
AUTO_SEARCH_COUNT = 8
RATE_SPREAD = 1.5  # a candidate's peak rate: the default's times 2**u, u uniform in +-1.5
WIDTHS = (128, 256, 512)
DEPTHS = (2, 3, 4)
SMOOTHINGS = (0.0, 0.1)
MIN_BATCH = 16


@dataclass(frozen=True)
class Candidate:
    """One configuration the search trains: its own seed (initial weights and row order), peak
    learning rate, batch size, and for a table's MLP its shape, label smoothing (classes) and
    whether the numeric cells get their piecewise-linear encoding; None keeps the job's model
    as it is (candidate 0, and what does not apply to the model)."""

    index: int
    seed: int
    learning_rate: float
    batch_size: int
    width: int | None = None
    depth: int | None = None
    smoothing: float | None = None
    encoding: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        def given(name: str, kind: type) -> Any:
            return None if data.get(name) is None else kind(data[name])

        return cls(int(data["index"]), int(data["seed"]), float(data["learning_rate"]),
                   int(data["batch_size"]), given("width", int), given("depth", int),
                   given("smoothing", float), given("encoding", bool))

    def shaped(self) -> dict[str, Any]:
        """The model fields it sets (the rest are the job's)."""
        return {k: v for k, v in {"width": self.width, "depth": self.depth,
                                  "smoothing": self.smoothing,
                                  "encoding": self.encoding}.items() if v is not None}

    def describe(self) -> str:
        """The configuration in a few words, e.g. 'rate 0.0031, batch 256, 4 x 512, smoothing
        0, no encoding, seed 3' (the job's model: 'the default model')."""
        words = [f"rate {self.learning_rate:.2g}", f"batch {self.batch_size}"]
        if self.width is not None and self.depth is not None:
            words.append(f"{self.depth} x {self.width}")
        if self.smoothing is not None:
            words.append(f"smoothing {self.smoothing:g}")
        if self.encoding is not None:
            words.append("encoding" if self.encoding else "no encoding")
        if self.index == 0:
            words.append("the default model")
        return ", ".join(words + [f"seed {self.seed}"])


def draw_candidates(count: int, seed: int, batch_size: int, learning_rate: float,
                    image: bool = False, regression: bool = False) -> list[Candidate]:
    """``count`` configurations drawn from the job's ``seed``: the first is the job's default
    (``batch_size``, ``learning_rate``, the recipe's shape); each other draws a peak rate
    log-uniformly around the default's, a batch of half, once or twice the default's, and for
    a table a width, depth, encoding and (classes) label smoothing. The same arguments draw the
    same candidates on every machine (``random.Random`` seeded with a string)."""
    if not SEARCH_MIN <= count <= SEARCH_MAX:
        raise ValueError(f"search: expected {SEARCH_MIN} to {SEARCH_MAX} candidates; "
                         f"found {count}")
    draw = random.Random(f"bucketlearn-search-{seed}")
    candidates = [Candidate(0, seed, learning_rate, batch_size)]
    for index in range(1, count):
        rate = round(learning_rate * 2 ** draw.uniform(-RATE_SPREAD, RATE_SPREAD), 8)
        batch = max(MIN_BATCH, int(batch_size * draw.choice((0.5, 1, 2))))
        shape: tuple[Any, ...] = (None, None, None, None)
        if not image:
            width, depth, smoothing = (draw.choice(WIDTHS), draw.choice(DEPTHS),
                                       draw.choice(SMOOTHINGS))
            shape = (width, depth, None if regression else smoothing, draw.random() < 0.5)
        candidates.append(Candidate(index, (seed + index) % 2**31, rate, batch, *shape))
    return candidates


def auto_search(train_rows: int, validates: bool) -> tuple[int, str]:
    """What ``search=auto`` becomes for a job training on ``train_rows`` rows, and why: 0 (off)
    without validation rows to select on or below ``AUTO_SEARCH_ROWS``, else
    ``AUTO_SEARCH_COUNT`` candidates."""
    if not validates:
        return 0, "off: no validation rows to select candidates on (validation_fraction none)"
    if train_rows < AUTO_SEARCH_ROWS:
        return 0, (f"off: {train_rows:,} training rows, below {AUTO_SEARCH_ROWS:,} (on small "
                   "tables the measured search gained nothing for up to 5.3x the training)")
    return AUTO_SEARCH_COUNT, (
        f"{AUTO_SEARCH_COUNT} candidates: {train_rows:,} training rows, at least "
        f"{AUTO_SEARCH_ROWS:,} (where the measured search gained 0.1 to 0.7 points over the "
        "default model, for 5.3x its training, run side by side on the learners)")


@dataclass(frozen=True)
class Rung:
    """Rung ``index`` trains ``count`` candidates up to ``epochs`` epochs each, then keeps
    ``keep`` of them (the last rung keeps them all)."""

    index: int
    count: int
    epochs: int
    keep: int


def rungs(count: int, epochs: int) -> list[Rung]:
    """Successive halving's rungs for ``count`` candidates and a budget of ``epochs`` each:
    every rung keeps a third (``ETA``) of its candidates, at least ``FINALISTS``; the last
    rung trains its candidates to ``epochs``, each earlier one to a third of the next (at
    least one epoch)."""
    counts = [count]
    while counts[-1] > FINALISTS:
        counts.append(max(FINALISTS, math.ceil(counts[-1] / ETA)))
    last = len(counts) - 1
    budgets = [max(1, math.ceil(epochs / ETA ** (last - r))) for r in range(last + 1)]
    return [Rung(r, counts[r], budgets[r], counts[r + 1] if r < last else counts[r])
            for r in range(last + 1)]


def best_through(scores: Sequence[Score], epoch: int) -> Score | None:
    """The best of ``scores`` (in epoch order) among epochs up to ``epoch``; the first of
    equals, as ``domain.recipe.advance`` picks."""
    return max((s for s in scores if s.epoch <= epoch), key=Score.key, default=None)


def promote(standing: Mapping[int, Score | None], keep: int) -> list[int]:
    """The ``keep`` candidates (by index) that go on: the best by score, a tie to the lower
    index; a candidate with no score (dropped, or none yet) never goes on."""
    scored = [(index, score) for index, score in standing.items() if score is not None]
    scored.sort(key=lambda item: (tuple(-v for v in item[1].key()), item[0]))
    return [index for index, _ in scored[:keep]]


@dataclass(frozen=True)
class Line:
    """What the search knows of one candidate's line of versions: its validation scores so
    far (epoch order; or, enough for every rung, its best up to each rung it trained), whether
    it has finished (stopped early, or trained its budget), the epoch it was dropped in (it
    diverged; None while it trains well) and the epochs it has trained (0: its last score's)."""

    index: int
    scores: tuple[Score, ...] = ()
    finished: bool = False
    dropped_at: int | None = None
    epochs: int = 0

    def through(self, epochs: int) -> bool:
        """Whether its score at ``epochs`` is known, or will never be."""
        return (self.dropped_at is not None or self.finished or self.epochs >= epochs
                or bool(self.scores and self.scores[-1].epoch >= epochs))

    def standing(self, epochs: int) -> Score | None:
        """Its best score up to ``epochs``; None when it was dropped by then (a line dropped
        later keeps the standing it had at the rungs it passed)."""
        if self.dropped_at is not None and self.dropped_at <= epochs:
            return None
        return best_through(self.scores, epochs)


@dataclass(frozen=True)
class Verdict:
    """Rung ``rung``'s decision: the candidates it trained, and those that go on (best first;
    after the last rung, the finalists)."""

    rung: int
    trained: tuple[int, ...]
    kept: tuple[int, ...]


def settle(plan: Sequence[Rung], lines: Mapping[int, Line]) -> list[Verdict]:
    """The rungs decided so far, in order: a rung is decided once every candidate it trains
    has its score at the rung's epochs (or has finished or been dropped before them), from the
    best score of each up to those epochs (``best_through``, ``promote``). A line that went on
    past a rung before the rung was decided changes nothing: only its scores up to the rung's
    epochs count. So the verdicts depend on the scores alone, whatever the order they came in,
    the number of learners or how far ahead any line ran."""
    alive = tuple(sorted(lines))
    verdicts: list[Verdict] = []
    for rung in plan:
        if not all(lines[i].through(rung.epochs) for i in alive):
            break
        standing = {i: lines[i].standing(rung.epochs) for i in alive}
        kept = tuple(promote(standing, rung.keep))
        verdicts.append(Verdict(rung.index, alive, kept))
        alive = kept
    return verdicts


def candidate_epochs(plan: Sequence[Rung]) -> int:
    """Epochs of candidate training the search takes at most (no candidate stopping early):
    each rung's candidates from the previous rung's budget to their own."""
    done, total = 0, 0
    for rung in plan:
        total += rung.count * (rung.epochs - done)
        done = rung.epochs
    return total


def projected_wall(rung_durations: Sequence[Sequence[float]], workers: int) -> float:
    """The wall of a search's rungs on ``workers`` learners: each rung's candidates (their
    durations in index order) handed out in that order to the first free learner, the next
    rung begun once the last of this one ends (promotions wait for every score)."""
    total = 0.0
    for durations in rung_durations:
        free = [0.0] * max(1, workers)
        for duration in durations:
            at = free.index(min(free))
            free[at] += duration
        total += max(free)
    return total


# -- a searched job's record (``Job.search``): what its writer and its readers make of it ------

def pair(candidate: int, rung: int) -> str:
    """The name of one segment (a candidate's training through a rung) in ``published``."""
    return f"{candidate}:{rung}"


def search_record(candidates: Sequence[Candidate], plan: Sequence[Rung]) -> dict[str, Any]:
    """A searched job's record before any segment: its candidates and rungs, no line, none
    published."""
    return {"count": len(candidates), "candidates": [c.to_dict() for c in candidates],
            "rungs": [asdict(r) for r in plan], "lines": {}, "published": []}


def plan_of(record: Mapping[str, Any]) -> list[Rung]:
    return [Rung(**r) for r in record["rungs"]]


def lines_of(record: Mapping[str, Any]) -> dict[int, Line]:
    """Every candidate's line as recorded (``Line.scores``: its best up to each rung)."""
    lines = record.get("lines") or {}
    found = {}
    for candidate in record["candidates"]:
        index = int(candidate["index"])
        doc = lines.get(str(index)) or {}
        found[index] = Line(index, tuple(Score.from_dict(s) for s in doc.get("bests") or []
                                         if s is not None), bool(doc.get("finished")),
                            doc.get("dropped_at"), int(doc.get("epochs") or 0))
    return found


def due(record: Mapping[str, Any], verdicts: Sequence[Verdict]) -> list[tuple[int, int]]:
    """The segments to publish now, as (candidate, rung): every candidate in the first rung;
    then each candidate a decided rung kept, into the next rung, unless its line has finished
    or was dropped (it has nothing more to train). Never one published already."""
    published = set(record.get("published") or [])
    lines = lines_of(record)
    wanted = [(int(c["index"]), 0) for c in record["candidates"]]
    for verdict in verdicts:
        if verdict.rung + 1 < len(record["rungs"]):
            wanted += [(i, verdict.rung + 1) for i in verdict.kept
                       if not lines[i].finished and lines[i].dropped_at is None]
    return [(c, r) for c, r in wanted if pair(c, r) not in published]


def recorded_rung(record: Mapping[str, Any], candidate: int) -> int:
    """The last rung recorded for ``candidate`` (-1: none)."""
    line = (record.get("lines") or {}).get(str(candidate))
    return int(line["rung"]) if line else -1


def outstanding_pairs(record: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The segments published and not yet recorded, as (candidate, rung)."""
    published = (p.split(":") for p in record.get("published") or [])
    return [(int(c), int(r)) for c, r in published if int(r) > recorded_rung(record, int(c))]


def outstanding(record: Mapping[str, Any]) -> int:
    """Segments published and not yet recorded (what the learners have to do)."""
    return len(outstanding_pairs(record))


def standings(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each candidate as people read it, best first: its configuration, the last rung it
    trained, its epochs, its best validation score, its state (``training``, ``pruned`` at a
    rung, ``dropped`` with the reason, ``finalist``) and its seconds of training."""
    plan = plan_of(record)
    lines = lines_of(record)
    verdicts = settle(plan, lines)
    docs = record.get("lines") or {}
    rows = []
    for raw in record["candidates"]:
        candidate = Candidate.from_dict(raw)
        doc = docs.get(str(candidate.index)) or {}
        line = lines[candidate.index]
        state, reason = ("dropped", doc.get("reason") or "") if line.dropped_at is not None \
            or doc.get("state") == "dropped" else ("training", "")
        for verdict in verdicts:
            if state == "training" and candidate.index in verdict.trained and \
                    candidate.index not in verdict.kept:
                state, reason = "pruned", (f"rung {verdict.rung}: not among the best "
                                           f"{plan[verdict.rung].keep} of "
                                           f"{len(verdict.trained)}")
        if state == "training" and len(verdicts) == len(plan) and \
                candidate.index in verdicts[-1].kept:
            state = "finalist"
        best = line.standing(line.epochs or plan[-1].epochs) if line.scores else None
        rows.append({**candidate.to_dict(), "configuration": candidate.describe(),
                     "rung": doc.get("rung"), "epochs": line.epochs,
                     "best": best.to_dict() if best is not None else None, "state": state,
                     "reason": reason, "seconds": round(sum(doc.get("seconds") or []), 3)})
    order = {"finalist": 0, "training": 1, "pruned": 2, "dropped": 3}
    return sorted(rows, key=lambda r: (order[r["state"]], tuple(
        -v for v in Score.from_dict(r["best"]).key()) if r["best"] else (math.inf,),
        r["index"]))
