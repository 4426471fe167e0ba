"""What a split adds up of its training rows as they stream past: their mean and variance per
cell (``RunningStats``), and a fixed-size uniform sample of them (``RowSample``), which the
numeric cells' scaling is fitted on (``domain.scaling``).

Each training row gets a pseudo-random key from the job's seed and its number among the
training rows (file order), and the sample keeps the rows with the smallest keys (a bottom-k
sample: uniform, without replacement). The keys depend on nothing but the seed and the row's
number, so the sample is the same however the file is cut into batches.
"""

from __future__ import annotations

import numpy as np

_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9),
        np.uint64(0x94D049BB133111EB))


def row_keys(seed: int, ordinals: np.ndarray) -> np.ndarray:
    """SplitMix64 of (seed, row number): well-spread uint64 keys, one per row."""
    with np.errstate(over="ignore"):
        z = ordinals.astype(np.uint64) + np.uint64(seed & 0xFFFFFFFF) * _MIX[0] + _MIX[0]
        z = (z ^ (z >> np.uint64(30))) * _MIX[1]
        z = (z ^ (z >> np.uint64(27))) * _MIX[2]
        return z ^ (z >> np.uint64(31))


class RunningStats:
    """Chan et al. parallel mean/variance over row blocks, in float64, per column over the cells
    that are not NaN (a missing cell is imputed later, so it does not count)."""

    def __init__(self, width: int) -> None:
        self.n = np.zeros(width)
        self.mean = np.zeros(width)
        self.m2 = np.zeros(width)

    def add(self, x: np.ndarray) -> None:
        if len(x) == 0:
            return
        block = x.astype(np.float64)  # the one float64 copy: deviations are squared in place
        missing = np.isnan(block)
        if missing.any():
            n_b = (~missing).sum(axis=0).astype(np.float64)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean_b = np.where(n_b > 0, np.nansum(block, axis=0) / np.maximum(n_b, 1), 0.0)
            block -= mean_b
            block[missing] = 0.0
        else:
            n_b = np.full(block.shape[1], float(len(block)))
            mean_b = block.mean(axis=0)
            block -= mean_b
        np.square(block, out=block)
        m2_b = block.sum(axis=0)
        total = self.n + n_b
        delta = mean_b - self.mean
        share = np.divide(n_b, total, out=np.zeros_like(total), where=total > 0)
        cross = np.divide(self.n * n_b, total, out=np.zeros_like(total), where=total > 0)
        self.mean = self.mean + delta * share
        self.m2 = self.m2 + m2_b + delta**2 * cross
        self.n = total

    def variance(self) -> np.ndarray:
        var = self.m2 / np.maximum(self.n, 1)
        # A feature constant in training data would divide by ~0 at prediction time: leave it
        # unscaled instead (variance 1) so unseen values cannot explode.
        return np.where(var < 1e-12, 1.0, var)


class RowSample:
    """At most ``size`` training rows, uniformly sampled (see the module docstring)."""

    def __init__(self, size: int, width: int, seed: int) -> None:
        self.size, self.seed = size, seed
        self.rows = np.zeros((0, width), dtype=np.float32)
        self.keys = np.zeros(0, dtype=np.uint64)
        self.seen = 0

    def add(self, x: np.ndarray) -> None:
        """Offer a batch's training rows, in file order."""
        if len(x) == 0:
            return
        keys = row_keys(self.seed, np.arange(self.seen, self.seen + len(x)))
        self.seen += len(x)
        keys = np.concatenate([self.keys, keys])
        rows = np.concatenate([self.rows, x.astype(np.float32, copy=False)])
        if len(keys) > self.size:
            keep = np.argpartition(keys, self.size - 1)[:self.size]
            keys, rows = keys[keep], rows[keep]
        self.keys, self.rows = keys, rows

    def sample(self) -> np.ndarray:
        """The sampled rows, ordered by key (the same rows in the same order every time)."""
        order = np.argsort(self.keys, kind="stable")
        return self.rows[order]
