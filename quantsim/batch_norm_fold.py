"""AIMET's ``aimet_onnx.batch_norm_fold``: fold inference-mode BatchNormalization into the weighted layers next
to it, in place on the caller's model, before building a sim.

``QuantizationSimModel`` folds BatchNormalization on its own during preparation (``fold_batchnorm``); an AIMET
script calls this function first, as AIMET asks (its sim warns about unfolded BatchNormalization), and then
gets AIMET's tensor names: after a fold the layer keeps its own output name (the BatchNormalization's output
name survives only where it is a graph output).

Rules (AIMET 2.42's, checked against it on small models), with ``s = gamma / sqrt(var + eps)``:

1. **After a layer** (Conv, ConvTranspose, Gemm, MatMul with a constant 2-D weight and a 2-D input):
   ``W' = W * s`` on the output channels, ``b' = s * (b - mean) + beta``; a MatMul becomes a Gemm (AIMET's
   ``_matmul_to_gemm``; a ``MatMul`` in the node name becomes ``Gemm``) to hold the bias. The fold itself is
   `quantsim.prepare.batchnorm` (one home); its checks apply (the layer output feeds only the
   BatchNormalization, constant unshared parameters).
2. **Before a layer** (a BatchNormalization whose output only feeds a Conv with ``group`` 1 and no padding, or
   a Gemm / MatMul, directly or through one ``Flatten(axis=1)``; a MatMul read directly only with a 2-D
   input, whose channel axis is the one it contracts): with ``t = beta - s * mean`` per input
   channel, ``W' = W * s`` on the input channels and ``b' = b + sum(W * t)`` over them; a Flatten repeats each
   channel's ``s``/``t`` over its ``H*W`` features. Padding would pad the normalised input with 0, not the
   raw one, so padded Convs are refused, as are grouped Convs and ConvTranspose (AIMET's refusals).
3. Folds after a layer are tried first; a BatchNormalization is folded once.
4. Every BatchNormalization left is **rewritten** to ``gamma' = s``, ``beta' = beta - s * mean``, mean 0,
   var 1, epsilon 0 (same outputs up to float rounding; the quantized ``scale`` is then the whole per-channel
   factor, as in AIMET); a parameter another node reads too gets a new initializer.

The float model computes what it computed before, up to float rounding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantsim.errors import InvalidTypeError
from quantsim.graph.edit import constant_names, drop_unused_initializers, drop_value_info
from quantsim.graph.index import GraphIndex, node_attributes
from quantsim.prepare.batchnorm import fold_batchnorm_pairs

__all__ = ["BNLayer", "fold_all_batch_norms_to_weight"]


@dataclass
class BNLayer:
    """A folded BatchNormalization as AIMET returns it: the removed node and its ``gamma`` / ``beta``
    (one value per folded channel)."""

    bn_layer: onnx.NodeProto
    gamma: np.ndarray
    beta: np.ndarray


FoldedPairs = list[tuple[onnx.NodeProto, BNLayer]]


def fold_all_batch_norms_to_weight(model: Any) -> tuple[FoldedPairs, FoldedPairs]:
    """Fold every foldable BatchNormalization of ``model`` into the weight and bias of its layer, in place
    (module docstring for the rules); ``model`` is a ModelProto or a wrapper holding one as ``.model``
    (onnxruntime's / AIMET's ``ONNXModel``).

    Returns AIMET's pair of lists: ``(layer node, BNLayer)`` for the folds after a layer, then for the folds
    before a layer (the layer node is the one now in the graph)."""
    proto = model.model if not isinstance(model, onnx.ModelProto) and hasattr(model, "model") else model
    if not isinstance(proto, onnx.ModelProto):
        raise InvalidTypeError(f"fold_all_batch_norms_to_weight expects an onnx.ModelProto (or an object whose "
                               f".model is one), got {type(model).__name__}")
    _matmuls_to_gemm(proto)
    after = [(layer, BNLayer(bn, gamma, beta)) for layer, bn, gamma, beta in fold_batchnorm_pairs(proto)]
    before = []
    while (found := _next_input_fold(proto)) is not None:
        before.append(found)
    _rewrite_standalone(proto)
    live = {node.name: node for node in proto.graph.node}  # the nodes now in the graph (removals rebuild the list)
    return ([(live.get(layer.name, layer), bn) for layer, bn in after],
            [(live.get(layer.name, layer), bn) for layer, bn in before])


# 1. MatMul -> BatchNormalization: the MatMul becomes a Gemm -------------------------------------------------
def _matmuls_to_gemm(model: onnx.ModelProto) -> None:
    index = GraphIndex(model)
    constants = constant_names(model)
    for node in index.nodes:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        bn = index.single_consumer(node.output[0])
        weight = node.input[1]
        if (bn is None or bn.op_type != "BatchNormalization" or bn.input[0] != node.output[0]
                or weight not in constants or len(index.shape.get(weight) or ()) != 2
                or len(index.shape.get(node.input[0]) or ()) != 2 or len(index.uses(weight)) != 1
                or node_attributes(bn).get("training_mode", 0) or any(n not in constants for n in bn.input[1:5])):
            continue
        node.op_type = "Gemm"
        node.name = node.name.replace("MatMul", "Gemm")


# 2. BatchNormalization -> layer ----------------------------------------------------------------------------
def _next_input_fold(model: onnx.ModelProto) -> tuple[onnx.NodeProto, BNLayer] | None:
    index = GraphIndex(model)
    constants = constant_names(model)
    for bn in index.nodes:
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
            continue
        found = _input_fold_target(index, constants, bn)
        if found is not None:
            layer, flatten = found
            gamma, beta = (index.constant_value(n).reshape(-1).copy() for n in bn.input[1:3])
            repeat = _input_features(index, layer) // gamma.size  # through a Flatten: one value per feature, as AIMET
            _fold_into_input(model, index, bn, layer, flatten)
            return layer, BNLayer(bn, np.repeat(gamma, repeat), np.repeat(beta, repeat))
    return None


def _input_fold_target(index: GraphIndex, constants: set[str], bn: onnx.NodeProto):
    """``(layer, Flatten or None)`` when ``bn`` can be folded into the layer reading it (rule 2)."""
    if node_attributes(bn).get("training_mode", 0) or sum(1 for n in bn.output if n) != 1:
        return None
    if any(name not in constants for name in bn.input[1:5]):
        return None
    channels = int(np.prod(index.shape.get(bn.input[1]) or (0,)))
    if any(int(np.prod(index.shape.get(n) or (0,))) != channels for n in bn.input[1:5]) or channels == 0:
        return None
    layer, flatten = index.single_consumer(bn.output[0]), None
    if layer is not None and layer.op_type == "Flatten" and node_attributes(layer).get("axis", 1) == 1:
        flatten, layer = layer, index.single_consumer(layer.output[0])
    if layer is None or layer.input[0] != (flatten or bn).output[0] or list(layer.input).count(layer.input[0]) != 1:
        return None
    attrs = node_attributes(layer)
    if layer.op_type == "Conv":
        padded = any(attrs.get("pads", [])) or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID")
        if flatten is not None or padded or attrs.get("group", 1) != 1:
            return None
    elif layer.op_type not in ("Gemm", "MatMul") or attrs.get("transA", 0):
        return None
    params = [layer.input[1]] + ([layer.input[2]] if len(layer.input) > 2 and layer.input[2] else [])
    if any(p not in constants or len(index.uses(p)) != 1 for p in params):
        return None
    if layer.op_type == "MatMul" and len(index.shape.get(layer.input[1]) or ()) != 2:
        return None
    if layer.op_type == "MatMul" and flatten is None and len(index.shape.get(bn.input[0]) or ()) != 2:
        return None  # rank > 2: the BatchNormalization scales axis 1, the MatMul contracts the last (and no Gemm)
    features = _input_features(index, layer)
    if not features or features % channels or (flatten is None and features != channels):
        return None
    return layer, flatten


def _input_features(index: GraphIndex, layer: onnx.NodeProto) -> int:
    """Input channels (Conv) or features (Gemm / MatMul) of ``layer``'s weight; 0 when its shape is unknown."""
    weight = index.shape.get(layer.input[1]) or ()
    if not weight:
        return 0
    return weight[1] if layer.op_type == "Conv" or node_attributes(layer).get("transB", 0) else weight[0]


