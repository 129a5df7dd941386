"""``fold_batchnorm``: an inference-mode BatchNormalization after Conv / ConvTranspose / Gemm is folded
into that layer's weight and bias.

Derivation. BatchNormalization computes, per channel ``c`` of its input ``y``,
    bn(y)_c = gamma_c * (y_c - mean_c) / sqrt(var_c + eps) + beta_c = s_c * y_c + (beta_c - s_c * mean_c)
with ``s = gamma / sqrt(var + eps)``. When ``y = w * x + b`` is linear with output channel ``c``,
    bn(y)_c = (s_c * w_c) * x + (s_c * (b_c - mean_c) + beta_c)
so ``w' = w * s`` along the output-channel axis and ``b' = (b - mean) * s + beta`` (``b = 0`` if absent).
The output-channel axis of the weight is
- Conv: ``W[M, C/group, k...]``, axis 0;
- ConvTranspose: ``W[C, M/group, k...]``; output channel ``g * M/group + j`` is column ``j`` of the
  rows of group ``g``, so ``W`` is viewed as ``[group, C/group, M/group, k...]`` and scaled by
  ``s`` viewed as ``[group, 1, M/group, 1...]``;
- Gemm: ``Y = alpha * A' B' + beta_g * C``: ``B[K, N]`` scaled on axis 1, or ``B[N, K]`` on axis 0
  when ``transB = 1``; ``alpha`` commutes with ``s``; the new ``C' = beta_g * C * s + (beta - mean * s)``
  (broadcast to ``[N]`` or ``C``'s shape) and ``beta_g`` becomes 1.
Arithmetic is in float64, results are cast back to the weight's type.

Pre: node names unique, nodes topologically sorted. Post: every foldable pair is one layer whose output
keeps the BatchNormalization's output name; outputs equal up to float rounding.
Match: a default-domain BatchNormalization whose input is output 0 of a Conv, ConvTranspose or Gemm.
Check (a refusal leaves the pair unchanged and is reported as a ``PrepareWarning`` with the reason;
``find_batchnorm_folds`` lists every decision):
1. the BatchNormalization is in inference mode (``training_mode`` 0, one output);
2. the layer's output feeds only the BatchNormalization and is not a graph output;
3. scale, B, mean and var are constant initializers (not graph inputs) with one value per output channel;
4. the weight (and the bias / Gemm C, if present) is a floating-point constant initializer that no other
   node reads (shared weights would change the other reader);
5. the weight's shape matches the op (ConvTranspose: input channels divisible by ``group``).
Rewrite: weight and bias replaced in place (a missing bias is added as ``<layer>.bias``), the layer takes
the BatchNormalization's output name, the BatchNormalization and its now unused parameters are removed.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import GraphIndex, node_attributes
from .common import PrepareWarning, constant_names, describe, drop_unused_initializers, drop_value_info

__all__ = ["BatchNormFold", "find_batchnorm_folds", "fold_batchnorm"]

_LAYERS = ("Conv", "ConvTranspose", "Gemm")


@dataclass(frozen=True)
class BatchNormFold:
    """One BatchNormalization after a foldable layer: ``reason`` is None when it can be folded."""

    batchnorm: str
    layer: str
    reason: str | None


@dataclass
class _Match:
    bn: onnx.NodeProto
    layer: onnx.NodeProto
    bn_position: int


def find_batchnorm_folds(model: onnx.ModelProto) -> list[BatchNormFold]:
    """Every layer -> BatchNormalization pair of the top-level graph, with the reason it cannot fold."""
    index = GraphIndex(model)
    constants = constant_names(model)
    return [BatchNormFold(m.bn.name, m.layer.name, _check(index, constants, m)) for m in _matches(index)]


def fold_batchnorm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Fold every foldable BatchNormalization into its layer (rules in the module docstring)."""
    modified, refused = False, set()
    while True:  # a second round catches BN -> BN chains that the first fold exposed
        index = GraphIndex(model)
        constants = constant_names(model)
        folded: list[_Match] = []
        for match in _matches(index):
            reason = _check(index, constants, match)
            if reason is None:
                _rewrite(model.graph, index, match)
                folded.append(match)
            elif match.bn.name not in refused:
                refused.add(match.bn.name)
                warnings.warn(f"BatchNormalization {describe(match.bn)} not folded into {describe(match.layer)}: "
                              f"{reason}", PrepareWarning, stacklevel=2)
        if not folded:
            return model, modified
        _remove(model.graph, folded)
        modified = True


def _matches(index: GraphIndex) -> list[_Match]:
    found = []
    for position, node in enumerate(index.nodes):
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        entry = index.producer.get(node.input[0])
        if entry and entry[1] == 0 and entry[0].op_type in _LAYERS and entry[0].domain in ("", "ai.onnx"):
            found.append(_Match(node, entry[0], position))
    return found


