"""Lowering of elementwise and pooling ops to onnxruntime's com.microsoft QLinear* kernels.

All tensors are uint8 per-tensor grids; with ``r = s (q - z)`` on each side:

* Add:  ``q_c = z_c + round(M_a (q_a - z_a) + M_b (q_b - z_b))``, ``M_a = s_a / s_c``, ``M_b = s_b / s_c``
  -> ``QLinearAdd`` (MLAS: 22-bit fixed-point multipliers when the ratios lie in [2^-14, 2^8)).
* Mul:  ``q_c = z_c + round(M (q_a - z_a)(q_b - z_b))``, ``M = s_a s_b / s_c`` -> ``QLinearMul``.
  A one-element constant operand makes Add/Mul a unary function: exact lookup table (`lowering_lut`).
  A larger constant operand (e.g. a [1, C, 1, 1] scale) is quantized with its own sim quantizer.
* Sub / Div by a constant tensor (per-channel input normalisation ``(x - mean) / std``): ``QLinearAdd``
  with the negated constant codes (exact: ``s((255 - q) - (255 - z)) = -s(q - z)``) / ``QLinearMul`` by
  the reciprocal on its own uint8 grid. Sub of two quantized activations (a detection head's box decode,
  ``x2y2 - x1y1``): the subtrahend's codes negated at run time by a uint8 ``Sub(255, q)`` (never wraps),
  then ``QLinearAdd``; a constant minuend (a detector's ``anchors - distances``) the same way. Div of two
  activations has no integer kernel and stays float.
* A float constant the sim leaves unquantized (shape arithmetic folded into constants by ``input_shapes``:
  anchor centres, strides) is read on its `exact_grid`, a power-of-two grid holding every value exactly.
* Concat: inputs already on the output grid (the sim ties Concat inputs to the output quantizer) are
  copied by a plain uint8 ``Concat``; otherwise ``QLinearConcat`` requantizes each input with
  ``M_i = s_i / s_out`` (onnxruntime: a 256-entry table per input).
* AveragePool / GlobalAveragePool: ``q_y = z_y + round(M sum_k (q_k - z_x))``, ``M = s_x / (s_y N)``
  over the ``N`` taps -> ``QLinearAveragePool`` / ``QLinearGlobalAveragePool``; a ReduceMean or ReduceSum
  over trailing axes (torch's dynamo export of ``adaptive_avg_pool2d(1)``), or channels last over the
  spatial axes, is the latter (a sum on a grid ``N`` times finer).
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
from quantsim.export.integer.context import MS_DOMAIN, Grid, LoweringContext, QTensor, Unsupported
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
    _binary_kernel(ctx, node, "QLinearAdd" if node.op_type == "Add" else "QLinearMul", a, b, node.input[1])


def lower_sum(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """Preparation turns one- and two-input Sums into Identity / Add (`quantsim.prepare.canonical`), lowered as
    those; a Sum of three or more inputs stays float."""
    raise Unsupported(f"Sum of {len(node.input)} inputs has no integer kernel (preparation turns one- and "
                      "two-input Sums into Identity / Add, which are lowered)")


def _binary_kernel(ctx: LoweringContext, node: onnx.NodeProto, op: str, a: QTensor, b: QTensor, b_base: str) -> None:
    ep = epilogue(ctx, node)
    out = ctx.fresh(f"{ep.tensor}/codes")
    ctx.emit(op, [a.name, *ctx.grid_inputs(a.grid, node.input[0]), b.name, *ctx.grid_inputs(b.grid, b_base),
                  *ctx.grid_inputs(ep.grid, ep.tensor)], [out], name=node.name, domain=MS_DOMAIN)
    entry = _grid_entry(op, ep.tensor, [a.grid, b.grid], ep.grid)
    if op == "QLinearAdd":
        entry["input_multipliers"] = [multiplier_record(_f32(g.scale) / _f32(ep.grid.scale)) for g in (a.grid, b.grid)]
    else:
        entry.update(multiplier_record(_f32(a.grid.scale) * _f32(b.grid.scale) / _f32(ep.grid.scale)))
    entry["clamp"] = [ep.low, ep.high]
    ctx.record(node, entry)
    finish(ctx, ep, out)


def lower_sub_div(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """``x - c`` / ``x / c`` with a constant tensor ``c`` (e.g. per-channel input normalisation):
    ``QLinearAdd(x, -c)`` with the exactly negated codes of ``c``'s grid, or ``QLinearMul(x, 1/c)`` with
    ``1/c`` on its own uint8 grid (a rounding of ``1/c`` of at most ``max|1/c| / 510``, below half an
    output step). A one-element constant is a function of ``x`` (`lower_scalar_binary`)."""
    if scalar_operand_slot(ctx, node) is not None:
        lower_scalar_binary(ctx, node)
        return
    c_name = node.input[1]
    if node.op_type == "Sub" and not ctx.index.is_constant(c_name):
        _lower_activation_difference(ctx, node)  # a - b, or c - b with a constant minuend (anchors - distances)
        return
    if not ctx.index.is_constant(c_name) or ctx.index.is_constant(node.input[0]):
        raise Unsupported(f"{node.op_type} of two activations has no integer kernel")
    x = ctx.int_input(node.input[0])
    if node.op_type == "Sub":
        g = ctx.constant_grid(c_name)
        codes = 255 - g.quantize(ctx.index.constant_value(c_name))
        name = ctx.add_initializer(codes.astype(np.uint8), f"{c_name}/negated_codes")
        _binary_kernel(ctx, node, "QLinearAdd", x, QTensor(name, g.negated), f"{c_name}/negated")
        return
    values = np.asarray(ctx.constant(c_name), np.float64)
    if np.any(values == 0) or not np.all(np.isfinite(values)):
        raise Unsupported(f"divisor {c_name!r} has zero or non-finite elements")
    reciprocal = 1.0 / values
    low, high = min(0.0, float(reciprocal.min())), max(0.0, float(reciprocal.max()))
    scale = float(np.float32((high - low) / 255.0))
    grid = Grid(scale, int(np.clip(np.rint(-low / scale), 0, 255)))
    name = ctx.add_initializer(grid.quantize(reciprocal).astype(np.uint8), f"{c_name}/reciprocal_codes")
    _binary_kernel(ctx, node, "QLinearMul", x, QTensor(name, grid), f"{c_name}/reciprocal")


def _lower_activation_difference(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """``a - b`` of two quantized tensors: ``QLinearAdd(a, 255 - q_b)`` on ``b``'s negated grid (`Grid.negated`, exact)."""
    if ctx.opset < 14:  # onnxruntime registers Sub for uint8 from opset 14
        raise Unsupported("Sub of two activations negates codes with a uint8 Sub, which needs opset >= 14")
    a, b = ctx.int_input(node.input[0]), ctx.int_input(node.input[1])
    codes = ctx.fresh(f"{node.input[1]}/negated_codes")
    ctx.emit("Sub", [ctx.scalar(255, np.uint8, "uint8/255"), b.name], [codes], name=f"{node.name}/negate")
    _binary_kernel(ctx, node, "QLinearAdd", a, QTensor(codes, b.grid.negated), f"{node.input[1]}/negated")


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
    shape = ctx.index.shape.get(node.input[0]) or ()
    _global_average_pool(ctx, node, channels_last=0, pooled=list(range(2, len(shape))))


