"""Element-wise, pooling and lookup-table QLinear kernels of the integer reference executor. PURE numpy.

QLinearAdd/Mul/Concat/Where, QLinearAveragePool / QLinearGlobalAveragePool and QLinearSigmoid /
LeakyRelu / Softmax; kernel convention and numerics as described in `quantsim.export.reference.qlinear_linear`,
which assembles them into `QUANT_KERNELS`.
"""
from __future__ import annotations

import math

import numpy as np

from quantsim.core.fixed_point import quantize_multiplier
from quantsim.export.reference.numerics import (
    codes_of,
    extract_windows,
    fixed_point_multiply,
    float64_of,
    grid_span,
    pool_geometry,
    qrange,
    requantize_fine,
    requantize_real,
    result_dtype,
    wrap_int32,
    zero_point_of,
)

__all__ = [
    "qlinear_add", "qlinear_mul", "qlinear_concat", "qlinear_where", "qlinear_average_pool",
    "qlinear_global_average_pool", "qlinear_sigmoid", "qlinear_leaky_relu", "qlinear_softmax",
]


# ------------------------------------------------------------------------------------------------ element-wise
def _binary_inputs(ins, name):
    a, as_, az, b, bs, bz, cs, cz = (list(ins) + [None] * 8)[:8]
    qa, qb = codes_of(a, name) - zero_point_of(az), codes_of(b, name) - zero_point_of(bz)
    return qa, float64_of(as_), qb, float64_of(bs), float64_of(cs), cz, a


def qlinear_add(ins, attrs, opset):
    da, sa, db, sb, sc, cz, a = _binary_inputs(ins, "QLinearAdd")
    left_shift = min(20, 30 - max(grid_span(ins[0].dtype), grid_span(ins[3].dtype)).bit_length())  # TFLite: 20 for 8 bits
    da, db = da.astype(np.int64), db.astype(np.int64)
    twice_max = 2.0 * max(float(sa), float(sb))
    ma, sha = quantize_multiplier(sa / twice_max)
    mb, shb = quantize_multiplier(sb / twice_max)
    ra = fixed_point_multiply(da << left_shift, ma, sha).astype(np.int64)
    rb = fixed_point_multiply(db << left_shift, mb, shb).astype(np.int64)
    total = (ra + rb).astype(np.int32)  # each |r| <= 2**27: no overflow
    return [requantize_real(total, twice_max / (2.0**left_shift * sc), cz, result_dtype(cz, a))]


def qlinear_mul(ins, attrs, opset):
    da, sa, db, sb, sc, cz, a = _binary_inputs(ins, "QLinearMul")
    bound = grid_span(ins[0].dtype) * grid_span(ins[3].dtype)
    return [requantize_fine(da * db, sa * sb / sc, cz, result_dtype(cz, a), bound)]


def qlinear_concat(ins, attrs, opset):
    ys, yz = float64_of(ins[0]), ins[1]
    dtype = result_dtype(yz, ins[2])
    parts = []
    for i in range(2, len(ins), 3):
        q, s, z = ins[i], float64_of(ins[i + 1]), ins[i + 2]
        if float(s) == float(ys) and int(zero_point_of(z)) == int(zero_point_of(yz)):
            parts.append(np.asarray(q).astype(dtype))  # same grid: a copy
        else:
            parts.append(requantize_fine(codes_of(q, "QLinearConcat") - zero_point_of(z), s / ys, yz, dtype, grid_span(q.dtype)))
    return [np.concatenate(parts, axis=int(attrs.get("axis", 0)))]


def qlinear_where(ins, attrs, opset):
    cond, x, xs, xz, y, ys, yz, zs, zz = ins[:9]
    dtype = result_dtype(zz, x)
    dx, dy = codes_of(x, "QLinearWhere") - zero_point_of(xz), codes_of(y, "QLinearWhere") - zero_point_of(yz)
    qx = requantize_fine(dx, float64_of(xs) / float64_of(zs), zz, dtype, grid_span(x.dtype))
    qy = requantize_fine(dy, float64_of(ys) / float64_of(zs), zz, dtype, grid_span(y.dtype))
    return [np.where(np.asarray(cond, bool), qx, qy)]


# ------------------------------------------------------------------------------------------------ pooling
def _nchw(x, channels_last: bool):
    return np.moveaxis(x, -1, 1) if channels_last else x


