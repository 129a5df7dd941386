"""AdaRound's soft rounding, its regulariser and schedule, and the Adam step (Nagel et al. 2020).

PURE numpy, float32 for weight-sized arrays. With ``zeta = 1.1`` and ``gamma = -0.1`` (the paper's
stretch), the rectified sigmoid ``h(alpha) = clip(sigmoid(alpha) * (zeta - gamma) + gamma, 0, 1)`` decides
how much of one grid step is added to ``floor(W / scale)``; ``alpha`` starts where ``h`` equals the
fractional part, so the first soft weight is the float weight. The regulariser
``sum(1 - |2h - 1|^beta)`` pushes every ``h`` to 0 or 1 as ``beta`` anneals from 20 to 2 (cosine, after a
warm start without it); the final rounding is ``h >= 0.5``, i.e. ``alpha >= 0``.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = [
    "ZETA",
    "GAMMA",
    "init_alpha",
    "rectified_sigmoid",
    "rectified_sigmoid_grad",
    "regularizer",
    "regularizer_grad",
    "beta_at",
    "Adam",
]

ZETA, GAMMA = 1.1, -0.1


def init_alpha(fraction: np.ndarray, zeta: float = ZETA, gamma: float = GAMMA) -> np.ndarray:
    """``alpha`` with ``h(alpha) == fraction`` (fractions kept strictly inside (0, 1) so alpha is finite)."""
    r = np.clip(np.asarray(fraction, dtype=np.float64), 1e-6, 1 - 1e-6)
    return (-np.log((zeta - gamma) / (r - gamma) - 1)).astype(np.float32)


def _sigmoid(alpha: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * alpha))  # overflow-free


def rectified_sigmoid(alpha: np.ndarray, zeta: float = ZETA, gamma: float = GAMMA) -> np.ndarray:
    """``h(alpha)`` in [0, 1]."""
    return np.clip(_sigmoid(alpha) * (zeta - gamma) + gamma, 0.0, 1.0).astype(np.float32)


def rectified_sigmoid_grad(alpha: np.ndarray, zeta: float = ZETA, gamma: float = GAMMA) -> np.ndarray:
    """``dh/dalpha`` (0 where the clip is active)."""
    s = _sigmoid(alpha)
    raw = s * (zeta - gamma) + gamma
    return np.where((raw > 0) & (raw < 1), s * (1 - s) * (zeta - gamma), 0.0).astype(np.float32)


def regularizer(h: np.ndarray, beta: float) -> float:
    """``sum(1 - |2h - 1|^beta)``: 0 when every ``h`` is 0 or 1."""
    return float(np.sum(1.0 - np.abs(2.0 * h - 1.0) ** beta))


def regularizer_grad(h: np.ndarray, beta: float) -> np.ndarray:
    """``d regularizer / dh``."""
    u = 2.0 * h - 1.0
    return (-2.0 * beta * np.sign(u) * np.abs(u) ** (beta - 1)).astype(np.float32)


def beta_at(iteration: int, num_iterations: int, beta_range: tuple[float, float] = (20.0, 2.0),
            warm_start: float = 0.2) -> float | None:
    """The regulariser's exponent at ``iteration`` (0-based), or None during the warm start (regulariser
    off). Cosine from ``beta_range[0]`` right after the warm start to ``beta_range[1]`` at the end."""
    start = warm_start * num_iterations
    if iteration < start:
        return None
    rel = (iteration - start) / max(num_iterations - start, 1)
    high, low = beta_range
    return low + 0.5 * (high - low) * (1 + math.cos(math.pi * rel))


class Adam:
    """Adam (Kingma and Ba) on one array, updated in place by `step`."""

    def __init__(self, param: np.ndarray, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.param, self.lr, self.betas, self.eps = param, lr, betas, eps
        self.m = np.zeros_like(param)
        self.v = np.zeros_like(param)
        self.t = 0

    def step(self, grad: np.ndarray) -> None:
        """One update, in place. ``lr m_hat / (sqrt(v_hat) + eps)`` is computed as the equal
        ``lr_t m / (sqrt(v) + eps_t)`` with the bias corrections folded into two scalars."""
        self.begin()
        self.update(grad)

    def begin(self) -> None:
        """Start an update: the step count and its two scalars (then `update` each part of the parameter)."""
        b1, b2 = self.betas
        self.t += 1
        correction = math.sqrt(1 - b2 ** self.t)
        self._eps_t = self.eps * correction
        self._lr_t = self.lr * correction / (1 - b1 ** self.t)

    def update(self, grad: np.ndarray, part: slice | None = None) -> None:
        """The update begun by `begin` on the elements ``part`` of the flattened parameter (all when None), with
        their gradient ``grad``; parts are independent (every operation is elementwise)."""
        b1, b2 = self.betas
        param, m, v = (a.reshape(-1)[part] if part is not None else a for a in (self.param, self.m, self.v))
        buffer = getattr(self, "_buffer", None)
        if buffer is None or buffer.size < grad.size:
            buffer = self._buffer = np.empty(grad.size, np.result_type(grad, m))
        buffer = buffer[:grad.size].reshape(grad.shape)
        np.subtract(grad, m, out=buffer)  # m += (1 - b1) (g - m)
        buffer *= 1 - b1
        m += buffer
        np.multiply(grad, grad, out=buffer)  # v += (1 - b2) (g^2 - v)
        buffer -= v
        buffer *= 1 - b2
        v += buffer
        np.sqrt(v, out=buffer)
        buffer += self._eps_t
        np.divide(m, buffer, out=buffer)
        buffer *= self._lr_t
        param -= buffer
