"""Shared integer-arithmetic helpers of the reference kernels (`quantsim.export.reference.qlinear_linear`). PURE numpy.

Quantization ranges, zero points and code checks, int32 wrap-around, fixed-point requantization
(`requantize_real`, `requantize_fine`), the exact integer matmul (`int_matmul`) and the Conv/pool window geometry
(`pool_geometry`, `extract_windows`); the numerics are described in `quantsim.export.reference.qlinear_linear`.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from quantsim.core.fixed_point import (
    ROUNDINGS,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    requantize,
    single_rounding_multiply,
)
from quantsim.errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "qrange",
    "int_matmul",
    "pool_geometry",
    "extract_windows",
    "along_axis",
    "codes_of",
    "float64_of",
    "zero_point_of",
    "wrap_int32",
    "requantize_real",
    "requantize_fine",
    "fixed_point_multiply",
    "rounding_mode",
    "grid_span",
    "result_dtype",
]

_EXACT_F64 = 2.0**53


def qrange(dtype) -> tuple[int, int]:
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def float64_of(t) -> np.ndarray:
    return np.asarray(t, dtype=np.float64)


def zero_point_of(t) -> np.ndarray:
    return np.zeros((), np.int32) if t is None else np.asarray(t).astype(np.int32)


def codes_of(q, name: str) -> np.ndarray:
    q = np.asarray(q)
    if not np.issubdtype(q.dtype, np.integer):
        raise InvalidTypeError(f"{name}: quantized input must be an integer tensor, got {q.dtype}")
    return q.astype(np.int32)


def along_axis(p, ndim: int, axis: int) -> np.ndarray:
    """A per-tensor (size 1) or 1-D per-axis parameter shaped to broadcast against rank ``ndim``."""
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    if p.ndim != 1:
        return p
    shape = [1] * ndim
    shape[axis] = -1
    return p.reshape(shape)


def wrap_int32(acc) -> np.ndarray:
    """int64 -> int32 with two's complement wrap-around (int32 accumulator hardware)."""
    return np.asarray(acc, dtype=np.int64).astype(np.int32)


_ROUNDING: ContextVar[str] = ContextVar("quantsim_reference_rounding", default="double")


@contextmanager
def rounding_mode(rounding: str) -> Iterator[None]:
    """Within the block the kernels requantize with ``rounding`` (`quantsim.core.fixed_point.ROUNDINGS`):
    ``"double"`` (gemmlowp / TFLite reference kernels) or ``"single"`` (one rounding of the 64-bit product)."""
    if rounding not in ROUNDINGS:
        raise InvalidArgumentError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    token = _ROUNDING.set(rounding)
    try:
        yield
    finally:
        _ROUNDING.reset(token)


def fixed_point_multiply(x, mantissa, shift) -> np.ndarray:
    """``x`` times a stored multiplier with the current `rounding_mode`."""
    if _ROUNDING.get() == "single":
        return single_rounding_multiply(x, mantissa, shift)
    return multiply_by_quantized_multiplier(x, mantissa, shift)


def requantize_real(acc, real_multiplier, zero_point, out_dtype) -> np.ndarray:
    mantissa, shift = quantize_multiplier(real_multiplier)
    lo, hi = qrange(out_dtype)
    return requantize(acc, mantissa, shift, zero_point_of(zero_point), lo, hi,
                      rounding=_ROUNDING.get()).astype(out_dtype)


def requantize_fine(d, real_multiplier, zero_point, out_dtype, bound: int) -> np.ndarray:
    """`requantize_real` of a small integer ``|d| <= bound`` pre-shifted left by ``L`` bits (TFLite's QLinearAdd
    trick, ``L <= 20``, ``|d << L| < 2**30``) with the multiplier divided by ``2**L`` (exact): SRDHM then
    rounds ``2**-L`` finer, so the double rounding is off only within ``2**-(n+L+1)`` of a tie."""
    real = float64_of(real_multiplier)
    positive = real[real > 0]
    headroom = 31 + (int(np.floor(np.log2(positive.min()))) if positive.size else 0)  # keep real/2^L >= 2^-31
    left = max(0, min(20, 30 - int(bound).bit_length(), headroom))
    return requantize_real(np.asarray(d, np.int64) << left, real / 2.0**left, zero_point, out_dtype)


def grid_span(dtype) -> int:
    lo, hi = qrange(dtype)
    return hi - lo


def result_dtype(zero_point, like) -> np.dtype:
    return np.asarray(zero_point).dtype if zero_point is not None else np.asarray(like).dtype


def int_matmul(a, b) -> np.ndarray:
    """Exact int64 ``a @ b`` of integer arrays (numpy matmul broadcasting)."""
    a = np.asarray(a)
    b = np.asarray(b)
    k = a.shape[-1]
    amax = int(np.abs(a.astype(np.int64)).max(initial=0))
    bmax = int(np.abs(b.astype(np.int64)).max(initial=0))
    if float(amax) * float(bmax) * k < _EXACT_F64:
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64)
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


# ------------------------------------------------------------------------------------------------ windows
def pool_geometry(spatial, kernel, attrs, ceil_mode: bool = False):
    """``(pads_begin, pads_end, out_shape, strides, dilations)`` of a Conv/pool window (ONNX + ORT rules)."""
    nd = len(kernel)
    strides = list(attrs.get("strides") or [1] * nd)
    dil = list(attrs.get("dilations") or [1] * nd)
    pads = list(attrs.get("pads") or [0] * (2 * nd))
    begin, end = pads[:nd], pads[nd:]
    auto_pad = attrs.get("auto_pad", "NOTSET")
    out = []
    for i in range(nd):
        extent = (kernel[i] - 1) * dil[i] + 1
        length, s = int(spatial[i]), strides[i]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-length // s)
            total = max((o - 1) * s + extent - length, 0)
            small, big = total // 2, total - total // 2
            begin[i], end[i] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        else:
            if auto_pad == "VALID":
                begin[i] = end[i] = 0
            span = length + begin[i] + end[i] - extent
            if ceil_mode:
                o = -(-span // s) + 1
                if (o - 1) * s >= length + begin[i]:  # last window would start in the end padding
                    o -= 1
            else:
                o = span // s + 1
        out.append(int(o))
    return begin, end, out, strides, dil


def extract_windows(x, begin, end, out, kernel, strides, dil, fill) -> np.ndarray:
    """View ``[..., *out, *kernel]`` of the windows over the last ``len(kernel)`` axes of ``x``."""
    nd = len(kernel)
    lead = x.ndim - nd
    widths = [(0, 0)] * lead
    for i in range(nd):
        need = (out[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1
        widths.append((begin[i], max(need - x.shape[lead + i] - begin[i], 0)))
    xp = np.pad(x, widths, constant_values=fill)
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    view = sliding_window_view(xp, extents, axis=tuple(range(lead, x.ndim)))
    index = [slice(None)] * lead
    index += [slice(0, (o - 1) * s + 1, s) for o, s in zip(out, strides)]
    index += [slice(None, None, d) for d in dil]
    return view[tuple(index)]
