"""LPBQ entries of AIMET's 1.0.0 and 2.0.0 encodings files, as aimet-onnx 2.42 writes them.

An LPBQ record (`TensorEncoding.lpbq_scale_bits` set) holds the effective block scales
``int_scale * channel_scale`` (`quantsim.core.lpbq`); the files hold the two factors:

* 1.0.0: ``{"name", "dtype": "INT", "enc_type": "LPBQ", "compressed_bw": b, "bw": b + scale_bits,
  "is_sym": true, "scale": [C channel scales], "per_block_int_scale": [C * n_blocks ints in
  (channel, block) order], "offset": [-2^(bw-1)] * C, "block_size"}``;
* 2.0.0: ``{"name", "output_dtype": "int<b>", "per_block_int_scale": ints, "per_channel_float_scale":
  floats, "axis": <block axis>, "block_size"}``, both nested with the tensor's rank: the int scales have
  the channel count and the block count at their axes and 1 elsewhere, the float scales the channel count
  at the channel axis and 1 elsewhere. The format has no field for the scale bitwidth: it is ``b`` (AIMET
  refuses to write an LPBQ grid whose decompressed bitwidth is not ``2 * b``, and reads ``2 * b`` back).

Integer scales outside ``[1, 2^scale_bits]`` are refused on reading.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from quantsim.core.lpbq import decompose_block_scales, lpbq_block_scales
from quantsim.core.numerics import Encoding, grid_bounds
from quantsim.encodings.grids import check_int_bits
from quantsim.encodings.record import TensorEncoding
from quantsim.encodings.validate import Where, as_int, as_str, integral, numeric_array, positive_scales, require

__all__ = ["LPBQ_KEYS", "write_1_0_0", "read_1_0_0", "write_2_0_0", "read_2_0_0"]

LPBQ_KEYS = ("per_block_int_scale", "per_channel_float_scale")


def _factors(where: Where, record: TensorEncoding) -> tuple[Encoding, int, np.ndarray, np.ndarray]:
    enc, scale_bits = record.grid, record.lpbq_scale_bits
    assert scale_bits is not None  # callers check it
    if enc.scale.ndim != 2 or enc.block_size is None:
        raise where.error(f"an LPBQ encoding needs (channels, blocks) scales, got shape {enc.scale.shape}")
    int_scale, channel_scale = decompose_block_scales(enc.scale, scale_bits)
    return enc, scale_bits, int_scale, channel_scale


def write_1_0_0(where: Where, record: TensorEncoding) -> dict[str, Any]:
    """The 1.0.0 entry of an LPBQ record."""
    enc, scale_bits, int_scale, channel_scale = _factors(where, record)
    bw = enc.bits + scale_bits
    return {
        "name": record.name,
        "dtype": "INT",
        "enc_type": "LPBQ",
        "compressed_bw": enc.bits,
        "bw": bw,
        "is_sym": True,
        "scale": [float(s) for s in channel_scale],
        "per_block_int_scale": [int(i) for i in int_scale.reshape(-1)],
        "offset": [-(1 << (bw - 1))] * channel_scale.size,
        "block_size": int(enc.block_size or 0),
    }


def _int_scales(where: Where, raw: Any, scale_bits: int) -> np.ndarray:
    ints = integral(where, numeric_array(where, require(where, raw, "per_block_int_scale"), "per_block_int_scale"),
                    "per_block_int_scale")
    top = 1 << scale_bits
    if np.any(ints < 1) or np.any(ints > top):
        bad = int(ints[(ints < 1) | (ints > top)].flat[0])
        raise where.error(f"'per_block_int_scale' value {bad} is outside [1, {top}] ({scale_bits}-bit block scales)")
    return ints


def _encoding(where: Where, scale: np.ndarray, bits: int, **axes) -> Encoding:
    qmin, qmax = grid_bounds(bits, signed=True)
    scale = positive_scales(where, scale, "per_block_int_scale * per_channel_float_scale")
    return Encoding(scale, np.zeros(scale.shape, np.int64), bits, True, qmin, qmax, True, **axes)


def read_1_0_0(where: Where, raw: Any, name: str, kind: str) -> TensorEncoding:
    """An ``enc_type: "LPBQ"`` 1.0.0 entry: flat (channel, block) scales with ``block_size`` and no axes,
    which the simulator binds to the tensor as it does PER_BLOCK entries."""
    bits = check_int_bits(where, as_int(where, require(where, raw, "compressed_bw"), "compressed_bw"), "compressed_bw")
    bw = as_int(where, require(where, raw, "bw"), "bw")
    if bw <= bits or bw - bits > 16:
        raise where.error(f"'bw' {bw} must exceed 'compressed_bw' {bits} by 1..16 bits (the block scales' bits)")
    if raw.get("is_sym", True) is not True:
        raise where.error("LPBQ entries are symmetric ('is_sym' must be true)")
    block_size = as_int(where, require(where, raw, "block_size"), "block_size", minimum=1)
    channel_scale = positive_scales(where, numeric_array(where, require(where, raw, "scale"), "scale", ndim=1))
    ints = _int_scales(where, raw, bw - bits).reshape(-1)
    if ints.size % channel_scale.size:
        raise where.error(f"{ints.size} 'per_block_int_scale' values do not split into {channel_scale.size} channels")
    scale = lpbq_block_scales(ints.reshape(channel_scale.size, -1), channel_scale).reshape(-1)
    return TensorEncoding.from_encoding(name, _encoding(where, scale, bits, block_size=block_size), kind,
                                        lpbq_scale_bits=bw - bits)


def write_2_0_0(where: Where, record: TensorEncoding) -> dict[str, Any]:
    """The 2.0.0 entry of an LPBQ record (its scale bitwidth must equal its bitwidth, as AIMET requires)."""
    enc, scale_bits, int_scale, channel_scale = _factors(where, record)
    if scale_bits != enc.bits:
        raise where.error(f"an LPBQ grid of {enc.bits} bits with {scale_bits}-bit block scales (decompressed "
                          f"bitwidth {enc.bits + scale_bits}) cannot be written in 2.0.0, which needs a decompressed "
                          f"bitwidth of 2 * {enc.bits}; write 1.0.0")
    shape = record.shape
    if shape is None or len(shape) < 2 or enc.axis is None or enc.block_axis is None:
        raise where.error("writing an LPBQ encoding in 2.0.0 needs the tensor's rank and its channel and block axes")
    rank = len(shape)
    axis, block_axis = enc.axis % rank, enc.block_axis % rank
    ints = int_scale if axis < block_axis else int_scale.T
    view = [1] * rank
    view[axis], view[block_axis] = int_scale.shape
    channel_view = [1] * rank
    channel_view[axis] = channel_scale.size
    return {
        "name": record.name,
        "output_dtype": f"int{enc.bits}",
        "per_block_int_scale": ints.reshape(view).tolist(),
        "per_channel_float_scale": channel_scale.reshape(channel_view).tolist(),
        "axis": block_axis,
        "block_size": int(enc.block_size or 0),
    }


def read_2_0_0(where: Where, raw: Any, name: str, kind: str | None) -> TensorEncoding:
    """A 2.0.0 entry with ``per_block_int_scale``: the channel axis is where the float scales vary (the
    first axis other than the block axis when there is one channel); other axes must be replicas."""
    dtype = as_str(where, require(where, raw, "output_dtype"), "output_dtype")
    if not dtype.startswith("int") or not dtype[3:].isdigit():
        raise where.error(f"an LPBQ entry needs a signed integer 'output_dtype', got {dtype!r}")
    bits = check_int_bits(where, int(dtype[3:]), "output_dtype")
    block_size = as_int(where, require(where, raw, "block_size"), "block_size", minimum=1)
    channel_scale = positive_scales(where, numeric_array(where, require(where, raw, "per_channel_float_scale"),
                                                         "per_channel_float_scale"), "per_channel_float_scale")
    ints = _int_scales(where, raw, bits)
    rank = ints.ndim
    if rank < 2 or channel_scale.ndim != rank:
        raise where.error(f"'per_block_int_scale' (rank {rank}) and 'per_channel_float_scale' (rank "
                          f"{channel_scale.ndim}) must be nested with the tensor's rank (>= 2)")
    block_axis = as_int(where, require(where, raw, "axis"), "axis")
    if not -rank <= block_axis < rank:
        raise where.error(f"'axis' {block_axis} is out of range for rank {rank}")
    block_axis %= rank
    if channel_scale.shape[block_axis] != 1:
        raise where.error("'per_channel_float_scale' must have size 1 along the block axis")
    varying = [k for k in range(rank) if k != block_axis and channel_scale.shape[k] > 1]
    if len(varying) > 1:
        raise where.error(f"'per_channel_float_scale' varies along axes {varying}; one channel axis is supported")
    axis = varying[0] if varying else (0 if block_axis else 1)
    try:
        full = np.broadcast_to(ints * channel_scale, np.broadcast_shapes(ints.shape, channel_scale.shape))
    except ValueError:
        raise where.error(f"'per_block_int_scale' of shape {ints.shape} does not fit 'per_channel_float_scale' of "
                          f"shape {channel_scale.shape}") from None
    moved = np.moveaxis(full, (axis, block_axis), (0, 1))
    grid = moved.reshape(moved.shape[0], moved.shape[1], -1)
    if np.any(grid != grid[:, :, :1]):
        raise where.error("LPBQ scales vary along an axis that is neither the channel nor the block axis")
    shape = list(full.shape)
    shape[block_axis] *= block_size
    enc = _encoding(where, grid[:, :, 0], bits, axis=axis, block_axis=block_axis, block_size=block_size)
    return TensorEncoding.from_encoding(name, enc, kind, tuple(shape), lpbq_scale_bits=bits)