def _reduced_axes(ctx: LoweringContext, node: onnx.NodeProto, rank: int) -> list[int]:
    """The axes a ReduceMean / ReduceSum reduces, non-negative (attribute, or constant input from opset 18 /
    ReduceSum 13)."""
    axes = node_attributes(node).get("axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        if not ctx.index.is_constant(node.input[1]):
            raise Unsupported(f"{node.op_type} axes {node.input[1]!r} are not a constant")
        axes = ctx.index.constant_value(node.input[1]).reshape(-1).tolist()
    if not axes:
        raise Unsupported(f"{node.op_type} over every axis (no axes given)")
    return sorted({int(a) + rank if int(a) < 0 else int(a) for a in axes})


def lower_spatial_reduction(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """ReduceMean / ReduceSum over trailing axes (``adaptive_avg_pool2d(1)`` in torch's dynamo export, a
    ``sum(dim=-1)`` of attention-weighted keys) or, channels last, over every axis between batch and channel
    -> QLinearGlobalAveragePool. Trailing axes from the third on are the kernel's spatial axes as they are;
    otherwise the codes are reshaped to ``[batch, kept, reduced]`` first and back after (the kept dims must be
    static). A sum is the mean on a grid ``N`` times finer (``s_y / N``, with ``N`` the static number of
    reduced elements), so its codes are the sum's on the output grid. ``keepdims=0`` squeezes the reduced
    axes. Other reductions stay float."""
    shape = ctx.index.shape.get(node.input[0])
    if shape is None or len(shape) < 2:
        raise Unsupported(f"{node.op_type} input of unknown rank or rank below 2")
    rank = len(shape)
    axes = _reduced_axes(ctx, node, rank)
    keepdims = bool(node_attributes(node).get("keepdims", 1))
    if node.op_type == "ReduceSum" and _static_count(shape, axes) is None:
        raise Unsupported(f"ReduceSum over dims {[shape[a] for a in axes]}: a sum needs the static number of "
                          "reduced elements")
    if rank >= 3 and axes == list(range(1, rank - 1)):
        _global_average_pool(ctx, node, channels_last=1, pooled=axes, squeeze=not keepdims)
        return
    first = axes[0]
    if first < 1 or axes != list(range(first, rank)):
        raise Unsupported(f"{node.op_type} over axes {axes} of a rank-{rank} tensor is not a global average pool")
    if first == 2:
        _global_average_pool(ctx, node, channels_last=0, pooled=axes, squeeze=not keepdims)
        return
    kept = shape[1:first]
    if not all(isinstance(d, int) and d > 0 for d in kept):
        raise Unsupported(f"{node.op_type} over axes {axes}: the kept dims {list(kept)} are not static")
    x = ctx.int_input(node.input[0])
    merged = ctx.fresh(f"{node.input[0]}/merged")
    ctx.emit("Reshape", [x.name, ctx.scalar([0, int(np.prod(kept)), -1], np.int64, f"{node.name}/merged_shape")],
             [merged], name=f"{node.name}/merge")
    out_shape = [0, *kept, *([1] * len(axes) if keepdims else [])]
    _global_average_pool(ctx, node, channels_last=0, pooled=axes, codes=merged,
                         reshape_to=[int(d) for d in out_shape])


def _static_count(shape, axes: list[int]) -> int | None:
    """The number of elements over ``axes`` of ``shape`` when those dims are static, else None."""
    dims = [shape[a] for a in axes if a < len(shape)]
    return int(np.prod(dims)) if dims and all(isinstance(d, int) and d > 0 for d in dims) else None


def _global_average_pool(ctx: LoweringContext, node: onnx.NodeProto, *, channels_last: int, pooled: list[int],
                         squeeze: bool = False, codes: str | None = None, reshape_to: list[int] | None = None) -> None:
    """com.microsoft QLinearGlobalAveragePool over the ``pooled`` axes of ``node.input[0]`` (its codes, or
    ``codes``: the same values reshaped), then ``squeeze`` those axes or ``reshape_to`` a shape. A ReduceSum
    runs on the output grid's scale divided by the number of pooled elements."""
    x = ctx.int_input(node.input[0])
    ep = epilogue(ctx, node)
    count = _static_count(ctx.index.shape.get(node.input[0]) or (), pooled)
    divisor = count if node.op_type == "ReduceSum" and count else 1
    scale = _f32(ep.grid.scale) / divisor
    out = ctx.fresh(f"{ep.tensor}/codes")
    ctx.emit("QLinearGlobalAveragePool",
             [codes or x.name, *ctx.grid_inputs(x.grid, node.input[0]),
              ctx.scalar(np.float32(scale), np.float32, f"{ep.tensor}/pool_scale"),
              ctx.grid_inputs(ep.grid, ep.tensor)[1]], [out],
             name=node.name, domain=MS_DOMAIN, channels_last=channels_last)
    if squeeze or reshape_to is not None:
        moved = ctx.fresh(f"{ep.tensor}/reshaped")
        if reshape_to is not None:
            ctx.emit("Reshape", [out, ctx.scalar(reshape_to, np.int64, f"{node.name}/shape")], [moved],
                     name=f"{node.name}/reshape")
        elif ctx.opset >= 13:
            ctx.emit("Squeeze", [out, ctx.scalar(pooled, np.int64, f"{node.name}/axes")], [moved],
                     name=f"{node.name}/squeeze")
        else:
            ctx.emit("Squeeze", [out], [moved], name=f"{node.name}/squeeze", axes=pooled)
        out = moved
    entry = _grid_entry("QLinearGlobalAveragePool", ep.tensor, [x.grid], ep.grid)
    if count is not None:  # a sum's multiplier has no 1/N: the grid it runs on is N times finer
        entry.update(taps=count, **multiplier_record(_f32(x.grid.scale) * divisor / (_f32(ep.grid.scale) * count)))
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
    "Sum": lower_sum,
    "Sub": lower_sub_div,
    "Div": lower_sub_div,
    "Concat": lower_concat,
    "AveragePool": lower_average_pool,
    "GlobalAveragePool": lower_global_average_pool,
    "ReduceMean": lower_spatial_reduction,
    "ReduceSum": lower_spatial_reduction,
    "Sigmoid": _unary_kernel("QLinearSigmoid"),
    "LeakyRelu": _unary_kernel("QLinearLeakyRelu"),
    "Softmax": _unary_kernel("QLinearSoftmax"),
}
