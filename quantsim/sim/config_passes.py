"""AIMET's ``LayerNormalization``, ``RMSNormalization`` and ``MaskedSoftmax`` supergroup passes (config
``supergroup_pass_list``; ``MatmulAdd`` is applied by `quantsim.sim.placement` itself).

Each pass finds a layer spelled out in elementary ops and turns off the quantizers inside it, so the layer runs
in float between its input and output quantizers (aimet-onnx 2.42 ``graph_passes/passes/layernorm.py``,
``rmsnorm.py`` and ``fusions/masked_softmax.py``; checked against it on small graphs):

* **LayerNormalization**: ``d = x - ReduceMean(x)``; ``Div(d, Sqrt(Add(ReduceMean(Pow(d, 2)), eps)))``. The
  outputs of ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt and the constants of all seven ops (the exponent, eps)
  are not quantized. With a following ``Mul(., gamma)`` the Div output is not quantized either and gamma, when
  16-bit, is symmetric; with ``Add(., beta)`` after that Mul the Mul output and beta are not quantized.
* **RMSNormalization**: ``Pow(x, 2)`` or ``Mul(x, x)`` -> ReduceMean -> Add(eps), then ``Div(x, Sqrt(.))``,
  ``Mul(x, Div(1, Sqrt(.)))``, ``Mul(x, Reciprocal(Sqrt(.)))`` or ``Mul(x, Pow(., -0.5))``, optionally Casts
  and a ``Mul(., gamma)``: every output but the last and the constants of every op but the last (the exponent,
  eps; not gamma) are not quantized.
* **MaskedSoftmax**: ``Softmax(Where(mask, x, ReduceMin(x) + B))`` over the last axis of a 4-D ``x``, ``B`` a
  constant <= -20 (AIMET fuses it into one op): the ReduceMin, Add and Where outputs and ``B`` are not
  quantized; ``x`` and the Softmax output keep their quantizers.

quantsim's own rule (`tensor_roles.find_normalization_statistics`) already keeps most of these statistics float
whatever the config says; the passes add what AIMET also turns off (the normalized value before gamma, beta).
"""
from __future__ import annotations

import numpy as np
import onnx

from quantsim.graph.index import GraphIndex

__all__ = ["norm_pass_sites"]


def _next(index: GraphIndex, node: onnx.NodeProto | None, op_type: str | None = None) -> onnx.NodeProto | None:
    """The only consumer of ``node``'s first output (of ``op_type``, when given), else None."""
    if node is None or not node.output:
        return None
    consumer = index.single_consumer(node.output[0])
    return consumer if consumer is not None and (op_type is None or consumer.op_type == op_type) else None


def _chain(index: GraphIndex, start: onnx.NodeProto, op_types: tuple[str, ...], last_single: bool = True):
    """``[start, ...]`` when ``start`` and its single consumers have ``op_types`` (AIMET's consecutive-ops match;
    ``last_single``: the last op must have one consumer too), else None."""
    chain = [start]
    if start.op_type != op_types[0]:
        return None
    for op_type in op_types[1:]:
        nxt = _next(index, chain[-1], op_type)
        if nxt is None:
            return None
        chain.append(nxt)
    if last_single and _next(index, chain[-1]) is None:
        return None
    return chain


def _scalar(index: GraphIndex, name: str, value: float) -> bool:
    if not name or not index.is_constant(name):
        return False
    array = np.asarray(index.constant_value(name))
    return array.size == 1 and float(array.reshape(-1)[0]) == value


def _constants(index: GraphIndex, nodes: list[onnx.NodeProto]) -> list[str]:
    return [name for node in nodes for name in node.input if name and index.is_constant(name)]


def _outputs(nodes: list[onnx.NodeProto]) -> list[str]:
    return [name for node in nodes for name in node.output if name]


def _layer_norm(index: GraphIndex, mean: onnx.NodeProto, off: set[str], symmetric16: set[str]) -> None:
    sub = _next(index, mean, "Sub") if mean.op_type == "ReduceMean" else None
    if sub is None or sub.input[0] != mean.input[0]:
        return
    readers = [use.node for use in index.uses(sub.output[0])]
    if len(readers) != 2:
        return
    power = next((n for n in readers if n.op_type == "Pow"), None)
    div = next((n for n in readers if n.op_type == "Div"), None)
    denominator = _chain(index, power, ("Pow", "ReduceMean", "Add", "Sqrt")) if power is not None else None
    if div is None or denominator is None or list(div.input[:2]) != [sub.output[0], denominator[-1].output[0]]:
        return
    ops = [mean, sub, *denominator, div]
    off.update(_outputs(ops[:-1]))
    off.update(_constants(index, ops))
    scaled = _chain(index, div, ("Div", "Mul"))
    if scaled is None:
        return
    mul = scaled[1]
    symmetric16.add(mul.input[1] if mul.input[0] == div.output[0] else mul.input[0])
    off.update(_outputs([div]))
    off.update(_constants(index, [div]))
    shifted = _chain(index, mul, ("Mul", "Add"), last_single=False)
    if shifted is not None:
        off.update(_outputs([mul]))
        off.update(_constants(index, [shifted[1]]))


