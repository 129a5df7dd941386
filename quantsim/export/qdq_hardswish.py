"""QDQ export: ``x * HardSigmoid(x)`` on a dequantized input written as the one ``HardSwish`` op.

Below opset 14 (no HardSwish) `quantsim.prepare.activations` spells a HardSwish ``Mul(x, HardSigmoid(x,
alpha=1/6, beta=0.5))``, and the sim runs it so. In a QDQ model ``x`` is a DequantizeLinear output that two
nodes read, and onnxruntime gives every reader of a DequantizeLinear its own copy before it groups node
units: the export of PP-OCRv4 det ran 24 duplicate DequantizeLinear nodes over full feature maps. ONNX
defines ``HardSwish(x)`` as exactly ``x * HardSigmoid(x, alpha=1/6, beta=0.5)`` (its function body, which
onnxruntime inlines after the Q/DQ passes), so the one op computes the same numbers bit for bit and leaves
one reader of the DequantizeLinear (one pass over the tensor fewer per HardSwish).

The pattern is rewritten when the HardSigmoid's alpha is float32(1/6) and beta 0.5 exactly, its output is
read by that Mul only, and ``x`` is dequantized. The model's opset must be at least 14; an opset-13 model
is raised to 14, whose changes to opset-13 ops are new types and attributes whose defaults keep the
opset-13 meaning (Reshape's allowzero, the recurrent ops' layout, BatchNormalization's training_mode); a
model below 13 is left as it is.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from quantsim.graph.edit import drop_value_info
from quantsim.graph.index import GraphIndex, node_attributes

__all__ = ["hardswish_for_gated_products"]

_ALPHA, _BETA = np.float32(1.0 / 6.0), np.float32(0.5)


def _gate_of(index: GraphIndex, mul: onnx.NodeProto) -> tuple[str, onnx.NodeProto] | None:
    """``(x, HardSigmoid node)`` when ``mul`` is ``x * HardSigmoid(x)`` with HardSwish's constants, the gate
    read by ``mul`` only and ``x`` dequantized."""
    if mul.op_type != "Mul" or len(mul.input) != 2:
        return None
    for x, gate in (mul.input, mul.input[::-1]):
        node = index.producer_of(gate)
        if node is None or node.op_type != "HardSigmoid" or node.input[0] != x:
            continue
        attrs = node_attributes(node)
        if np.float32(attrs.get("alpha", 0.2)) != _ALPHA or np.float32(attrs.get("beta", 0.5)) != _BETA:
            continue
        if len(index.uses(gate)) != 1 or gate in index.graph_outputs:
            continue
        source = index.producer_of(x)
        if source is not None and source.op_type == "DequantizeLinear":
            return x, node
    return None


def hardswish_for_gated_products(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace ``Mul(x, HardSigmoid(x))`` on a dequantized ``x`` by ``HardSwish(x)`` (module docstring)."""
    index = GraphIndex(model)
    opset = index.opset()
    if opset < 13:
        return model
    replaced: dict[int, onnx.NodeProto] = {}
    gates: set[int] = set()
    for node in index.nodes:
        found = _gate_of(index, node)
        if found is None:
            continue
        x, gate = found
        replaced[id(node)] = helper.make_node("HardSwish", [x], [node.output[0]], name=node.name)
        gates.add(id(gate))
    if not replaced:
        return model
    nodes = [replaced.get(id(n), n) for n in model.graph.node if id(n) not in gates]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    drop_value_info(model.graph, {n.output[0] for n in index.nodes if id(n) in gates})
    if opset < 14:
        for entry in model.opset_import:
            if entry.domain in ("", "ai.onnx"):
                entry.version = 14
    return model
