"""Float <-> integer maths of the simulator. PURE: numpy only, no I/O, no ONNX.

Conventions (ONNX, not AIMET): ``q = clip(rint(x / scale) + zero_point, qmin, qmax)`` with ties to
even, ``x' = (q - zero_point) * scale``, computed in float32 exactly as QuantizeLinear /
DequantizeLinear do in onnxruntime. ``[qmin, qmax]`` is the grid inside the storage type: the full
range of a native 4/8/16-bit type, or a narrower range (strict symmetric, 2..15-bit grids) that a Clip
enforces in the graph.

Range -> encoding follows AIMET 2.42's min-max rules (reference/aimet_onnx_api.md §6.1), computed in
float64 with the scale kept as float64 and cast to float32 where it is applied:

* the range always includes zero: ``mn = min(min, 0)``, ``mx = max(max, 0)``;
* ``N = 2^b - 1`` steps (``N - 1`` when symmetric and strict);
* symmetric (signed grid): ``P = floor(N/2)`` (2 when ``N == 3``), ``Nneg = N - P``,
  ``scale = max(mx / P, -mn / Nneg)``, zero point 0, grid ``[-Nneg, N - Nneg]``;
* unsigned symmetric (flag set and ``mn >= 0``) and asymmetric: ``scale = (mx - mn) / N``,
  ``zero_point = clip(round_half_away(-mn / scale), 0, N)`` on the unsigned grid ``[0, N]``;
* ``scale >= min(float32 eps, 0.01 / N)``; the zero point is recomputed from the floored scale.

AIMET's file ``offset`` is ``qmin - zero_point`` (``<= 0``) and its ``min``/``max`` are
``scale * (qmin - zp)`` and ``scale * (qmax - zp)``; see `aimet_offset` / `encoding_from_aimet`.

FP8 (``Encoding.fp8`` names the format, `quantsim.core.fp8`): ``x' = round_to_format(x / scale) * scale``,
QuantizeLinear/DequantizeLinear with a float8 zero point of 0. The encoding is symmetric with zero point 0,
``[qmin, qmax] = [-max_value, max_value]`` (integers for both formats) so ``min``/``max`` are AIMET's
``-+scale * max_value``; its scale is ``max(amax / max_value, float32 tiny)``, AIMET's rule
(`quantsim.core.fp8_encodings`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from quantsim.core.fp8 import fp8_format, round_to_format
from quantsim.errors import InvalidArgumentError

__all__ = [
    "Encoding",
    "grid_bounds",
    "encoding_from_range",
    "encoding_from_aimet",
    "aimet_offset",
    "broadcast_param",
    "quantize",
    "dequantize",
    "fake_quantize_parts",
    "fake_quantize",
    "fp16_round_trip",
    "reduce_min_max",
    "round_half_away",
    "SCALE_FLOOR_EPS",
]

SCALE_FLOOR_EPS = float(np.finfo(np.float32).eps)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero (C's ``round``), as AIMET's offset computation does."""
    x = np.asarray(x, dtype=np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def grid_bounds(bits: int, signed: bool, strict: bool = False) -> tuple[int, int]:
    """Integer grid ``[qmin, qmax]`` of a ``bits``-bit grid (strict drops the most negative code)."""
    if signed:
        qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        return (qmin + 1 if strict else qmin), qmax
    return 0, (1 << bits) - 1


@dataclass(frozen=True, eq=False)
class Encoding:
    """A computed quantization grid.

    ``scale`` (float64) and ``zero_point`` (int64) have shape ``()`` per tensor, ``(C,)`` per channel
    along ``axis``, or ``(C, n_blocks)`` per block (blocks of ``block_size`` along ``block_axis``).
    ``signed`` says whether the grid lives in a signed storage type. ``fp8`` names a float8 format
    ("float8e4m3fn", "float8e5m2") for the scaled float encodings (module docstring), None for integer grids.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    bits: int
    signed: bool
    qmin: int
    qmax: int
    symmetric: bool = False
    axis: int | None = None
    block_axis: int | None = None
    block_size: int | None = None
    fp8: str | None = None

    def __post_init__(self) -> None:
        scale = np.asarray(self.scale, dtype=np.float64)
        if scale.ndim == 0 and np.ndim(self.zero_point) == 0:  # per tensor: plain float/int checks
            zp = np.array(self.zero_point, dtype=np.int64)
            scale_ok, zp_ok = 0.0 < float(scale) < math.inf, self.qmin <= int(zp) <= self.qmax
        else:
            zp = np.broadcast_to(np.asarray(self.zero_point, dtype=np.int64), scale.shape).copy()
            scale_ok = bool(np.isfinite(scale).all() and not (scale <= 0).any())
            zp_ok = not ((zp < self.qmin).any() or (zp > self.qmax).any())
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "zero_point", zp)
        if not scale_ok:
            raise InvalidArgumentError("encoding scales must be finite and positive")
        if not zp_ok:
            raise InvalidArgumentError(f"zero point outside the grid [{self.qmin}, {self.qmax}]")

    @property
    def num_steps(self) -> int:
        return self.qmax - self.qmin

    @property
    def is_per_tensor(self) -> bool:
        return self.scale.ndim == 0

    @property
    def full_storage_range(self) -> bool:
        """True when the grid fills its native 4/8/16-bit container (no Clip needed); always for float8."""
        if self.fp8 is not None:
            return True
        container = 4 if self.bits <= 4 else 8 if self.bits <= 8 else 16
        return (self.qmin, self.qmax) == grid_bounds(container, self.signed)

    @property
    def min(self) -> np.ndarray:
        return self.scale * (self.qmin - self.zero_point)

    @property
    def max(self) -> np.ndarray:
        return self.scale * (self.qmax - self.zero_point)

    def same_as(self, other: Encoding) -> bool:
        """Exact equality of grid and parameters."""
        return (
            isinstance(other, Encoding)
            and (self.bits, self.signed, self.qmin, self.qmax, self.symmetric)
            == (other.bits, other.signed, other.qmin, other.qmax, other.symmetric)
            and (self.axis, self.block_axis, self.block_size, self.fp8)
            == (other.axis, other.block_axis, other.block_size, other.fp8)
            and self.scale.shape == other.scale.shape
            and np.array_equal(self.scale, other.scale)
            and np.array_equal(self.zero_point, other.zero_point)
        )


def _symmetric_split(n_steps: int) -> tuple[int, int]:
    """(positive divisor, negative code count) of AIMET's symmetric grid; 2-bit uses 2 for both."""
    negative = n_steps - n_steps // 2
    positive = 2 if n_steps == 3 else n_steps // 2
    return positive, negative


def _scalar_grid(min_val: float, max_val: float, n_steps: int, symmetric: bool,
                 unsigned_symmetric: bool) -> tuple[float, int, int, int, bool]:
    """`encoding_from_range` for one range in Python floats: ``(scale, zero_point, qmin, qmax, signed)``.

    The same float64 operations as the array path (IEEE division and comparisons, exact floor), without
    numpy's per-call overhead on 0-d arrays.
    """
    if min_val != min_val or max_val != max_val:  # NaN (np.minimum/np.maximum would keep it)
        raise InvalidArgumentError("cannot compute an encoding from a non-finite range")
    mn = min_val if min_val < 0.0 else 0.0
    mx = max_val if max_val > 0.0 else 0.0
    if not (math.isfinite(mn) and math.isfinite(mx)):
        raise InvalidArgumentError("cannot compute an encoding from a non-finite range")
    floor = min(SCALE_FLOOR_EPS, 0.01 / n_steps)
    if symmetric and not (unsigned_symmetric and mn >= 0):
        positive, negative = _symmetric_split(n_steps)
        return max(mx / positive, -mn / negative, floor), 0, -negative, n_steps - negative, True
    scale = max((mx - mn) / n_steps, floor)
    # round_half_away(-mn / scale): the argument is >= 0 (or -0.0, which rounds to 0 either way)
    zero_point = min(max(math.floor(abs(-mn / scale) + 0.5), 0), n_steps)
    return scale, zero_point, 0, n_steps, False


def encoding_from_range(
    min_val,
    max_val,
    bits: int,
    *,
    symmetric: bool,
    strict: bool = False,
    unsigned_symmetric: bool = False,
    axis: int | None = None,
    block_axis: int | None = None,
    block_size: int | None = None,
) -> Encoding:
    """AIMET 2.42 min-max encoding for observed ranges (scalars or arrays of equal shape)."""
    strict = bool(strict and symmetric)
    n_steps = (1 << bits) - 1 - (1 if strict else 0)
    if np.ndim(min_val) == 0 and np.ndim(max_val) == 0:
        s, z, low, high, is_signed = _scalar_grid(float(min_val), float(max_val), n_steps, symmetric, unsigned_symmetric)
        return Encoding(np.asarray(s), np.asarray(z), bits, is_signed, low, high, symmetric, axis, block_axis, block_size)
    mn = np.minimum(np.asarray(min_val, dtype=np.float64), 0.0)
    mx = np.maximum(np.asarray(max_val, dtype=np.float64), 0.0)
    if mn.shape != mx.shape:
        raise InvalidArgumentError(f"min and max shapes differ: {mn.shape} vs {mx.shape}")
    if not (np.isfinite(mn).all() and np.isfinite(mx).all()):
        raise InvalidArgumentError("cannot compute an encoding from a non-finite range")
    floor = min(SCALE_FLOOR_EPS, 0.01 / n_steps)
    use_unsigned = symmetric and unsigned_symmetric and bool((mn >= 0).all())
    if symmetric and not use_unsigned:
        positive, negative = _symmetric_split(n_steps)
        scale = np.maximum(np.maximum(mx / positive, -mn / negative), floor)
        qmin = -negative
        qmax = n_steps - negative
        zero_point = np.zeros(scale.shape, dtype=np.int64)
        signed = True
    else:
        scale = np.maximum((mx - mn) / n_steps, floor)
        zero_point = np.clip(round_half_away(-mn / scale), 0, n_steps).astype(np.int64)
        qmin, qmax = 0, n_steps
        signed = False
    return Encoding(scale, zero_point, bits, signed, qmin, qmax, symmetric, axis, block_axis, block_size)


def aimet_offset(enc: Encoding) -> np.ndarray:
    """AIMET's ``offset`` (unsigned-grid convention, ``<= 0``): ``qmin - zero_point``; 0 for float8."""
    if enc.fp8 is not None:
        return np.zeros(enc.scale.shape, np.int64)
    return (enc.qmin - enc.zero_point).astype(np.int64)


def encoding_from_aimet(
    scale,
    offset,
    bits: int,
    *,
    symmetric: bool,
    axis: int | None = None,
    block_axis: int | None = None,
    block_size: int | None = None,
) -> Encoding:
    """Rebuild an `Encoding` from AIMET's ``(scale, offset, bw, is_sym)`` description.

    Symmetric encodings with offset ``-2^(b-1)`` are signed (zero point 0), with ``-(2^(b-1) - 1)``
    strict signed, with ``0`` unsigned symmetric; anything else is an asymmetric unsigned grid with
    zero point ``-offset``. Fractional offsets (AIMET's zero-point shift) are rejected.
    """
    scale = np.asarray(scale, dtype=np.float64)
    off = np.broadcast_to(np.asarray(offset, dtype=np.float64), scale.shape)
    if np.any(off != np.round(off)):
        raise InvalidArgumentError("fractional offsets (zero-point shift) are not supported")
    off = off.astype(np.int64)
    half = 1 << (bits - 1)
    if symmetric and np.all(off == -half):
        qmin, qmax = grid_bounds(bits, signed=True)
        return Encoding(scale, np.zeros(scale.shape, np.int64), bits, True, qmin, qmax, True, axis, block_axis, block_size)
    if symmetric and bits > 1 and np.all(off == -(half - 1)):
        qmin, qmax = grid_bounds(bits, signed=True, strict=True)
        return Encoding(scale, np.zeros(scale.shape, np.int64), bits, True, qmin, qmax, True, axis, block_axis, block_size)
    qmin, qmax = grid_bounds(bits, signed=False)
    if np.any(off > 0) or np.any(off < -qmax):
        raise InvalidArgumentError(f"offset outside [-{qmax}, 0] for a {bits}-bit grid")
    return Encoding(scale, -off, bits, False, qmin, qmax, symmetric, axis, block_axis, block_size)


def broadcast_param(enc: Encoding, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Expand a per-tensor/channel/block parameter array so it broadcasts against ``shape``."""
    values = np.asarray(values)
    if values.ndim == 0:
        return values
    rank = len(shape)
    assert enc.axis is not None  # per-channel or per-block: an array parameter has its axis
    axis = enc.axis % rank
    if enc.block_size is None:
        view = [1] * rank
        view[axis] = values.shape[0]
        return values.reshape(view)
    assert enc.block_axis is not None
    block_axis = enc.block_axis % rank
    # (C, n_blocks) -> repeat each block along block_axis, broadcast over the remaining axes
    expanded = np.repeat(values, enc.block_size, axis=1)[:, : shape[block_axis]]
    view = [1] * rank
    view[axis], view[block_axis] = shape[axis], shape[block_axis]
    order = [axis, block_axis]
    target = sorted(order)
    if order != target:
        expanded = expanded.T
    return expanded.reshape(view)


_EXACT_FLOAT32_GRID = 1 << 23  # grids within +-2^23: codes, zero points and their differences are exact in float32


def _float_codes(x: np.ndarray, enc: Encoding, scale: np.ndarray | None = None,
                 zero_point: np.ndarray | None = None) -> np.ndarray:
    """The codes of `quantize` as a fresh float array: float32 for grids within ``+-2^23``, else float64.

    ``x / scale`` is the float32 division of QuantizeLinear. For a grid within ``+-2^23``,
    ``rint(x / scale) + zero_point`` in float32 is exact whenever the sum lies within ``+-2^24``; beyond
    that it is rounded but stays beyond the grid, so the clip gives the codes of exact integer arithmetic.
    NaN goes to ``qmin``; adding the zero point turns a ``-0.0`` into ``0.0``.
    """
    x = np.asarray(x, dtype=np.float32)
    if scale is None:
        scale = broadcast_param(enc, enc.scale.astype(np.float32), x.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        codes = np.asarray(np.divide(x, scale, dtype=np.float32))
    np.rint(codes, out=codes)
    ftype = np.float32 if max(-enc.qmin, enc.qmax) < _EXACT_FLOAT32_GRID else np.float64
    codes = codes.astype(ftype, copy=False)
    if zero_point is None:
        zero_point = broadcast_param(enc, enc.zero_point, x.shape)
    np.add(codes, zero_point.astype(ftype), out=codes)
    if codes.size < CLIP_MIN_ELEMENTS:
        np.fmax(codes, ftype(enc.qmin), out=codes)  # NaN saturates low, like onnxruntime's CPU QuantizeLinear
        np.fmin(codes, ftype(enc.qmax), out=codes)
        return codes
    np.clip(codes, ftype(enc.qmin), ftype(enc.qmax), out=codes)
    nan = np.isnan(codes)
    if nan.any():  # clip keeps NaN: to qmin, as fmax does above
        codes[nan] = enc.qmin
    return codes


CLIP_MIN_ELEMENTS = 1 << 16
"""From this many elements `_float_codes` saturates with one ``np.clip`` pass and sends NaN to ``qmin`` afterwards
(the same codes as ``fmax`` then ``fmin``, which numpy 2.4 runs about 3x slower than ``clip`` on big arrays;
``clip``'s own overhead, some 10 us a call, outweighs that on small ones). Read at call time."""


def quantize(x: np.ndarray, enc: Encoding, dtype=np.int64) -> np.ndarray:
    """ONNX QuantizeLinear on the grid: float32 division, ties to even, saturation (+-inf to the ends,
    NaN to ``qmin`` like onnxruntime's CPU kernel). Returns ``dtype`` codes, int64 unless said otherwise
    (a numpy scalar for a 0-d ``x``); a narrower ``dtype`` must hold ``[qmin, qmax]``. A tensor of more than
    `FAKE_QUANTIZE_BLOCK` elements is done in slices of whole rows, like `fake_quantize` (the same codes; the
    scratch is one slice's, not the tensor's: exports quantize weights of hundreds of megabytes).
    For a float8 encoding the "codes" are the format's values as float32 (``dtype`` is not used)."""
    if enc.fp8 is not None:
        return _in_row_slices(np.asarray(x), enc, np.dtype(np.float32), _fp8_codes)[()]
    return _in_row_slices(np.asarray(x), enc, np.dtype(dtype),
                          lambda part, e, scale, zp: _float_codes(part, e, scale, zp).astype(dtype))[()]


def dequantize(q: np.ndarray, enc: Encoding) -> np.ndarray:
    """ONNX DequantizeLinear: ``(q - zero_point) * scale`` in float32 (``q * scale`` for float8 values)."""
    q = np.asarray(q)
    scale = broadcast_param(enc, enc.scale.astype(np.float32), q.shape)
    if enc.fp8 is not None:
        return q.astype(np.float32) * scale
    zp = broadcast_param(enc, enc.zero_point, q.shape)
    return (q.astype(np.int64) - zp).astype(np.float32) * scale


FAKE_QUANTIZE_BLOCK = 1 << 18
"""Elements per slice `fake_quantize` works on for big tensors: its seven elementwise steps then run on a
slice that stays in the CPU's cache instead of streaming the whole tensor through memory seven times."""


def fake_quantize(x: np.ndarray, enc: Encoding) -> np.ndarray:
    """Quantize then dequantize (what a Q->DQ pair in the sim computes): `dequantize` of `quantize`,
    with the codes kept as floats (``code - zero_point`` is an exact integer there too).

    A tensor of more than `FAKE_QUANTIZE_BLOCK` elements is done in slices along its first axis (whole
    rows, each element the same operations in the same order: the same values, bit for bit)."""
    whole = _fake_quantize_fp8 if enc.fp8 is not None else _fake_quantize_whole
    return _in_row_slices(np.asarray(x), enc, np.dtype(np.float32), whole)


def fake_quantize_parts(x: np.ndarray, enc: Encoding) -> Iterator[np.ndarray]:
    """`fake_quantize` of ``x`` as consecutive blocks of whole rows (float32; ``x`` itself is never copied whole):
    concatenated along the first axis they are `fake_quantize`'s result, bit for bit. A writer can store each
    block while it is still in the CPU's cache instead of filling, then copying, a tensor-sized array."""
    return _row_slices(np.asarray(x), enc, _fake_quantize_fp8 if enc.fp8 is not None else _fake_quantize_whole)


def _in_row_slices(x: np.ndarray, enc: Encoding, dtype: np.dtype, whole: Callable[..., np.ndarray]) -> np.ndarray:
    """``whole(x, enc, scale, zero_point)`` at once for a small tensor, else over slices of whole rows of about
    `FAKE_QUANTIZE_BLOCK` elements into one ``dtype`` result (``scale``/``zero_point`` broadcast per slice;
    None for the whole tensor: ``whole`` broadcasts them itself)."""
    if _row_step(x) is None:
        return whole(x, enc, None, None)
    out = np.empty(x.shape, dtype=dtype)
    start = 0
    for part in _row_slices(x, enc, whole):
        out[start:start + part.shape[0]] = part
        start += part.shape[0]
    return out


def _row_step(x: np.ndarray) -> int | None:
    """Rows per slice of ``x`` (module constant `FAKE_QUANTIZE_BLOCK`, read at call time); None: all at once."""
    rows = x.shape[0] if x.ndim else 0
    step = FAKE_QUANTIZE_BLOCK // max(1, x.size // max(1, rows))
    return None if x.ndim == 0 or x.size <= FAKE_QUANTIZE_BLOCK or step < 1 else step


def _row_slices(x: np.ndarray, enc: Encoding, whole: Callable[..., np.ndarray]) -> Iterator[np.ndarray]:
    """``whole`` of each slice of `_row_step` rows of ``x`` in turn (of all of ``x`` at once where it is small)."""
    step = _row_step(x)
    if step is None:
        yield whole(x, enc, None, None)
        return
    scale = broadcast_param(enc, enc.scale.astype(np.float32), x.shape)
    zero_point = broadcast_param(enc, enc.zero_point, x.shape)
    for start in range(0, x.shape[0], step):
        part = slice(start, start + step)
        yield whole(x[part], enc, _rows(scale, part), _rows(zero_point, part))


def _rows(param: np.ndarray, part: slice) -> np.ndarray:
    """The slice ``part`` of a broadcast parameter along the first axis (itself where it does not vary there)."""
    return param if param.ndim == 0 or param.shape[0] == 1 else param[part]


def _fake_quantize_whole(x: np.ndarray, enc: Encoding, scale: np.ndarray | None = None,
                         zero_point: np.ndarray | None = None) -> np.ndarray:
    """`fake_quantize` in one piece; ``scale``/``zero_point`` given already broadcast against ``x``."""
    codes = _float_codes(x, enc, scale, zero_point)
    if zero_point is None:
        zero_point = broadcast_param(enc, enc.zero_point, codes.shape)
    np.subtract(codes, zero_point.astype(codes.dtype), out=codes)
    values = codes.astype(np.float32, copy=False)
    if scale is None:
        scale = broadcast_param(enc, enc.scale.astype(np.float32), values.shape)
    np.multiply(values, scale, out=values)
    return values[()]  # a numpy scalar for a 0-d ``x``, like numpy's own operators


def _fp8_codes(x: np.ndarray, enc: Encoding, scale: np.ndarray | None = None,
               zero_point: np.ndarray | None = None) -> np.ndarray:
    """QuantizeLinear onto a float8 format: ``round_to_format(x / scale)`` (float32 division), as float32."""
    x = np.asarray(x, dtype=np.float32)
    if scale is None:
        scale = broadcast_param(enc, enc.scale.astype(np.float32), x.shape)
    assert enc.fp8 is not None
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return round_to_format(np.divide(x, scale, dtype=np.float32), fp8_format(enc.fp8))


def _fake_quantize_fp8(x: np.ndarray, enc: Encoding, scale: np.ndarray | None = None,
                       zero_point: np.ndarray | None = None) -> np.ndarray:
    """`fake_quantize` onto a float8 format: the float8 value times the scale, in float32."""
    if scale is None:
        scale = broadcast_param(enc, enc.scale.astype(np.float32), np.shape(x))
    values = np.asarray(_fp8_codes(x, enc, scale))
    with np.errstate(over="ignore"):
        return np.multiply(values, scale, dtype=np.float32)[()]


def fp16_round_trip(x: np.ndarray) -> np.ndarray:
    """float32 -> float16 -> float32 (round to nearest even; overflow to inf)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def reduce_min_max(
    x: np.ndarray, axis: int | None = None, block_axis: int | None = None, block_size: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Min and max of ``x``: overall, per slice along ``axis``, or per (channel, block)."""
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        x = x.astype(np.float64)
    # reduced in x's own type: conversion to float64 is monotone, so the extremes convert to the same values
    if axis is None:
        return np.asarray(x.min(), dtype=np.float64), np.asarray(x.max(), dtype=np.float64)
    axis %= x.ndim
    if block_size is None:
        moved = (x if axis == 0 else np.moveaxis(x, axis, 0)).reshape(x.shape[axis], -1)
        return moved.min(axis=1).astype(np.float64), moved.max(axis=1).astype(np.float64)
    assert block_axis is not None, "a block size needs a block axis"
    block_axis %= x.ndim
    length = x.shape[block_axis]
    if length % block_size:
        raise InvalidArgumentError(f"dimension {block_axis} of size {length} is not divisible by block size {block_size}")
    moved = np.moveaxis(x, (axis, block_axis), (0, 1))
    blocks = moved.reshape(x.shape[axis], length // block_size, -1)
    return blocks.min(axis=2).astype(np.float64), blocks.max(axis=2).astype(np.float64)
