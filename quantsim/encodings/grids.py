"""Grid facts shared by the format modules: which grids a file can carry and how AIMET names them."""
from __future__ import annotations

import numpy as np

from quantsim.core.numerics import Encoding, aimet_offset, encoding_from_aimet, grid_bounds
from quantsim.encodings.record import INT32_BITS
from quantsim.encodings.validate import Where

__all__ = [
    "MIN_BITS",
    "MAX_BITS",
    "check_int_bits",
    "is_strict",
    "check_writable",
    "granularity",
    "flat_offsets",
    "flat_scales",
    "from_aimet",
]

MIN_BITS = 2
MAX_BITS = 16


def check_int_bits(where: Where, bits: int, field: str) -> int:
    """Integer grids are 2..16 bits, plus 32 for int32 bias entries."""
    if not (MIN_BITS <= bits <= MAX_BITS or bits == INT32_BITS):
        raise where.error(f"'{field}' {bits} is not a supported integer bitwidth (2..16 or 32)")
    return bits


def is_strict(enc: Encoding) -> bool:
    """A signed grid without its most negative code, ``[-(2^(b-1)-1), 2^(b-1)-1]``."""
    return enc.signed and (enc.qmin, enc.qmax) == grid_bounds(enc.bits, True, strict=True)


def check_writable(where: Where, enc: Encoding) -> None:
    """Files describe full n-bit grids and strict symmetric ones (zero point 0); nothing narrower. float8
    encodings only 2.0.0 describes (it writes them before calling this), as in AIMET 2.42."""
    if enc.fp8 is not None:
        raise where.error(f"a {enc.fp8} encoding can only be written in format 2.0.0 (or exported as a QDQ model)")
    if (enc.qmin, enc.qmax) == grid_bounds(enc.bits, enc.signed):
        return
    if is_strict(enc):
        if np.any(enc.zero_point != 0):
            raise where.error("a strict symmetric grid must have zero point 0 to be written")
        return
    raise where.error(
        f"grid [{enc.qmin}, {enc.qmax}] is neither the full {enc.bits}-bit grid nor strict symmetric"
    )


def granularity(where: Where, enc: Encoding) -> str:
    """"tensor", "channel" or "block", from the scale's shape and ``block_size``."""
    ndim = enc.scale.ndim
    if enc.block_size is not None:
        if ndim in (1, 2):
            return "block"
        raise where.error(f"blockwise scale must have shape (C, n_blocks), got {enc.scale.shape}")
    if ndim == 0:
        return "tensor"
    if ndim == 1:
        return "channel"
    raise where.error(f"scale of shape {enc.scale.shape} needs a block_size")


def flat_scales(enc: Encoding) -> list[float]:
    """Scales as Python floats in (channel, block) order (repr of a float64 round-trips exactly)."""
    return [float(s) for s in enc.scale.reshape(-1)]


def flat_offsets(enc: Encoding) -> list[float]:
    """AIMET's ``offset`` (``qmin - zero_point``, <= 0 on unsigned grids) as floats, flattened."""
    return [float(o) for o in aimet_offset(enc).reshape(-1)]


def from_aimet(
    where: Where, scale: np.ndarray, offset: np.ndarray, bits: int, symmetric: bool, block_size: int | None = None
) -> Encoding:
    """`encoding_from_aimet`, with its complaints turned into format errors naming the entry."""
    try:
        return encoding_from_aimet(scale, offset, bits, symmetric=symmetric, block_size=block_size)
    except ValueError as exc:
        raise where.error(str(exc)) from None
