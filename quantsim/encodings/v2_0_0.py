"""AIMET encodings format 2.0.0 (ONNX QuantizeLinear-like; 2.1.0 shares the layout).

One ``encodings`` list, no param/activation split and no ``quantizer_args``. Entry: ``name``,
``output_dtype`` ("int8", "uint8", "int4", "uint16", "int32", ...), ``y_scale`` (number per tensor, list
per channel, for blockwise a nested list in ONNX's blocked layout: the tensor's shape with the block axis
divided by ``block_size``), ``y_zero_point`` (omitted when all zero), ``axis`` (channel axis per channel,
*block* axis blockwise) and ``block_size``. LPBQ entries (``per_block_int_scale`` and
``per_channel_float_scale`` instead of ``y_scale``) are read and written by `quantsim.encodings.lpbq_entries`.

Conventions shared with AIMET: symmetric grids are signed types with no zero point; strict symmetric
grids are written with zero point -1 (AIMET's ``offset + 2^(b-1)``) and read back as the strict grid;
activation entries (kind "activation" or None, not int32) are forced to unsigned by adding ``2^(b-1)`` to
the zero point (``force_activation_as="signed"`` goes the other way). float16 entries are omitted; only
4/8/16/32-bit grids have an ``output_dtype``. Records read from a 2.0.0 file have kind None.

float8 entries (AIMET 2.42's layout): ``output_dtype`` "float8e4m3fn" or "float8e5m2", ``y_scale`` (and
``axis`` per channel), no ``y_zero_point`` (a zero one is accepted when read); activations stay float8.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from quantsim.core.fp8 import FP8_FORMATS
from quantsim.core.fp8_encodings import fp8_encoding_from_scale
from quantsim.core.numerics import Encoding, grid_bounds
from quantsim.encodings import lpbq_entries
from quantsim.encodings.grids import check_writable, granularity, is_strict
from quantsim.encodings.record import INT32_BITS, TensorEncoding
from quantsim.encodings.validate import (
    Where,
    as_int,
    as_str,
    entry_label,
    integral,
    numeric_array,
    positive_scales,
    require,
)

__all__ = ["VERSION", "OUTPUT_DTYPES", "FORCE_CHOICES", "dtype_name", "write_section", "read_section"]

VERSION = "2.0.0"
OUTPUT_DTYPES = {
    f"{'' if signed else 'u'}int{bits}": (bits, signed) for bits in (4, 8, 16, 32) for signed in (True, False)
}
FORCE_CHOICES = ("unsigned", "signed", None)  # None: each activation grid's own signedness (AIMET's None)


def dtype_name(where: Where, bits: int, signed: bool) -> str:
    """``output_dtype`` of a grid; bitwidths without an AIMET/ONNX type name are an error."""
    name = f"{'' if signed else 'u'}int{bits}"
    if name not in OUTPUT_DTYPES:
        raise where.error(
            f"a {bits}-bit grid has no 2.0.0 output_dtype (only 4, 8, 16 and 32 bits); write 0.6.1 or 1.0.0"
        )
    return name


def _file_grid(enc: Encoding, kind: str | None, force: str | None) -> tuple[bool, np.ndarray]:
    """(signed dtype?, zero points) as they go into the file."""
    if is_strict(enc):
        signed, zp = True, np.full(enc.scale.shape, -1, dtype=np.int64)
    else:
        signed, zp = enc.signed, enc.zero_point.copy()
    if kind != "param" and enc.bits != INT32_BITS:
        half = 1 << (enc.bits - 1)
        if force == "unsigned" and signed:
            signed, zp = False, zp + half
        elif force == "signed" and not signed:
            signed, zp = True, zp - half
    return signed, zp


def _blocked(where: Where, record: TensorEncoding, values: np.ndarray) -> tuple[np.ndarray, int]:
    """(C, n_blocks) values -> ONNX blocked layout (replicated along the other axes), and the block axis."""
    enc, shape = record.grid, record.shape
    if shape is None or len(shape) < 2:
        raise where.error("writing a blockwise encoding in 2.0.0 needs the tensor shape (rank >= 2)")
    if enc.axis is None or enc.block_axis is None or enc.block_size is None:
        raise where.error("blockwise encoding has no channel axis / block axis / block size bound")
    rank = len(shape)
    axis, block_axis = enc.axis % rank, enc.block_axis % rank
    if axis == block_axis:
        raise where.error("channel axis and block axis must differ")
    n_blocks = -(-shape[block_axis] // enc.block_size)
    grid = values.reshape(shape[axis], -1) if values.ndim == 1 and values.size % shape[axis] == 0 else values
    if grid.shape != (shape[axis], n_blocks):
        raise where.error(
            f"block scales of shape {values.shape} do not fit tensor shape {shape} "
            f"(axis {axis}, block axis {block_axis}, block size {enc.block_size})"
        )
    if axis > block_axis:
        grid = grid.T
    view = [1] * rank
    view[axis], view[block_axis] = shape[axis], n_blocks
    target = list(shape)
    target[block_axis] = n_blocks
    return np.broadcast_to(grid.reshape(view), target), block_axis


def _write_fp8_entry(where: Where, record: TensorEncoding) -> dict[str, Any]:
    enc = record.grid
    entry: dict[str, Any] = {"name": record.name, "output_dtype": enc.fp8}
    if granularity(where, enc) == "channel":
        if enc.axis is None:
            raise where.error("per-channel encoding has no channel axis bound; 2.0.0 needs 'axis'")
        entry["axis"] = int(enc.axis)
    entry["y_scale"] = enc.scale.tolist()
    return entry


def _read_fp8_entry(where: Where, raw: Any, name: str, dtype: str, kind: str | None) -> TensorEncoding:
    if "block_size" in raw:
        raise where.error(f"blockwise {dtype} encodings are not supported (per tensor or per channel only)")
    scale = positive_scales(where, numeric_array(where, require(where, raw, "y_scale"), "y_scale"), "y_scale")
    if scale.ndim > 1:
        raise where.error(f"a {dtype} 'y_scale' must be a number or a list")
    if raw.get("y_zero_point") is not None and np.any(numeric_array(where, raw["y_zero_point"], "y_zero_point") != 0):
        raise where.error(f"a {dtype} entry's 'y_zero_point' must be 0 (or left out)")
    axis = raw.get("axis") if scale.ndim else None
    axis = None if axis is None else as_int(where, axis, "axis")
    return TensorEncoding.from_encoding(name, fp8_encoding_from_scale(scale, dtype, axis=axis), kind)


def _write_entry(where: Where, record: TensorEncoding, force: str | None) -> dict[str, Any]:
    if record.lpbq_scale_bits is not None:
        return lpbq_entries.write_2_0_0(where, record)
    enc = record.grid
    if enc.fp8 is not None:
        return _write_fp8_entry(where, record)
    check_writable(where, enc)
    layout = granularity(where, enc)
    signed, zp = _file_grid(enc, record.kind, force)
    entry: dict[str, Any] = {"name": record.name, "output_dtype": dtype_name(where, enc.bits, signed)}
    scale = enc.scale
    if layout == "channel":
        if enc.axis is None:
            raise where.error("per-channel encoding has no channel axis bound; 2.0.0 needs 'axis'")
        entry["axis"] = int(enc.axis)
    elif layout == "block":
        scale, block_axis = _blocked(where, record, scale)
        zp, _ = _blocked(where, record, zp)
        entry["axis"] = block_axis
        entry["block_size"] = int(enc.block_size or 0)  # set: the layout is "block"
    entry["y_scale"] = scale.tolist()
    if np.any(zp != 0):
        entry["y_zero_point"] = zp.tolist()
    return entry


def write_section(records: list[TensorEncoding], source: str, force_activation_as: str | None) -> list[dict[str, Any]]:
    """The ``encodings`` list (float16 records are left out, as AIMET does)."""
    return [
        _write_entry(Where(source, f"tensor {record.name!r}"), record, force_activation_as)
        for record in records
        if not record.is_float
    ]


def _constant_along(values: np.ndarray, axis: int) -> bool:
    return bool(np.all(values == np.take(values, [0], axis=axis)))


def _collapse(where: Where, scale: np.ndarray, zp: np.ndarray, block_axis: int):
    """Blocked layout -> (channel axis, (C, n_blocks) scales, zero points); other axes must be replicas."""
    others = [k for k in range(scale.ndim) if k != block_axis]
    varying = [k for k in others if not (_constant_along(scale, k) and _constant_along(zp, k))]
    if len(varying) > 1:
        raise where.error(
            f"blockwise 'y_scale' varies along axes {varying}; quantsim supports one channel axis"
        )
    axis = varying[0] if varying else (0 if block_axis != 0 else 1)

    def pick(values: np.ndarray) -> np.ndarray:
        moved = np.moveaxis(values, (axis, block_axis), (0, 1))
        return moved.reshape(moved.shape[0], moved.shape[1], -1)[:, :, 0]

    return axis, pick(scale), pick(zp)


def _read_entry(where: Where, raw: Any, kind: str | None) -> TensorEncoding:
    name = as_str(where, require(where, raw, "name"), "name")
    if "bw" in raw:
        raise where.error("'bw' is not a 2.x field (the bitwidth comes from 'output_dtype')")
    if any(key in raw for key in lpbq_entries.LPBQ_KEYS):
        return lpbq_entries.read_2_0_0(where, raw, name, kind)
    dtype = as_str(where, require(where, raw, "output_dtype"), "output_dtype")
    if dtype in FP8_FORMATS:
        return _read_fp8_entry(where, raw, name, dtype, kind)
    if dtype not in OUTPUT_DTYPES:
        raise where.error(f"unsupported output_dtype {dtype!r} (expected one of {', '.join([*OUTPUT_DTYPES, *FP8_FORMATS])})")
    bits, signed = OUTPUT_DTYPES[dtype]
    scale = positive_scales(where, numeric_array(where, require(where, raw, "y_scale"), "y_scale"), "y_scale")
    axis = raw.get("axis")
    axis = None if axis is None else as_int(where, axis, "axis")
    block_size = raw.get("block_size")
    block_size = None if block_size is None else as_int(where, block_size, "block_size", minimum=1)
    if block_size is not None and axis is None:
        raise where.error("'block_size' requires 'axis'")
    zp = np.zeros(scale.shape, dtype=np.int64)
    if raw.get("y_zero_point") is not None:
        zp = integral(where, numeric_array(where, raw["y_zero_point"], "y_zero_point"), "y_zero_point")
        if zp.shape != scale.shape:
            raise where.error(f"'y_zero_point' shape {zp.shape} differs from 'y_scale' shape {scale.shape}")
    lo, hi = grid_bounds(bits, signed)
    if np.any(zp < lo) or np.any(zp > hi):
        bad = zp[(zp < lo) | (zp > hi)].flat[0]
        raise where.error(f"'y_zero_point' {bad} is outside the {dtype} range [{lo}, {hi}]")
    shape = block_axis = None
    if block_size is None:
        if scale.ndim > 1:
            raise where.error("a nested 'y_scale' needs 'block_size'")
        if scale.ndim == 0:
            axis = None
    else:
        assert axis is not None  # checked above: block_size requires axis
        rank = scale.ndim
        if rank < 2:
            raise where.error("a blockwise 'y_scale' must be nested with the tensor's rank (>= 2)")
        if not -rank <= axis < rank:
            raise where.error(f"'axis' {axis} is out of range for a rank-{rank} 'y_scale'")
        block_axis = axis % rank
        full = list(scale.shape)
        full[block_axis] *= block_size
        shape = tuple(full)
        axis, scale, zp = _collapse(where, scale, zp, block_axis)
    qmin, qmax = lo, hi
    symmetric = False
    if signed and np.all(zp == 0):
        symmetric = True
    elif signed and np.all(zp == -1):
        qmin, qmax = grid_bounds(bits, True, strict=True)
        zp, symmetric = np.zeros_like(zp), True
    try:
        enc = Encoding(scale, zp, bits, signed, qmin, qmax, symmetric, axis, block_axis, block_size)
    except ValueError as exc:
        raise where.error(str(exc)) from None
    return TensorEncoding.from_encoding(name, enc, kind, shape)


def read_section(data: Any, source: str, section: str = "encodings", kind: str | None = None) -> list[TensorEncoding]:
    """An ``encodings`` list (also a bare param-encodings list, then with kind "param")."""
    if not isinstance(data, list):
        raise Where(source, section).error(f"expected a JSON list of entries, got {type(data).__name__}")
    return [
        _read_entry(Where(source, entry_label(section, index, raw)), raw, kind) for index, raw in enumerate(data)
    ]