def _fold_into_input(model: onnx.ModelProto, index: GraphIndex, bn: onnx.NodeProto, layer: onnx.NodeProto,
                     flatten: onnx.NodeProto | None) -> None:
    graph = model.graph
    gamma, beta, mean, var = (index.constant_value(n).astype(np.float64).reshape(-1) for n in bn.input[1:5])
    scale = gamma / np.sqrt(var + node_attributes(bn).get("epsilon", 1e-5))
    shift = beta - scale * mean
    weight_tensor = index.initializers[layer.input[1]]
    weight = index.constant_value(layer.input[1]).astype(np.float64)
    attrs = node_attributes(layer)
    if layer.op_type == "MatMul":  # a Gemm holds the bias
        layer.op_type = "Gemm"
        layer.name = layer.name.replace("MatMul", "Gemm")
    in_axis = 1 if layer.op_type == "Conv" or attrs.get("transB", 0) else 0
    repeat = weight.shape[in_axis] // scale.size
    scale, shift = np.repeat(scale, repeat), np.repeat(shift, repeat)
    view = [1] * weight.ndim
    view[in_axis] = -1
    out_axis = 1 - in_axis if layer.op_type == "Gemm" else 0
    moved = np.moveaxis(weight * shift.reshape(view), out_axis, 0)
    bias_shift = moved.reshape(moved.shape[0], -1).sum(axis=1) * (attrs.get("alpha", 1.0) if layer.op_type == "Gemm" else 1.0)
    weight_tensor.CopyFrom(numpy_helper.from_array((weight * scale.reshape(view)).astype(
        helper.tensor_dtype_to_np_dtype(weight_tensor.data_type)), weight_tensor.name))
    dtype = helper.tensor_dtype_to_np_dtype(weight_tensor.data_type)
    if len(layer.input) > 2 and layer.input[2]:
        bias = index.constant_value(layer.input[2]).astype(np.float64)
        if layer.op_type == "Gemm":
            bias = attrs.get("beta", 1.0) * bias
            _set_float_attr(layer, "beta", 1.0)
        new_bias = (bias + np.broadcast_to(bias_shift, np.broadcast_shapes(bias.shape, bias_shift.shape)))
        index.initializers[layer.input[2]].CopyFrom(numpy_helper.from_array(new_bias.astype(dtype), layer.input[2]))
    else:
        name = index.fresh_name(f"{layer.name or layer.output[0]}.bias")
        graph.initializer.append(numpy_helper.from_array(bias_shift.astype(dtype), name))
        if layer.op_type == "Gemm":
            _set_float_attr(layer, "beta", 1.0)
        layer.input.append(name)
    (flatten or layer).input[0] = bn.input[0]
    drop_value_info(graph, {bn.output[0]})
    graph.node.remove(bn)
    drop_unused_initializers(graph, set(bn.input[1:5]))


