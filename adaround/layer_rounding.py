"""Optimising one layer's rounding: Adam on ``alpha`` against reconstruction loss + rounding regulariser.

PURE numpy. The weight's grid comes from its (frozen) encoding: per tensor, per channel or per block
``scale`` and ``zero_point`` broadcast to the weight's shape; the soft integer code is
``clip(floor(W / scale) + h(alpha) + zero_point, qmin, qmax)`` and the soft weight
``(code - zero_point) * scale``. The result is the hard rounding (``alpha >= 0``): weights exactly on the
grid, which the sim's fake quantization maps to themselves.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from adaround.activations import Activation
from adaround.layer_data import ColumnSample, SecondMoments
from adaround.linear_form import LinearForm
from adaround.params import AdaroundSettings
from adaround.rounding import (
    Adam,
    beta_at,
    init_alpha,
    rectified_sigmoid,
    rectified_sigmoid_grad,
    regularizer_grad,
)

__all__ = ["WeightGrid", "RoundingResult", "optimize_rounding", "reconstruction_loss"]


@dataclass(frozen=True)
class WeightGrid:
    """A weight's integer grid broadcast to its shape."""

    scale: np.ndarray  # float32, broadcastable to the weight
    zero_point: np.ndarray  # float32 (exact small integers)
    qmin: int
    qmax: int

    def floor_and_fraction(self, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ratio = np.divide(weight, self.scale, dtype=np.float32)
        base = np.floor(ratio)
        return base, ratio - base

    def weight(self, base: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(soft weight, d soft weight / d h)``."""
        code = base + h + self.zero_point
        inside = (code >= self.qmin) & (code <= self.qmax)
        clipped = np.clip(code, self.qmin, self.qmax)
        return ((clipped - self.zero_point) * self.scale).astype(np.float32), np.where(inside, self.scale, 0.0)

    def nearest(self, weight: np.ndarray) -> np.ndarray:
        code = np.clip(np.rint(np.divide(weight, self.scale, dtype=np.float32)) + self.zero_point, self.qmin, self.qmax)
        return ((code - self.zero_point) * self.scale).astype(np.float32)


@dataclass(frozen=True)
class RoundingResult:
    """The rounded weight and the reconstruction loss of nearest rounding and of the result."""

    weight: np.ndarray
    loss_before: float
    loss_after: float
    flipped: float  # share of weights rounded away from nearest
    kept_nearest: bool = False  # the optimised rounding was worse on the data: nearest rounding kept


def reconstruction_loss(form: LinearForm, w_soft: np.ndarray, w_float: np.ndarray, data: SecondMoments | ColumnSample,
                        bias: np.ndarray, activation: Activation | None) -> tuple[float, np.ndarray]:
    """``(loss, d loss / d W_soft)`` in weight layout, over all the data (or all sampled columns)."""
    ms, mf = form.to_matrix(w_soft), form.to_matrix(w_float)
    if isinstance(data, SecondMoments):
        return data.loss(ms, mf), form.to_weight(data.grad(ms, mf))
    return _sampled(form, ms, data.cols, data.target, bias, activation)


def _sampled(form: LinearForm, ms: np.ndarray, cols: np.ndarray, target: np.ndarray, bias: np.ndarray,
             activation: Activation | None) -> tuple[float, np.ndarray]:
    g, m_g, _ = ms.shape
    z = (np.matmul(ms, cols) + bias).reshape(g * m_g, -1)
    y = z if activation is None else activation.forward(z)
    diff = y - target
    columns = diff.shape[1]
    upstream = (2.0 / columns) * diff
    dz = upstream if activation is None else activation.backward(z, y, upstream)
    grad = np.matmul(dz.reshape(g, m_g, -1).astype(np.float32), np.swapaxes(cols, 1, 2))
    return float(np.sum(diff * diff)) / columns, form.to_weight(grad)


def optimize_rounding(form: LinearForm, weight: np.ndarray, grid: WeightGrid, data: SecondMoments | ColumnSample,
                      bias: np.ndarray, activation: Activation | None, settings: AdaroundSettings,
                      rng: np.random.Generator, on_step: Callable[[int], None] | None = None) -> RoundingResult:
    """AdaRound one layer (see the module docstring); ``on_step(i)`` is called after each iteration."""
    base, fraction = grid.floor_and_fraction(weight)
    alpha = init_alpha(fraction)
    adam = Adam(alpha, lr=settings.learning_rate)
    float_matrix = form.to_matrix(weight)
    total = data.cols.shape[2] if isinstance(data, ColumnSample) else 0
    batch = min(settings.columns_per_iteration, total) if total else 0
    for iteration in range(settings.num_iterations):
        h = rectified_sigmoid(alpha)
        w_soft, dw_dh = grid.weight(base, h)
        if isinstance(data, ColumnSample):  # columns were shuffled once: consecutive windows are random samples
            start = min((iteration * batch) % total, total - batch)
            window = slice(start, start + batch)
            _, grad_w = _sampled(form, form.to_matrix(w_soft), data.cols[:, :, window], data.target[:, window], bias,
                                 activation)
        else:
            grad_w = form.to_weight(data.grad(form.to_matrix(w_soft), float_matrix))
        grad_h = grad_w * dw_dh
        beta = beta_at(iteration, settings.num_iterations, settings.beta_range, settings.warm_start)
        if beta is not None and settings.reg_param:
            grad_h = grad_h + settings.reg_param * regularizer_grad(h, beta)
        adam.step((grad_h * rectified_sigmoid_grad(alpha)).astype(np.float32))
        if on_step is not None:
            on_step(iteration)
    hard = grid.weight(base, (alpha >= 0).astype(np.float32))[0]
    nearest = grid.nearest(weight)
    loss_before = reconstruction_loss(form, nearest, weight, data, bias, activation)[0]
    loss_hard = reconstruction_loss(form, hard, weight, data, bias, activation)[0]
    if loss_hard > loss_before:  # too few iterations to settle: never end worse than nearest rounding
        return RoundingResult(nearest, loss_before, loss_before, 0.0, kept_nearest=True)
    return RoundingResult(hard, loss_before, loss_hard, float(np.mean(hard != nearest)))

