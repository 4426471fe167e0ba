"""The deal of a file's rows, from its class counts alone (made before the rows are read again):
which rows of each class are held out (a systematic, per-class sample with a seeded phase:
``holdout_phase``, ``holdout_count``, ``holdout_mask``), which shard each training row goes to
(``DealPlan``: equal shares of every class, the extra rows spread over the shards by a stride
near the golden ratio's), and the whole plan (``plan_split``), or why the counts cannot be
split (``Unsplittable``). Pure: numbers in, numbers out; ingest deals the rows by it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bucketlearn.domain.recipe import validation_share


def holdout_phase(n: int, fraction: float, phase: float) -> float:
    """The phase the systematic rule uses for an n-row class.

    The random phase is kept unless it would leave a class of two or more rows without any
    holdout row (n * fraction < 1); then a phase is used that selects exactly one row.
    """
    if n >= 2 and math.floor(n * fraction + phase) - math.floor(phase) < 1:
        return 1.0 - n * fraction / 2
    return phase


def holdout_count(n: int, fraction: float, phase: float) -> int:
    """Rows of an n-row class the systematic holdout rule selects (at least one when n >= 2)."""
    phase = holdout_phase(n, fraction, phase)
    return int(math.floor(n * fraction + phase)) - int(math.floor(phase))


def holdout_mask(j: np.ndarray, fraction: float, phase: float) -> np.ndarray:
    """Which of a class's rows ``j`` (0-based, file order) the systematic rule holds out."""
    return np.floor((j + 1) * fraction + phase) > np.floor(j * fraction + phase)


_GOLDEN_STRIDE = (3 - math.sqrt(5)) / 2  # 1/phi^2: consecutive multiples spread evenly mod 1


