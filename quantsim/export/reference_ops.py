"""Quantized-arithmetic kernels of the integer reference executor (`quantsim.export.reference`). PURE numpy.

A kernel takes ``(inputs, attrs, opset)`` (missing optional inputs are ``None``) and returns its outputs.
Inside the quantized region tensor data only meets integer arithmetic:

* **Accumulation** ``acc = sum (q_x - z_x)(q_w - z_w) + q_bias``, exact, wrapped to int32 like int32
  hardware (and MLAS). `int_matmul` uses float64 BLAS as an exact integer engine when
  ``K * max|a| * max|b| < 2**53`` (every product and partial sum is then an integer float64 holds exactly,
  in any order) and int64 matmul otherwise; the two are bit-identical (tested).
* **Requantization** ``q_y = clamp(z_y + MBQM(acc, mantissa, shift))``, gemmlowp fixed point
  (`quantsim.export.fixed_point`), the multiplier computed once from the op's float scales:
  ``s_x s_w[c] / s_y`` (QLinearConv/MatMul), ``alpha s_a s_b[c] / s_y`` (QGemm), ``s_in / (s_out N)`` (N-tap
  average pools), ``s_in / s_out`` (QLinearConcat/Where), ``s_a s_b / s_y`` on ``(q_a - z_a)(q_b - z_b)``
  (QLinearMul). QLinearAdd is TFLite's: inputs shifted left 20 bits, scaled by ``s_i / (2 max(s_a, s_b))``,
  summed, scaled by ``2 max(s_a, s_b) / (2**20 s_y)``. SRDHM + rounding shift round twice; with a
  multiplier near 1 (concat, pools, leaky relu) that is off by one often (``-90 * 0.325 = -29.25 -> -30``),
  so operands with a known small range are pre-shifted left by up to 20 bits with the multiplier divided
  by the same power of two (TFLite's Add trick, `_requant_fine`); wide accumulators (Conv/MatMul/Gemm) use
  the plain TFLite pipeline.
* **Non-linear ops**: QLinearSigmoid is a table over the 256 input codes built once from the scales (what
  integer hardware and onnxruntime do). QLinearSoftmax: table ``E[d] = round(2**b exp(-d s_x))`` over the
  integer ``d = max_row - q``, then ``q_y = z_y + round(E[d] (1/s_y) / sum E)`` in integers (``1/s_y`` a
  fixed-point multiplier, an exact rounded integer division). QLinearLeakyRelu is integer (TFLite's): one
  multiplier ``s_x/s_y`` for ``q >= z_x``, one ``|alpha| s_x/s_y`` below.

Float only at the boundary: Quantize/DequantizeLinear, DynamicQuantizeLinear, MatMulIntegerToFloat and
QGemm without ``y_scale``, computed in float32 like onnxruntime.

onnxruntime requantizes with an fp32 multiplier and round-half-even and builds its tables in float: outputs
agree within one LSB (exact ties differ by design: gemmlowp rounds them away from zero). Choices: with
``count_include_pad`` QLinearAveragePool divides by the full kernel even for ``ceil_mode`` windows that
overhang the padding (onnxruntime's rule); QLinearSoftmax uses the exact ``1/s_y`` (onnxruntime uses
``floor(1/s_y)``: the same for the usual ``s_y = 1/256``).
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .fixed_point import multiply_by_quantized_multiplier, quantize_multiplier, requantize

__all__ = ["QUANT_KERNELS", "BOUNDARY_OPS", "int_matmul", "qrange", "pool_geometry", "extract_windows"]

_EXACT_F64 = 2.0**53


def qrange(dtype) -> tuple[int, int]:
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def _f64(t) -> np.ndarray:
    return np.asarray(t, dtype=np.float64)


def _zp(t) -> np.ndarray:
    return np.zeros((), np.int32) if t is None else np.asarray(t).astype(np.int32)


def _codes(q, name: str) -> np.ndarray:
    q = np.asarray(q)
    if not np.issubdtype(q.dtype, np.integer):
        raise TypeError(f"{name}: quantized input must be an integer tensor, got {q.dtype}")
    return q.astype(np.int32)


def _along(p, ndim: int, axis: int) -> np.ndarray:
    """A per-tensor (size 1) or 1-D per-axis parameter shaped to broadcast against rank ``ndim``."""
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    if p.ndim != 1:
        return p
    shape = [1] * ndim
    shape[axis] = -1
    return p.reshape(shape)


def _wrap32(acc) -> np.ndarray:
    """int64 -> int32 with two's complement wrap-around (int32 accumulator hardware)."""
    return np.asarray(acc, dtype=np.int64).astype(np.int32)


def _requant(acc, real_multiplier, zero_point, out_dtype) -> np.ndarray:
    mantissa, shift = quantize_multiplier(real_multiplier)
    lo, hi = qrange(out_dtype)
    return requantize(acc, mantissa, shift, _zp(zero_point), lo, hi).astype(out_dtype)


