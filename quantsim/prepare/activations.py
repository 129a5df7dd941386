"""``fuse_activations``: decomposed hard / leaky activations become the ONNX ops they spell out.

Exporters (Paddle, some PyTorch versions) write HardSwish and HardSigmoid as elementwise chains. Left as
they are, every link gets an activation quantizer (three extra rounding points inside one activation
function, and three more tensors to observe during calibration), and integer hardware, which applies
the whole function as one lookup table, never sees those intermediate values.

Rules (each intermediate tensor must have exactly one consumer and not be a graph output; constants
are scalar initializers):

* HardSigmoid: ``Div(Clip(Add(x, 3), 0, 6), 6)`` or ``Mul(Clip(Add(x, 3), 0, 6), 1/6)`` ->
  ``HardSigmoid(x, alpha=1/6, beta=0.5)`` since ``clip(x + 3, 0, 6) / 6 = max(0, min(1, x/6 + 1/2))``.
* HardSwish: ``Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)`` (or ``Mul(..., 1/6)``) -> ``HardSwish(x)`` at
  opset >= 14, else ``Mul(x, HardSigmoid(x))`` (placement then quantizes only the product).

* LeakyRelu: ``Max(x, Mul(x, a))`` with a scalar ``0 < a < 1`` (TensorFlow-style exports) ->
  ``LeakyRelu(x, alpha=a)``, since ``max(x, a x)`` is ``x`` for ``x >= 0`` and ``a x`` below.

The fused op writes the chain's output name; outputs agree up to float rounding (a few ulp).
Pre: node names unique, topologically sorted. Post: no matched chain is left.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from quantsim.graph.edit import drop_unused_initializers, drop_value_info
from quantsim.graph.index import GraphIndex

__all__ = ["fuse_activations"]


def _scalar(index: GraphIndex, name: str, value: float) -> bool:
    if not name or not index.is_constant(name):
        return False
    array = index.constant_value(name)
    return array.size == 1 and bool(np.isclose(float(array.reshape(())), value, rtol=1e-6, atol=0))


def _only_use(index: GraphIndex, name: str) -> onnx.NodeProto | None:
    return index.single_consumer(name)


def _divided_by_six(index: GraphIndex, node: onnx.NodeProto) -> bool:
    if node.op_type == "Div":
        return _scalar(index, node.input[1], 6.0)
    if node.op_type == "Mul":
        return any(_scalar(index, n, 1.0 / 6.0) for n in node.input)
    return False


def _relu6_of_x_plus_3(index: GraphIndex, clip: onnx.NodeProto) -> str | None:
    """``x`` when ``clip`` computes ``clip(x + 3, 0, 6)`` with a single-use ``x + 3``."""
    if clip.op_type != "Clip" or len(clip.input) < 3:
        return None
    if not (_scalar(index, clip.input[1], 0.0) and _scalar(index, clip.input[2], 6.0)):
        return None
    add = index.producer_of(clip.input[0])
    if add is None or add.op_type != "Add" or _only_use(index, clip.input[0]) is not clip:
        return None
    others = [n for n in add.input if not _scalar(index, n, 3.0)]
    return others[0] if len(others) == 1 else None


def _leaky_slope(index: GraphIndex, node: onnx.NodeProto) -> tuple[str, onnx.NodeProto, float] | None:
    """``(x, mul, a)`` when ``node`` is ``Max(x, Mul(x, a))`` with a scalar ``0 < a < 1`` and a single-use product."""
    if node.op_type != "Max" or len(node.input) != 2:
        return None
    for slot in (0, 1):
        x, product = node.input[1 - slot], node.input[slot]
        mul = index.producer_of(product)
        if mul is None or mul.op_type != "Mul" or x not in mul.input or _only_use(index, product) is not node:
            continue
        others = [n for n in mul.input if n != x]
        if len(others) != 1 or not index.is_constant(others[0]) or index.constant_value(others[0]).size != 1:
            continue
        slope = float(index.constant_value(others[0]).reshape(()))
        if 0.0 < slope < 1.0:
            return x, mul, slope
    return None


def fuse_activations(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Replace decomposed HardSwish / HardSigmoid / LeakyRelu chains (module docstring)."""
    index = GraphIndex(model)
    opset = index.opset()
    remove: set[int] = set()  # id() of nodes: the pass also works on unnamed nodes
    replace: dict[int, onnx.NodeProto] = {}
    for node in index.nodes:
        leaky = _leaky_slope(index, node)
        if leaky is not None and id(leaky[1]) not in remove:
            source, mul, slope = leaky
            replace[id(node)] = helper.make_node("LeakyRelu", [source], [node.output[0]], name=node.name, alpha=slope)
            remove.add(id(mul))
    for clip in index.nodes:
        x = _relu6_of_x_plus_3(index, clip)
        if x is None:
            continue
        add = index.producer_of(clip.input[0])
        after = _only_use(index, clip.output[0])
        if after is None:
            continue
        if _divided_by_six(index, after):  # HardSigmoid
            replace[id(after)] = helper.make_node("HardSigmoid", [x], [after.output[0]], name=after.name,
                                                  alpha=1.0 / 6.0, beta=0.5)
            remove.update({id(add), id(clip)})
            continue
        if after.op_type != "Mul" or sorted(after.input) != sorted([x, clip.output[0]]):
            continue
        last = _only_use(index, after.output[0])
        if last is None or not _divided_by_six(index, last):
            continue
        if opset >= 14:
            replace[id(last)] = helper.make_node("HardSwish", [x], [last.output[0]], name=last.name)
            remove.update({id(add), id(clip), id(after)})
        else:  # HardSwish needs opset 14: x * HardSigmoid(x)
            gate = index.fresh_name(f"{clip.output[0]}/hard_sigmoid")
            replace[id(clip)] = helper.make_node("HardSigmoid", [x], [gate], name=clip.name, alpha=1.0 / 6.0, beta=0.5)
            replace[id(last)] = helper.make_node("Mul", [x, gate], [last.output[0]], name=last.name)
            remove.update({id(add), id(after)})
    if not replace:
        return model, False
    stale = {o for n in index.nodes if id(n) in remove for o in n.output}
    nodes = [replace.get(id(n), n) for n in model.graph.node if id(n) not in remove]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    drop_unused_initializers(model.graph, {t.name for t in model.graph.initializer})
    drop_value_info(model.graph, stale)
    return model, True
