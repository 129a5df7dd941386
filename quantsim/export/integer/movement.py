"""Data movement on 8-bit codes, and Relu/Clip as clamps on codes.

Ops that only move, select or compare elements commute with an affine grid: for a per-tensor grid
``r = s (q - z)``, ``op(DQ(q)) == DQ(op(q))`` elementwise, so they run unchanged on the uint8 codes
(onnxruntime has uint8 kernels for all of them: `DIRECT_OPS`, with the first opset that has one) and
their outputs inherit the input grid, exactly as in the sim (the sim leaves these outputs unquantized,
or ties them to the input's quantizer). Two adjustments keep this exact:

* Pad (mode "constant") pads with ``q(c)``; refused unless ``c`` lies on the grid (0 always does), since
  the sim's output would otherwise hold an off-grid value.
* Resize: only ``mode="nearest"`` (a selection); linear/cubic interpolation is arithmetic.
* An output with its own, different quantizer is moved to that grid (`regrid`: a requantizing kernel or a table).

GlobalMaxPool runs as a uint8 ReduceMax over its spatial axes (onnxruntime has no uint8 GlobalMaxPool).
Where selects codes of branches moved onto its output grid (a constant branch quantized onto it; with no output
quantizer the constant must be one of the grid's values: a -inf mask fill saturated to the lowest code would give
masked positions weight in the Softmax after it), and so do
ScatterElements / ScatterND with reduction none, max or min (`lower_scatter`: a max of grid points is the grid
point of the max, ``q`` being monotone; add and mul reductions are arithmetic and stay float); IsNaN /
IsInf of a quantized tensor are false everywhere (grid points are finite). ArgMax / ArgMin read the codes:
the index of the largest code is the index of the largest value, ties included (a greedy decoder's next
token). Identity and Dropout (inference) alias their input codes, and so does a Cast between float types
(float32 <-> float16, `float_types`); Shape and Size read the codes' shape.

Relu / Clip not absorbed by their producer (`epilogue`): when the output grid equals the input grid (the
sim ties a Relu output to its input quantizer) the op is ``clip(q, q(lo), q(hi))`` on codes, exact by
monotonicity of ``q`` and omitted when the grid already implies it (``q(lo) <= 0``, ``q(hi) >= 255``);
an unquantized output inherits the input grid when the bounds lie on it; a different output grid makes
the op a move to that grid (`regrid`) followed by the code clamp.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from quantsim.export.integer.context import LoweringContext, QTensor, Unsupported
from quantsim.export.integer.epilogue import clamp_codes, clip_bounds, code_clamp
from quantsim.export.integer.fallback import apply_quantizer
from quantsim.export.integer.lut import regrid
from quantsim.graph.index import node_attributes
from quantsim.graph.op_facts import UINT8_KERNEL_OPSET

__all__ = ["RULES", "DIRECT_OPS"]

DIRECT_OPS = UINT8_KERNEL_OPSET  # op -> first opset with a uint8 kernel (`quantsim.graph.op_facts`)


def _data_outputs(ctx: LoweringContext, node: onnx.NodeProto) -> list[int]:
    positions = [i for i, name in enumerate(node.output) if name and ctx.index.is_float(name)]
    extra = [node.output[i] for i, name in enumerate(node.output) if name and i not in positions]
    if node.op_type == "MaxPool" and any(ctx.index.uses(n) or n in ctx.index.graph_outputs for n in extra):
        raise Unsupported("MaxPool Indices output has no uint8 kernel")
    return positions


def _settle(ctx: LoweringContext, tensor: str, codes: QTensor) -> None:
    """Register ``codes`` (on the input grid) for ``tensor``, moved to the tensor's own grid if it has one."""
    grid = ctx.output_grid(tensor, codes.grid)
    moved = regrid(ctx, codes, grid, tensor)
    ctx.set_int(tensor, moved.name, grid)