def _check(index: GraphIndex, constants: set[str], match: _Match) -> str | None:
    bn, layer = match.bn, match.layer
    if node_attributes(bn).get("training_mode", 0) or sum(1 for name in bn.output if name) != 1:
        return "it is in training mode (more than one output)"
    between = bn.input[0]
    others = [use.node for use in index.uses(between) if use.node is not bn]
    if between in index.graph_outputs:
        return f'the layer output "{between}" is also a graph output'
    if others:
        return f'the layer output "{between}" also feeds {", ".join(describe(n) for n in others)}'
    for role, name in zip(("scale", "B", "mean", "var"), bn.input[1:5]):
        if name not in constants:
            return f'its {role} "{name}" is not a constant initializer'
    params = [(1, "weight")] + ([(2, "bias")] if len(layer.input) > 2 and layer.input[2] else [])
    for slot, role in params:
        name = layer.input[slot] if len(layer.input) > slot else ""
        if name not in constants:
            return f'the {role} "{name}" of the layer is not a constant initializer'
        readers = [u.node for u in index.uses(name) if u.node is not layer or u.index != slot]
        if readers:
            return f'the {role} "{name}" is shared with {", ".join(describe(n) for n in readers)}'
    weight = index.initializers[layer.input[1]]
    if weight.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
        return f"the weight has non-float type {onnx.TensorProto.DataType.Name(weight.data_type)}"
    channels = _output_channels(layer, tuple(weight.dims))
    if channels is None:
        return f"the weight shape {tuple(weight.dims)} does not fit {layer.op_type}"
    for role, name in zip(("scale", "B", "mean", "var"), bn.input[1:5]):
        if int(np.prod(index.initializers[name].dims)) != channels:
            return f'its {role} "{name}" has shape {tuple(index.initializers[name].dims)}, not [{channels}]'
    return None


def _output_channels(layer: onnx.NodeProto, shape: tuple[int, ...]) -> int | None:
    if layer.op_type == "Conv":
        return shape[0] if len(shape) >= 3 else None
    if layer.op_type == "ConvTranspose":
        group = node_attributes(layer).get("group", 1)
        return group * shape[1] if len(shape) >= 3 and shape[0] % group == 0 else None
    if len(shape) != 2:
        return None
    return shape[0] if node_attributes(layer).get("transB", 0) else shape[1]


def _rewrite(graph: onnx.GraphProto, index: GraphIndex, match: _Match) -> None:
    bn, layer = match.bn, match.layer
    gamma, beta, mean, var = (index.constant_value(name).astype(np.float64).reshape(-1) for name in bn.input[1:5])
    scale = gamma / np.sqrt(var + node_attributes(bn).get("epsilon", 1e-5))
    weight_tensor = index.initializers[layer.input[1]]
    weight = numpy_helper.to_array(weight_tensor)
    dtype = weight.dtype
    folded = _scale_weight(layer, weight.astype(np.float64), scale)
    weight_tensor.CopyFrom(numpy_helper.from_array(folded.astype(dtype), weight_tensor.name))
    has_bias = len(layer.input) > 2 and layer.input[2]
    bias = index.constant_value(layer.input[2]).astype(np.float64) if has_bias else np.zeros(1)
    if layer.op_type == "Gemm":
        bias = node_attributes(layer).get("beta", 1.0) * bias if has_bias else np.zeros(1)
        _set_attr(layer, "beta", 1.0)
    new_bias = ((bias - mean) * scale + beta).astype(dtype)
    if has_bias:
        index.initializers[layer.input[2]].CopyFrom(numpy_helper.from_array(new_bias, layer.input[2]))
    else:
        name = index.fresh_name(f"{layer.name or layer.output[0]}.bias")
        graph.initializer.append(numpy_helper.from_array(new_bias, name))
        layer.input.append(name)
    drop_value_info(graph, {layer.output[0]})
    layer.output[0] = bn.output[0]


def _scale_weight(layer: onnx.NodeProto, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    if layer.op_type == "Conv":
        return weight * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
    if layer.op_type == "ConvTranspose":
        group = node_attributes(layer).get("group", 1)
        grouped = weight.reshape((group, weight.shape[0] // group) + weight.shape[1:])
        factor = scale.reshape((group, 1, weight.shape[1]) + (1,) * (weight.ndim - 2))
        return (grouped * factor).reshape(weight.shape)
    return weight * (scale[:, None] if node_attributes(layer).get("transB", 0) else scale[None, :])


def _remove(graph: onnx.GraphProto, folded: list[_Match]) -> None:
    drop = {m.bn_position for m in folded}
    keep = [node for position, node in enumerate(graph.node) if position not in drop]
    del graph.node[:]
    graph.node.extend(keep)
    drop_unused_initializers(graph, {name for m in folded for name in m.bn.input[1:5]})


def _set_attr(node: onnx.NodeProto, name: str, value) -> None:
    for position, attr in enumerate(node.attribute):
        if attr.name == name:
            del node.attribute[position]
            break
    node.attribute.append(helper.make_attribute(name, value))
