"""How a job's numbers are put on one scale before its model sees them, fitted on a sample of
its training rows (``Preprocessing``, stored in the manifest and built into the model). Pure:
numpy arrays in, numbers out.

Each numeric cell (a numeric column, or a part of a date) is centred on its median and divided
by its interquartile range (half its range where that is 0, 1 where both are), then squashed
smoothly into about (-3, 3) by ``x / sqrt(1 + (x / 3)^2)``: robust scaling with smooth clipping,
as RealMLP (Holzmüller et al. 2024) does, so a skewed column or an outlier cannot dominate the
first layer. A missing cell takes the median (and the column a missing indicator, as before).
Where a table has few enough numeric cells (``PLE_MAX_CELLS``), each is also given a
piecewise-linear encoding over ``PLE_BINS`` quantile bins of its scaled training values
(Gorishniy et al. 2022, "On Embeddings for Numerical Features in Tabular Deep Learning"): the
edges are fitted here; the model turns the encoding into a learned embedding per cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PLE_BINS = 16
PLE_MAX_CELLS = 128  # numeric cells beyond which no encoding is made (its weights grow with them)
CLIP = 3.0
SAMPLE_ROWS = 8192  # training rows the statistics are fitted on, at most
SAMPLE_BYTES = 32 * 1024**2  # and at most this many bytes of them


def sample_rows(width: int) -> int:
    """How many training rows of ``width`` cells the fit's sample holds."""
    return max(64, min(SAMPLE_ROWS, SAMPLE_BYTES // max(1, 4 * width)))


def squash(z: np.ndarray) -> np.ndarray:
    """Smooth clipping into about (-``CLIP``, ``CLIP``): identity near 0."""
    return z / np.sqrt(1.0 + np.square(z / CLIP))


@dataclass(frozen=True)
class Preprocessing:
    """The fitted scaling of a matrix's numeric cells.

    Attributes:
        cells: the matrix's numeric cells (indices, in order).
        center, scale: each such cell's median and scale.
        edges: with an encoding, each cell's ``PLE_BINS + 1`` bin edges over its scaled values
            (non-decreasing); empty without one.
    """

    cells: list[int]
    center: list[float]
    scale: list[float]
    edges: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"cells": list(self.cells), "center": list(self.center),
                "scale": list(self.scale), "edges": [list(e) for e in self.edges]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Preprocessing:
        return cls([int(c) for c in data["cells"]], [float(v) for v in data["center"]],
                   [float(v) for v in data["scale"]],
                   [[float(v) for v in e] for e in data.get("edges") or []])


def fit(sample: np.ndarray, numeric_cells: Sequence[int], encode: bool | None = None
        ) -> Preprocessing:
    """Fit the scaling (and, with ``encode``, the encoding's bin edges) of ``numeric_cells`` on
    a sample of training rows.

    Args:
        sample: training rows (rows x cells of the matrix, float32, NaN where missing).
        numeric_cells: the cells to scale.
        encode: make the encoding's edges; None: when there are at most ``PLE_MAX_CELLS``.
    """
    cells = list(numeric_cells)
    if encode is None:
        encode = 0 < len(cells) <= PLE_MAX_CELLS
    if not cells:
        return Preprocessing([], [], [])
    values = sample[:, cells].astype(np.float64) if len(sample) else np.zeros((0, len(cells)))
    present = ~np.isnan(values)
    center, scale, edges = [], [], []
    for j in range(len(cells)):
        column = values[present[:, j], j]
        if len(column) == 0:
            center.append(0.0)
            scale.append(1.0)
            edges.append([0.0] * (PLE_BINS + 1))
            continue
        q1, median, q3 = np.quantile(column, [0.25, 0.5, 0.75])
        spread = q3 - q1
        if not spread > 0:
            spread = 0.5 * (column.max() - column.min())
        spread = spread if spread > 0 else 1.0
        center.append(float(median))
        scale.append(float(spread))
        scaled = squash((column - median) / spread)
        bounds = np.quantile(scaled, np.linspace(0.0, 1.0, PLE_BINS + 1))
        edges.append([float(v) for v in np.maximum.accumulate(bounds)])
    return Preprocessing(cells, center, scale, edges if encode else [])
