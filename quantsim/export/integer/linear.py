"""Lowering of Conv, Gemm and MatMul to onnxruntime's integer kernels.

With input codes ``qx`` (grid ``s_x, z_x``), weight codes ``qw`` (int8, ``s_w[c]``, ``z_w[c]``; per output
channel or per tensor) and output grid ``s_y, z_y``, the sim computes ``y = sum((qx - z_x) s_x (qw - z_w)
s_w) + b`` in float and quantizes it. The integer form is

    acc[c] = sum_k (qx_k - z_x)(qw_kc - z_w[c]) + qb[c],   qb[c] = round(b[c] / (s_x s_w[c]))  (int32)
    qy[c]  = clamp(z_y + round(M[c] acc[c]), 0, 255),       M[c] = s_x s_w[c] / s_y

which differs from the sim by the bias rounding (<= 0.5 accumulator units = ``0.5 M[c]`` output steps,
`bias.quantize_bias`): values that close to a rounding midpoint move by one step. onnxruntime
requantizes ``acc`` with a float32 multiplier (round half to even); on the test models that adds no
difference (with zero biases the outputs equal the sim's bit for bit). The fixed-point form of every ``M[c]`` is recorded
in the requant table (`fixed_point.multiplier_record`).

* Conv -> ``QLinearConv`` (uint8 x, int8 or uint8 weights, uint8 y, int32 bias), attributes unchanged.
* ConvTranspose (2-D, group 1, equal strides ``s``; onnxruntime has no QLinearConvTranspose on CPU): with
  kernel ``s x s`` and no padding (U-Net / DB-head upsampling) a 1x1 ``QLinearConv`` to ``s^2 C_out``
  channels then ``DepthToSpace(s, DCR)`` on the codes (sub-pixel form, the ConvTranspose's own MACs);
  otherwise zero insertion on the codes (``Pad`` the channel axis with ``(s^2 - 1) C`` channels of ``z_x``, then
  ``DepthToSpace(s, DCR)`` puts each input pixel at the top-left of an ``s x s`` block of zero codes) and a
  stride-1 ``QLinearConv`` with the kernel flipped and its in/out axes swapped, padded ``k - 1 - p`` at the
  start and ``k - 1 - p + output_padding - (s - 1)`` at the end: the same sums, so the same numerics as Conv.
* Gemm (constant B) -> ``com.microsoft.QGemm``: ``alpha`` folds into the weight scale, ``beta`` into the
  bias; int32 bias ``C`` on the accumulator grid.
* MatMul with a constant 2-D weight -> ``QLinearMatMul`` (per-column weight scales allowed); with an
  absorbed bias Add -> ``QGemm`` (inputs of any other rank, or of unknown rank, are reshaped to 2-D and
  back, to ``Shape(x)[:-1] + [N]`` computed at run time when the leading dims are not known statically:
  data movement on uint8 codes). MatMul of two activations -> ``QLinearMatMul`` with uint8 on both sides.
Relu/Clip after the op and the MatMul bias Add are absorbed (`epilogue`).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from quantsim.core.bias import fits_int32, quantize_bias
from quantsim.core.fixed_point import multiplier_record
from quantsim.core.numerics import quantize
from quantsim.export.integer.context import MS_DOMAIN, LoweringContext, QTensor, Unsupported
from quantsim.export.integer.epilogue import epilogue, finish
from quantsim.graph.deferred import DeferredArray
from quantsim.graph.index import node_attributes

__all__ = ["RULES", "lower_conv", "lower_conv_transpose", "lower_gemm", "lower_matmul", "weight_inputs", "int32_bias",
           "record_linear"]



def _weight(ctx: LoweringContext, name: str, axis: int, extra_scale: float = 1.0) -> dict:
    """Weight codes (a `DeferredArray`, computed when written), scales and zero points laid out for the
    kernels (channel axis ``axis``)."""
    enc = ctx.param_encoding(name)
    shape = ctx.index.shape[name]
    assert shape is not None  # a constant always has its shape
    if enc.axis is not None and enc.axis % len(shape) != axis:
        raise Unsupported(f"weight {name!r} is per-channel along axis {enc.axis}, the kernel needs axis {axis}")
    dtype = np.int8 if enc.signed else np.uint8
    codes = ctx.lazy_constant(name, dtype, lambda: quantize(ctx.index.constant_value(name), enc, dtype))
    scale = (np.float32(enc.scale) * np.float32(extra_scale)).astype(np.float32)
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise Unsupported(f"weight {name!r} has a zero or non-finite float32 scale")
    return {"codes": codes, "scale": scale, "zero_point": enc.zero_point.astype(dtype), "enc": enc}


def _rearranged(codes: DeferredArray, shape: tuple, rearrange: Callable[[np.ndarray], np.ndarray]) -> DeferredArray:
    """``rearrange`` of the weight ``codes`` (of shape ``shape``), computed when they are."""
    return DeferredArray(shape, codes.dtype, lambda: rearrange(codes.array()))


def weight_inputs(ctx: LoweringContext, name: str, w: dict) -> tuple[str, str, str]:
    """Initializers of a kernel's weight codes, scales and zero points (``w`` as `_weight` lays it out): int8
    codes, which ``weight_codes="uint8"`` shifts for every kernel alike (`weight_codes.shift_weight_codes`)."""
    return (ctx.add_initializer(w["codes"], f"{name}/codes"),
            ctx.add_initializer(w["scale"], f"{name}/scale"),
            ctx.add_initializer(w["zero_point"], f"{name}/zero_point"))


def int32_bias(ctx: LoweringContext, values: np.ndarray, x: QTensor, w: dict, name: str) -> tuple[str, np.ndarray]:
    """The int32 bias initializer on the accumulator grid ``s_x * s_w`` and that grid; Unsupported when it
    does not fit int32."""
    if not fits_int32(values, x.grid.scale, w["scale"]):  # the sim and the QDQ export keep it float too
        raise Unsupported(f"bias {name!r} does not fit int32 on the accumulator grid s_in * s_w (calibration "
                          "widens the weight scale unless the weight encoding is frozen or loaded)")
    codes, scale = quantize_bias(values, x.grid.scale, w["scale"])
    return ctx.add_initializer(codes, f"{name}/int32"), scale


def record_linear(ctx, node, op, x: QTensor, w: dict, y, bias_scale=None, weight=None, extra: dict | None = None):
    """The requant-table entry of a weighted kernel (multipliers ``s_x s_w / s_y`` in fixed point)."""
    multiplier = np.float64(np.float32(x.grid.scale)) * w["scale"].astype(np.float64) / np.float64(y.grid.scale)
    entry = {"op": op, "output": y.tensor if hasattr(y, "tensor") else None,
             "input_scale": x.grid.scale, "input_zero_point": x.grid.zero_point,
             "weight_scale": w["scale"].tolist(), "weight_zero_point": w["zero_point"].tolist(),
             "output_scale": y.grid.scale, "output_zero_point": y.grid.zero_point,
             **multiplier_record(multiplier)}
    if bias_scale is not None:
        entry["bias_scale"] = np.asarray(bias_scale, np.float64).tolist()
    if weight is not None:
        entry["weight"] = weight
    entry.update(extra or {})
    ctx.record(node, entry)


def lower_conv(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """Conv -> QLinearConv with int8 weights (per channel or per tensor) and an int32 bias on ``s_in * s_w``."""
    x = ctx.int_input(node.input[0])
    w_name = node.input[1]
    w = _weight(ctx, w_name, axis=0)
    ep = epilogue(ctx, node)
    ys, yzp = ctx.grid_inputs(ep.grid, ep.tensor)
    xs, xzp = ctx.grid_inputs(x.grid, node.input[0])
    inputs = [x.name, xs, xzp, *weight_inputs(ctx, w_name, w), ys, yzp]
    bias_scale = None
    if len(node.input) > 2 and node.input[2]:
        bias_name, bias_scale = int32_bias(ctx, ctx.constant(node.input[2]), x, w, node.input[2])
        inputs.append(bias_name)
    out = ctx.fresh(f"{ep.tensor}/codes")
    ctx.emit("QLinearConv", inputs, [out], name=node.name, attributes_of=node)
    record_linear(ctx, node, "QLinearConv", x, w, ep, bias_scale, w_name, {"clamp": [ep.low, ep.high]})
    finish(ctx, ep, out)


def _transpose_conv_geometry(ctx: LoweringContext, node: onnx.NodeProto, kernel: tuple) -> tuple[int, list[int]]:
    """(stride, QLinearConv pads) of a ConvTranspose the zero-insertion form covers, else Unsupported."""
    attrs = node_attributes(node)
    rank = len(kernel)
    strides = list(attrs.get("strides", [1] * rank))
    pads = list(attrs.get("pads", [0] * 2 * rank))
    extra = list(attrs.get("output_padding", [0] * rank))
    if rank != 2 or int(attrs.get("group", 1)) != 1 or any(d != 1 for d in attrs.get("dilations", [1] * rank)):
        raise Unsupported("only 2-D ConvTranspose with group 1 and no dilation runs as a QLinearConv")
    if "output_shape" in attrs or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise Unsupported("ConvTranspose with output_shape or auto_pad has no integer lowering")
    if len(set(strides)) != 1 or ctx.opset < 11:
        raise Unsupported("ConvTranspose zero insertion needs equal strides and opset >= 11 (DepthToSpace DCR)")
    stride = int(strides[0])
    begin = [k - 1 - p for k, p in zip(kernel, pads[:rank])]
    end = [k - 1 - p + e - (stride - 1) for k, p, e in zip(kernel, pads[rank:], extra)]
    if min(begin + end) < 0:
        raise Unsupported("ConvTranspose pads larger than kernel - 1 need a crop; no integer lowering")
    return stride, begin + end


def lower_conv_transpose(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """ConvTranspose -> QLinearConv on uint8 codes (sub-pixel or zero insertion, see the module docstring)."""
    w_name = node.input[1]
    w_shape = ctx.index.shape.get(w_name)
    if not ctx.index.is_constant(w_name) or w_shape is None or len(w_shape) != 4:
        raise Unsupported(f"ConvTranspose weight {w_name!r} is not a constant 4-D tensor")
    stride, conv_pads = _transpose_conv_geometry(ctx, node, tuple(w_shape[2:]))
    x = ctx.int_input(node.input[0])
    w = _weight(ctx, w_name, axis=1)  # [C_in, C_out, kh, kw]: output channels on axis 1
    bias = ctx.constant(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    subpixel = stride > 1 and list(w_shape[2:]) == [stride, stride] and conv_pads == [stride - 1] * 2 + [0, 0]
    codes = x.name
    if subpixel:  # channel (i s + j) C_out + c of a 1x1 conv is output pixel (i, j) of each s x s block (DCR)
        blocks = stride * stride
        c_in, c_out, kh, kw = (int(d) for d in w_shape)
        w = {**w, "codes": _rearranged(w["codes"], (kh * kw * c_out, c_in, 1, 1),
                                       lambda c: np.ascontiguousarray(c.transpose(2, 3, 1, 0)).reshape(-1, c_in, 1, 1)),
             "scale": np.tile(w["scale"], blocks) if w["scale"].ndim else w["scale"],
             "zero_point": np.tile(w["zero_point"], blocks) if w["zero_point"].ndim else w["zero_point"]}
        bias = None if bias is None else np.tile(np.asarray(bias).reshape(-1), blocks)
        kernel, conv_pads = [1, 1], [0, 0, 0, 0]
    else:
        c_in, c_out, kh, kw = (int(d) for d in w_shape)
        w = {**w, "codes": _rearranged(w["codes"], (c_out, c_in, kh, kw),
                                       lambda c: np.ascontiguousarray(c.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1]))}
        kernel = list(w_shape[2:])
    if stride > 1 and not subpixel:
        padded = ctx.fresh(f"{node.input[0]}/zero_blocks")
        pads = ctx.add_initializer(np.array([0, 0, 0, 0, 0, (stride * stride - 1) * int(w_shape[0]), 0, 0], np.int64),
                                   f"{node.name}/block_pads")
        ctx.emit("Pad", [codes, pads, ctx.scalar(x.grid.zero_point, np.uint8, f"zero_point/uint8/{x.grid.zero_point}")],
                 [padded], name=f"{node.name}/zero_blocks")
        codes = ctx.fresh(f"{node.input[0]}/zero_inserted")
        ctx.emit("DepthToSpace", [padded], [codes], name=f"{node.name}/zero_insert", blocksize=stride, mode="DCR")
    ep = epilogue(ctx, node)
    ys, yzp = ctx.grid_inputs(ep.grid, ep.tensor)
    xs, xzp = ctx.grid_inputs(x.grid, node.input[0])
    inputs = [codes, xs, xzp, *weight_inputs(ctx, w_name, w), ys, yzp]
    bias_scale = None
    if bias is not None:
        bias_name, bias_scale = int32_bias(ctx, bias, x, w, node.input[2])
        inputs.append(bias_name)
    out = ctx.fresh(f"{ep.tensor}/codes")
    ctx.emit("QLinearConv", inputs, [out], name=node.name, kernel_shape=kernel, pads=conv_pads)
    if subpixel:
        blocks_out, out = out, ctx.fresh(f"{ep.tensor}/codes")
        ctx.emit("DepthToSpace", [blocks_out], [out], name=f"{node.name}/subpixel", blocksize=stride, mode="DCR")
    record_linear(ctx, node, "QLinearConv", x, w, ep, bias_scale, w_name,
            {"clamp": [ep.low, ep.high], "transposed": {"stride": stride, "subpixel": subpixel, "pads": conv_pads}})
    finish(ctx, ep, out)


def _qgemm(ctx, node, x: QTensor, a_name: str, w_name: str, w: dict, bias, ep, attrs: dict, out: str) -> None:
    xs, xzp = ctx.grid_inputs(x.grid, a_name)
    ys, yzp = ctx.grid_inputs(ep.grid, ep.tensor)
    bias_input, bias_scale = "", None
    if bias is not None:
        bias_input, bias_scale = int32_bias(ctx, bias, x, w, f"{node.name}/bias")
    ctx.emit("QGemm", [x.name, xs, xzp, *weight_inputs(ctx, w_name, w), bias_input, ys, yzp], [out],
             name=node.name, domain=MS_DOMAIN, **attrs)
    record_linear(ctx, node, "QGemm", x, w, ep, bias_scale, w_name, {"clamp": [ep.low, ep.high]})


def lower_gemm(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """Gemm -> com.microsoft QGemm (alpha folded into the weight scale, beta into the int32 bias)."""
    attrs = node_attributes(node)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    trans_a, trans_b = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
    x = ctx.int_input(node.input[0])
    w_name = node.input[1]
    w = _weight(ctx, w_name, axis=0 if trans_b else 1, extra_scale=alpha)
    bias = None
    if len(node.input) > 2 and node.input[2]:
        if not ctx.index.is_constant(node.input[2]):
            raise Unsupported(f"Gemm bias {node.input[2]!r} is not a constant")
        bias = np.asarray(ctx.constant(node.input[2]), np.float32) * np.float32(beta)
        n = w["codes"].shape[0 if trans_b else 1]
        if bias.size != 1 and (bias.ndim > 2 or bias.shape[-1] != n):
            raise Unsupported(f"Gemm bias of shape {bias.shape} is not broadcastable per column")
        if bias.size == 1:
            bias = np.full(n, bias.reshape(-1)[0], np.float32)
    ep = epilogue(ctx, node)
    out = ctx.fresh(f"{ep.tensor}/codes")
    _qgemm(ctx, node, x, node.input[0], w_name, w, bias, ep, {"transA": trans_a, "transB": trans_b}, out)
    finish(ctx, ep, out)


def _reshape(ctx: LoweringContext, codes: str, shape: list, base: str) -> str:
    out = ctx.fresh(f"{base}/reshaped")
    ctx.emit("Reshape", [codes, ctx.add_initializer(np.asarray(shape, np.int64), f"{base}/shape")], [out],
             name=f"{base}/reshape")
    return out


def lower_matmul(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """MatMul -> QLinearMatMul (constant weight, or two 8-bit activations); with a bias Add -> QGemm."""
    a_name, b_name = node.input[0], node.input[1]
    x = ctx.int_input(a_name)
    if not ctx.index.is_constant(b_name):
        _matmul_activations(ctx, node, x)
        return
    w_shape = ctx.index.shape.get(b_name)
    if w_shape is None or len(w_shape) != 2:
        raise Unsupported(f"MatMul weight {b_name!r} is not 2-D")
    w = _weight(ctx, b_name, axis=1)
    ep = epilogue(ctx, node, allow_bias=True)
    out = ctx.fresh(f"{ep.tensor}/codes")
    if ep.bias is None:
        xs, xzp = ctx.grid_inputs(x.grid, a_name)
        ys, yzp = ctx.grid_inputs(ep.grid, ep.tensor)
        ctx.emit("QLinearMatMul", [x.name, xs, xzp, *weight_inputs(ctx, b_name, w), ys, yzp], [out], name=node.name)
        record_linear(ctx, node, "QLinearMatMul", x, w, ep, None, b_name, {"clamp": [ep.low, ep.high]})
        finish(ctx, ep, out)
        return
    a_shape = ctx.index.shape.get(a_name)
    if a_shape is not None and len(a_shape) == 2:
        _qgemm(ctx, node, x, a_name, b_name, w, ep.bias, ep, {}, out)
        finish(ctx, ep, out)
        return
    k, n = w["codes"].shape
    flat = QTensor(_reshape(ctx, x.name, [-1, k], f"{node.name}/input"), x.grid)
    gemm_out = ctx.fresh(f"{ep.tensor}/codes2d")
    _qgemm(ctx, node, flat, a_name, b_name, w, ep.bias, ep, {}, gemm_out)
    ctx.emit("Reshape", [gemm_out, _output_shape(ctx, node, x.name, a_shape, n)], [out],
             name=f"{node.name}/output_reshape")
    finish(ctx, ep, out)


def _output_shape(ctx: LoweringContext, node: onnx.NodeProto, codes: str, a_shape: tuple | None, n: int) -> str:
    """``x.shape[:-1] + [n]``, the shape of ``x @ W`` for a ``[K, n]`` weight: a constant when the leading dims
    are known (one dynamic dim at most), else computed from ``Shape(x)`` at run time (shape arithmetic on
    int64, e.g. when inference lost ``x``'s rank behind a Reshape to a computed shape)."""
    if a_shape is not None and len(a_shape) >= 2:
        leading = [d if isinstance(d, int) and d > 0 else -1 for d in a_shape[:-1]]
        if leading.count(-1) <= 1:
            return ctx.add_initializer(np.asarray(leading + [n], np.int64), f"{node.name}/output_shape")
    shape, leading_dims, target = (ctx.fresh(f"{node.name}/{part}") for part in ("input_shape", "leading", "output_shape"))
    ctx.emit("Shape", [codes], [shape], name=f"{node.name}/shape")
    ctx.emit("Slice", [shape, ctx.scalar([0], np.int64, "slice/start/0"), ctx.scalar([-1], np.int64, "slice/end/-1")],
             [leading_dims], name=f"{node.name}/leading_dims")
    ctx.emit("Concat", [leading_dims, ctx.scalar([n], np.int64, f"{node.name}/columns")], [target],
             name=f"{node.name}/output_dims", axis=0)
    return target


def _matmul_activations(ctx: LoweringContext, node: onnx.NodeProto, x: QTensor) -> None:
    y = ctx.int_input(node.input[1])
    ep = epilogue(ctx, node)
    xs, xzp = ctx.grid_inputs(x.grid, node.input[0])
    bs, bzp = ctx.grid_inputs(y.grid, node.input[1])
    ys, yzp = ctx.grid_inputs(ep.grid, ep.tensor)
    out = ctx.fresh(f"{ep.tensor}/codes")
    ctx.emit("QLinearMatMul", [x.name, xs, xzp, y.name, bs, bzp, ys, yzp], [out], name=node.name)
    w = {"scale": np.asarray(np.float32(y.grid.scale)), "zero_point": np.asarray(y.grid.zero_point)}
    record_linear(ctx, node, "QLinearMatMul", x, w, ep, None, None, {"clamp": [ep.low, ep.high]})
    finish(ctx, ep, out)


RULES = {"Conv": lower_conv, "ConvTranspose": lower_conv_transpose, "Gemm": lower_gemm, "MatMul": lower_matmul}