def _requant_fine(d, real_multiplier, zero_point, out_dtype, bound: int) -> np.ndarray:
    """`_requant` of a small integer ``|d| <= bound`` pre-shifted left by ``L`` bits (TFLite's QLinearAdd
    trick, ``L <= 20``, ``|d << L| < 2**30``) with the multiplier divided by ``2**L`` (exact): SRDHM then
    rounds ``2**-L`` finer, so the double rounding is off only within ``2**-(n+L+1)`` of a tie."""
    real = _f64(real_multiplier)
    positive = real[real > 0]
    headroom = 31 + (int(np.floor(np.log2(positive.min()))) if positive.size else 0)  # keep real/2^L >= 2^-31
    left = max(0, min(20, 30 - int(bound).bit_length(), headroom))
    return _requant(np.asarray(d, np.int64) << left, real / 2.0**left, zero_point, out_dtype)


def _span(dtype) -> int:
    lo, hi = qrange(dtype)
    return hi - lo


def _out_dtype(zero_point, like) -> np.dtype:
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


def _conv_acc(xc, wc, attrs) -> np.ndarray:
    """int32 accumulator of a grouped N-d convolution of zero-point-free codes (im2col + int_matmul)."""
    nd = xc.ndim - 2
    kernel = list(wc.shape[2:])
    group = int(attrs.get("group", 1))
    begin, end, out, strides, dil = pool_geometry(xc.shape[2:], kernel, attrs)
    win = extract_windows(xc, begin, end, out, kernel, strides, dil, 0)
    n, c = xc.shape[:2]
    m, cg = wc.shape[0], c // group
    positions, taps = math.prod(out), math.prod(kernel)
    win = win.reshape(n, group, cg, *out, *kernel)
    perm = [0, 1, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd)]
    cols = win.transpose(perm).reshape(n, group, positions, cg * taps)
    wm = wc.reshape(group, m // group, cg * taps).transpose(0, 2, 1)
    acc = int_matmul(cols, wm)  # [n, group, positions, m/group]
    return _wrap32(acc.transpose(0, 1, 3, 2).reshape(n, m, *out))


# ------------------------------------------------------------------------------------------------ boundary
def _param_like(p, x, axis: int, block: int) -> np.ndarray:
    p = np.asarray(p)
    if block:
        axis %= x.ndim
        return np.take(np.repeat(p, block, axis=axis), np.arange(x.shape[axis]), axis=axis)
    return _along(p, x.ndim, axis % x.ndim if x.ndim else 0)


def quantize_linear(ins, attrs, opset):
    x, scale, zp = ins[0], ins[1], ins[2] if len(ins) > 2 else None
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    if zp is not None:
        dtype = np.asarray(zp).dtype
    elif attrs.get("output_dtype"):
        from onnx.helper import tensor_dtype_to_np_dtype
        dtype = np.dtype(tensor_dtype_to_np_dtype(attrs["output_dtype"]))
    else:
        dtype = np.dtype(np.uint8)
    s = _param_like(scale, x, axis, block).astype(np.float32)
    z = _param_like(_zp(zp), x, axis, block).astype(np.float32)
    q = np.rint(np.asarray(x, np.float32) / s) + z
    lo, hi = qrange(dtype)
    return [np.clip(q, lo, hi).astype(dtype)]


def dequantize_linear(ins, attrs, opset):
    x, scale, zp = ins[0], ins[1], ins[2] if len(ins) > 2 else None
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    scale = np.asarray(scale)
    d = (np.asarray(x).astype(np.int64) - _param_like(_zp(zp), x, axis, block)).astype(np.float32)
    return [(d * _param_like(scale, x, axis, block).astype(np.float32)).astype(scale.dtype)]


def dynamic_quantize_linear(ins, attrs, opset):
    x = np.asarray(ins[0], np.float32)
    lo, hi = np.float32(min(x.min(initial=0.0), 0.0)), np.float32(max(x.max(initial=0.0), 0.0))
    scale = np.float32(1.0) if lo == hi else np.float32((hi - lo) / np.float32(255.0))
    zp = np.uint8(np.rint(np.clip(np.float32(0.0) - lo / scale, 0, 255)))
    q = np.clip(np.rint(x / scale) + np.float32(zp), 0, 255).astype(np.uint8)
    return [q, np.asarray(scale, np.float32), np.asarray(zp, np.uint8)]


# ------------------------------------------------------------------------------------------------ conv / gemm
def qlinear_conv(ins, attrs, opset):
    x, xs, xz, w, ws, wz, ys, yz = ins[:8]
    bias = ins[8] if len(ins) > 8 else None
    channels_last = int(attrs.get("channels_last", 0))
    x = _codes(x, "QLinearConv")
    if channels_last:
        x = np.moveaxis(x, -1, 1)
    w = _codes(w, "QLinearConv weight")
    acc = _conv_acc(x - _zp(xz), w - _along(_zp(wz), w.ndim, 0), attrs)
    if bias is not None:
        acc = _wrap32(acc.astype(np.int64) + _along(np.asarray(bias, np.int64), acc.ndim, 1))
    real = _along(_f64(xs) * _f64(ws) / _f64(ys), acc.ndim, 1)
    y = _requant(acc, real, yz, _out_dtype(yz, ins[0]))
    return [np.moveaxis(y, 1, -1) if channels_last else y]


def conv_integer(ins, attrs, opset):
    x, w = _codes(ins[0], "ConvInteger"), _codes(ins[1], "ConvInteger weight")
    xz = ins[2] if len(ins) > 2 else None
    wz = ins[3] if len(ins) > 3 else None
    return [_conv_acc(x - _zp(xz), w - _along(_zp(wz), w.ndim, 0), attrs)]


def _matmul_acc(a, az, b, bz, name):
    a, b = _codes(a, name), _codes(b, name)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    acc = _wrap32(int_matmul(a2 - _along(_zp(az), 2, 0), b2 - _along(_zp(bz), 2, 1)))
    return acc, a.ndim == 1, b.ndim == 1


def _unpromote(y, a_vec, b_vec):
    if b_vec:
        y = y[..., 0]
    if a_vec:
        y = y[..., 0, :] if not b_vec else y[..., 0]
    return y


def qlinear_matmul(ins, attrs, opset):
    a, as_, az, b, bs, bz, ys, yz = ins[:8]
    acc, a_vec, b_vec = _matmul_acc(a, az, b, bz, "QLinearMatMul")
    real = _along(_f64(as_), 2, 0) * _along(_f64(bs), 2, 1) / _f64(ys)
    return [_unpromote(_requant(acc, real, yz, _out_dtype(yz, a)), a_vec, b_vec)]


def matmul_integer(ins, attrs, opset):
    az = ins[2] if len(ins) > 2 else None
    bz = ins[3] if len(ins) > 3 else None
    acc, a_vec, b_vec = _matmul_acc(ins[0], az, ins[1], bz, "MatMulInteger")
    return [_unpromote(acc, a_vec, b_vec)]


def matmul_integer_to_float(ins, attrs, opset):
    """com.microsoft MatMulIntegerToFloat: float boundary ``acc * (s_a * s_b) + bias`` in float32."""
    a, b, as_, bs = ins[:4]
    az, bz, bias = (list(ins[4:]) + [None] * 3)[:3]
    acc, a_vec, b_vec = _matmul_acc(a, az, b, bz, "MatMulIntegerToFloat")
    scale = _along(np.asarray(as_, np.float32), 2, 0) * _along(np.asarray(bs, np.float32), 2, 1)
    y = acc.astype(np.float32) * scale
    if bias is not None:
        y = y + np.asarray(bias, np.float32)
    return [_unpromote(y.astype(np.float32), a_vec, b_vec)]


def qgemm(ins, attrs, opset):
    a, as_, az, b, bs, bz = ins[:6]
    c, ys, yz = (list(ins[6:]) + [None] * 3)[:3]
    alpha = float(attrs.get("alpha", 1.0))
    a, b = _codes(a, "QGemm"), _codes(b, "QGemm")
    a = a.T if int(attrs.get("transA", 0)) else a
    b = b.T if int(attrs.get("transB", 0)) else b
    acc = int_matmul(a - _zp(az), b - _along(_zp(bz), 2, 1))
    if c is not None:
        acc = acc + np.asarray(c, np.int64)
    acc = _wrap32(acc)
    if ys is None:  # float output: the boundary, computed as onnxruntime does (float32 alpha * s_a * s_b)
        scale = np.float32(alpha) * np.float32(as_) * np.asarray(bs, np.float32)
        return [(acc.astype(np.float32) * _along(scale, 2, 1)).astype(np.float32)]
    real = _along(alpha * _f64(as_) * _f64(bs) / _f64(ys), 2, 1)
    return [_requant(acc, real, yz, _out_dtype(yz, ins[0]))]


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


#: op types (any domain) computed in float at the graph boundary
BOUNDARY_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulIntegerToFloat"})

_MS = "com.microsoft"
QUANT_KERNELS = {
    ("", "QuantizeLinear"): quantize_linear,
    ("", "DequantizeLinear"): dequantize_linear,
    ("", "DynamicQuantizeLinear"): dynamic_quantize_linear,
    ("", "QLinearConv"): qlinear_conv,
    ("", "ConvInteger"): conv_integer,
    ("", "QLinearMatMul"): qlinear_matmul,
    ("", "MatMulInteger"): matmul_integer,
    (_MS, "QuantizeLinear"): quantize_linear,
    (_MS, "DequantizeLinear"): dequantize_linear,
    (_MS, "QLinearConv"): qlinear_conv,
    (_MS, "MatMulIntegerToFloat"): matmul_integer_to_float,
    (_MS, "QGemm"): qgemm,
    (_MS, "QLinearAdd"): qlinear_add,
    (_MS, "QLinearMul"): qlinear_mul,
    (_MS, "QLinearConcat"): qlinear_concat,
    (_MS, "QLinearWhere"): qlinear_where,
    (_MS, "QLinearAveragePool"): qlinear_average_pool,
    (_MS, "QLinearGlobalAveragePool"): qlinear_global_average_pool,
    (_MS, "QLinearSigmoid"): qlinear_sigmoid,
    (_MS, "QLinearLeakyRelu"): qlinear_leaky_relu,
    (_MS, "QLinearSoftmax"): qlinear_softmax,
}
