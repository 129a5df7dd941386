"""Lowering of a standalone inference-mode BatchNormalization (one preparation could not fold into a preceding
layer: DenseNet's pre-activation BN after a Concat or a pool) to a depthwise 1x1 ``QLinearConv``.

In inference mode BatchNormalization is a per-channel affine map of its input,

    y_c = a_c x_c + b_c,     a_c = gamma_c / sqrt(var_c + eps),     b_c = beta_c - a_c mean_c,

with the sim's values of ``gamma``, ``beta``, ``mean`` and ``var`` (fake-quantized where the sim quantizes
them: ``gamma`` is a weight). It runs as a ``QLinearConv`` with ``group = C`` and a 1x1 kernel whose weight
for channel ``c`` is the integer code ``k_c sign(a_c)`` on the per-channel scale ``|a_c| / k_c``: the
product of code and scale is ``a_c`` up to float32 rounding, for every ``k_c``, so the multiplier is not
quantized at all. ``k_c = 127`` keeps the int32 bias ``round(b_c / (s_x |a_c| / k_c))`` on the finest
accumulator grid; where that would overflow int32 (a tiny input scale, a large shift) ``k_c`` shrinks until
it fits, and when even ``k_c = 1`` does not the node stays float with that reason. A channel with
``a_c = 0`` (a gamma quantized to zero) gets code 0 and the scale of the largest ``|a|`` (the kernel wants a
positive scale), so its output is its bias alone. The difference from the sim is the bias rounding, at most
``0.5 s_x |a_c| / (k_c s_y)`` output steps (as for Conv, `linear`).

The weight codes are int8 like every kernel weight, so ``weight_codes="uint8"`` stores them shifted
(`quantsim.export.weight_codes`). Inputs of rank 3 to 5 run directly (QLinearConv's 1-D to 3-D
convolutions); rank 2 (``[N, C]``) gets a unit spatial axis by ``Unsqueeze`` on the codes and loses it by
``Squeeze`` after. A following Relu / Clip is absorbed (`epilogue`).
"""
from __future__ import annotations

import numpy as np
import onnx

from quantsim.export.integer.context import LoweringContext, Unsupported
from quantsim.export.integer.epilogue import epilogue, finish
from quantsim.export.integer.linear import int32_bias, record_linear, weight_inputs
from quantsim.graph.index import node_attributes

__all__ = ["RULES", "lower_batchnorm", "affine_codes"]

_INT32_MAX = float(np.iinfo(np.int32).max)
_MARGIN = 1.0001  # room for the float32 rounding of the accumulator scale
_MAX_CODE = 127


def affine_codes(a: np.ndarray, b: np.ndarray, input_scale: float) -> tuple[np.ndarray, np.ndarray] | None:
    """``(int8 codes, float32 scales)`` of the per-channel multipliers ``a`` (module docstring): codes
    ``k_c sign(a_c)`` with ``k_c <= 127`` as large as lets ``round(b_c / (s_x s_w,c))`` fit int32, scales
    ``|a_c| / k_c``; None when a channel's bias does not fit even with ``k_c = 1``."""
    a = np.asarray(a, np.float64).reshape(-1)
    b = np.abs(np.asarray(b, np.float64).reshape(-1))
    magnitude = np.abs(a)
    reference = np.where(magnitude > 0, magnitude, magnitude.max(initial=0.0) or 1.0)
    accumulator = np.float64(np.float32(input_scale)) * reference  # s_x s_w with code 1
    with np.errstate(divide="ignore"):
        largest = np.where(b > 0, np.floor(_INT32_MAX * accumulator / (_MARGIN * b)), _MAX_CODE)
    k = np.minimum(largest, _MAX_CODE)
    if np.any(k < 1):
        return None
    codes = (np.sign(a) * k).astype(np.int8)
    scales = (reference / k).astype(np.float32)
    if not np.all(np.isfinite(scales)) or np.any(scales <= 0):
        return None
    return codes, scales


