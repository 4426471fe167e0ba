"""The numeric cells' scaling (``domain.scaling``): robust scaling with smooth clipping, the
encoding's bins, fitted on a sample of training rows."""

from __future__ import annotations

import numpy as np

from bucketlearn.domain import scaling


def test_a_skewed_column_is_centred_on_its_median_and_scaled_by_its_quartiles() -> None:
    # Prepare
    rng = np.random.default_rng(0)
    x = np.stack([rng.lognormal(0, 2, 5000), rng.normal(10, 3, 5000)], axis=1)
    # Execute
    fitted = scaling.fit(x.astype(np.float32), [0, 1])
    # Assert
    q1, median, q3 = np.quantile(x[:, 0].astype(np.float32), [0.25, 0.5, 0.75])
    assert fitted.center[0] == np.float32(median).item() or abs(fitted.center[0] - median) < 1e-3
    assert abs(fitted.scale[0] - (q3 - q1)) < 1e-2
    assert len(fitted.edges) == 2 and all(len(e) == scaling.PLE_BINS + 1 for e in fitted.edges)
    assert all(np.all(np.diff(e) >= 0) for e in fitted.edges)
    # the outliers of the skewed column land within the smooth clip's bound
    assert max(fitted.edges[0]) < scaling.CLIP


def test_constant_missing_and_wide_inputs_get_safe_scales() -> None:
    # Prepare
    x = np.zeros((100, 3), dtype=np.float32)
    x[:, 1] = np.nan
    x[:20, 2] = 5.0  # no spread between its quartiles: half the range
    # Execute
    fitted = scaling.fit(x, [0, 1, 2])
    wide = scaling.fit(np.zeros((10, 400), np.float32), list(range(400)))
    # Assert
    assert fitted.scale == [1.0, 1.0, 2.5] and fitted.center[1] == 0.0
    assert wide.edges == []  # too many cells for an encoding of its own each
    assert scaling.Preprocessing.from_dict(fitted.to_dict()) == fitted


def test_squash_is_the_identity_near_zero_and_bounded() -> None:
    z = np.array([0.0, 0.1, 3.0, 1e6, -1e6])
    out = scaling.squash(z)
    assert abs(out[1] - 0.1) < 1e-3 and np.all(np.abs(out) < scaling.CLIP)
