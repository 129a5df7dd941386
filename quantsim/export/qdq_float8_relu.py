"""A Relu or Clip feeding a float8 QuantizeLinear, spelled so that onnxruntime keeps it.

onnxruntime's ``ReluQuantRewrite`` and ``ClipQuantRewrite`` (1.32, default in every session) drop a
``Relu`` / ``Clip`` whose output only feeds a QuantizeLinear when the quantizer's zero point makes the clamp
redundant, which is true of uint8/int8 grids. With a float8 zero point the test misfires: float8 codes
carry negative values, the Relu is dropped anyway, and the model computes something else (a Conv -> Relu ->
float8 Q/DQ -> Conv net: output wrong by 4.7 of 5.5 in a default session). In a float16 model the Relu
reaches the QuantizeLinear through a ``Cast`` to float32, which onnxruntime removes first (an MLP: output
wrong by 1.5 of 1.9), so Casts between them count too. The sim's own sessions disable
both rewrites (`quantsim.graph.session`), but a user's default session cannot be relied on to.

The exported QDQ model therefore writes such a ``Relu(x)`` as ``Max(x, 0)`` and such a ``Clip(x, lo, hi)``
as ``Min(Max(x, lo), hi)``: the same values in every runtime (``Max``/``Min`` of float tensors are exact,
and NaN propagates as through Relu), which the rewrites do not match. Graph inputs, outputs and node
names are unchanged. `restore_relus_before_float8` undoes the rewrite when such a model is read back
(`quantsim.export.qdq_import`), so the imported float model has the ops it was exported from.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim.graph.index import GraphIndex

__all__ = ["keep_relus_before_float8", "restore_relus_before_float8"]

_FLOAT8 = frozenset({TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
                     TensorProto.FLOAT8E5M2FNUZ})


def _float8_quantize(index: GraphIndex, node: onnx.NodeProto) -> bool:
    if node.op_type != "QuantizeLinear":
        return False
    return index.code_type(node) in _FLOAT8


_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})


def _feeds_float8_quantize(index: GraphIndex, tensor: str, casts_left: int = 2) -> bool:
    """Whether ``tensor`` is read by a float8 QuantizeLinear, directly or through float-to-float Casts (a
    float16 model's ``Relu -> Cast(float) -> Q``: onnxruntime removes such Casts before the rewrite runs)."""
    for use in index.uses(tensor):
        if _float8_quantize(index, use.node):
            return True
        if (casts_left and use.node.op_type == "Cast"
                and next((a.i for a in use.node.attribute if a.name == "to"), None) in _FLOAT_TYPES
                and _feeds_float8_quantize(index, use.node.output[0], casts_left - 1)):
            return True
    return False


def keep_relus_before_float8(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite (in place) each Relu/Clip read by a float8 QuantizeLinear as Max/Min (module docstring)."""
    index = GraphIndex(model)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    constants: list[onnx.TensorProto] = []
    for position, node in enumerate(model.graph.node):
        if node.op_type not in ("Relu", "Clip") or not node.input or not node.input[0]:
            continue
        if not _feeds_float8_quantize(index, node.output[0]):
            continue
        dtype = index.elem_type.get(node.input[0], TensorProto.FLOAT)
        if node.op_type == "Relu":
            zero = index.fresh_name(f"{node.name or node.output[0]}/zero")
            constants.append(numpy_helper.from_array(np.zeros((), helper.tensor_dtype_to_np_dtype(dtype)), zero))
            replaced[position] = [helper.make_node("Max", [node.input[0], zero], [node.output[0]], name=node.name)]
            continue
        bounds = list(node.input[1:3]) + [""] * (3 - len(node.input))
        current, steps = node.input[0], []
        for op, bound in (("Max", bounds[0]), ("Min", bounds[1])):
            if bound:
                steps.append((op, bound))
        if not steps:  # a Clip without bounds is an identity: onnxruntime's rewrite keeps the values
            continue
        nodes = []
        for i, (op, bound) in enumerate(steps):
            last = i == len(steps) - 1
            out = node.output[0] if last else index.fresh_name(f"{node.output[0]}/{op.lower()}")
            name = node.name if last else index.fresh_name(f"{node.name or node.output[0]}/{op.lower()}")
            nodes.append(helper.make_node(op, [current, bound], [out], name=name))
            current = out
        replaced[position] = nodes
    if not replaced:
        return model
    rebuilt = []
    for position, node in enumerate(model.graph.node):
        rebuilt.extend(replaced.get(position, [node]))
    del model.graph.node[:]
    model.graph.node.extend(rebuilt)
    model.graph.initializer.extend(constants)
    return model


def _scalar(index: GraphIndex, name: str) -> float | None:
    if not name or not index.is_constant(name):
        return None
    value = index.constant_value(name)
    return float(value.reshape(())) if value.size == 1 else None


def restore_relus_before_float8(model: onnx.ModelProto) -> onnx.ModelProto:
    """Turn ``Max(x, 0)`` back into ``Relu(x)`` and ``Min(Max(x, lo), hi)`` (or one of the two) back into
    ``Clip(x, lo, hi)`` where the result feeds a float8 QuantizeLinear (in place; the inverse of
    `keep_relus_before_float8`, the same values either way)."""
    index = GraphIndex(model)
    replaced: dict[int, onnx.NodeProto | None] = {}
    positions = {id(node): i for i, node in enumerate(model.graph.node)}
    for position, node in enumerate(model.graph.node):
        if node.op_type not in ("Max", "Min") or len(node.input) != 2:
            continue
        if not _feeds_float8_quantize(index, node.output[0]):
            continue
        bound = _scalar(index, node.input[1])
        if bound is None:
            continue
        found = index.producer_of(node.input[0]) if node.op_type == "Min" else None
        inner = found if found is not None and found.op_type == "Max" and len(found.input) == 2 \
            and _scalar(index, found.input[1]) is not None and index.single_consumer(found.output[0]) is node else None
        if inner is not None:
            replaced[positions[id(inner)]] = None
            replaced[position] = helper.make_node("Clip", [inner.input[0], inner.input[1], node.input[1]],
                                                  [node.output[0]], name=node.name)
        elif node.op_type == "Max" and bound == 0.0:
            replaced[position] = helper.make_node("Relu", [node.input[0]], [node.output[0]], name=node.name)
        else:
            lo, hi = (node.input[1], "") if node.op_type == "Max" else ("", node.input[1])
            replaced[position] = helper.make_node("Clip", [node.input[0], lo, hi], [node.output[0]], name=node.name)
    if not replaced:
        return model
    rebuilt = [replaced.get(i, node) for i, node in enumerate(model.graph.node)]
    del model.graph.node[:]
    model.graph.node.extend(n for n in rebuilt if n is not None)
    return model