def _constant(ctx: LoweringContext, node: onnx.NodeProto, slot: int, channels: int) -> np.ndarray:
    name = node.input[slot]
    if not ctx.index.is_constant(name):
        raise Unsupported(f"BatchNormalization input {name!r} is not a constant")
    values = np.asarray(ctx.constant(name), np.float64).reshape(-1)
    if values.size != channels or not np.all(np.isfinite(values)):
        raise Unsupported(f"BatchNormalization input {name!r} is not {channels} finite values")
    return values


def lower_batchnorm(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """Inference-mode BatchNormalization -> depthwise 1x1 QLinearConv (module docstring)."""
    attrs = node_attributes(node)
    if int(attrs.get("training_mode", 0)) or len([o for o in node.output if o]) != 1:
        raise Unsupported("BatchNormalization in training mode (running statistics as outputs)")
    shape = ctx.index.shape.get(node.input[0])
    if shape is None or not 2 <= len(shape) <= 5 or not isinstance(shape[1], int) or shape[1] <= 0:
        raise Unsupported("BatchNormalization runs as a QLinearConv for inputs of rank 2 to 5 with a known "
                          "channel count")
    channels, rank = int(shape[1]), len(shape)
    x = ctx.int_input(node.input[0])
    gamma, beta, mean, var = (_constant(ctx, node, slot, channels) for slot in (1, 2, 3, 4))
    epsilon = float(attrs.get("epsilon", 1e-5))
    if np.any(var + epsilon <= 0):
        raise Unsupported("BatchNormalization has var + epsilon <= 0")
    a = gamma / np.sqrt(var + epsilon)
    b = beta - a * mean
    fitted = affine_codes(a, b, x.grid.scale)
    if fitted is None:
        raise Unsupported(f"BatchNormalization bias of {node.name!r} does not fit int32 on the accumulator grid "
                          "s_in * |a| even with weight code 1 (input scale too small for its shift)")
    codes, scales = fitted
    spatial = max(rank - 2, 1)
    w = {"codes": codes.reshape((channels, 1) + (1,) * spatial), "scale": scales,
         "zero_point": np.zeros(channels, np.int8)}
    ep = epilogue(ctx, node)
    codes_in = x.name
    if rank == 2:
        codes_in = _reshaped(ctx, "Unsqueeze", x.name, f"{node.name}/spatial")
    base = f"{node.name}/multiplier"
    inputs = [codes_in, *ctx.grid_inputs(x.grid, node.input[0]), *weight_inputs(ctx, base, w),
              *ctx.grid_inputs(ep.grid, ep.tensor)]
    bias_name, bias_scale = int32_bias(ctx, b.astype(np.float32), x, w, f"{node.name}/bias")
    out = ctx.fresh(f"{ep.tensor}/codes")
    ctx.emit("QLinearConv", [*inputs, bias_name], [out], name=node.name, group=channels,
             kernel_shape=[1] * spatial)
    if rank == 2:
        out = _reshaped(ctx, "Squeeze", out, f"{ep.tensor}/flat")
    record_linear(ctx, node, "QLinearConv", x, w, ep, bias_scale, None,
                  {"clamp": [ep.low, ep.high], "batchnorm": {"weight_codes": codes.tolist()}})
    finish(ctx, ep, out)


def _reshaped(ctx: LoweringContext, op: str, codes: str, base: str) -> str:
    """``op`` (Unsqueeze / Squeeze) of axis 2 on uint8 codes (axes an input from opset 13, an attribute before)."""
    out = ctx.fresh(base)
    if ctx.opset >= 13:
        ctx.emit(op, [codes, ctx.scalar([2], np.int64, "axes/2")], [out], name=base)
    else:
        ctx.emit(op, [codes], [out], name=base, axes=[2])
    return out


RULES = {"BatchNormalization": lower_batchnorm}