def lower_direct(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """Data movement (`DIRECT_OPS`) applied to the uint8 codes themselves: the values keep their grid."""
    if ctx.opset < DIRECT_OPS[node.op_type]:
        raise Unsupported(f"no uint8 {node.op_type} kernel before opset {DIRECT_OPS[node.op_type]}")
    attrs = node_attributes(node)
    if node.op_type == "Resize" and attrs.get("mode", b"nearest") not in (b"nearest", "nearest"):
        raise Unsupported(f"Resize mode {attrs['mode']!r} interpolates (only nearest moves codes)")
    x = ctx.int_input(node.input[0])
    mode = attrs.get("mode", b"constant")
    pad_value = node.op_type == "Pad" and mode in (b"constant", "constant")
    # a constant Pad's float value is replaced by its code below: not read, so not copied into the model
    inputs = [x.name] + [ctx.float_input(name) if name and not (pad_value and slot == 2) else name
                         for slot, name in enumerate(node.input[1:], start=1)]
    if pad_value:
        value = 0.0
        if len(node.input) > 2 and node.input[2]:
            if not ctx.index.is_constant(node.input[2]):
                raise Unsupported("Pad value is not a constant")
            value = float(np.asarray(ctx.constant(node.input[2])).reshape(-1)[0])
        if not x.grid.on_grid(value):
            raise Unsupported(f"Pad value {value} is not on the input grid")
        code = ctx.scalar(int(x.grid.quantize(value)), np.uint8, "pad/value")
        inputs = inputs[:2] + [code] + inputs[3:] if len(inputs) > 2 else inputs + [code]
    positions = _data_outputs(ctx, node)
    outputs = list(node.output)
    for i in positions:
        outputs[i] = ctx.fresh(f"{node.output[i]}/codes")
    ctx.emit(node.op_type, inputs, outputs, name=node.name, attributes_of=node)
    for i in positions:
        _settle(ctx, node.output[i], QTensor(outputs[i], x.grid))


def lower_alias(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """Identity / Dropout at inference: the output is the input."""
    if any(ctx.index.uses(n) or n in ctx.index.graph_outputs for n in node.output[1:] if n):
        raise Unsupported(f"{node.op_type} mask output is used")
    _settle(ctx, node.output[0], ctx.int_input(node.input[0]))


def lower_float_cast(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """A Cast between float types (float32 <-> float16): codes pass through on their grid (`float_types`);
    a value without codes is cast in float (no arithmetic to lower). Casts to or from other types (float64,
    integers) are Unsupported."""
    source, target = node.input[0], node.output[0]
    types = {ctx.index.elem_type.get(source), ctx.index.elem_type.get(target)}
    if not types <= {TensorProto.FLOAT, TensorProto.FLOAT16}:
        raise Unsupported("Cast to or from a type other than float32 / float16")
    try:
        codes = ctx.int_input(source)
    except Unsupported:
        codes = None
    if codes is not None and (ctx.grid_of(target) is not None or not ctx.has_quantizer(target)):
        _settle(ctx, target, codes)
        return
    out = ctx.fresh(f"{target}/float")
    ctx.emit("Cast", [ctx.float_input(source)], [out], name=node.name, attributes_of=node)
    apply_quantizer(ctx, target, out)


def lower_shape(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """Shape/Size read the codes tensor: its shape is the float tensor's shape."""
    ctx.emit(node.op_type, [ctx.any_input(node.input[0])], list(node.output), name=node.name, attributes_of=node)


def lower_clamp(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """A standalone Relu / Clip (see the module docstring)."""
    x = ctx.int_input(node.input[0])
    low, high = clip_bounds(ctx, node)
    tensor = node.output[0]
    grid = ctx.grid_of(tensor)
    if grid is None:
        if ctx.has_quantizer(tensor):
            raise Unsupported(ctx.why_not_8bit(tensor))
        if not (x.grid.on_grid(low) and x.grid.on_grid(high)):
            raise Unsupported(f"{node.op_type} bounds ({low}, {high}) are not on the input grid")
        grid = x.grid
    if grid != x.grid:  # q_y(clip(v, lo, hi)) = clip(q_y(v), q_y(lo), q_y(hi)): a regrid, then a code clamp
        moved = regrid(ctx, x, grid, tensor)
        lo, hi = code_clamp(grid, low, high)
        ctx.set_int(tensor, clamp_codes(ctx, moved.name, max(lo, grid.low), min(hi, grid.high), tensor), grid)
        return
    lo, hi = code_clamp(grid, low, high)
    ctx.set_int(tensor, clamp_codes(ctx, x.name, lo, hi, tensor), grid)


def lower_where(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """``Where(cond, a, b)``: each branch moved onto the output's grid (`regrid`; a constant branch quantized
    onto it, as the sim's output quantizer quantizes it), then a uint8 Where selects codes. Exact: quantizing
    commutes with selecting. An unquantized output keeps the branches' common grid, and a constant branch
    must lie on it."""
    if ctx.opset < 9:
        raise Unsupported("Where needs opset >= 9")
    out = node.output[0]
    codes = {name: ctx.int_input(name) for name in node.input[1:3] if not ctx.index.is_constant(name)}
    if not codes:
        raise Unsupported("Where of two constants (a mask being built) stays float")
    grids = {c.grid for c in codes.values()}
    grid = ctx.output_grid(out, next(iter(grids)) if len(grids) == 1 else None)
    inputs = [ctx.float_input(node.input[0])]  # the boolean condition, as it is
    for slot, name in enumerate(node.input[1:3], start=1):
        if name in codes:
            inputs.append(regrid(ctx, codes[name], grid, f"{out}/branch{slot}").name)
            continue
        values = np.asarray(ctx.constant(name), np.float32)
        if not ctx.has_quantizer(out) and not all(grid.holds(float(v)) for v in values.reshape(-1)):
            raise Unsupported(f"Where constant {name!r} is not on the grid of the unquantized output")
        constant = np.clip(grid.quantize(values), grid.low, grid.high).astype(np.uint8)
        inputs.append(ctx.add_initializer(constant, f"{out}/branch{slot}_codes"))
    result = ctx.fresh(f"{out}/codes")
    ctx.emit("Where", inputs, [result], name=node.name)
    ctx.set_int(out, result, grid)


def _codes_on(ctx: LoweringContext, name: str, codes: QTensor | None, grid, base: str, inherited: bool) -> str:
    """``name``'s codes on ``grid``: moved there (`regrid`), or, for a constant, quantized onto it as the sim's
    output quantizer quantizes it; with no output quantizer (``inherited``) a constant must lie on the grid."""
    if codes is not None:
        return regrid(ctx, codes, grid, base).name
    values = np.asarray(ctx.constant(name), np.float32)
    if inherited and not all(grid.holds(float(v)) for v in values.reshape(-1)):
        raise Unsupported(f"constant {name!r} is not on the grid of the unquantized output")
    with np.errstate(over="ignore", invalid="ignore"):  # a fill of finfo.min saturates to the lowest code
        constant = np.clip(grid.quantize(values), grid.low, grid.high)
    return ctx.add_initializer(constant.astype(np.uint8), f"{base}_codes")


def lower_scatter(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """ScatterElements / ScatterND with reduction none, max or min on codes: the data and the updates moved
    onto the output's grid (constants quantized onto it), then a uint8 scatter. Exact: ``q`` is monotone, so
    it commutes with overwriting and with max / min, and the writes happen in the same order."""
    reduction = node_attributes(node).get("reduction", b"none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in ("none", "max", "min"):
        raise Unsupported(f"{node.op_type} reduction {reduction!r} is arithmetic on the values")
    if ctx.opset < 11:
        raise Unsupported(f"no uint8 {node.op_type} kernel before opset 11")
    out = node.output[0]
    slots = (0, 2)
    codes: dict[int, QTensor] = {}
    unquantized = []  # float inputs without a grid (a max-scatter's identity fill, left float by placement)
    for slot in slots:
        if not ctx.index.is_constant(node.input[slot]):
            try:
                codes[slot] = ctx.int_input(node.input[slot])
            except Unsupported:
                unquantized.append(slot)
    if not codes:
        raise Unsupported(f"{node.op_type} without a quantized input stays float")
    inherited = not ctx.has_quantizer(out)
    if unquantized and inherited:
        raise Unsupported(f"{node.op_type} input {node.input[unquantized[0]]!r} has no grid and the output none")
    grids = {c.grid for c in codes.values()}
    grid = ctx.output_grid(out, next(iter(grids)) if len(grids) == 1 else None)
    for slot in unquantized:  # the sim's output quantizer saturates these values: QuantizeLinear does the same
        source = ctx.float_input(node.input[slot])
        if not grid.full:
            source = ctx.float_clip(source, grid.min, grid.max, f"{out}/input{slot}")
        scale, zp = ctx.grid_inputs(grid, f"{out}/input{slot}")
        moved = ctx.fresh(f"{out}/input{slot}/codes")
        ctx.emit("QuantizeLinear", [source, scale, zp], [moved], name=f"{out}/input{slot}/quantize")
        codes[slot] = QTensor(moved, grid)
    data, updates = (_codes_on(ctx, node.input[slot], codes.get(slot), grid, f"{out}/input{slot}", inherited)
                     for slot in slots)
    result = ctx.fresh(f"{out}/codes")
    ctx.emit(node.op_type, [data, ctx.float_input(node.input[1]), updates], [result], name=node.name,
             attributes_of=node)
    ctx.set_int(out, result, grid)


def lower_global_max_pool(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """GlobalMaxPool on codes as ``ReduceMax`` over the spatial axes with ``keepdims=1`` (the same output
    shape): a maximum commutes with the monotone quantization, and onnxruntime has a uint8 ReduceMax from
    opset 12 but no uint8 GlobalMaxPool (Keras' GlobalMaxPooling2D through tf2onnx)."""
    shape = ctx.index.shape.get(node.input[0])
    if shape is None or len(shape) < 3:
        raise Unsupported("GlobalMaxPool input of unknown rank")
    if ctx.opset < DIRECT_OPS["ReduceMax"]:
        raise Unsupported(f"no uint8 ReduceMax kernel before opset {DIRECT_OPS['ReduceMax']}")
    x = ctx.int_input(node.input[0])
    axes = list(range(2, len(shape)))
    out = ctx.fresh(f"{node.output[0]}/codes")
    if ctx.opset >= 18:  # axes became an input
        ctx.emit("ReduceMax", [x.name, ctx.scalar(axes, np.int64, f"{node.name}/axes")], [out], name=node.name,
                 keepdims=1)
    else:
        ctx.emit("ReduceMax", [x.name], [out], name=node.name, axes=axes, keepdims=1)
    _settle(ctx, node.output[0], QTensor(out, x.grid))


def lower_never_special(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """IsNaN / IsInf of a tensor on an 8-bit grid: its sim values are grid points, never NaN or infinite, so
    the answer is false everywhere (``ConstantOfShape`` of the codes' shape). Transformers' exports guard
    attention probabilities so: ``Where(IsNaN(p), 0, p)``."""
    x = ctx.int_input(node.input[0])
    shape = ctx.fresh(f"{node.output[0]}/shape")
    ctx.emit("Shape", [x.name], [shape], name=f"{node.name}/shape")
    ctx.emit("ConstantOfShape", [shape], [node.output[0]], name=node.name,
             value=onnx.helper.make_tensor("false", TensorProto.BOOL, [1], [False]))


def lower_arg_extreme(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """ArgMax / ArgMin of a tensor on a per-tensor grid: the same op on its uint8 codes. Exact: dequantizing
    ``s (q - z)`` with ``s > 0`` is strictly increasing in ``q``, so the codes order and tie as the sim's values
    do (``select_last_index`` breaks ties alike); the int64 index output is the model's own."""
    if ctx.opset < 11:
        raise Unsupported(f"no uint8 {node.op_type} kernel before opset 11")
    x = ctx.int_input(node.input[0])
    ctx.emit(node.op_type, [x.name], list(node.output), name=node.name, attributes_of=node)


RULES = {op: lower_direct for op in DIRECT_OPS}
RULES.update({"Cast": lower_float_cast, "Identity": lower_alias, "Dropout": lower_alias, "Shape": lower_shape,
              "Size": lower_shape, "Relu": lower_clamp, "Clip": lower_clamp, "Where": lower_where,
              "IsNaN": lower_never_special, "IsInf": lower_never_special, "ScatterElements": lower_scatter,
              "ScatterND": lower_scatter, "GlobalMaxPool": lower_global_max_pool, "ArgMax": lower_arg_extreme,
              "ArgMin": lower_arg_extreme})