def qlinear_average_pool(ins, attrs, opset):
    x, xs, xz, ys, yz = (list(ins) + [None] * 5)[:5]
    cl = bool(int(attrs.get("channels_last", 0)))
    xc = _nchw(codes_of(x, "QLinearAveragePool"), cl) - zero_point_of(xz)
    kernel = list(attrs["kernel_shape"])
    nd = len(kernel)
    begin, end, out, strides, dil = pool_geometry(xc.shape[2:], kernel, attrs, bool(attrs.get("ceil_mode", 0)))
    window_axes = tuple(range(-nd, 0))
    acc = extract_windows(xc, begin, end, out, kernel, strides, dil, 0).sum(axis=window_axes, dtype=np.int64)
    if int(attrs.get("count_include_pad", 0)):
        count = np.asarray(math.prod(kernel))  # onnxruntime: the full kernel, overhanging windows included
    else:
        ones = np.ones((1, 1, *xc.shape[2:]), np.int32)
        count = extract_windows(ones, begin, end, out, kernel, strides, dil, 0).sum(axis=window_axes)
    bound = grid_span(x.dtype) * math.prod(kernel)
    y = requantize_fine(wrap_int32(acc), float64_of(xs) / (float64_of(ys) * count), yz, result_dtype(yz, x), bound)
    return [np.moveaxis(y, 1, -1) if cl else y]


def qlinear_global_average_pool(ins, attrs, opset):
    x, xs, xz, ys, yz = (list(ins) + [None] * 5)[:5]
    cl = bool(int(attrs.get("channels_last", 0)))
    xc = codes_of(x, "QLinearGlobalAveragePool") - zero_point_of(xz)
    axes = tuple(range(1, xc.ndim - 1)) if cl else tuple(range(2, xc.ndim))
    acc = wrap_int32(xc.sum(axis=axes, keepdims=True, dtype=np.int64))
    count = math.prod(xc.shape[a] for a in axes)
    return [requantize_fine(acc, float64_of(xs) / (float64_of(ys) * count), yz, result_dtype(yz, x), grid_span(x.dtype) * count)]


# ------------------------------------------------------------------------------------------------ non-linear
def _lookup(x, xs, xz, ys, yz, fn):
    """Apply ``fn`` through a table over every input code, built once from the scales."""
    x = np.asarray(x)
    lo, hi = qrange(x.dtype)
    codes = np.arange(lo, hi + 1, dtype=np.int64)
    real = fn((codes - zero_point_of(xz)) * float64_of(xs))
    dtype = result_dtype(yz, x)
    olo, ohi = qrange(dtype)
    table = np.clip(np.rint(real / float64_of(ys)) + zero_point_of(yz), olo, ohi).astype(dtype)
    return table[x.astype(np.int64) - lo]


def qlinear_sigmoid(ins, attrs, opset):
    x, xs, xz, ys, yz = (list(ins) + [None] * 5)[:5]
    codes_of(x, "QLinearSigmoid")
    return [_lookup(x, xs, xz, ys, yz, lambda r: 1.0 / (1.0 + np.exp(-r)))]


def qlinear_leaky_relu(ins, attrs, opset):
    x, xs, xz, ys, yz = (list(ins) + [None] * 5)[:5]
    alpha = float(attrs.get("alpha", 0.01))
    d = codes_of(x, "QLinearLeakyRelu") - zero_point_of(xz)
    dtype = result_dtype(yz, x)
    bound = grid_span(x.dtype)
    pos = requantize_fine(d, float64_of(xs) / float64_of(ys), yz, dtype, bound)
    neg = requantize_fine(d if alpha >= 0 else -d, abs(alpha) * float64_of(xs) / float64_of(ys), yz, dtype, bound)
    return [np.where(d >= 0, pos, neg)]


def qlinear_softmax(ins, attrs, opset):
    x, xs, xz, ys, yz = (list(ins) + [None] * 5)[:5]
    q = codes_of(x, "QLinearSoftmax")
    op_opset = int(attrs["opset"])
    axis = int(attrs.get("axis", 1 if op_opset < 13 else -1)) % q.ndim
    shape = q.shape
    if op_opset < 13:  # softmax over the flattened trailing block [axis:]
        rows = q.reshape(math.prod(shape[:axis]), -1)
    else:
        rows = np.moveaxis(q, axis, -1)
    length = rows.shape[-1]
    mantissa, shift = (int(v) for v in quantize_multiplier(1.0 / float64_of(ys)))
    denom_shift = max(31 - shift, 0)
    exp_bits = max(8, min(24, 61 - denom_shift - max(length - 1, 1).bit_length()))
    d = np.arange(grid_span(q_dtype := np.asarray(x).dtype) + 1, dtype=np.float64)
    table = np.rint(np.exp(-d * float64_of(xs)) * 2.0**exp_bits).astype(np.int64)
    e = table[rows.max(axis=-1, keepdims=True).astype(np.int64) - rows]  # d = max - q in [0, span]
    total = e.sum(axis=-1, keepdims=True)
    num = (e * mantissa) << max(shift - 31, 0)
    den = total << denom_shift
    p = (2 * num + den) // (2 * den)  # round(num / den), ties up (num >= 0)
    dtype = result_dtype(yz, q_dtype)
    y = np.clip(p + zero_point_of(yz), *qrange(dtype)).astype(dtype)
    return [y.reshape(shape) if op_opset < 13 else np.moveaxis(y, -1, axis)]
