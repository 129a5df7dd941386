"""Graph passes run before quantizers are placed. Each takes a ModelProto it may modify (the caller
passes a private copy) and returns ``(model, modified)``; each keeps the model's outputs unchanged.
"""
from __future__ import annotations

from collections import Counter

import onnx
from onnx import numpy_helper

__all__ = ["name_nodes", "constants_to_initializers", "infer_shapes"]


def name_nodes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Give every node a unique, stable name.

    Rules: a unique non-empty name is kept; an empty or repeated name becomes ``/<op_type>`` or, if
    taken, ``/<op_type>_<i>`` with the smallest free ``i`` (the first holder of a repeated name keeps
    it), the naming AIMET applies, but never on the caller's model.
    """
    seen: set[str] = set()
    taken = Counter(n.name for n in model.graph.node if n.name)
    modified = False
    for node in model.graph.node:
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base = f"/{node.op_type}"
        candidate, counter = base, 0
        while candidate in seen or (candidate != node.name and taken.get(candidate)):
            counter += 1
            candidate = f"{base}_{counter}"
        node.name = candidate
        seen.add(candidate)
        modified = True
    return model, modified


def constants_to_initializers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Turn top-level ``Constant`` nodes holding a tensor (``value``, ``value_float(s)``,
    ``value_int(s)``) into initializers of the same name, so weights exported that way (Paddle, some
    PyTorch exports) are seen as parameters and can be quantized per channel.
    """
    graph = model.graph
    keep, modified = [], False
    for node in graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
            keep.append(node)
            continue
        attr = node.attribute[0]
        if attr.name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(attr.t)
        elif attr.name in ("value_float", "value_floats", "value_int", "value_ints"):
            tensor = numpy_helper.from_array(_attribute_array(attr))
        else:
            keep.append(node)
            continue
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        modified = True
    if modified:
        del graph.node[:]
        graph.node.extend(keep)
    return model, modified


def _attribute_array(attr: onnx.AttributeProto):
    import numpy as np

    value = onnx.helper.get_attribute_value(attr)
    dtype = np.float32 if "float" in attr.name else np.int64
    return np.asarray(value, dtype=dtype)


def infer_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """ONNX shape and type inference (non-strict, with data propagation); a failure keeps the model
    as it is: later steps fall back to observing types by running it.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is best effort by contract
        return model, False
    return inferred, True
