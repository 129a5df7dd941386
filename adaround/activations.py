"""The activation that follows a layer, applied to both sides of AdaRound's loss, with its
vector-Jacobian product. PURE numpy.

Arrays are in column form ``[M, S]``: one row per output channel, one column per sampled output
position (see `adaround.linear_form`). Softmax is supported over the channel axis only (it then stays
inside a column); PRelu's slope is per channel (or scalar).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Activation", "activation_for", "SUPPORTED"]

Forward = Callable[[np.ndarray], np.ndarray]
Backward = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]  # (z, f(z), upstream) -> dL/dz


class Activation:
    """``forward(z)`` and ``backward(z, y, upstream)`` of one activation in column form; `output_grad` chains
    them for a squared error (an activation may give a faster one computing the same numbers)."""

    def __init__(self, name: str, forward: Forward, backward: Backward,
                 output_grad: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None):
        self.name, self.forward, self.backward = name, forward, backward
        self._output_grad = output_grad

    def output_grad(self, z: np.ndarray, target: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``backward(z, y, y - target)`` with ``y = forward(z)``, the difference written into ``out``; the
        answer may be ``out`` itself (overwritten) or a new array."""
        if self._output_grad is not None:
            return self._output_grad(z, target, out)
        y = self.forward(z)
        return self.backward(z, y, np.subtract(y, target, out=out))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _clip(lo: float, hi: float) -> Activation:
    if hi == math.inf:  # Relu: one comparison in the backward pass
        return Activation("Clip", lambda z: np.maximum(z, lo), lambda z, y, g: g * (z > lo))
    return Activation("Clip", lambda z: np.clip(z, lo, hi), lambda z, y, g: g * ((z > lo) & (z < hi)))


def _leaky(alpha: float, name: str = "LeakyRelu") -> Activation:
    return Activation(name, lambda z: np.where(z >= 0, z, alpha * z), lambda z, y, g: g * np.where(z >= 0, 1.0, alpha))


def _prelu(slope: np.ndarray, rows: int) -> Activation:
    s = np.broadcast_to(np.asarray(slope, dtype=np.float32).reshape(-1), (rows,)).reshape(rows, 1)
    return Activation("PRelu", lambda z: np.where(z >= 0, z, s * z), lambda z, y, g: g * np.where(z >= 0, 1.0, s))


def _hard_sigmoid(alpha: float, beta: float) -> Activation:
    def forward(z):
        return np.clip(alpha * z + beta, 0.0, 1.0)

    def backward(z, y, g):
        raw = alpha * z + beta
        return g * alpha * ((raw > 0) & (raw < 1))

    return Activation("HardSigmoid", forward, backward)


def _hard_swish() -> Activation:
    def forward(z):
        return z * np.clip(z / 6.0 + 0.5, 0.0, 1.0)

    def backward(z, y, g):  # hard_sigmoid(z) + z / 6 on |z| < 3: z / 3 + 1/2 there, 0 below, 1 above
        third = np.multiply(z, np.float32(1 / 6))
        slope = np.add(third, np.float32(0.5))
        np.clip(slope, 0.0, 1.0, out=slope)
        third *= np.abs(z) < 3
        slope += third
        slope *= g
        return slope

    scratch: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def output_grad(z, target, out):  # forward and backward as above, on three reused buffers
        if z.dtype != np.float32:
            y = forward(z)
            return backward(z, y, np.subtract(y, target, out=out))
        if z.shape not in scratch:
            scratch[z.shape] = (np.empty(z.shape, np.float32), np.empty(z.shape, np.float32), np.empty(z.shape, np.float32))
        a, b, c = scratch[z.shape]
        np.divide(z, 6.0, out=a)
        a += 0.5
        np.clip(a, 0.0, 1.0, out=a)
        diff = np.subtract(np.multiply(z, a, out=a), target, out=out)
        third = np.multiply(z, np.float32(1 / 6), out=a)
        slope = np.add(third, np.float32(0.5), out=b)
        np.clip(slope, 0.0, 1.0, out=slope)
        inside = np.less(np.abs(z, out=c), 3, out=c)  # 1.0 / 0.0: as multiplying by the bool
        third *= inside
        slope += third
        return np.multiply(slope, diff, out=diff)  # into ``out``: the caller's buffer

    return Activation("HardSwish", forward, backward, output_grad)


def _elu(alpha: float) -> Activation:
    return Activation("Elu", lambda z: np.where(z > 0, z, alpha * np.expm1(np.minimum(z, 0))),
                      lambda z, y, g: g * np.where(z > 0, 1.0, y + alpha))


def _gelu(approximate: str) -> Activation:
    if approximate == "tanh":
        c = math.sqrt(2 / math.pi)

        def forward(z):
            return 0.5 * z * (1 + np.tanh(c * (z + 0.044715 * z ** 3)))

        def backward(z, y, g):
            t = np.tanh(c * (z + 0.044715 * z ** 3))
            return g * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z))

        return Activation("Gelu", forward, backward)
    from scipy.special import erf

    def forward_erf(z):
        return 0.5 * z * (1 + erf(z / math.sqrt(2)))

    def backward_erf(z, y, g):
        return g * (0.5 * (1 + erf(z / math.sqrt(2))) + z * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi))

    return Activation("Gelu", forward_erf, backward_erf)


def _softmax() -> Activation:
    def forward(z):
        e = np.exp(z - z.max(axis=0, keepdims=True))
        return e / e.sum(axis=0, keepdims=True)

    def backward(z, y, g):
        return y * (g - (g * y).sum(axis=0, keepdims=True))

    return Activation("Softmax", forward, backward)


SUPPORTED = frozenset({"Relu", "Clip", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "LeakyRelu", "PRelu", "Elu",
                       "Gelu", "Softmax"})


def activation_for(op_type: str, attributes: dict[str, Any], rows: int, softmax_on_channels: bool) -> Activation | None:
    """The activation for a following node, or None when it cannot be applied in column form (then the
    caller optimises the plain layer output)."""
    a = attributes
    if op_type == "Relu":
        return _clip(0.0, math.inf)
    if op_type == "Clip":
        return _clip(float(a.get("min", -math.inf)), float(a.get("max", math.inf)))
    if op_type == "Sigmoid":
        return Activation("Sigmoid", _sigmoid, lambda z, y, g: g * y * (1 - y))
    if op_type == "Tanh":
        return Activation("Tanh", np.tanh, lambda z, y, g: g * (1 - y * y))
    if op_type == "HardSwish":
        return _hard_swish()
    if op_type == "HardSigmoid":
        return _hard_sigmoid(float(a.get("alpha", 0.2)), float(a.get("beta", 0.5)))
    if op_type == "LeakyRelu":
        return _leaky(float(a.get("alpha", 0.01)))
    if op_type == "PRelu":
        slope = np.asarray(a["slope"])
        return _prelu(slope, rows) if slope.size in (1, rows) else None
    if op_type == "Elu":
        return _elu(float(a.get("alpha", 1.0)))
    if op_type == "Gelu":
        approximate = a.get("approximate", "none")
        return _gelu(approximate.decode() if isinstance(approximate, bytes) else approximate)
    if op_type == "Softmax" and softmax_on_channels:
        return _softmax()
    return None
