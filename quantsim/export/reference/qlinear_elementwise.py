"""Element-wise, pooling and lookup-table QLinear kernels of the integer reference executor. PURE numpy.

QLinearAdd/Mul/Concat/Where, QLinearAveragePool / QLinearGlobalAveragePool and QLinearSigmoid /
LeakyRelu / Softmax; kernel convention and numerics as described in `quantsim.export.reference.qlinear_linear`,
which assembles them into `QUANT_KERNELS`.
"""
from __future__ import annotations

import math

import numpy as np

from quantsim.core.fixed_point import multiply_by_quantized_multiplier, quantize_multiplier
from quantsim.export.reference.numerics import (
    _codes,
    _f64,
    _out_dtype,
    _requant,
    _requant_fine,
    _span,
    _wrap32,
    _zp,
    extract_windows,
    pool_geometry,
    qrange,
)

__all__ = [
    "qlinear_add", "qlinear_mul", "qlinear_concat", "qlinear_where", "qlinear_average_pool",
    "qlinear_global_average_pool", "qlinear_sigmoid", "qlinear_leaky_relu", "qlinear_softmax",
]


# ------------------------------------------------------------------------------------------------ element-wise
def _binary_inputs(ins, name):
    a, as_, az, b, bs, bz, cs, cz = (list(ins) + [None] * 8)[:8]
    return _codes(a, name) - _zp(az), _f64(as_), _codes(b, name) - _zp(bz), _f64(bs), _f64(cs), cz, a


def qlinear_add(ins, attrs, opset):
    da, sa, db, sb, sc, cz, a = _binary_inputs(ins, "QLinearAdd")
    left_shift = min(20, 30 - max(_span(ins[0].dtype), _span(ins[3].dtype)).bit_length())  # TFLite: 20 for 8 bits
    da, db = da.astype(np.int64), db.astype(np.int64)
    twice_max = 2.0 * max(float(sa), float(sb))
    ma, sha = quantize_multiplier(sa / twice_max)
    mb, shb = quantize_multiplier(sb / twice_max)
    ra = multiply_by_quantized_multiplier(da << left_shift, ma, sha).astype(np.int64)
    rb = multiply_by_quantized_multiplier(db << left_shift, mb, shb).astype(np.int64)
    total = (ra + rb).astype(np.int32)  # each |r| <= 2**27: no overflow
    return [_requant(total, twice_max / (2.0**left_shift * sc), cz, _out_dtype(cz, a))]


def qlinear_mul(ins, attrs, opset):
    da, sa, db, sb, sc, cz, a = _binary_inputs(ins, "QLinearMul")
    bound = _span(ins[0].dtype) * _span(ins[3].dtype)
    return [_requant_fine(da * db, sa * sb / sc, cz, _out_dtype(cz, a), bound)]


def qlinear_concat(ins, attrs, opset):
    ys, yz = _f64(ins[0]), ins[1]
    dtype = _out_dtype(yz, ins[2])
    parts = []
    for i in range(2, len(ins), 3):
        q, s, z = ins[i], _f64(ins[i + 1]), ins[i + 2]
        if float(s) == float(ys) and int(_zp(z)) == int(_zp(yz)):
            parts.append(np.asarray(q).astype(dtype))  # same grid: a copy
        else:
            parts.append(_requant_fine(_codes(q, "QLinearConcat") - _zp(z), s / ys, yz, dtype, _span(q.dtype)))
    return [np.concatenate(parts, axis=int(attrs.get("axis", 0)))]


def qlinear_where(ins, attrs, opset):
    cond, x, xs, xz, y, ys, yz, zs, zz = ins[:9]
    dtype = _out_dtype(zz, x)
    qx = _requant_fine(_codes(x, "QLinearWhere") - _zp(xz), _f64(xs) / _f64(zs), zz, dtype, _span(x.dtype))
    qy = _requant_fine(_codes(y, "QLinearWhere") - _zp(yz), _f64(ys) / _f64(zs), zz, dtype, _span(y.dtype))
    return [np.where(np.asarray(cond, bool), qx, qy)]


# ------------------------------------------------------------------------------------------------ pooling
def _nchw(x, channels_last: bool):
    return np.moveaxis(x, -1, 1) if channels_last else x


