"""Per-channel histograms of weights whose channels are their last axis (MatMul, Gemm) are binned in place,
tile by tile (`histograms._last_axis_item`): the same counts, grids and ranges, bit for bit, as binning the
float64 copy in channel order (the oracle: the general path, forced by switching the in-place one off), and
so the same TF-enhanced encodings."""
from __future__ import annotations

import numpy as np
import pytest

import quantsim.calibration.histograms as histograms


def _both(monkeypatch, x, axis):
    fast = histograms._tensor_item(x, axis, 512)
    with monkeypatch.context() as patch:
        patch.setattr(histograms, "_last_axis_item", lambda *args, **kwargs: None)
        general = histograms._tensor_item(x, axis, 512)
    return fast, general


@pytest.mark.parametrize("shape", [(700, 130), (64, 64), (3, 5, 70), (1, 9), (1030, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_in_place_channel_histograms_equal_the_general_ones(monkeypatch, shape, dtype):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 10, shape[-1])).astype(dtype)
    x[..., 0] = 0.5  # a constant channel: the empty-range grid
    fast, general = _both(monkeypatch, x, -1)
    for mine, theirs in zip(fast, general):
        np.testing.assert_array_equal(mine, theirs)
        assert np.asarray(mine).dtype == np.asarray(theirs).dtype
    assert fast[0].sum() == x.size


def test_non_finite_channels_take_the_general_path(monkeypatch):
    x = np.random.default_rng(1).standard_normal((40, 8)).astype(np.float32)
    x[3, 2], x[5, 6] = np.nan, np.inf
    fast, general = _both(monkeypatch, x, 1)
    for mine, theirs in zip(fast, general):
        np.testing.assert_array_equal(mine, theirs)


def test_tf_enhanced_encodings_are_unchanged(monkeypatch):
    x = np.random.default_rng(2).standard_normal((300, 70)).astype(np.float32) ** 3
    fast = histograms.tf_enhanced_encodings_of([(x, 1)], 8, symmetric=True)[0]
    with monkeypatch.context() as patch:
        patch.setattr(histograms, "_last_axis_item", lambda *args, **kwargs: None)
        general = histograms.tf_enhanced_encodings_of([(x, 1)], 8, symmetric=True)[0]
    np.testing.assert_array_equal(fast.scale, general.scale)
    np.testing.assert_array_equal(fast.zero_point, general.zero_point)
