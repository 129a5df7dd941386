"""Quantized-arithmetic kernels of the integer reference executor (`quantsim.export.reference.executor`). PURE numpy.

A kernel takes ``(inputs, attrs, opset)`` (missing optional inputs are ``None``) and returns its outputs.
Inside the quantized region tensor data only meets integer arithmetic:

* **Accumulation** ``acc = sum (q_x - z_x)(q_w - z_w) + q_bias``, exact, wrapped to int32 like int32
  hardware (and MLAS). `int_matmul` uses float64 BLAS as an exact integer engine when
  ``K * max|a| * max|b| < 2**53`` (every product and partial sum is then an integer float64 holds exactly,
  in any order) and int64 matmul otherwise; the two are bit-identical (tested).
* **Requantization** ``q_y = clamp(z_y + MBQM(acc, mantissa, shift))``, gemmlowp fixed point
  (`quantsim.core.fixed_point`), the multiplier computed once from the op's float scales:
  ``s_x s_w[c] / s_y`` (QLinearConv/MatMul), ``alpha s_a s_b[c] / s_y`` (QGemm), ``s_in / (s_out N)`` (N-tap
  average pools), ``s_in / s_out`` (QLinearConcat/Where), ``s_a s_b / s_y`` on ``(q_a - z_a)(q_b - z_b)``
  (QLinearMul). QLinearAdd is TFLite's: inputs shifted left 20 bits, scaled by ``s_i / (2 max(s_a, s_b))``,
  summed, scaled by ``2 max(s_a, s_b) / (2**20 s_y)``. SRDHM + rounding shift round twice; with a
  multiplier near 1 (concat, pools, leaky relu) that is off by one often (``-90 * 0.325 = -29.25 -> -30``),
  so operands with a known small range are pre-shifted left by up to 20 bits with the multiplier divided
  by the same power of two (TFLite's Add trick, `requantize_fine`); wide accumulators (Conv/MatMul/Gemm) use
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

Shared helpers live in `quantsim.export.reference.numerics`; the element-wise, pooling and lookup-table
kernels in `quantsim.export.reference.qlinear_elementwise`.
"""
from __future__ import annotations

import math

import numpy as np

from quantsim.export.reference.numerics import (
    along_axis,
    codes_of,
    extract_windows,
    float64_of,
    int_matmul,
    pool_geometry,
    qrange,
    requantize_real,
    result_dtype,
    wrap_int32,
    zero_point_of,
)
from quantsim.export.reference.qlinear_elementwise import (
    qlinear_add,
    qlinear_average_pool,
    qlinear_concat,
    qlinear_global_average_pool,
    qlinear_leaky_relu,
    qlinear_mul,
    qlinear_sigmoid,
    qlinear_softmax,
    qlinear_where,
)

__all__ = ["QUANT_KERNELS", "BOUNDARY_OPS", "int_matmul", "qrange", "pool_geometry", "extract_windows"]


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
    return wrap_int32(acc.transpose(0, 1, 3, 2).reshape(n, m, *out))


# ------------------------------------------------------------------------------------------------ boundary
def _param_like(p, x, axis: int, block: int) -> np.ndarray:
    p = np.asarray(p)
    if block:
        axis %= x.ndim
        return np.take(np.repeat(p, block, axis=axis), np.arange(x.shape[axis]), axis=axis)
    return along_axis(p, x.ndim, axis % x.ndim if x.ndim else 0)


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
    z = _param_like(zero_point_of(zp), x, axis, block).astype(np.float32)
    q = np.rint(np.asarray(x, np.float32) / s) + z
    lo, hi = qrange(dtype)
    return [np.clip(q, lo, hi).astype(dtype)]


def dequantize_linear(ins, attrs, opset):
    x, scale, zp = ins[0], ins[1], ins[2] if len(ins) > 2 else None
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    scale = np.asarray(scale)
    d = (np.asarray(x).astype(np.int64) - _param_like(zero_point_of(zp), x, axis, block)).astype(np.float32)
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
    x = codes_of(x, "QLinearConv")
    if channels_last:
        x = np.moveaxis(x, -1, 1)
    w = codes_of(w, "QLinearConv weight")
    acc = _conv_acc(x - zero_point_of(xz), w - along_axis(zero_point_of(wz), w.ndim, 0), attrs)
    if bias is not None:
        acc = wrap_int32(acc.astype(np.int64) + along_axis(np.asarray(bias, np.int64), acc.ndim, 1))
    real = along_axis(float64_of(xs) * float64_of(ws) / float64_of(ys), acc.ndim, 1)
    y = requantize_real(acc, real, yz, result_dtype(yz, ins[0]))
    return [np.moveaxis(y, 1, -1) if channels_last else y]


def conv_integer(ins, attrs, opset):
    x, w = codes_of(ins[0], "ConvInteger"), codes_of(ins[1], "ConvInteger weight")
    xz = ins[2] if len(ins) > 2 else None
    wz = ins[3] if len(ins) > 3 else None
    return [_conv_acc(x - zero_point_of(xz), w - along_axis(zero_point_of(wz), w.ndim, 0), attrs)]


def _matmul_acc(a, az, b, bz, name):
    a, b = codes_of(a, name), codes_of(b, name)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    acc = wrap_int32(int_matmul(a2 - along_axis(zero_point_of(az), 2, 0), b2 - along_axis(zero_point_of(bz), 2, 1)))
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
    real = along_axis(float64_of(as_), 2, 0) * along_axis(float64_of(bs), 2, 1) / float64_of(ys)
    return [_unpromote(requantize_real(acc, real, yz, result_dtype(yz, a)), a_vec, b_vec)]


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
    scale = along_axis(np.asarray(as_, np.float32), 2, 0) * along_axis(np.asarray(bs, np.float32), 2, 1)
    y = acc.astype(np.float32) * scale
    if bias is not None:
        y = y + np.asarray(bias, np.float32)
    return [_unpromote(y.astype(np.float32), a_vec, b_vec)]


def qgemm(ins, attrs, opset):
    a, as_, az, b, bs, bz = ins[:6]
    c, ys, yz = (list(ins[6:]) + [None] * 3)[:3]
    alpha = float(attrs.get("alpha", 1.0))
    a, b = codes_of(a, "QGemm"), codes_of(b, "QGemm")
    a = a.T if int(attrs.get("transA", 0)) else a
    b = b.T if int(attrs.get("transB", 0)) else b
    acc = int_matmul(a - zero_point_of(az), b - along_axis(zero_point_of(bz), 2, 1))
    if c is not None:
        acc = acc + np.asarray(c, np.int64)
    acc = wrap_int32(acc)
    if ys is None:  # float output: the boundary, computed as onnxruntime does (float32 alpha * s_a * s_b)
        scale = np.float32(alpha) * np.float32(as_) * np.asarray(bs, np.float32)
        return [(acc.astype(np.float32) * along_axis(scale, 2, 1)).astype(np.float32)]
    real = along_axis(alpha * float64_of(as_) * float64_of(bs) / float64_of(ys), 2, 1)
    return [requantize_real(acc, real, yz, result_dtype(yz, ins[0]))]



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