def _set_float_attr(node: onnx.NodeProto, name: str, value: float) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute(name, value)])


# 4. the BatchNormalizations left: mean 0, var 1, epsilon 0 ----------------------------------------------------
def _rewrite_standalone(model: onnx.ModelProto) -> None:
    index = GraphIndex(model)
    constants = constant_names(model)
    for bn in index.nodes:
        if bn.op_type != "BatchNormalization" or any(n not in constants for n in bn.input[1:5]):
            continue
        if node_attributes(bn).get("training_mode", 0):
            continue
        dtype = index.constant_value(bn.input[1]).dtype
        gamma, beta, mean, var = (index.constant_value(n).astype(np.float64) for n in bn.input[1:5])
        scale = gamma / np.sqrt(var + node_attributes(bn).get("epsilon", 1e-5))
        values = (scale, beta - mean * scale, np.zeros_like(scale), np.ones_like(scale))
        for slot, value in zip(range(1, 5), values):
            name = bn.input[slot]
            tensor = numpy_helper.from_array(value.astype(dtype), name)
            if len(index.uses(name)) == 1 and name in index.initializers:
                index.initializers[name].CopyFrom(tensor)
            else:  # shared with another node: this one gets its own copy
                tensor.name = index.fresh_name(name)
                model.graph.initializer.append(tensor)
                bn.input[slot] = tensor.name
        _set_float_attr(bn, "epsilon", 0.0)
    drop_unused_initializers(model.graph, {n for bn in index.nodes if bn.op_type == "BatchNormalization"
                                           for n in bn.input[1:5]})
