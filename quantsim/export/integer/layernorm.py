"""Layer normalization in the integer export: one float LayerNormalization between codes.

onnxruntime has no integer LayerNorm kernel (``quantize_static`` leaves LayerNormalization float too), so a
normalization runs in float here, as small as possible:

    codes(x) -> Cast -> Sub -> Mul (= DequantizeLinear) -> LayerNormalization -> QuantizeLinear -> codes(y)

* A fused ``LayerNormalization`` node takes that form through the float fallback; its report entry says why.
* A decomposed one, as exporters spell it (PaddlePaddle, PyTorch before opset 17)::

      mean = ReduceMean(x, axes)             centered = Sub(x, mean)
      var  = ReduceMean(Pow(centered, 2))    (or Mul(centered, centered))
      std  = Sqrt(Add(var, eps))             y = Div(centered, std)

  becomes that one LayerNormalization (scale 1, bias 0, ``axis`` = the first reduced axis, ``epsilon``)
  when ``x`` has 8-bit codes, ``y`` has an 8-bit grid in the sim (the statistics between them are float
  in the sim: `quantsim.graph.tensor_roles`), every intermediate feeds only the pattern, the reduced axes
  are the trailing ones, and the opset is >= 17 (``export_integer(opset=17)`` converts older models). The
  gamma ``Mul`` and beta ``Add`` after ``y`` stay separate integer kernels (the sim quantizes between them).

Numerics: the sim computes the decomposed form in float32, the fused kernel the same maths with another
rounding order (onnxruntime accumulates mean and mean square in one pass), so the float values differ by
a few float32 ulps and a code of ``y`` moves by one step only where its value lies within those ulps of a
rounding midpoint (tests/test_export_integer_attention.py measures it). The node stays in the export's
report (one float op where the sim's graph had seven).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from quantsim.export.integer.context import LoweringContext, Unsupported
from quantsim.export.integer.fallback import apply_quantizer
from quantsim.export.integer.float_types import as_float32, as_own_type
from quantsim.graph.index import GraphIndex, node_attributes

__all__ = ["RULES", "LayerNormMatch", "match_decomposed_layer_norm", "lower_decomposed_layer_norm",
           "LAYER_NORM_OPSET", "FLOAT_REASON"]

LAYER_NORM_OPSET = 17
FLOAT_REASON = ("no integer LayerNorm kernel in onnxruntime (quantize_static leaves it float too): "
                "runs as DequantizeLinear -> LayerNormalization -> QuantizeLinear")


@dataclass(frozen=True)
class LayerNormMatch:
    """A decomposed layer normalization: its input, normalized output, nodes, first axis (negative, from the
    end) and epsilon."""

    x: str
    y: str
    nodes: tuple[onnx.NodeProto, ...]
    axis: int
    epsilon: float


def _reduced_axes(index: GraphIndex, node: onnx.NodeProto) -> tuple[int, ...] | None:
    attrs = node_attributes(node)
    if int(attrs.get("keepdims", 1)) != 1:
        return None
    if "axes" in attrs:
        return tuple(int(a) for a in attrs["axes"])
    if len(node.input) > 1 and node.input[1] and index.is_constant(node.input[1]):
        return tuple(int(a) for a in np.asarray(index.constant_value(node.input[1])).reshape(-1))
    return None


def _scalar(index: GraphIndex, name: str) -> float | None:
    if not index.is_constant(name):
        return None
    value = np.asarray(index.constant_value(name))
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def _trailing_axis(axes: tuple[int, ...], rank: int) -> int | None:
    """The first axis when ``axes`` are exactly the trailing axes of a rank-``rank`` tensor, else None."""
    normalized = sorted(a % rank for a in axes)
    if not normalized or normalized != list(range(normalized[0], rank)):
        return None
    return normalized[0]


def match_decomposed_layer_norm(index: GraphIndex, mean_node: onnx.NodeProto) -> LayerNormMatch | None:
    """The decomposed layer normalization starting at ``mean_node`` (module docstring), or None."""
    if mean_node.op_type != "ReduceMean" or not mean_node.input or not mean_node.output[0]:
        return None
    x, mean = mean_node.input[0], mean_node.output[0]
    sub = index.single_consumer(mean)
    if sub is None or sub.op_type != "Sub" or list(sub.input) != [x, mean]:
        return None
    centered = sub.output[0]
    uses = index.uses(centered)
    if len(uses) != 2 or any(u.index < 0 for u in uses) or centered in index.graph_outputs:
        return None
    square = next((u.node for u in uses if u.node.op_type in ("Pow", "Mul")), None)
    div = next((u.node for u in uses if u.node.op_type == "Div"), None)
    if square is None or div is None or list(div.input[:1]) != [centered]:
        return None
    if square.op_type == "Pow" and (square.input[0] != centered or _scalar(index, square.input[1]) != 2.0):
        return None
    if square.op_type == "Mul" and list(square.input) != [centered, centered]:
        return None
    var_node = index.single_consumer(square.output[0])
    if var_node is None or var_node.op_type != "ReduceMean" or var_node.input[0] != square.output[0]:
        return None
    add = index.single_consumer(var_node.output[0])
    if add is None or add.op_type != "Add":
        return None
    eps_name = add.input[1] if add.input[0] == var_node.output[0] else add.input[0]
    epsilon = _scalar(index, eps_name)
    sqrt = index.single_consumer(add.output[0])
    if epsilon is None or epsilon < 0 or sqrt is None or sqrt.op_type != "Sqrt":
        return None
    if index.single_consumer(sqrt.output[0]) is not div or list(div.input) != [centered, sqrt.output[0]]:
        return None
    shape = index.shape.get(x)
    axes, var_axes = _reduced_axes(index, mean_node), _reduced_axes(index, var_node)
    if axes is None or var_axes is None:
        return None
    if shape is None:  # rank unknown (behind a computed Reshape): only the last axis, spelled -1, is certain
        if tuple(axes) != (-1,) or tuple(var_axes) != (-1,):
            return None
        axis = -1
    else:
        first = _trailing_axis(axes, len(shape))
        if first is None or first != _trailing_axis(var_axes, len(shape)):
            return None
        axis = first - len(shape)  # negative: counts from the end, as the normalized dims do
    return LayerNormMatch(x, div.output[0], (mean_node, sub, square, var_node, add, sqrt, div), axis, epsilon)


def _normalized_shape(index: GraphIndex, match: LayerNormMatch) -> list[int]:
    """Static dims normalized over: from the input's or output's shape, else (last axis only: unknown rank
    or dims) the length of a 1-D constant multiplied or added right after (the layer's gamma / beta), else
    Unsupported."""
    for name in (match.x, match.y):
        shape = index.shape.get(name)
        if shape is not None:
            dims = list(shape[match.axis:])
            if dims and all(isinstance(d, int) and d > 0 for d in dims):
                return [int(d) for d in dims]
    if match.axis == -1:
        for use in index.uses(match.y):
            for operand in use.node.input:
                if use.node.op_type in ("Mul", "Add") and operand != match.y and index.is_constant(operand):
                    value = np.asarray(index.constant_value(operand))
                    if value.ndim == 1 and value.size > 1:
                        return [int(value.size)]
    raise Unsupported(f"the normalized dims of {match.x!r} are not static (LayerNormalization needs its scale)")


def lower_decomposed_layer_norm(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """A ReduceMean that opens a decomposed layer normalization -> one float LayerNormalization between
    codes (module docstring); any other ReduceMean is Unsupported."""
    match = match_decomposed_layer_norm(ctx.index, node)
    if match is None:
        raise Unsupported("no integer lowering for ReduceMean")
    if ctx.opset < LAYER_NORM_OPSET:
        raise Unsupported(f"decomposed LayerNorm: LayerNormalization needs opset >= {LAYER_NORM_OPSET} "
                          f"(export_integer(opset={LAYER_NORM_OPSET}) fuses the {len(match.nodes)} ops into one)")
    if ctx.grid_of(match.y) is None:
        raise Unsupported(f"decomposed LayerNorm output {match.y!r}: {ctx.why_not_8bit(match.y)} "
                          "(the normalization runs in float as in the sim)")
    ctx.int_input(match.x)  # codes available (raises Unsupported otherwise)
    source = as_float32(ctx, ctx.float_input(match.x), match.x)  # the island computes in float32
    shape = _normalized_shape(ctx.index, match)
    width = int(np.prod(shape))
    ones = ctx.add_initializer(np.ones(shape, np.float32), f"{node.name}/layer_norm_scale")
    zeros = ctx.add_initializer(np.zeros(shape, np.float32), f"{node.name}/layer_norm_bias")
    out = ctx.fresh(f"{match.y}/float")
    ctx.emit("LayerNormalization", [source, ones, zeros], [out], name=f"{node.name}/layer_norm",
             axis=match.axis, epsilon=float(np.float32(match.epsilon)))
    apply_quantizer(ctx, match.y, as_own_type(ctx, out, match.y))
    ctx.absorbed.update(n.name for n in match.nodes[1:])
    ctx.islands.append((node.name, "LayerNormalization",
                        f"decomposed LayerNorm ({len(match.nodes)} ops over {width} values) fused into one: "
                        + FLOAT_REASON))


def refuse_layer_norm(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """A fused LayerNormalization runs in float (the fallback's DQ -> LayerNormalization -> Q)."""
    raise Unsupported(FLOAT_REASON)


RULES = {"ReduceMean": lower_decomposed_layer_norm, "LayerNormalization": refuse_layer_norm}
