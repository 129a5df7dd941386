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
2. some channel's grid is over `REACH_LIMIT` (2) times wider than the min-max grid of that channel's weights
   (its largest magnitude against min-max's), so most of its codes go unused. An encoding computed on these
   weights never does that: min-max is the reference (a dead channel's grid at the scale floor included),
   and Sequential MSE, TF-enhanced or percentile ranges only shrink the grid.
Clipping alone is not the test: Sequential MSE clips on purpose, and on layers the output hardly depends on
(squeeze-excitation convolutions) it keeps grids of 0.15x a channel's range with 18% of the values clipped,
up to 11 dB more weight error than min-max (PaddleOCR's cls.onnx, W4, random data). Moving encodings to
weights they were not computed on rescales channels both ways, so some grids are too wide. Measured (W4,
encodings of the default BatchNormalization-folded sim frozen onto a ``fold_batchnorm=False`` sim): a
two-Conv-BN model 2 of 2 convolutions (12-14 dB, channel reaches 0.13x-7.6x); cls.onnx 17 weights,
orientation/model.onnx 26, PaddleOCR det.onnx 2; the same files on a folded sim, and Sequential MSE's own
encodings, flag none on any of them.
The report adds the fraction of values clipped (further than half a step outside the grid).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantsim.core.numerics import Encoding, broadcast_param, encoding_from_range, fake_quantize, reduce_min_max

__all__ = ["MSE_RATIO_LIMIT", "REACH_LIMIT", "WeightFit", "weight_fit"]

MSE_RATIO_LIMIT = 4.0
"""A file's weight encoding fits when its quantization error is at most this many times min-max's (one bit)."""
REACH_LIMIT = 2.0
"""A channel's grid reaching more than this many times its weights' largest magnitude was made for other weights."""
_NEGLIGIBLE = 1e-6  # error / mean square of the weights below which any encoding fits (60 dB)


@dataclass(frozen=True)
class WeightFit:
    """How well ``encoding`` fits ``tensor``'s values: its quantization MSE against min-max's of the same spec,
    the fraction of values clipped, and the grid's reach (largest magnitude) over min-max's (its smallest and
    largest value over the channels of a per-channel grid)."""

    tensor: str
    mse_ratio: float
    clipped_fraction: float
    reach_low: float
    reach_high: float

    @property
    def fits(self) -> bool:
        return self.mse_ratio <= MSE_RATIO_LIMIT or self.reach_high <= REACH_LIMIT

    def describe(self) -> str:
        reach = (f"{self.reach_low:.2g}x" if np.isclose(self.reach_low, self.reach_high, rtol=0.05)
                 else f"{self.reach_low:.2g}x to {self.reach_high:.2g}x")
        return (f"{self.tensor} ({100 * self.clipped_fraction:.1f}% of values clipped; the grid reaches {reach} "
                f"as far as the weights' min-max grid; {10 * np.log10(max(self.mse_ratio, 1e-12)):.0f} dB more error than "
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
                                    strict=encoding.qmin == -encoding.qmax,
                                    unsigned_symmetric=bool(encoding.symmetric) and not encoding.signed, axis=encoding.axis,
                                    block_axis=encoding.block_axis, block_size=encoding.block_size)
    ref_error = float(np.mean((fake_quantize(w, reference) - w).astype(np.float64) ** 2))
    if error <= _NEGLIGIBLE * power:
        ratio = 0.0
    else:
        ratio = error / ref_error if ref_error > 0 else float("inf")
    scale = broadcast_param(encoding, encoding.scale, w.shape)
    low, high = _grid(encoding, w.shape)
    clipped = float(np.mean((w < low - scale / 2) | (w > high + scale / 2)))
    reach = np.maximum(np.abs(low), np.abs(high)) * np.ones_like(w)
    ref_low, ref_high = _grid(reference, w.shape)  # min-max, scale floor included: a dead channel's grid too
    ref_reach = np.maximum(np.abs(ref_low), np.abs(ref_high)) * np.ones_like(w)
    axis = encoding.axis
    if axis is None:
        ratios = [_ratio(float(reach.max()), float(ref_reach.max()))]
    else:
        def per_channel(values: np.ndarray) -> np.ndarray:
            return np.moveaxis(values, axis, 0).reshape(w.shape[axis], -1).max(axis=1)
        ratios = [_ratio(float(g), float(r)) for g, r in zip(per_channel(reach), per_channel(ref_reach))]
    return WeightFit(tensor, ratio, clipped, min(ratios), max(ratios))


def _grid(encoding: Encoding, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The lowest and highest values ``encoding``'s grid holds, broadcast against ``shape``."""
    scale = broadcast_param(encoding, encoding.scale, shape)
    zero = broadcast_param(encoding, encoding.zero_point, shape)
    return (encoding.qmin - zero) * scale, (encoding.qmax - zero) * scale


def _ratio(grid: float, reference: float) -> float:
    return grid / reference if reference > 0 else 1.0
