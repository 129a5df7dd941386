"""Optimising one layer's rounding: Adam on ``alpha`` against reconstruction loss + rounding regulariser.

PURE numpy. The weight's grid comes from its (frozen) encoding: per tensor, per channel or per block
``scale`` and ``zero_point`` broadcast to the weight's shape; the soft integer code is
``clip(floor(W / scale) + h(alpha) + zero_point, qmin, qmax)`` and the soft weight
``(code - zero_point) * scale``. The result is the hard rounding (``alpha >= 0``): weights exactly on the
grid, which the sim's fake quantization maps to themselves.

A layer whose output goes through a per-channel affine map ``y = s * z + t`` before anything else reads it (an
unfolded BatchNormalization, `quantsim.FollowingBatchNorm`) is optimised for the error after that map and after
the activation reading it, as the folded layer ``(s * W, s * b + t)`` would be (`OutputAffine`: rows of
``W_mat`` scaled; with an activation, the target is the float model's activation output after the map). Each
channel's error is counted in the layer's own output units (divided by ``s_m^2``): the output channels'
roundings are independent of each other, so a per-channel weight cannot move any channel's optimum, only its
balance against the rounding regulariser, which ``reg_param`` sets for the layer alone (measured: the plain
``s^2``-weighted loss rounds the high-``s`` channels worse). What the BN changes is which errors count: those
the activation after it clips away do not. Without an activation the objective is the layer's own loss. The
losses reported (and the never-worse-than-nearest check) are in the network's units, after the map.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from adaround.activations import Activation
from adaround.layer_data import ColumnSample, SecondMoments
from adaround.linear_form import LinearForm
from adaround.params import AdaroundSettings
from adaround.rounding import Adam, beta_at, init_alpha
from adaround.soft_rounding import SoftRounding as _SoftRounding
from quantsim import InvalidArgumentError

__all__ = ["WeightGrid", "RoundingResult", "OutputAffine", "optimize_rounding", "reconstruction_loss"]


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
    iterations: int = 0  # Adam steps taken (fewer than asked once no later step can change the rounding)


class OutputAffine:
    """A per-output-channel map ``y = scale * z + shift`` (``[M]`` each) applied to a layer's output ``z``.
    `apply` scales a weight's output channels (rows of ``W_mat``): a loss ``L`` of the folded layer is then
    ``L(apply(W))`` and its gradient ``apply(grad L(apply(W)))`` (``W_mat`` is a permutation of the weight's
    elements, so scaling rows commutes with it)."""

    def __init__(self, form: LinearForm, scale: np.ndarray, shift: np.ndarray | None = None):
        scale = np.asarray(scale, np.float64).reshape(-1)
        shift = np.zeros_like(scale) if shift is None else np.asarray(shift, np.float64).reshape(-1)
        if scale.size != form.rows or shift.size != form.rows:
            raise InvalidArgumentError(f"the output map has {scale.size} scales and {shift.size} shifts, the layer "
                                       f"has {form.rows} output channels")
        if not (np.isfinite(scale).all() and np.isfinite(shift).all()):
            raise InvalidArgumentError("the output map's scale or shift is not finite")
        groups = form.to_matrix(np.zeros(form.weight_shape, np.float32)).shape[0]
        self.form = form
        self.rows = scale.reshape(groups, -1, 1).astype(np.float32)
        self.shift = shift.reshape(groups, -1, 1).astype(np.float32)

    def apply(self, weight: np.ndarray) -> np.ndarray:
        """``weight`` with each output channel multiplied by its scale."""
        return self.form.to_weight(self.form.to_matrix(weight) * self.rows)

    def per_channel_units(self, grad: np.ndarray) -> np.ndarray:
        """From ``grad L(apply(W))`` (the folded layer's loss gradient at the scaled weights), the gradient in
        ``W`` of ``sum_m L_m(apply(W)) / scale_m^2``: each channel's error after the map, in the layer's own
        output units (a channel with scale 0, whose error nobody sees, gets none)."""
        matrix = self.form.to_matrix(grad)
        return self.form.to_weight(np.divide(matrix, self.rows, out=np.zeros_like(matrix), where=self.rows != 0))

    def bias(self, bias: np.ndarray) -> np.ndarray:
        """The folded layer's bias matrix ``scale * b + shift`` (``[groups, M/g, 1]``)."""
        return bias * self.rows + self.shift


def reconstruction_loss(form: LinearForm, w_soft: np.ndarray, w_float: np.ndarray, data: SecondMoments | ColumnSample,
                        bias: np.ndarray, activation: Activation | None,
                        output_affine: OutputAffine | None = None) -> tuple[float, np.ndarray]:
    """``(loss, d loss / d W_soft)`` in weight layout, over all the data (or all sampled columns); with
    ``output_affine``, of the error after that map (a sampled target is then the float tensor after it)."""
    if output_affine is not None:
        loss, grad = reconstruction_loss(form, output_affine.apply(w_soft), output_affine.apply(w_float), data,
                                         output_affine.bias(bias), activation)
        return loss, output_affine.apply(grad)
    ms, mf = form.to_matrix(w_soft), form.to_matrix(w_float)
    if isinstance(data, SecondMoments):
        return data.loss(ms, mf), form.to_weight(data.grad(ms, mf))
    return _sampled(form, ms, data.cols, data.target, bias, activation)


def _loss(form: LinearForm, w_soft: np.ndarray, w_float: np.ndarray, data: SecondMoments | ColumnSample,
          bias: np.ndarray, activation: Activation | None, output_affine: OutputAffine | None = None) -> float:
    """`reconstruction_loss`'s loss alone (the same number, without the gradient's work)."""
    if output_affine is not None:
        return _loss(form, output_affine.apply(w_soft), output_affine.apply(w_float), data, output_affine.bias(bias),
                     activation)
    ms = form.to_matrix(w_soft)
    if isinstance(data, SecondMoments):
        return data.loss(ms, form.to_matrix(w_float))
    g, m_g, _ = ms.shape
    z = np.matmul(ms, data.cols)
    z += bias
    z = z.reshape(g * m_g, -1)
    diff = (z if activation is None else activation.forward(z)) - data.target
    return float(np.vdot(diff, diff)) / diff.shape[1]


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


# A grouped (depthwise) layer's step is done per slice of groups small enough that the gradient's product reads
# the window's columns from cache after the forward product did (the products are memory-bound there: 40 MB
# of columns per step on PP-LCNet's 5x5 layers); an ungrouped layer's elementwise passes go per slice of rows
# (measured: no gain over one pass, none lost). Slicing never changes a number: every elementwise pass is per
# element, and a grouped layer's products are one BLAS call per group either way.
_GROUP_SLICE_BYTES = 1 << 21  # a slice of groups' window columns
_ROW_SLICE_ELEMENTS = 1 << 16  # a slice of output rows' elementwise work (ungrouped layers)


class _WindowSteps:
    """``d loss / d W`` on a window of consecutive sampled columns at a random offset (a view), as
    `reconstruction_loss` computes it, into buffers reused every step, the ``2 / B`` folded into the
    weight-sized gradient. The work is done in cache-sized slices of output channels (see above): a grouped
    layer's products per slice of groups, an ungrouped layer's elementwise passes per slice of rows between
    its two products."""

    def __init__(self, form: LinearForm, data: ColumnSample, bias: np.ndarray, activation: Activation | None,
                 batch: int, rng: np.random.Generator):
        self.form, self.data, self.bias, self.activation, self.rng = form, data, bias, activation, rng
        self.total = data.cols.shape[2]
        self.batch = min(batch, self.total)
        groups, inputs, _ = data.cols.shape
        rows = data.target.shape[0]
        self.rows_per_group = rows // groups
        self.z = np.empty((groups, self.rows_per_group, self.batch), np.float32)
        dtype: np.dtype = np.dtype(np.float32)  # the activation's gradient's (float32 but LeakyRelu's): kept as it was
        if activation is not None:
            probe = np.zeros((1, 1), np.float32)
            dtype = activation.backward(probe, activation.forward(probe), probe).dtype
        self.dz = np.empty((groups, self.rows_per_group, self.batch), dtype)
        self.grad = np.empty((groups, self.rows_per_group, inputs), np.result_type(dtype, np.float32))
        if groups > 1:
            step = max(1, _GROUP_SLICE_BYTES // (4 * (inputs + self.rows_per_group) * self.batch))
            self.slices = [slice(s, min(groups, s + step)) for s in range(0, groups, step)]
        else:
            step = max(1, _ROW_SLICE_ELEMENTS // self.batch)
            self.slices = [slice(s, min(rows, s + step)) for s in range(0, rows, step)]

    def _output_grad(self, z: np.ndarray, bias: np.ndarray, target: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``d loss / d z`` (without the ``2 / B``) of the rows ``z`` (``[n, m, B]``, biased in place)."""
        z += bias
        flat = z.reshape(target.shape)
        if self.activation is None:
            return np.subtract(flat, target, out=out.reshape(target.shape)).reshape(z.shape)
        return self.activation.output_grad(flat, target, out.reshape(target.shape)).reshape(z.shape)

    def __call__(self, w_soft: np.ndarray) -> np.ndarray:
        start = int(self.rng.integers(0, self.total - self.batch + 1))
        cols = self.data.cols[:, :, start:start + self.batch]
        target = self.data.target[:, start:start + self.batch]
        matrix = self.form.to_matrix(w_soft)
        m = self.rows_per_group
        if len(self.z) > 1:
            for part in self.slices:
                window = cols[part]
                z = np.matmul(matrix[part], window, out=self.z[part])
                dz = self._output_grad(z, self.bias[part], target[part.start * m:part.stop * m], self.dz[part])
                np.matmul(dz, np.swapaxes(window, 1, 2), out=self.grad[part])
        else:
            z = np.matmul(matrix, cols, out=self.z)
            for part in self.slices:
                dz = self._output_grad(z[:, part], self.bias[:, part], target[part], self.dz[:, part])
                if not np.may_share_memory(dz, self.dz):  # a new array (activations without a buffered gradient)
                    self.dz[:, part] = dz
            np.matmul(self.dz, np.swapaxes(cols, 1, 2), out=self.grad)
        grad = self.grad
        grad *= 2.0 / self.batch
        return self.form.to_weight(grad)


class _AnchoredSteps:
    """``d loss / d W`` of a quadratic layer as ``G(A) + 2 (W - A) C C^T / B``: the exact gradient at an
    anchor ``A`` (the soft weight every ``anchor_interval`` steps) plus the change since, on a window ``C``
    of ``B`` shuffled sim-side columns (its expectation is the change of the exact gradient)."""

    def __init__(self, form: LinearForm, data: SecondMoments, float_matrix: np.ndarray, settings: AdaroundSettings,
                 rng: np.random.Generator):
        assert data.sample is not None
        self.form, self.data, self.float_matrix, self.rng = form, data, float_matrix, rng
        self.sample = data.sample
        self.total = self.sample.shape[2]
        self.batch = min(settings.quadratic_columns_per_iteration, self.total)
        self.interval = settings.anchor_interval
        self.calls = 0
        self.anchor = np.empty(float_matrix.shape, np.float32)
        self.anchor_grad = np.empty(float_matrix.shape, np.float32)
        self.change = np.empty(float_matrix.shape, np.float32)

    def __call__(self, w_soft: np.ndarray) -> np.ndarray:
        matrix = self.form.to_matrix(w_soft)
        if self.calls % self.interval == 0:
            self.anchor[...] = matrix
            self.anchor_grad[...] = self.data.grad(self.anchor, self.float_matrix)
        self.calls += 1
        start = int(self.rng.integers(0, self.total - self.batch + 1))
        window = self.sample[:, :, start:start + self.batch]
        np.subtract(matrix, self.anchor, out=self.change)
        grad = np.matmul(np.matmul(self.change, window), np.swapaxes(window, 1, 2))
        grad *= 2.0 / self.batch
        grad += self.anchor_grad
        return self.form.to_weight(grad)


def optimize_rounding(form: LinearForm, weight: np.ndarray, grid: WeightGrid, data: SecondMoments | ColumnSample,
                      bias: np.ndarray, activation: Activation | None, settings: AdaroundSettings,
                      rng: np.random.Generator, on_step: Callable[[int], None] | None = None,
                      output_affine: OutputAffine | None = None) -> RoundingResult:
    """AdaRound one layer (see the module docstring); ``on_step(i)`` is called after each iteration;
    ``output_affine``: the per-channel map the layer's output goes through (module docstring)."""
    base, fraction = grid.floor_and_fraction(weight)
    alpha = init_alpha(fraction)
    adam = Adam(alpha, lr=settings.learning_rate)
    soft = _SoftRounding(grid, base)
    step: Callable[[np.ndarray], np.ndarray]
    if output_affine is not None:
        affine = output_affine
        inner = _steps(form, affine.apply(weight), data, affine.bias(bias), activation, settings, rng)
        step = lambda w_soft: affine.per_channel_units(inner(affine.apply(w_soft)))  # noqa: E731
    else:
        step = _steps(form, weight, data, bias, activation, settings, rng)
    check = max(1, settings.num_iterations // 50)
    taken = settings.num_iterations
    w_soft = soft.forward(alpha)
    for iteration in range(settings.num_iterations):
        grad_w = step(w_soft)
        beta = beta_at(iteration, settings.num_iterations, settings.beta_range, settings.warm_start)
        w_soft = soft.update(grad_w, beta, settings.reg_param, adam)  # Adam's step, then the next soft weight
        if on_step is not None:
            on_step(iteration)
        if (iteration + 1) % check == 0 and iteration + 1 < settings.num_iterations and settled(alpha, adam, soft):
            taken = iteration + 1
            break
    hard = grid.weight(base, (alpha >= 0).astype(np.float32))[0]
    nearest = grid.nearest(weight)
    loss_before = _loss(form, nearest, weight, data, bias, activation, output_affine)
    loss_hard = _loss(form, hard, weight, data, bias, activation, output_affine)
    if loss_hard > loss_before:  # too few iterations to settle: never end worse than nearest rounding
        return RoundingResult(nearest, loss_before, loss_before, 0.0, kept_nearest=True, iterations=taken)
    return RoundingResult(hard, loss_before, loss_hard, float(np.mean(hard != nearest)), iterations=taken)


def settled(alpha: np.ndarray, adam: Adam, soft: _SoftRounding) -> bool:
    """Whether no later step can change the rounding ``alpha >= 0``: every ``h(alpha)`` is clipped at 0 or 1, so
    every later gradient is exactly 0 (`_SoftRounding.backward` multiplies by the clip's mask), and Adam's
    momentum alone cannot carry any ``alpha`` back to the unclipped band. With zero gradients step ``t + k``
    moves ``alpha`` by at most ``lr / (1 - b1^(t+1)) * r^k * |m| / sqrt(v)`` (``r = b1 / sqrt(b2)``; ``m`` and
    ``v`` decay by ``b1`` and ``b2`` per step), so in all at most ``r / (1 - r)`` (about 9.05) times that; the
    test asks for twice that distance plus a margin of 0.01 (float32's rounding of ``tanh`` near the band's edge
    is about 1e-7). Stopping then gives exactly the rounding of the full run (tested)."""
    b1, b2 = adam.betas
    ratio = b1 / math.sqrt(b2)
    reach = 2 * ratio / (1 - ratio) * adam.lr / (1 - b1 ** (adam.t + 1))
    band = float(soft.t_mid - soft.t_half), float(soft.t_mid + soft.t_half)  # h unclipped for t = tanh(alpha / 2) inside
    low, high = 2 * math.atanh(max(band[0], -1.0 + 1e-7)) - 0.01, 2 * math.atanh(min(band[1], 1.0 - 1e-7)) + 0.01
    if float(np.min(np.abs(alpha))) <= min(-low, high):  # some alpha still inside the band (cheap first test)
        return False
    with np.errstate(divide="ignore", invalid="ignore"):
        drift = reach * np.abs(adam.m) / np.sqrt(adam.v)
    drift = np.where(adam.m == 0, 0.0, drift)  # v = 0 implies m = 0: never moved
    return bool(np.all((alpha - drift > high) | (alpha + drift < low)))


def _steps(form: LinearForm, weight: np.ndarray, data: SecondMoments | ColumnSample, bias: np.ndarray,
           activation: Activation | None, settings: AdaroundSettings,
           rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
    """``d loss / d W`` for one training step: on a window of sampled columns, at an anchor, or exact."""
    float_matrix = form.to_matrix(weight)
    step: Callable[[np.ndarray], np.ndarray]
    if isinstance(data, ColumnSample):
        step = _WindowSteps(form, data, bias, activation, settings.columns_per_iteration, rng)
    elif data.sample is not None:
        step = _AnchoredSteps(form, data, float_matrix, settings, rng)
    else:
        step = lambda w_soft: form.to_weight(data.grad(form.to_matrix(w_soft), float_matrix))  # noqa: E731
    return step

