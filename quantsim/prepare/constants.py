"""``constants_to_initializers``: weights held in ``Constant`` nodes become initializers.

Pre: none. Post: no top-level default-domain ``Constant`` node holds a dense tensor or number.
Rules:
1. a top-level ``Constant`` (domain ``""``/``ai.onnx``) with a ``value`` tensor, or a
   ``value_float(s)`` / ``value_int(s)`` attribute, is removed and an initializer named after its
   output takes its place (float32 for floats, int64 for ints, as the ONNX spec defines);
2. ``sparse_value`` and ``value_string(s)`` constants are kept as nodes;
3. outputs are unchanged bit for bit.
Weights exported this way (Paddle, some PyTorch exports) are then seen as parameters and can be
quantized per channel.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ["constants_to_initializers"]

_NUMBER_ATTRIBUTES = {"value_float": np.float32, "value_floats": np.float32,
                      "value_int": np.int64, "value_ints": np.int64}


def constants_to_initializers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Turn tensor-valued ``Constant`` nodes into initializers of the same name (rules above)."""
    graph = model.graph
    keep, modified = [], False
    for node in graph.node:
        tensor = _constant_tensor(node)
        if tensor is None:
            keep.append(node)
            continue
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        modified = True
    if modified:
        del graph.node[:]
        graph.node.extend(keep)
    return model, modified


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value":
        tensor = onnx.TensorProto()
        tensor.CopyFrom(attr.t)
        return tensor
    if attr.name in _NUMBER_ATTRIBUTES:
        value = onnx.helper.get_attribute_value(attr)
        return numpy_helper.from_array(np.asarray(value, dtype=_NUMBER_ATTRIBUTES[attr.name]))
    return None
