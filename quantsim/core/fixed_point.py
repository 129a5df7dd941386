"""Fixed-point requantization (gemmlowp / TFLite integer arithmetic). PURE: numpy only.

An 8-bit kernel accumulates in int32 and must rescale the accumulator to the output grid by a real
multiplier ``M`` (``M = s_in * s_w / s_out`` for Conv/MatMul/Gemm, per output channel with per-channel
weights; ``s_in / s_out`` for Add/Concat inputs; ``s_a * s_b / s_out`` for Mul; ``s_in / (s_out * N)``
for an N-tap average pool). Integer-only hardware stores ``M`` as

    M ~= mantissa * 2^(shift - 31),   mantissa in [2^30, 2^31) (an int32 Q0.31 number in [0.5, 1)),

(TFLite ``QuantizeMultiplier``: ``(q, e) = frexp(M)``, ``mantissa = round_half_away(q * 2^31)``, ``shift = e``;
a mantissa that rounds up to ``2^31`` is halved and the shift incremented). ``shift <= 0`` is a right shift
(``M < 1``), ``shift > 0`` a left shift (``M >= 1``). ``M == 0`` is stored as ``(0, 0)``; like TFLite, a
multiplier below ``2^-32`` (``shift < -31``) is flushed to ``(0, 0)``. The relative error of the stored
multiplier is at most ``2^-31``.

Applying it (``multiply_by_quantized_multiplier``, TFLite's ``MultiplyByQuantizedMultiplier``):

    x' = saturate_int32(x * 2^max(shift, 0))
    y  = rounding_right_shift(saturating_rounding_doubling_high_mul(x', mantissa), max(-shift, 0))

* ``saturating_rounding_doubling_high_mul(a, b)`` (gemmlowp SRDHM, ARM ``VQRDMULH``) is
  ``floor(a * b / 2^31 + 1/2)``: ``a * b / 2^31`` rounded to nearest with ties toward +infinity (the nudge
  ``1 - 2^30`` for negative products makes ties round toward zero there), saturated to ``INT32_MAX`` in
  the single overflow case ``a == b == INT32_MIN``.
* ``rounding_right_shift(x, e)`` (gemmlowp ``RoundingDivideByPOT``) is ``x / 2^e`` rounded to nearest with
  ties away from zero.

The two roundings make ``y`` differ from ``round(x * M)`` by at most one step (double rounding), which the
tests check against exact rational arithmetic. The first rounding is at ``2^-e`` of an output step, so
results within ``2^-(e+1)`` of a midpoint can move: with small right shifts ``e`` (multipliers near 1,
depthwise convolutions) that is several percent of a layer's outputs.

``single_rounding_multiply`` is the one-rounding form (TFLite's ``TFLITE_SINGLE_ROUNDING``, CMSIS-NN,
TOSA ``RESCALE`` with ``double_round = false``): ``y = (x * mantissa + 2^(30 - shift)) >> (31 - shift)``, the
exact 64-bit product rounded once (ties toward +infinity), i.e. ``round(x * M)`` up to the stored
multiplier's ``2^-31`` relative error: the same codes as a float multiplier except within about
``|y| 2^-31`` of a midpoint. ``requantize`` adds the output zero point and clamps to
``[qmin, qmax]`` (a fused ReLU/ReLU6 is a tighter clamp in codes). Everything is computed in int64 numpy
arrays, so no intermediate overflows.
"""
from __future__ import annotations

import numpy as np

from quantsim.errors import InvalidArgumentError

__all__ = [
    "quantize_multiplier",
    "dequantize_multiplier",
    "saturating_rounding_doubling_high_mul",
    "rounding_right_shift",
    "multiply_by_quantized_multiplier",
    "single_rounding_multiply",
    "ROUNDINGS",
    "requantize",
    "multiplier_record",
    "INT32_MIN",
    "INT32_MAX",
]

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
_MAX_LEFT_SHIFT = 30  # a larger left shift cannot keep any non-zero int32 input in range
#: requantization rounding modes: gemmlowp's two roundings (TFLite's reference kernels) or one
ROUNDINGS = ("double", "single")


