"""Lowering of elementwise and pooling ops to onnxruntime's com.microsoft QLinear* kernels.

All tensors are uint8 per-tensor grids; with ``r = s (q - z)`` on each side:

* Add:  ``q_c = z_c + round(M_a (q_a - z_a) + M_b (q_b - z_b))``, ``M_a = s_a / s_c``, ``M_b = s_b / s_c``
  -> ``QLinearAdd`` (MLAS: 22-bit fixed-point multipliers when the ratios lie in [2^-14, 2^8)).
* Mul:  ``q_c = z_c + round(M (q_a - z_a)(q_b - z_b))``, ``M = s_a s_b / s_c`` -> ``QLinearMul``.
  A one-element constant operand makes Add/Mul a unary function: exact lookup table (`lowering_lut`).
  A larger constant operand (e.g. a [1, C, 1, 1] scale) is quantized with its own sim quantizer.
* Concat: inputs already on the output grid (the sim ties Concat inputs to the output quantizer) are
  copied by a plain uint8 ``Concat``; otherwise ``QLinearConcat`` requantizes each input with
  ``M_i = s_i / s_out`` (onnxruntime: a 256-entry table per input).
* AveragePool / GlobalAveragePool: ``q_y = z_y + round(M sum_k (q_k - z_x))``, ``M = s_x / (s_y N)``
  over the ``N`` taps -> ``QLinearAveragePool`` / ``QLinearGlobalAveragePool``.
* Sigmoid, LeakyRelu -> ``QLinearSigmoid`` / ``QLinearLeakyRelu`` (onnxruntime builds a 256-entry
  table in float); Softmax -> ``QLinearSoftmax`` (exp table, row sum, division; ``opset`` attribute
  = the model's Softmax semantics).
Each multiplier's fixed-point form goes to the requant table. Following Relu/Clip are absorbed
(`epilogue`).
"""
from __future__ import annotations

import numpy as np
import onnx

from quantsim.core.fixed_point import multiplier_record
from quantsim.export.integer.context import MS_DOMAIN, LoweringContext, Unsupported
from quantsim.export.integer.epilogue import clamp_codes, epilogue, finish
from quantsim.export.integer.lut import lower_scalar_binary, scalar_operand_slot
from quantsim.graph.index import node_attributes

__all__ = ["RULES"]

_POOL_ATTRS = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")


def _f32(value) -> np.float64:
    return np.float64(np.float32(value))


def _grid_entry(op: str, output: str, inputs, out_grid) -> dict:
    return {"op": op, "output": output,
            "input_scale": [g.scale for g in inputs], "input_zero_point": [g.zero_point for g in inputs],
            "output_scale": out_grid.scale, "output_zero_point": out_grid.zero_point}


