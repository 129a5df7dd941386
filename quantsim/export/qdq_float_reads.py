"""Reading a QDQ export's "float reads" back as DequantizeLinear, for `from_onnx_qdq`.

Where an op with a float weight (disabled or float16 weight quantizer) reads a quantized activation, the QDQ
export (`quantsim.export.qdq.protect_float_weights`) writes the activation's DequantizeLinear as
``Cast(codes, to=float) -> Sub(float zero point) -> Mul(scale)``: the same values, which onnxruntime's
WeightBiasQuantization does not touch. `restore_float_reads` turns such a chain back into the pair it spells:

* if the QuantizeLinear producing the codes also feeds a DequantizeLinear with the same scale and zero
  point, readers of the chain read that DequantizeLinear's output instead;
* else the chain becomes ``DequantizeLinear(codes, scale, zero point)`` writing the chain's output.

A chain matches only when its Mul multiplies by the QuantizeLinear's own scale and its Sub (absent for a zero
point of 0) subtracts the QuantizeLinear's zero point, both constants equal in value: any other Cast/Sub/Mul
is the model's own arithmetic and stays.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from quantsim.graph.index import GraphIndex, node_attributes

__all__ = ["restore_float_reads"]


def _value(index: GraphIndex, name: str) -> np.ndarray | None:
    return np.asarray(index.constant_value(name)) if name and index.is_constant(name) else None


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is not None and b is not None and a.size == b.size and bool(np.all(a.astype(np.float64).reshape(-1)
                                                                              == b.astype(np.float64).reshape(-1)))


def _chain(index: GraphIndex, mul: onnx.NodeProto) -> tuple[onnx.NodeProto, list[onnx.NodeProto]] | None:
    """``(QuantizeLinear, [Cast, (Sub,) Mul])`` when ``mul`` ends a float read of that Q's codes."""
    if mul.op_type != "Mul" or len(mul.input) != 2:
        return None
    previous = index.producer_of(mul.input[0])
    sub = previous if previous is not None and previous.op_type == "Sub" and len(previous.input) == 2 else None
    cast = index.producer_of(sub.input[0]) if sub is not None else previous
    if cast is None or cast.op_type != "Cast" or node_attributes(cast).get("to") != TensorProto.FLOAT:
        return None
    q = index.producer_of(cast.input[0])
    if q is None or q.op_type != "QuantizeLinear" or not _same(_value(index, mul.input[1]), _value(index, q.input[1])):
        return None
    zero = _value(index, q.input[2]) if len(q.input) > 2 and q.input[2] else None
    if sub is None:
        if zero is not None and np.any(zero.astype(np.float64)):
            return None
    elif not _same(_value(index, sub.input[1]), zero if zero is not None else np.zeros(1)):
        return None
    steps = [cast] + ([sub] if sub is not None else []) + [mul]
    if any(index.single_consumer(step.output[0]) is None for step in steps[:-1]):
        return None
    return q, steps


def restore_float_reads(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite each float read of a QuantizeLinear's codes as its DequantizeLinear, in place (module docstring)."""
    index = GraphIndex(model)
    removed: set[int] = set()
    added: dict[int, onnx.NodeProto] = {}
    renames: dict[str, str] = {}
    for node in index.nodes:
        found = _chain(index, node)
        if found is None:
            continue
        q, steps = found
        twin = next((u.node for u in index.uses(q.output[0]) if u.node.op_type == "DequantizeLinear"
                     and list(u.node.input[1:]) == list(q.input[1:])), None)
        removed.update(id(step) for step in steps)
        if twin is not None and node.output[0] not in index.graph_outputs:
            renames[node.output[0]] = twin.output[0]
        else:
            added[id(node)] = helper.make_node("DequantizeLinear", [q.output[0], *q.input[1:]], [node.output[0]],
                                               name=node.name or f"{node.output[0]}/dequantize")
    if not removed:
        return model
    rebuilt = []
    for node in model.graph.node:
        if id(node) in added:
            rebuilt.append(added[id(node)])
        elif id(node) not in removed:
            for i, name in enumerate(node.input):
                if name in renames:
                    node.input[i] = renames[name]
            rebuilt.append(node)
    del model.graph.node[:]
    model.graph.node.extend(rebuilt)
    return model
