"""FP8 encodings: float8 `Encoding` values from magnitudes, observed ranges, integer grids or given scales.
PURE: numpy only.

AIMET 2.42's rule: ``scale = max(amax / max_value, float32 tiny)`` with ``amax = max(|min|, |max|)``, zero point 0,
``[qmin, qmax] = [-max_value, max_value]`` (``min``/``max`` are then AIMET's ``-+scale * max_value``). Min-max
takes ``amax`` from the observed range; AIMET's histogram schemes (TF-enhanced, percentile) from the bounds of
the 8-bit integer grid they choose (`fp8_encoding_from_grid`).
"""
from __future__ import annotations

import numpy as np

from quantsim.core.fp8 import fp8_format
from quantsim.core.numerics import Encoding
from quantsim.errors import InvalidArgumentError

__all__ = ["fp8_encoding", "fp8_encoding_from_scale", "fp8_encoding_from_range", "fp8_encoding_from_grid"]


def fp8_encoding(amax, fmt: str, *, axis: int | None = None) -> Encoding:
    """AIMET 2.42's float8 encoding for magnitudes ``amax`` (scalar or per channel along ``axis``):
    ``scale = max(amax / max_value, float32 tiny)``, zero point 0."""
    top = fp8_format(fmt).max_value
    amax = np.asarray(amax, dtype=np.float64)
    if not np.isfinite(amax).all():
        raise InvalidArgumentError("cannot compute an encoding from a non-finite range")
    return fp8_encoding_from_scale(np.maximum(amax / top, float(np.finfo(np.float32).tiny)), fmt, axis=axis)


def fp8_encoding_from_scale(scale, fmt: str, *, axis: int | None = None) -> Encoding:
    """The float8 encoding of format ``fmt`` with the given scale(s) (a file's or a QDQ model's)."""
    top = int(fp8_format(fmt).max_value)
    scale = np.asarray(scale, dtype=np.float64)
    return Encoding(scale, np.zeros(scale.shape, np.int64), 8, True, -top, top, True, axis, fp8=fmt)


def fp8_encoding_from_range(min_val, max_val, fmt: str, *, axis: int | None = None) -> Encoding:
    """`fp8_encoding` of ``max(|min|, |max|)`` of observed ranges (scalars or arrays of equal shape)."""
    amax = np.maximum(np.abs(np.asarray(min_val, dtype=np.float64)), np.abs(np.asarray(max_val, dtype=np.float64)))
    return fp8_encoding(amax, fmt, axis=axis)


def fp8_encoding_from_grid(enc: Encoding, fmt: str) -> Encoding:
    """The float8 encoding AIMET's histogram schemes (TF-enhanced, percentile) give: `fp8_encoding` of the
    largest magnitude of the integer grid ``enc`` they chose, ``max(|enc.min|, |enc.max|)``."""
    if enc.fp8 is not None:
        return enc
    if enc.block_size is not None:
        raise InvalidArgumentError("float8 encodings are per tensor or per channel, not per block")
    return fp8_encoding_from_range(enc.min, enc.max, fmt, axis=enc.axis)
