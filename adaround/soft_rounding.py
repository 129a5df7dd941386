"""One layer's soft rounding ``W(alpha)``, its chain rule back to ``alpha`` and the Adam update, per weight.

PURE numpy, float32. Every pass is elementwise over the weight, so a step's passes run over cache-sized
slices of the (flattened) weight one slice after the other: the gradient, Adam's update and the next soft
weight of one slice are computed while it is in cache (`SoftRounding.update`), instead of each pass reading
and writing every weight-sized buffer (measured on PP-LCNet's widest layers: within noise of unsliced passes,
which are bound by ``tanh``, ``log`` and ``exp`` rather than memory). Slicing changes no number: each element
goes through the same operations in the same order.
"""
from __future__ import annotations

import math

import numpy as np

from adaround.rounding import GAMMA, ZETA, Adam

__all__ = ["SoftRounding", "SLICE_ELEMENTS"]

# weights per slice (512 KiB per float32 buffer): on PP-LCNet 1 << 16 to 1 << 18 measured best, 1 << 14 slower by
# its Python overhead
SLICE_ELEMENTS = 1 << 17


class SoftRounding:
    """One layer's soft weight ``W(alpha)`` and the chain rule back to ``alpha``, on buffers reused every
    iteration, in few elementwise passes (they dominate wide layers' steps): with ``t = tanh(alpha / 2)``
    the rectified sigmoid is ``h = clip(c1 t + c0, 0, 1)`` (``c1 = (zeta - gamma) / 2``,
    ``c0 = c1 + gamma``) and ``dh/dalpha = c1 (1 - t^2) / 2`` where ``t_low < t < t_high`` (the clip is
    inactive), 0 elsewhere. The weight is ``h scale + floor scale`` except on the few weights whose
    floor sits at the grid's edge, where the code clip can act: those are computed apart.
    Computes exactly `rectified_sigmoid`, `WeightGrid.weight`, `regularizer_grad` and
    `rectified_sigmoid_grad` (tested against them)."""

    def __init__(self, grid, base: np.ndarray, zeta: float = ZETA, gamma: float = GAMMA,
                 slice_elements: int | None = None):
        shape = base.shape
        scale = np.broadcast_to(grid.scale, shape).astype(np.float32)
        low = np.broadcast_to(grid.qmin - grid.zero_point, shape).astype(np.float32)
        high = np.broadcast_to(grid.qmax - grid.zero_point, shape).astype(np.float32)
        self.c1 = np.float32(0.5 * (zeta - gamma))
        self.c0 = np.float32(0.5 * (zeta - gamma) + gamma)
        self.t_mid = np.float32(((0.0 - self.c0) / self.c1 + (1.0 - self.c0) / self.c1) / 2)
        self.t_half = np.float32((1.0 / self.c1) / 2)
        self.scale = scale.reshape(-1)
        self.grad_scale = (scale * (0.5 * self.c1)).astype(np.float32).reshape(-1)  # dL/dW -> dL/dh times dh/dalpha's constant
        self.offset = (base * scale).astype(np.float32).reshape(-1)
        edge = np.flatnonzero(~((base >= low) & (base + 1 <= high)))
        self.edge = edge
        self.edge_base, self.edge_low, self.edge_high = base.reshape(-1)[edge], low.reshape(-1)[edge], high.reshape(-1)[edge]
        self.edge_scale = scale.reshape(-1)[edge]
        self.edge_inside = np.ones(edge.size, bool)
        self.shape = shape
        self.t, self.h, self.weight, self.grad = (np.empty(base.size, np.float32) for _ in range(4))
        size = max(1, min(base.size, SLICE_ELEMENTS if slice_elements is None else slice_elements))
        self.work, self.work2, self.mask = (np.empty(size, np.float32) for _ in range(3))
        bounds = list(range(0, base.size, size)) + [base.size]
        self.parts: list[tuple[slice, int, int]] = []  # (weights, their edge entries lo:hi)
        for a, b in zip(bounds[:-1], bounds[1:]):
            lo, hi = np.searchsorted(edge, [a, b])
            self.parts.append((slice(a, b), int(lo), int(hi)))

    # whole-weight API -------------------------------------------------------------------------------
    def forward(self, alpha: np.ndarray) -> np.ndarray:
        """The soft weight for ``alpha`` (a buffer, valid until the next call)."""
        flat = alpha.reshape(-1)
        for part in self.parts:
            self._forward(flat, part)
        return self.weight.reshape(self.shape)

    def backward(self, grad_weight: np.ndarray, beta: float | None, reg_param: float) -> np.ndarray:
        """``d (loss + reg_param * regularizer) / d alpha`` from ``d loss / d W`` (a buffer)."""
        flat = grad_weight.reshape(-1)
        for part in self.parts:
            self._backward(flat, part, beta, reg_param)
        return self.grad.reshape(self.shape)

    def update(self, grad_weight: np.ndarray, beta: float | None, reg_param: float, adam: Adam) -> np.ndarray:
        """`backward`, ``adam``'s step on ``alpha`` (its parameter) with that gradient, and `forward` at the new
        ``alpha``, slice by slice: exactly ``adam.step(backward(...)); forward(alpha)``. Returns the new soft
        weight (a buffer)."""
        flat, alpha = grad_weight.reshape(-1), adam.param.reshape(-1)
        adam.begin()
        for part in self.parts:
            adam.update(self._backward(flat, part, beta, reg_param), part[0])
            self._forward(alpha, part)
        return self.weight.reshape(self.shape)

    # one slice --------------------------------------------------------------------------------------
    def _forward(self, alpha: np.ndarray, part: tuple[slice, int, int]) -> None:
        where, lo, hi = part
        t, h = self.t[where], self.h[where]
        np.multiply(alpha[where], 0.5, out=t)
        np.tanh(t, out=t)
        np.multiply(t, self.c1, out=h)
        h += self.c0
        np.clip(h, 0, 1, out=h)
        w = np.multiply(h, self.scale[where], out=self.weight[where])
        w += self.offset[where]
        if hi > lo:
            index = self.edge[lo:hi] - where.start
            code = self.edge_base[lo:hi] + h[index]
            self.edge_inside[lo:hi] = (code >= self.edge_low[lo:hi]) & (code <= self.edge_high[lo:hi])
            w[index] = np.clip(code, self.edge_low[lo:hi], self.edge_high[lo:hi]) * self.edge_scale[lo:hi]

    def _backward(self, grad_weight: np.ndarray, part: tuple[slice, int, int], beta: float | None,
                  reg_param: float) -> np.ndarray:
        where, lo, hi = part
        n = where.stop - where.start
        work, work2, mask = self.work[:n], self.work2[:n], self.mask[:n]
        t = self.t[where]
        g = np.multiply(grad_weight[where], self.grad_scale[where], out=self.grad[where])
        if hi > lo:
            g[self.edge[lo:hi] - where.start] *= self.edge_inside[lo:hi]
        if beta is not None and reg_param:  # - k sign(u) |u|^(beta - 1), u = 2h - 1, as exp((beta - 1) log|u| + log k)
            u = np.multiply(self.h[where], 2, out=work)
            u -= 1
            magnitude = np.abs(u, out=work2)
            k = 2.0 * beta * reg_param * 0.5 * float(self.c1)
            if beta > 1:  # |u| = 0 -> log = -inf -> 0, as 0 ** (beta - 1)
                with np.errstate(divide="ignore"):
                    np.log(magnitude, out=magnitude)
                magnitude *= beta - 1
                magnitude += math.log(k)
                np.exp(magnitude, out=magnitude)
            else:
                np.power(magnitude, beta - 1, out=magnitude)
                magnitude *= k
            np.copysign(magnitude, u, out=magnitude)
            g -= magnitude
        slope = np.multiply(t, t, out=work)
        np.subtract(1, slope, out=slope)
        g *= slope
        distance = np.subtract(t, self.t_mid, out=work2) if self.t_mid else t
        np.less(np.abs(distance, out=work2), self.t_half, out=mask)  # 1.0 / 0.0: as multiplying by the bool
        g *= mask
        return g