def quantize_multiplier(real) -> tuple[np.ndarray, np.ndarray]:
    """``(mantissa, shift)`` int64 arrays (shape of ``real``) with ``real ~= mantissa * 2^(shift - 31)``.

    Raises ValueError for negative, NaN or infinite multipliers and for ``real >= 2^30`` (a left shift
    above 30 bits overflows every non-zero int32 input).
    """
    m = np.asarray(real, dtype=np.float64)
    if not np.all(np.isfinite(m)) or np.any(m < 0):
        bad = m[~(np.isfinite(m) & (m >= 0))][:3]
        raise InvalidArgumentError(f"requantization multipliers must be finite and >= 0, got {bad}")
    fraction, exponent = np.frexp(m)  # m = fraction * 2^exponent, fraction in [0.5, 1) (0 for m == 0)
    mantissa = np.floor(fraction * 2.0**31 + 0.5).astype(np.int64)  # exact: fraction has 53 bits
    shift = exponent.astype(np.int64)
    carry = mantissa == (1 << 31)
    mantissa = np.where(carry, mantissa // 2, mantissa)
    shift = np.where(carry, shift + 1, shift)
    if np.any(shift > _MAX_LEFT_SHIFT):
        raise InvalidArgumentError(f"requantization multiplier {m.max():g} is too large for a 31-bit left shift")
    flush = (m == 0) | (shift < -31)
    return np.where(flush, 0, mantissa).astype(np.int64), np.where(flush, 0, shift).astype(np.int64)


def dequantize_multiplier(mantissa, shift) -> np.ndarray:
    """The real value ``mantissa * 2^(shift - 31)`` of a stored multiplier (float64, exact)."""
    return np.ldexp(np.asarray(mantissa, dtype=np.float64), np.asarray(shift, dtype=np.int64) - 31)


def saturating_rounding_doubling_high_mul(a, b) -> np.ndarray:
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` on int32 values: ``floor(a*b/2^31 + 1/2)`` (int64)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    product = a * b  # |a*b| <= 2^62: exact in int64
    nudge = np.where(product >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    total = product + nudge
    quotient = np.where(total >= 0, total >> 31, -((-total) >> 31))  # C division truncates toward zero
    overflow = (a == INT32_MIN) & (b == INT32_MIN)
    return np.where(overflow, np.int64(INT32_MAX), quotient).astype(np.int64)


def rounding_right_shift(x, exponent) -> np.ndarray:
    """gemmlowp ``RoundingDivideByPOT``: ``x / 2^exponent`` rounded to nearest, ties away from zero.

    ``exponent`` (scalar or broadcastable array) must lie in ``[0, 62]``; ``x`` is taken as int64.
    """
    x = np.asarray(x, dtype=np.int64)
    e = np.asarray(exponent, dtype=np.int64)
    if np.any(e < 0) or np.any(e > 62):
        raise InvalidArgumentError("rounding_right_shift exponent must be in [0, 62]")
    mask = np.left_shift(np.int64(1), e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0).astype(np.int64)
    return (x >> e) + (remainder > threshold).astype(np.int64)


def multiply_by_quantized_multiplier(x, mantissa, shift) -> np.ndarray:
    """TFLite ``MultiplyByQuantizedMultiplier(x, mantissa, shift)`` (int32 ``x``; broadcasting, int64 out).

    The left shift saturates to int32 (as ARM ``SQSHL``) instead of wrapping.
    """
    x = np.asarray(x, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    shifted = np.clip(x * np.left_shift(np.int64(1), left), INT32_MIN, INT32_MAX)
    return rounding_right_shift(saturating_rounding_doubling_high_mul(shifted, mantissa), right)


def single_rounding_multiply(x, mantissa, shift) -> np.ndarray:
    """``x * mantissa * 2^(shift - 31)`` rounded once, ties toward +infinity (TFLite ``TFLITE_SINGLE_ROUNDING``).

    ``x`` must fit in int32 (the 64-bit product then cannot overflow); broadcasting, int64 out."""
    x = np.asarray(x, dtype=np.int64)
    mantissa = np.asarray(mantissa, dtype=np.int64)
    total = 31 - np.asarray(shift, dtype=np.int64)  # >= 1: quantize_multiplier keeps shift <= 30
    if np.any(np.abs(x) > INT32_MAX + 1):
        raise InvalidArgumentError("single_rounding_multiply: x must fit in int32")
    rounded = (x * mantissa + np.left_shift(np.int64(1), total - 1)) >> total
    return np.where(mantissa == 0, 0, rounded).astype(np.int64)


def requantize(acc, mantissa, shift, zero_point, qmin: int = 0, qmax: int = 255,
               rounding: str = "double") -> np.ndarray:
    """Output codes ``clamp(zero_point + MBQM(acc), qmin, qmax)`` of an int32 accumulator (int64 array);
    ``rounding="single"``: `single_rounding_multiply` instead of gemmlowp's two roundings."""
    if rounding not in ROUNDINGS:
        raise InvalidArgumentError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    multiply = single_rounding_multiply if rounding == "single" else multiply_by_quantized_multiplier
    scaled = multiply(acc, mantissa, shift)
    return np.clip(scaled + np.asarray(zero_point, dtype=np.int64), qmin, qmax)


def multiplier_record(real) -> dict:
    """JSON-able ``{"multiplier", "mantissa", "shift"}`` of a multiplier (lists when ``real`` is an array)."""
    m = np.asarray(real, dtype=np.float64)
    mantissa, shift = quantize_multiplier(m)
    if m.ndim == 0:
        return {"multiplier": float(m), "mantissa": int(mantissa), "shift": int(shift)}
    return {"multiplier": m.tolist(), "mantissa": mantissa.tolist(), "shift": shift.tolist()}
