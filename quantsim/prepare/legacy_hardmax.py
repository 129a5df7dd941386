"""Keep what a Hardmax before opset 13 computes when onnx's version converter lifts it.

Before opset 13, Softmax, LogSoftmax and Hardmax coerced their input to 2-D at ``axis`` (default 1) and
worked on the flattened trailing block; from 13 they work along the one axis. onnx's version converter
(1.23) rewrites Softmax and LogSoftmax as ``Flatten -> op -> Reshape`` but leaves Hardmax as it is, so an
opset-9 Hardmax whose axis is not the last one picks one maximum per row of the trailing block before the
conversion and one per slice along ``axis`` after it.

Rule (`flatten_legacy_hardmax`, run on the model before the conversion, subgraphs included): a default-domain
Hardmax whose ``axis`` is not known to be the input's last axis becomes ``Flatten(axis) -> Hardmax(axis=1)
-> Reshape(Shape(x))``, written at the model's own opset (every op exists there), under the Hardmax's name
and output; the rewrite is exact whatever the rank.
"""
from __future__ import annotations

import onnx
from onnx import helper

from quantsim.graph.edit import graphs_within

__all__ = ["flatten_legacy_hardmax"]


def _ranks(graph: onnx.GraphProto) -> dict[str, int]:
    values = list(graph.input) + list(graph.value_info) + list(graph.output)
    return {v.name: len(v.type.tensor_type.shape.dim) for v in values
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}


def flatten_legacy_hardmax(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` (default-domain ``opset``) with its Hardmax nodes rewritten as the module docstring says:
    a copy when it has any below opset 13, else ``model`` itself."""
    if opset >= 13 or not any(n.op_type == "Hardmax" for g in graphs_within(model.graph) for n in g.node):
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for graph in graphs_within(model.graph):
        if not any(n.op_type == "Hardmax" and n.domain in ("", "ai.onnx") for n in graph.node):
            continue
        ranks = _ranks(graph)
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            if node.op_type != "Hardmax" or node.domain not in ("", "ai.onnx"):
                nodes.append(node)
                continue
            axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
            rank = ranks.get(node.input[0])
            if rank is not None and axis % rank == rank - 1:
                nodes.append(node)
                continue
            base = node.name or node.output[0]
            shape, flat, hard = (f"{base}/legacy_{part}" for part in ("shape", "flat", "hardmax"))
            nodes += [helper.make_node("Shape", [node.input[0]], [shape], name=f"{base}/legacy_shape"),
                      helper.make_node("Flatten", [node.input[0]], [flat], name=f"{base}/legacy_flatten", axis=axis),
                      helper.make_node("Hardmax", [flat], [hard], name=node.name, axis=1),
                      helper.make_node("Reshape", [hard, shape], list(node.output), name=f"{base}/legacy_reshape")]
        del graph.node[:]
        graph.node.extend(nodes)
    return model