def _divided(index: GraphIndex, x: str, denominator: str) -> list[onnx.NodeProto] | None:
    """AIMET's ``x / denominator`` forms: Div(x, b); Mul(x, Div(1, b)); Mul(x, Reciprocal(b)) (either order)."""
    uses = index.uses(denominator)
    if len(uses) != 1:
        return None
    op = uses[0].node
    if op.op_type == "Div" and list(op.input[:2]) == [x, denominator]:
        return [op]
    inverse = ((op.op_type == "Div" and _scalar(index, op.input[0], 1.0) and op.input[1] == denominator)
               or (op.op_type == "Reciprocal" and op.input[0] == denominator))
    mul = _next(index, op, "Mul") if inverse else None
    return [op, mul] if mul is not None and x in mul.input[:2] else None


def _rms_norm(index: GraphIndex, node: onnx.NodeProto, off: set[str]) -> None:
    if node.op_type == "RMSNormalization":
        ops = [node]
    else:
        squares = ((node.op_type == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1])
                   or (node.op_type == "Pow" and _scalar(index, node.input[1], 2.0)))
        first = _next(index, node) if squares else None
        denominator = _chain(index, first, ("ReduceMean", "Add"), last_single=False) if first is not None else None
        after = _next(index, denominator[-1]) if denominator is not None else None
        if after is None:
            return
        ops = [node, *(denominator or [])]
        x = node.input[0]
        if after.op_type == "Sqrt" and _next(index, after) is not None:
            divided = _divided(index, x, after.output[0])
            if divided is None:
                return
            ops += [after, *divided]
        elif after.op_type == "Pow" and _scalar(index, after.input[1], -0.5):
            mul = _next(index, after, "Mul")
            if mul is None or x not in mul.input[:2]:
                return
            ops += [after, mul]
        else:
            return
    casts, last = [], ops[-1]
    while (cast := _next(index, last, "Cast")) is not None:
        casts.append(cast)
        last = cast
    gamma = _next(index, last, "Mul")
    if gamma is not None:
        ops += [*casts, gamma]
    off.update(_outputs(ops[:-1]))
    off.update(_constants(index, ops[:-1]))  # the exponent and eps (aimet-onnx 2.42 turns them off too)


def _last_axis(index: GraphIndex, node: onnx.NodeProto, rank: int) -> bool:
    """Whether Softmax / ReduceMin ``node`` works on the last axis only (attribute or constant axes input)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "ReduceMin" and len(node.input) > 1 and node.input[1]:
        if not index.is_constant(node.input[1]):
            return False
        axes = [int(v) for v in np.asarray(index.constant_value(node.input[1])).reshape(-1)]
    else:
        value = attrs.get("axes", attrs.get("axis", -1))
        axes = [int(v) for v in np.asarray(value).reshape(-1)]
    return len(axes) == 1 and axes[0] % rank == rank - 1


def _masked_softmax(index: GraphIndex, softmax: onnx.NodeProto, off: set[str]) -> None:
    where = index.producer_of(softmax.input[0]) if softmax.op_type == "Softmax" else None
    if where is None or where.op_type != "Where" or len(where.input) != 3:
        return
    x, filled = where.input[1], where.input[2]
    add = index.producer_of(filled)
    if add is None or add.op_type != "Add" or len(add.input) != 2:
        return
    minimum = index.producer_of(add.input[0])
    fill = add.input[1]
    shape = index.shape.get(x)
    if (minimum is None or minimum.op_type != "ReduceMin" or minimum.input[0] != x or shape is None
            or len(shape) != 4 or not index.is_constant(fill)):
        return
    value = np.asarray(index.constant_value(fill))
    if value.size != 1 or not float(value.reshape(-1)[0]) <= -20:
        return
    if not (_last_axis(index, softmax, 4) and _last_axis(index, minimum, 4)):
        return
    off.update([minimum.output[0], add.output[0], where.output[0], fill])


def norm_pass_sites(index: GraphIndex, passes: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """``(tensors whose quantizers the configured passes turn off, constants made symmetric when 16-bit)``;
    ``passes`` is the config's ``supergroup_pass_list``."""
    off: set[str] = set()
    symmetric16: set[str] = set()
    for node in index.nodes:
        if "LayerNormalization" in passes:
            _layer_norm(index, node, off, symmetric16)
        if "RMSNormalization" in passes:
            _rms_norm(index, node, off)
        if "MaskedSoftmax" in passes:
            _masked_softmax(index, node, off)
    return off, symmetric16
