"""Does a weight encoding read from a file fit the weights it lands on?

A file's weight encodings are only right for the weights they were computed on. Loading or freezing them onto
other weights runs without error and quietly ruins the model: encodings computed on BatchNormalization-folded
weights and frozen onto a sim that keeps BatchNormalization (each channel's weights then differ from the
folded ones by ``gamma / sqrt(var + eps)``) clip some channels and waste the grid of others; so does a file
of another model with the same tensor names.

Rule (one per weight tensor, from its values): the file's encoding does not fit when both
1. quantizing the weights with it costs more than one bit against the min-max encoding of the same spec
   computed on these weights: its mean squared error is over `MSE_RATIO_LIMIT` (4 = 6 dB) times the min-max
   one's (a grid twice too wide costs exactly 4x: uniform rounding error grows with the square of the step);
   errors under a millionth of the weights' mean square (above 60 dB) never count; and
2. some channel's grid is far from its weights: it reaches more than `REACH_LIMITS[1]` (2) times the channel's
   largest magnitude (most of the grid unused; an encoding made for these weights reaches at most 8/7 of it)
   or less than `REACH_LIMITS[0]` (1/4) of it (three quarters of the range clipped away).
Encodings made for these weights pass: min-max equals the reference; Sequential MSE, TF-enhanced or percentile
ranges clip a little on purpose, which on a small layer can cost more than a bit of weight error (condition 1)
but never leaves a grid over twice too wide or one a quarter of the weights' range unless a single outlier
dominates the channel, and then the error stays small; AdaRound's weights lie on their grid. Measured on
a two-Conv-BN W4 model: encodings frozen from the folded sim onto an unfolded one cost 12-14 dB with channel
reaches 0.13x-7.6x; Sequential MSE's own encodings cost at most 9 dB with reaches 0.45x-1.1x.
The report adds the fraction of values clipped (further than half a step outside the grid).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantsim.core.numerics import Encoding, broadcast_param, encoding_from_range, fake_quantize, reduce_min_max

__all__ = ["MSE_RATIO_LIMIT", "REACH_LIMITS", "WeightFit", "weight_fit"]

MSE_RATIO_LIMIT = 4.0
"""A file's weight encoding fits when its quantization error is at most this many times min-max's (one bit)."""
REACH_LIMITS = (0.25, 2.0)
"""A channel's grid reach over its weights' largest magnitude outside these bounds is far from its weights."""
_NEGLIGIBLE = 1e-6  # error / mean square of the weights below which any encoding fits (60 dB)


@dataclass(frozen=True)
class WeightFit:
    """How well ``encoding`` fits ``tensor``'s values: its quantization MSE against min-max's of the same spec,
    the fraction of values clipped, and the grid's reach over the weights' largest magnitude (its smallest and
    largest value over the channels of a per-channel grid)."""

    tensor: str
    mse_ratio: float
    clipped_fraction: float
    reach_low: float
    reach_high: float

    @property
    def fits(self) -> bool:
        far = self.reach_low < REACH_LIMITS[0] or self.reach_high > REACH_LIMITS[1]
        return self.mse_ratio <= MSE_RATIO_LIMIT or not far

    def describe(self) -> str:
        reach = (f"{self.reach_low:.2g}x" if np.isclose(self.reach_low, self.reach_high, rtol=0.05)
                 else f"{self.reach_low:.2g}x to {self.reach_high:.2g}x")
        return (f"{self.tensor} ({100 * self.clipped_fraction:.1f}% of values clipped; the grid reaches {reach} the "
                f"weights' largest magnitude; {10 * np.log10(max(self.mse_ratio, 1e-12)):.0f} dB more error than "
                "a min-max grid)")


def weight_fit(tensor: str, values: np.ndarray, encoding: Encoding) -> WeightFit:
    """`WeightFit` of integer ``encoding`` on weight ``values`` (module docstring)."""
    w = np.asarray(values, dtype=np.float32)
    if w.size == 0:
        return WeightFit(tensor, 0.0, 0.0, 1.0, 1.0)
    error = float(np.mean((fake_quantize(w, encoding) - w).astype(np.float64) ** 2))
    power = float(np.mean(w.astype(np.float64) ** 2))
    mn, mx = reduce_min_max(w, encoding.axis, encoding.block_axis, encoding.block_size)
    reference = encoding_from_range(mn, mx, encoding.bits, symmetric=bool(encoding.symmetric),
                                    strict=encoding.qmin == -encoding.qmax, axis=encoding.axis,
                                    block_axis=encoding.block_axis, block_size=encoding.block_size)
    ref_error = float(np.mean((fake_quantize(w, reference) - w).astype(np.float64) ** 2))
    if error <= _NEGLIGIBLE * power:
        ratio = 0.0
    else:
        ratio = error / ref_error if ref_error > 0 else float("inf")
    scale = broadcast_param(encoding, encoding.scale, w.shape)
    zero = broadcast_param(encoding, encoding.zero_point, w.shape)
    low, high = (encoding.qmin - zero) * scale, (encoding.qmax - zero) * scale
    clipped = float(np.mean((w < low - scale / 2) | (w > high + scale / 2)))
    reach = np.maximum(np.abs(low), np.abs(high)) * np.ones_like(w)
    if encoding.axis is None:
        ratios = [_ratio(float(reach.max()), float(np.abs(w).max()))]
    else:
        moved = np.moveaxis(np.abs(w), encoding.axis, 0).reshape(w.shape[encoding.axis], -1)
        grid = np.moveaxis(reach, encoding.axis, 0).reshape(w.shape[encoding.axis], -1)
        ratios = [_ratio(float(g.max()), float(v.max())) for g, v in zip(grid, moved) if v.max() > 0] or [1.0]
    return WeightFit(tensor, ratio, clipped, min(ratios), max(ratios))


def _ratio(grid: float, weights: float) -> float:
    return grid / weights if weights > 0 else 1.0