def lower_add_mul(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """Add/Mul of two 8-bit tensors -> com.microsoft QLinearAdd/QLinearMul (requantized to the output grid)."""
    if scalar_operand_slot(ctx, node) is not None:
        lower_scalar_binary(ctx, node)
        return
    a, b = ctx.int_input(node.input[0]), ctx.int_input(node.input[1])
    ep = epilogue(ctx, node)
    op = "QLinearAdd" if node.op_type == "Add" else "QLinearMul"
    out = ctx.fresh(f"{ep.tensor}/codes")
    ctx.emit(op, [a.name, *ctx.grid_inputs(a.grid, node.input[0]), b.name, *ctx.grid_inputs(b.grid, node.input[1]),
                  *ctx.grid_inputs(ep.grid, ep.tensor)], [out], name=node.name, domain=MS_DOMAIN)
    entry = _grid_entry(op, ep.tensor, [a.grid, b.grid], ep.grid)
    if op == "QLinearAdd":
        entry["input_multipliers"] = [multiplier_record(_f32(g.scale) / _f32(ep.grid.scale)) for g in (a.grid, b.grid)]
    else:
        entry.update(multiplier_record(_f32(a.grid.scale) * _f32(b.grid.scale) / _f32(ep.grid.scale)))
    entry["clamp"] = [ep.low, ep.high]
    ctx.record(node, entry)
    finish(ctx, ep, out)


def lower_concat(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """Concat -> plain uint8 Concat when every input is on the output grid, else QLinearConcat."""
    parts = [ctx.int_input(name) for name in node.input]
    shared = parts[0].grid if all(p.grid == parts[0].grid for p in parts) else None
    tensor = node.output[0]
    grid = ctx.output_grid(tensor, shared)
    out = ctx.fresh(f"{tensor}/codes")
    axis = node_attributes(node)["axis"]
    if all(p.grid == grid for p in parts):
        ctx.emit("Concat", [p.name for p in parts], [out], name=node.name, axis=axis)
    else:
        inputs = [*ctx.grid_inputs(grid, tensor)]
        for name, part in zip(node.input, parts):
            inputs += [part.name, *ctx.grid_inputs(part.grid, name)]
        ctx.emit("QLinearConcat", inputs, [out], name=node.name, domain=MS_DOMAIN, axis=axis)
        out = clamp_codes(ctx, out, grid.low, grid.high, tensor)
        entry = _grid_entry("QLinearConcat", tensor, [p.grid for p in parts], grid)
        entry["input_multipliers"] = [multiplier_record(_f32(p.grid.scale) / _f32(grid.scale)) for p in parts]
        ctx.record(node, entry)
    ctx.set_int(tensor, out, grid)


def lower_average_pool(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """AveragePool -> com.microsoft QLinearAveragePool (same attributes, input and output grids)."""
    attrs = node_attributes(node)
    if any(d != 1 for d in attrs.get("dilations", [])):
        raise Unsupported("QLinearAveragePool has no dilations")
    x = ctx.int_input(node.input[0])
    ep = epilogue(ctx, node)
    out = ctx.fresh(f"{ep.tensor}/codes")
    ctx.emit("QLinearAveragePool", [x.name, *ctx.grid_inputs(x.grid, node.input[0]),
                                    *ctx.grid_inputs(ep.grid, ep.tensor)], [out],
             name=node.name, domain=MS_DOMAIN,
             **{k: v for k, v in attrs.items() if k in _POOL_ATTRS})
    taps = int(np.prod(attrs["kernel_shape"]))
    entry = _grid_entry("QLinearAveragePool", ep.tensor, [x.grid], ep.grid)
    entry.update(taps=taps, **multiplier_record(_f32(x.grid.scale) / (_f32(ep.grid.scale) * taps)))
    entry["clamp"] = [ep.low, ep.high]
    ctx.record(node, entry)
    finish(ctx, ep, out)


def lower_global_average_pool(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """GlobalAveragePool -> com.microsoft QLinearGlobalAveragePool."""
    x = ctx.int_input(node.input[0])
    ep = epilogue(ctx, node)
    out = ctx.fresh(f"{ep.tensor}/codes")
    ctx.emit("QLinearGlobalAveragePool", [x.name, *ctx.grid_inputs(x.grid, node.input[0]),
                                          *ctx.grid_inputs(ep.grid, ep.tensor)], [out],
             name=node.name, domain=MS_DOMAIN, channels_last=0)
    entry = _grid_entry("QLinearGlobalAveragePool", ep.tensor, [x.grid], ep.grid)
    shape = ctx.index.shape.get(node.input[0]) or ()
    spatial = shape[2:]
    if spatial and all(isinstance(d, int) and d > 0 for d in spatial):
        taps = int(np.prod(spatial))
        entry.update(taps=taps, **multiplier_record(_f32(x.grid.scale) / (_f32(ep.grid.scale) * taps)))
    entry["clamp"] = [ep.low, ep.high]
    ctx.record(node, entry)
    finish(ctx, ep, out)


def _unary_kernel(op: str, **fixed):
    def lower(ctx: LoweringContext, node: onnx.NodeProto) -> None:
        x = ctx.int_input(node.input[0])
        ep = epilogue(ctx, node)
        attrs = dict(fixed)
        if op == "QLinearLeakyRelu":
            attrs["alpha"] = float(node_attributes(node).get("alpha", 0.01))
        if op == "QLinearSoftmax":
            attrs = {"axis": int(node_attributes(node).get("axis", -1 if ctx.opset >= 13 else 1)), "opset": ctx.opset}
        out = ctx.fresh(f"{ep.tensor}/codes")
        ctx.emit(op, [x.name, *ctx.grid_inputs(x.grid, node.input[0]), *ctx.grid_inputs(ep.grid, ep.tensor)],
                 [out], name=node.name, domain=MS_DOMAIN, **attrs)
        entry = _grid_entry(op, ep.tensor, [x.grid], ep.grid)
        entry["clamp"] = [ep.low, ep.high]
        ctx.record(node, entry)
        finish(ctx, ep, out)

    lower.__name__ = f"lower_{op}"
    return lower


RULES = {
    "Add": lower_add_mul,
    "Mul": lower_add_mul,
    "Concat": lower_concat,
    "AveragePool": lower_average_pool,
    "GlobalAveragePool": lower_global_average_pool,
    "Sigmoid": _unary_kernel("QLinearSigmoid"),
    "LeakyRelu": _unary_kernel("QLinearLeakyRelu"),
    "Softmax": _unary_kernel("QLinearSoftmax"),
}
