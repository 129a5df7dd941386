"""Elementwise functions of one 8-bit tensor as 256-entry lookup tables (exact by construction).

An elementwise ``y = f(x)`` between an input grid ``(s_x, z_x)`` and an output grid ``(s_y, z_y)`` only
ever sees 256 inputs, so the sim's ``q_y = Q_y(f(DQ_x(q_x)))`` is a table indexed by the input code:

    table[c] = clamp(Q_y(f((c - z_x) s_x)), L, H),   c = 0..255
    q_y      = GatherElements(table, Cast<int32>(flat q_x))   (reshaped back)

Piecewise-linear functions (HardSwish, HardSigmoid, scalar Add/Sub/Mul/Div, one-slope PRelu, grid moves)
run instead on QLinear kernels that reproduce the table (checked on all 256 codes, `piecewise`); the
table is the fallback and the reference.

``f`` is evaluated by onnxruntime itself on the node copied from the model (same op, attributes and
constant operands, in a 256-element DequantizeLinear -> f -> QuantizeLinear graph with Q/DQ fusion
disabled, like the sim's session), so the table equals the sim's result for every code, including
onnxruntime's own approximations of tanh, erf, exp, .... The tables of one export come from one session per
opset they need (`code_graphs`: `prefetch` finds them before the lowering; their graphs run merged, each
unchanged).
``[L, H]`` is the clamp of an absorbed Relu/Clip (`epilogue`). Uses:

* unary activations without a QLinear kernel (`UNARY_OPS`: HardSigmoid, HardSwish, Tanh, Erf, Exp, Gelu,
  Softplus, Elu, ...);
* binary ops whose other operand is a one-element constant (`SCALAR_BINARY_OPS`: ``x * 0.5``,
  ``x + 3``, ``x / 6``, ``Pow(x, 2)``, PRelu with one slope, ...): a unary function of ``x``;
* `regrid`: moving codes to another grid, ``table[c] = Q_y(DQ_x(c))`` (identity ``f``).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim.export.integer.context import Grid, LoweringContext, QTensor, Unsupported
from quantsim.export.integer.epilogue import clamp_codes, epilogue, finish
from quantsim.export.integer.float_types import HALF, is_half
from quantsim.export.integer.piecewise import apply_table, fast_form
from quantsim.graph.index import node_attributes

__all__ = ["RULES", "UNARY_OPS", "SCALAR_BINARY_OPS", "lut_table", "regrid", "lower_lut",
           "hard_swish_gate", "lower_hard_sigmoid", "lower_hard_swish_product", "scalar_operand_slot",
           "lower_scalar_binary"]

UNARY_OPS = frozenset(
    """HardSigmoid HardSwish Tanh Erf Exp Log Gelu Softplus Softsign Elu Selu Celu Mish ThresholdedRelu Neg
    Abs Sqrt Reciprocal Sin Cos Tan Atan Sinh Cosh Asinh Floor Ceil Round Sign""".split()
)
SCALAR_BINARY_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"})


def lut_table(ctx: LoweringContext, grid_in: Grid, grid_out: Grid, node: onnx.NodeProto | None = None,
              data_slot: int = 0, opset: int | None = None) -> np.ndarray:
    """``table[c] = Q_out(f(DQ_in(c)))`` for the 256 codes, ``f`` = ``node`` (identity when None);
    ``opset`` overrides the model's for ``f`` (a HardSwish tabulated for an opset-13 model)."""
    inits = [numpy_helper.from_array(np.float32(grid_in.scale), "s_in"),
             numpy_helper.from_array(np.uint8(grid_in.zero_point), "z_in"),
             numpy_helper.from_array(np.float32(grid_out.scale), "s_out"),
             numpy_helper.from_array(np.uint8(grid_out.zero_point), "z_out")]
    nodes = [helper.make_node("DequantizeLinear", ["codes", "s_in", "z_in"], ["x"])]
    result = "x"
    opsets = {"": max(ctx.opset, opset or 0)}
    if node is not None:
        inputs = []
        for slot, name in enumerate(node.input):
            if slot == data_slot:
                inputs.append("x")
            elif not name:
                inputs.append("")
            elif ctx.index.is_constant(name):
                inits.append(numpy_helper.from_array(ctx.constant(name), f"c{slot}"))
                inputs.append(f"c{slot}")
            else:
                raise Unsupported(f"operand {name!r} of {node.op_type} is not a constant")
        # a float16 op runs in float16 between Casts, as in the sim
        half = is_half(ctx, node.input[data_slot]) or any(t.data_type == HALF for t in inits[4:])
        if half:
            nodes.append(helper.make_node("Cast", ["x"], ["x16"], to=HALF))
            inputs[data_slot] = "x16"
        copy = helper.make_node(node.op_type, inputs, ["y"], domain=node.domain or None)
        copy.attribute.extend(node.attribute)
        nodes.append(copy)
        result = "y"
        if half:
            nodes.append(helper.make_node("Cast", ["y"], ["y32"], to=TensorProto.FLOAT))
            result = "y32"
        if node.domain:
            opsets[node.domain] = ctx.index.opset(node.domain) or 1
    nodes.append(helper.make_node("QuantizeLinear", [result, "s_out", "z_out"], ["table"]))
    graph = helper.make_graph(nodes, "lut", [helper.make_tensor_value_info("codes", TensorProto.UINT8, [256])],
                              # no declared shape: a constant operand of shape [1, 1, 1, 1] (tf2onnx's spelling of a
                              # scalar) broadcasts the table to [1, 1, 1, 256], and onnxruntime warned at each export
                              [helper.make_tensor_value_info("table", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = ctx.index.model.ir_version
    try:
        (table,) = ctx.code_graphs.evaluate(model)  # batched with the export's other tables (`code_graphs`)
    except Exception as error:  # noqa: BLE001 - the op cannot be evaluated alone: run it in float
        raise Unsupported(f"cannot tabulate {node.op_type if node else 'Identity'}: {str(error).splitlines()[0]}") from error
    return np.clip(np.asarray(table, dtype=np.uint8).reshape(256), grid_out.low, grid_out.high)


def regrid(ctx: LoweringContext, x: QTensor, grid: Grid, base: str) -> QTensor:
    """``x``'s codes moved onto ``grid`` (no node when the grids are equal): a requantizing kernel when one
    reproduces the table exactly (`piecewise`), else the table."""
    if x.grid == grid:
        return x
    table = lut_table(ctx, x.grid, grid)
    codes = fast_form(ctx, x, grid, None, 0, table, grid.low, grid.high, base)
    if codes is None:
        return QTensor(apply_table(ctx, x, table, base), grid)
    return QTensor(clamp_codes(ctx, codes, grid.low, grid.high, base), grid)


def _lut(ctx: LoweringContext, node: onnx.NodeProto, data_slot: int, function: onnx.NodeProto | None = None,
         opset: int | None = None) -> None:
    """Tabulate ``function`` (default: ``node`` itself) of input ``data_slot`` onto ``node``'s output grid."""
    x = ctx.int_input(node.input[data_slot])
    ep = epilogue(ctx, node)
    function = node if function is None else function
    table = np.clip(lut_table(ctx, x.grid, ep.grid, function, 0 if function is not node else data_slot, opset),
                    ep.low, ep.high)
    first = len(ctx.nodes)
    codes = fast_form(ctx, x, ep.grid, function, 0 if function is not node else data_slot, table, ep.low, ep.high,
                      ep.tensor)
    kernels = [n.op_type for n in ctx.nodes[first:]]
    ctx.record(node, {"op": "LUT" if codes is None else "+".join(kernels), "function": function.op_type,
                      "output": ep.tensor, "input_scale": x.grid.scale, "input_zero_point": x.grid.zero_point,
                      "output_scale": ep.grid.scale, "output_zero_point": ep.grid.zero_point,
                      "table": table.astype(int).tolist()})
    if codes is None:  # the table already holds the clamp
        finish(ctx, dataclasses.replace(ep, low=0, high=255), apply_table(ctx, x, table, ep.tensor))
    else:
        finish(ctx, ep, codes)


def lower_lut(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """A unary activation (`UNARY_OPS`) as a lookup table."""
    _lut(ctx, node, 0)


def scalar_operand_slot(ctx: LoweringContext, node: onnx.NodeProto) -> int | None:
    """The data slot of a binary op whose other operand is a one-element constant (None if not so)."""
    if len(node.input) != 2:
        return None
    for data, other in ((0, 1), (1, 0)):
        name, data_name = node.input[other], node.input[data]
        if not ctx.index.is_constant(name) or ctx.index.is_constant(data_name):
            continue
        shape, data_shape = ctx.index.shape.get(name) or (), ctx.index.shape.get(data_name)
        if int(np.prod(shape)) == 1 and data_shape is not None and len(shape) <= len(data_shape):
            return data
    return None


def lower_scalar_binary(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """``op(x, c)`` / ``op(c, x)`` with a one-element constant ``c`` as a lookup table in ``x``."""
    slot = scalar_operand_slot(ctx, node)
    if slot is None:
        raise Unsupported(f"{node.op_type} has no one-element constant operand")
    _lut(ctx, node, slot)


RULES = {op: lower_lut for op in UNARY_OPS}


def hard_swish_gate(ctx: LoweringContext, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The ``Mul(x, gate)`` when ``node`` is ``gate = HardSigmoid(x)`` with HardSwish's constants
    (how preparation spells HardSwish below opset 14), else None."""
    attrs = node_attributes(node)
    if node.op_type != "HardSigmoid" or not (np.isclose(attrs.get("alpha", 0.2), 1 / 6)
                                             and np.isclose(attrs.get("beta", 0.5), 0.5)):
        return None
    mul = ctx.index.single_consumer(node.output[0])
    if mul is None or mul.op_type != "Mul" or sorted(mul.input) != sorted([node.input[0], node.output[0]]):
        return None
    if ctx.quantizer(node.output[0]) is not None:  # the sim rounds the gate itself: not one HardSwish
        return None
    state = ctx.snapshot()
    try:  # one table needs an integer x and an integer product grid, else both run in float
        ctx.int_input(node.input[0])
        epilogue(ctx, mul)
    except Unsupported:
        return None
    finally:
        ctx.restore(state)
    return mul


def lower_hard_sigmoid(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """A HardSwish gate emits nothing (its Mul is tabulated as HardSwish); otherwise a lookup table."""
    if hard_swish_gate(ctx, node) is None:
        _lut(ctx, node, 0)


def lower_hard_swish_product(ctx: LoweringContext, node: onnx.NodeProto) -> bool:
    """``Mul(x, HardSigmoid(x))`` as one HardSwish table of ``x``; False when ``node`` is not that."""
    for slot, name in enumerate(node.input):
        gate = ctx.index.producer_of(name)
        if gate is not None and hard_swish_gate(ctx, gate) is node:
            x_slot = 1 - slot
            function = helper.make_node("HardSwish", ["x"], ["y"])
            _lut(ctx, node, x_slot, function, opset=14)
            return True
    return False


RULES["HardSigmoid"] = lower_hard_sigmoid