def _largest_partial_quotient(numerator: int, denominator: int) -> int:
    """The largest term of the continued fraction of numerator/denominator (after the first)."""
    largest = 0
    numerator, denominator = denominator, numerator % denominator
    while denominator:
        largest = max(largest, numerator // denominator)
        numerator, denominator = denominator, numerator % denominator
    return largest


def spread_stride(shards: int) -> int:
    """A stride coprime to ``shards`` near ``shards / phi^2`` (so it permutes 0..shards-1).

    Of the coprime strides within 64 of ``shards / phi^2``, the one whose ratio to ``shards``
    has the smallest continued-fraction terms: its multiples are the most evenly spread
    (three-distance theorem), as the golden ratio's (all terms 1) are.
    """
    if shards <= 2:
        return 1
    base = round(shards * _GOLDEN_STRIDE)
    candidates = [s for s in range(max(1, base - 64), min(shards, base + 65))
                  if math.gcd(s, shards) == 1]
    if not candidates:
        return 1
    return min(candidates, key=lambda s: (_largest_partial_quotient(s, shards), abs(s - base)))


@dataclass(frozen=True)
class DealPlan:
    """Plans the deal: which shard each training row goes to (the part of a ``SplitPlan``).

    Made from the class counts alone, before pass 2.

    Class ``c`` has ``n_c = base[c] * shards + len(extras[c])`` training rows: every shard gets
    ``base[c]`` of them and the shards in ``extras[c]`` (sorted, distinct) one more. The extra
    rows of all classes are numbered one after the other (classes in a seeded order) and extra
    ``t`` goes to shard ``(t * stride + offset) mod shards``: each shard gets ``floor(R / S)``
    or ``ceil(R / S)`` of the ``R`` extra rows, and, the stride being near ``S / phi^2``, one
    class's extras are spread over the shards rather than bunched. Row ``j`` of a class goes to
    the shard whose range holds it, ranges in shard order.

    Memory: the extras, ``sum(n_c mod S)`` shard numbers (below classes x shards, both limited;
    not growing with the file).
    """

    shards: int
    base: np.ndarray
    extras: tuple[np.ndarray, ...]
    stride: int
    offset: int

    @classmethod
    def make(cls, train_per_class: list[int], shards: int, seed: int) -> DealPlan:
        """Plan the deal of ``train_per_class[c]`` rows of each class over ``shards`` shards.

        Args:
            train_per_class: training rows of each class (after the holdout).
            shards: how many shards (at least 1).
            seed: the job's seed; the same seed and counts give the same plan.

        Returns:
            The plan.
        """
        counts = np.asarray(train_per_class, dtype=np.int64)
        rng = np.random.default_rng([seed, 7919, 2])
        order = rng.permutation(len(counts))
        offset = int(rng.integers(shards))
        stride = spread_stride(shards)
        remainders = counts % shards
        first = np.zeros(len(counts), dtype=np.int64)
        first[order] = np.cumsum(remainders[order]) - remainders[order]
        dtype = np.uint16 if shards <= 1 << 16 else np.int64
        extras = tuple(
            np.sort(((first[c] + np.arange(remainders[c])) % shards * stride + offset)
                    % shards).astype(dtype)
            for c in range(len(counts)))
        return cls(shards=shards, base=counts // shards, extras=extras, stride=stride,
                   offset=offset)

    def sizes(self) -> np.ndarray:
        """Training rows of each shard."""
        total_extras = sum(len(e) for e in self.extras)
        sizes = np.full(self.shards, int(self.base.sum()) + total_extras // self.shards,
                        dtype=np.int64)
        first_round = np.arange(total_extras % self.shards, dtype=np.int64)
        sizes[(first_round * self.stride + self.offset) % self.shards] += 1
        return sizes

    def shard_of(self, c: int, j: np.ndarray) -> np.ndarray:
        """Shards of rows ``j`` (0-based among class ``c``'s training rows, file order)."""
        extras, per_shard = self.extras[c], int(self.base[c])
        if per_shard == 0:
            return extras[j].astype(np.int64)
        j = np.asarray(j, dtype=np.int64)
        # shard k holds rows [start(k), start(k + 1)), start(k) = k * base + extras below k, so
        # k * base <= start(k) <= k * base + min(k, len(extras)): binary search within that
        low = np.maximum(j // (per_shard + 1), (j - len(extras)) // per_shard)
        high = np.minimum(j // per_shard + 1, self.shards)
        while True:
            open_ = high - low > 1
            if not open_.any():
                return low
            middle = (low + high) // 2
            # (the query in the extras' own dtype: otherwise numpy converts the extras each time)
            below = middle * per_shard + np.searchsorted(extras, middle.astype(extras.dtype)) <= j
            low = np.where(open_ & below, middle, low)
            high = np.where(open_ & ~below, middle, high)


def holdout_phases(seed: int, classes: int) -> np.ndarray:
    """Per-class random phases for the systematic holdout rule."""
    return np.random.default_rng([seed, 7919]).random(classes)


@dataclass(frozen=True)
class SplitPlan:
    """Plans a file's split: its holdout rows, and the deal of the others (``DealPlan``).

    Decided from the class counts alone, before pass 2.

    Attributes:
        classes: class names in class-id order.
        class_counts: rows of each class in the file.
        label_kind: how labels were read ("int", "float", "text").
        hold_phase: each class's holdout phase (which of its rows are held out).
        holdout_per_class: rows of each class kept for the holdout.
        train_per_class: rows of each class to train on (dealt to the shards).
        deal: which shard each training row goes to.
        validation_fraction: the share of each class's non-holdout rows held out for
            validation (0: none), and ``validation_reason``, why.
        val_share: each class's share (0 for a class with fewer than two such rows, which keep
            them all for training) and ``val_phase``, its phase (the holdout's rule).
        validation_per_class: rows of each class held out for validation.
    """

    classes: list[str]
    class_counts: list[int]
    label_kind: str
    hold_phase: np.ndarray
    holdout_per_class: list[int]
    train_per_class: list[int]
    deal: DealPlan
    validation_fraction: float = 0.0
    validation_reason: str = ""
    val_share: np.ndarray | None = None
    val_phase: np.ndarray | None = None
    validation_per_class: list[int] = field(default_factory=list)

    @property
    def validation_rows(self) -> int:
        return int(sum(self.validation_per_class))

    @property
    def train_rows(self) -> int:
        return int(sum(self.train_per_class))

    @property
    def shards(self) -> int:
        return self.deal.shards


@dataclass(frozen=True)
class Unsplittable:
    """Why a file's class counts cannot be split: the texts of its problem (what is wrong, what
    was expected, what was found); ``of_label``: whether it is the label column's."""

    message: str
    expected: str
    found: str
    of_label: bool = True


def _elided(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def plan_split(classes: list[str], class_counts: list[int], label_kind: str,
               holdout_fraction: float, rows_per_shard: int, seed: int,
               max_tasks_per_epoch: int, validation_fraction: float | None = 0.0
               ) -> SplitPlan | Unsplittable:
    """Decide holdout, validation and shards from the class counts (pure: no I/O).

    Args:
        classes, class_counts, label_kind: the classes (names in class-id order), their rows
            in the file and how labels were read.
        holdout_fraction, rows_per_shard, seed: the job's options.
        max_tasks_per_epoch: the deployment's limit on shards.
        validation_fraction: the share of each class's other rows held out for validation
            (0: none; None: ``domain.recipe.validation_share`` decides from their count), by
            the holdout's systematic rule with phases of its own.

    Returns:
        The plan, or why there is none: a class with one row, too few rows, or too many shards.
    """
    single = [name for name, n in zip(classes, class_counts, strict=True) if n < 2]
    if single:
        return Unsplittable("a class has too few rows to train and evaluate",
                            expected="at least 2 rows of every class (one to train on, one to "
                                     "evaluate on)",
                            found=f"{len(single)} of {len(classes)} classes with a single row: "
                                  + _elided(", ".join(repr(v) for v in single), 120))
    random_phase = holdout_phases(seed, len(classes))
    hold_phase = np.array([holdout_phase(n, holdout_fraction, random_phase[c])
                           for c, n in enumerate(class_counts)])
    holdout_per_class = [holdout_count(n, holdout_fraction, hold_phase[c])
                         for c, n in enumerate(class_counts)]
    train_per_class = [n - h for n, h in zip(class_counts, holdout_per_class, strict=False)]
    share, reason = validation_share(sum(train_per_class), validation_fraction)
    val_share, val_phase, validation_per_class = _validation(train_per_class, share, seed)
    train_per_class = [n - v for n, v in zip(train_per_class, validation_per_class, strict=True)]
    train_rows = sum(train_per_class)
    if train_rows < 1 or sum(holdout_per_class) < 1:
        return Unsplittable("too few rows to train and evaluate",
                            expected="enough rows for a training split and a holdout "
                                     f"(holdout_fraction={holdout_fraction})",
                            found=f"{sum(class_counts)} rows")
    # never more shards than training rows: then no shard is empty
    shards = min(max(1, round(train_rows / rows_per_shard)), train_rows)
    if shards > max_tasks_per_epoch:
        return Unsplittable("the file would need too many shards",
                            expected=f"at most {max_tasks_per_epoch} shards per epoch "
                                     "(raise rows_per_shard)",
                            found=f"{shards} shards of {rows_per_shard} rows", of_label=False)
    return SplitPlan(classes, list(class_counts), label_kind, hold_phase, holdout_per_class,
                     train_per_class, DealPlan.make(train_per_class, shards, seed), share,
                     reason, val_share, val_phase, validation_per_class)


def _validation(rows_per_class: list[int], share: float, seed: int
                ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Each class's validation share, phase and rows: ``share`` of its rows by the holdout's
    rule, none for a class with fewer than two (it keeps its row for training)."""
    shares = np.array([share if n >= 2 else 0.0 for n in rows_per_class])
    phases = np.array([holdout_phase(n, s, p) for n, s, p in zip(
        rows_per_class, shares, np.random.default_rng([seed, 7919, 5]).random(
            len(rows_per_class)), strict=True)])
    counts = [holdout_count(n, s, p) if s > 0 else 0
              for n, s, p in zip(rows_per_class, shares, phases, strict=True)]
    return shares, phases, counts


def holdout_sample(part_rows: Sequence[int], max_rows: int, seed: int) -> list[np.ndarray]:
    """Which rows of each holdout part make a fixed random sample of ``max_rows`` rows.

    Uniform over the whole holdout, without replacement: how many rows each part gives is
    drawn from the multivariate hypergeometric distribution, then which rows within the part.
    Reproducible from ``seed``; every row when there are no more than ``max_rows``. Pure.

    Args:
        part_rows: the rows of each part, in the manifest's order.
        max_rows: the sample's size, at most.
        seed: the job's seed.

    Returns:
        One sorted array of row indices per part (empty for a part the sample skips).
    """
    if sum(part_rows) <= max_rows:
        return [np.arange(n) for n in part_rows]
    rng = np.random.default_rng([seed, 31])
    taken = rng.multivariate_hypergeometric(np.asarray(part_rows, dtype=np.int64), max_rows)
    return [np.sort(rng.choice(n, int(k), replace=False)) if k else np.arange(0)
            for n, k in zip(part_rows, taken, strict=True)]
