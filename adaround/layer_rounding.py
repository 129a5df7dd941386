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
from adaround.rounding import GAMMA, ZETA, Adam, beta_at, init_alpha

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
             activation: Activation | None, with_loss: bool = True) -> tuple[float, np.ndarray]:
    g, m_g, _ = ms.shape
    z = np.matmul(ms, cols)
    z += bias
    z = z.reshape(g * m_g, -1)
    y = z if activation is None else activation.forward(z)
    diff = y - target
    columns = diff.shape[1]
    loss = float(np.vdot(diff, diff)) / columns if with_loss else float("nan")
    diff *= 2.0 / columns
    dz = diff if activation is None else activation.backward(z, y, diff)
    grad = np.matmul(dz.reshape(g, m_g, -1).astype(np.float32, copy=False), np.swapaxes(cols, 1, 2))
    return loss, form.to_weight(grad)


class _SoftRounding:
    """One layer's soft weight ``W(alpha)`` and the chain rule back to ``alpha``, on buffers reused every
    iteration (the elementwise work dominated small layers' iterations when each step made temporaries).
    Computes exactly `rectified_sigmoid`, `WeightGrid.weight`, `regularizer_grad` and
    `rectified_sigmoid_grad` (tested against them)."""

    def __init__(self, grid: WeightGrid, base: np.ndarray, zeta: float = ZETA, gamma: float = GAMMA):
        shape = base.shape
        self.scale = np.broadcast_to(grid.scale, shape).astype(np.float32)
        self.low = np.broadcast_to(grid.qmin - grid.zero_point, shape).astype(np.float32)
        self.high = np.broadcast_to(grid.qmax - grid.zero_point, shape).astype(np.float32)
        self.base = base.astype(np.float32)
        self.stretch, self.gamma = np.float32(zeta - gamma), np.float32(gamma)
        self.sigmoid, self.h, self.dh = (np.empty(shape, np.float32) for _ in range(3))
        self.code, self.weight, self.grad, self.work = (np.empty(shape, np.float32) for _ in range(4))
        self.inside = np.empty(shape, bool)

    def forward(self, alpha: np.ndarray) -> np.ndarray:
        """The soft weight for ``alpha`` (a buffer, valid until the next call)."""
        s, h = self.sigmoid, self.h
        np.multiply(alpha, 0.5, out=s)
        np.tanh(s, out=s)
        s += 1
        s *= 0.5
        np.multiply(s, self.stretch, out=h)
        h += self.gamma
        np.subtract(1, s, out=self.dh)  # dh/dalpha = s (1 - s) (zeta - gamma) where the clip is inactive
        self.dh *= s
        self.dh *= self.stretch
        self.dh *= (h > 0) & (h < 1)
        np.clip(h, 0, 1, out=h)
        np.add(self.base, h, out=self.code)
        np.greater_equal(self.code, self.low, out=self.inside)
        self.inside &= self.code <= self.high
        np.clip(self.code, self.low, self.high, out=self.code)
        return np.multiply(self.code, self.scale, out=self.weight)

    def backward(self, grad_weight: np.ndarray, beta: float | None, reg_param: float) -> np.ndarray:
        """``d (loss + reg_param * regularizer) / d alpha`` from ``d loss / d W`` (a buffer)."""
        g = np.multiply(grad_weight, self.scale, out=self.grad)
        g *= self.inside
        if beta is not None and reg_param:
            u = np.multiply(self.h, 2, out=self.work)
            u -= 1
            magnitude = np.power(np.abs(u), beta - 1)
            np.copysign(magnitude, u, out=magnitude)
            magnitude *= -2.0 * beta * reg_param
            g += magnitude
        g *= self.dh
        return g


def optimize_rounding(form: LinearForm, weight: np.ndarray, grid: WeightGrid, data: SecondMoments | ColumnSample,
                      bias: np.ndarray, activation: Activation | None, settings: AdaroundSettings,
                      rng: np.random.Generator, on_step: Callable[[int], None] | None = None) -> RoundingResult:
    """AdaRound one layer (see the module docstring); ``on_step(i)`` is called after each iteration."""
    base, fraction = grid.floor_and_fraction(weight)
    alpha = init_alpha(fraction)
    adam = Adam(alpha, lr=settings.learning_rate)
    soft = _SoftRounding(grid, base)
    float_matrix = form.to_matrix(weight)
    total = data.cols.shape[2] if isinstance(data, ColumnSample) else 0
    batch = min(settings.columns_per_iteration, total) if total else 0
    for iteration in range(settings.num_iterations):
        w_soft = soft.forward(alpha)
        if isinstance(data, ColumnSample):  # a window of consecutive columns at a random offset: a view
            start = int(rng.integers(0, total - batch + 1))
            window = slice(start, start + batch)
            _, grad_w = _sampled(form, form.to_matrix(w_soft), data.cols[:, :, window], data.target[:, window], bias,
                                 activation, with_loss=False)
        else:
            grad_w = form.to_weight(data.grad(form.to_matrix(w_soft), float_matrix))
        beta = beta_at(iteration, settings.num_iterations, settings.beta_range, settings.warm_start)
        adam.step(soft.backward(grad_w, beta, settings.reg_param))
        if on_step is not None:
            on_step(iteration)
    hard = grid.weight(base, (alpha >= 0).astype(np.float32))[0]
    nearest = grid.nearest(weight)
    loss_before = reconstruction_loss(form, nearest, weight, data, bias, activation)[0]
    loss_hard = reconstruction_loss(form, hard, weight, data, bias, activation)[0]
    if loss_hard > loss_before:  # too few iterations to settle: never end worse than nearest rounding
        return RoundingResult(nearest, loss_before, loss_before, 0.0, kept_nearest=True)
    return RoundingResult(hard, loss_before, loss_hard, float(np.mean(hard != nearest)))