def qlinear_average_pool(ins, attrs, opset):
    x, xs, xz, ys, yz = (list(ins) + [None] * 5)[:5]
    cl = bool(int(attrs.get("channels_last", 0)))
    xc = _nchw(_codes(x, "QLinearAveragePool"), cl) - _zp(xz)
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
    bound = _span(x.dtype) * math.prod(kernel)
    y = _requant_fine(_wrap32(acc), _f64(xs) / (_f64(ys) * count), yz, _out_dtype(yz, x), bound)
    return [np.moveaxis(y, 1, -1) if cl else y]


def qlinear_global_average_pool(ins, attrs, opset):
    x, xs, xz, ys, yz = (list(ins) + [None] * 5)[:5]
    cl = bool(int(attrs.get("channels_last", 0)))
    xc = _codes(x, "QLinearGlobalAveragePool") - _zp(xz)
    axes = tuple(range(1, xc.ndim - 1)) if cl else tuple(range(2, xc.ndim))
    acc = _wrap32(xc.sum(axis=axes, keepdims=True, dtype=np.int64))
    count = math.prod(xc.shape[a] for a in axes)
    return [_requant_fine(acc, _f64(xs) / (_f64(ys) * count), yz, _out_dtype(yz, x), _span(x.dtype) * count)]


# ------------------------------------------------------------------------------------------------ non-linear
def _lookup(x, xs, xz, ys, yz, fn):
    """Apply ``fn`` through a table over every input code, built once from the scales."""
    x = np.asarray(x)
    lo, hi = qrange(x.dtype)
    codes = np.arange(lo, hi + 1, dtype=np.int64)
    real = fn((codes - _zp(xz)) * _f64(xs))
    dtype = _out_dtype(yz, x)
    olo, ohi = qrange(dtype)
    table = np.clip(np.rint(real / _f64(ys)) + _zp(yz), olo, ohi).astype(dtype)
    return table[x.astype(np.int64) - lo]


def qlinear_sigmoid(ins, attrs, opset):
    x, xs, xz, ys, yz = (list(ins) + [None] * 5)[:5]
    _codes(x, "QLinearSigmoid")
    return [_lookup(x, xs, xz, ys, yz, lambda r: 1.0 / (1.0 + np.exp(-r)))]


def qlinear_leaky_relu(ins, attrs, opset):
    x, xs, xz, ys, yz = (list(ins) + [None] * 5)[:5]
    alpha = float(attrs.get("alpha", 0.01))
    d = _codes(x, "QLinearLeakyRelu") - _zp(xz)
    dtype = _out_dtype(yz, x)
    bound = _span(x.dtype)
    pos = _requant_fine(d, _f64(xs) / _f64(ys), yz, dtype, bound)
    neg = _requant_fine(d if alpha >= 0 else -d, abs(alpha) * _f64(xs) / _f64(ys), yz, dtype, bound)
    return [np.where(d >= 0, pos, neg)]


def qlinear_softmax(ins, attrs, opset):
    x, xs, xz, ys, yz = (list(ins) + [None] * 5)[:5]
    q = _codes(x, "QLinearSoftmax")
    op_opset = int(attrs["opset"])
    axis = int(attrs.get("axis", 1 if op_opset < 13 else -1)) % q.ndim
    shape = q.shape
    if op_opset < 13:  # softmax over the flattened trailing block [axis:]
        rows = q.reshape(math.prod(shape[:axis]), -1)
    else:
        rows = np.moveaxis(q, axis, -1)
    length = rows.shape[-1]
    mantissa, shift = (int(v) for v in quantize_multiplier(1.0 / _f64(ys)))
    denom_shift = max(31 - shift, 0)
    exp_bits = max(8, min(24, 61 - denom_shift - max(length - 1, 1).bit_length()))
    d = np.arange(_span(q_dtype := np.asarray(x).dtype) + 1, dtype=np.float64)
    table = np.rint(np.exp(-d * _f64(xs)) * 2.0**exp_bits).astype(np.int64)
    e = table[rows.max(axis=-1, keepdims=True).astype(np.int64) - rows]  # d = max - q in [0, span]
    total = e.sum(axis=-1, keepdims=True)
    num = (e * mantissa) << max(shift - 31, 0)
    den = total << denom_shift
    p = (2 * num + den) // (2 * den)  # round(num / den), ties up (num >= 0)
    dtype = _out_dtype(yz, q_dtype)
    y = np.clip(p + _zp(yz), *qrange(dtype)).astype(dtype)
    return [y.reshape(shape) if op_opset < 13 else np.moveaxis(y, -1, axis)]
