"""``fold_batchnorm`` and ``fold_channel_affine``: a per-channel affine map after Conv / ConvTranspose / Gemm
(an inference-mode BatchNormalization, or a Mul / Add by a constant) is folded into that layer's weight
and bias.

Derivation. Each of these computes, per channel ``c`` of its input ``y``, ``f(y)_c = s_c * y_c + t_c``:
- BatchNormalization: ``s = gamma / sqrt(var + eps)``, ``t = beta - s * mean``;
- ``Mul(y, k)``: ``s = k``, ``t = 0``; ``Add(y, k)``: ``s = 1``, ``t = k`` (either operand order), for a
  constant ``k`` holding one value, or one value per output channel on the channel axis (axis 1), so that
  it broadcasts without growing ``y`` (shapes ``[]``, ``[1]``, ``[M, 1, 1]``, ``[1, M, 1, 1]``, ...).
  PaddlePaddle exports such pairs (PP-LCNet's learnable affine blocks: Conv -> Mul -> Add by scalars).
When ``y = w * x + b`` is linear with output channel ``c``,
    f(y)_c = (s_c * w_c) * x + (s_c * b_c + t_c)
so ``w' = w * s`` along the output-channel axis and ``b' = b * s + t`` (``b = 0`` if absent). Folding
removes a tensor the sim would quantize, as BatchNormalization folding does.
The output-channel axis of the weight is
- Conv: ``W[M, C/group, k...]``, axis 0;
- ConvTranspose: ``W[C, M/group, k...]``; output channel ``g * M/group + j`` is column ``j`` of the
  rows of group ``g``, so ``W`` is viewed as ``[group, C/group, M/group, k...]`` and scaled by
  ``s`` viewed as ``[group, 1, M/group, 1...]``;
- Gemm: ``Y = alpha * A' B' + beta_g * C``: ``B[K, N]`` scaled on axis 1, or ``B[N, K]`` on axis 0
  when ``transB = 1``; ``alpha`` commutes with ``s``; the new ``C' = beta_g * C * s + t``
  (broadcast to ``[N]`` or ``C``'s shape) and ``beta_g`` becomes 1.
Arithmetic is in float64, results are cast back to the weight's type. A fold with ``s == 1`` leaves the
weight untouched; one with ``t == 0`` on a layer without bias adds none.

Pre: node names unique, nodes topologically sorted. Post: every foldable pair is one layer whose output
keeps the folded node's output name; outputs equal up to float rounding. Chains (Conv -> Mul -> Add,
BatchNormalization -> BatchNormalization) fold in successive rounds.
Match: a default-domain BatchNormalization (``fold_batchnorm``) or Mul / Add / BatchNormalization
(``fold_channel_affine``: a ``layer -> Add(per-channel bias) -> BatchNormalization`` chain, PaddlePaddle's
ConvTranspose export, only becomes ``layer -> BatchNormalization`` when its Add folds, after
``fold_batchnorm``) reading output 0 of a Conv, ConvTranspose or Gemm.
Check (a BatchNormalization ``fold_batchnorm`` refuses is reported as a ``PrepareWarning`` with the reason;
``fold_channel_affine`` refuses silently, a Mul / Add being ordinary arithmetic; ``find_batchnorm_folds``
lists every BatchNormalization decision):
1. the BatchNormalization is in inference mode (``training_mode`` 0, one output);
2. the layer's output feeds only the folded node and is not a graph output;
3. BatchNormalization: scale, B, mean and var are constant initializers (not graph inputs) with one value
   per output channel; Mul / Add: the other operand is a floating-point constant initializer of a
   per-channel shape (above);
4. the weight (and the bias / Gemm C, if present) is a floating-point constant initializer that no other
   node reads (shared weights would change the other reader);
5. the weight's shape matches the op (ConvTranspose: input channels divisible by ``group``).
Rewrite: weight and bias replaced in place (a missing bias is added as ``<layer>.bias``), the layer takes
the folded node's output name, the folded node and its now unused parameters are removed.
`fold_batchnorm_pairs` (the home of `quantsim.batch_norm_fold`'s after-layer folds) names the result as AIMET's
``fold_all_batch_norms_to_weight`` does instead: the layer keeps its own output name and the folded node's
readers read it, unless the folded node's output is a graph output, whose name the layer then takes.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantsim.errors import PrepareWarning, warn_at_caller
from quantsim.graph.edit import constant_names, describe, drop_unused_initializers, drop_value_info
from quantsim.graph.index import GraphIndex, node_attributes, rename_outer_references
from quantsim.graph.mapped import tensor_values

__all__ = ["BatchNormFold", "find_batchnorm_folds", "fold_batchnorm", "fold_batchnorm_pairs", "fold_channel_affine",
           "output_channels"]

_log = logging.getLogger(__name__)
_LAYERS = ("Conv", "ConvTranspose", "Gemm")
_AFFINE_OPS = ("Mul", "Add")


@dataclass(frozen=True)
class BatchNormFold:
    """One BatchNormalization after a foldable layer: ``reason`` is None when it can be folded."""

    batchnorm: str
    layer: str
    reason: str | None


@dataclass
class _Match:
    bn: onnx.NodeProto  # the folded node: a BatchNormalization, Mul or Add
    layer: onnx.NodeProto
    bn_position: int

    @property
    def parameters(self) -> list[str]:
        """The folded node's inputs other than the layer output."""
        return [name for name in self.bn.input if name != self.layer.output[0]]


def find_batchnorm_folds(model: onnx.ModelProto) -> list[BatchNormFold]:
    """Every layer -> BatchNormalization pair of the top-level graph, with the reason it cannot fold."""
    index = GraphIndex(model)
    constants = constant_names(model)
    return [BatchNormFold(m.bn.name, m.layer.name, _check(index, constants, m))
            for m in _matches(index, ("BatchNormalization",))]


def fold_batchnorm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Fold every foldable BatchNormalization into its layer (rules in the module docstring)."""
    return _fold(model, ("BatchNormalization",), warn=True)


def fold_batchnorm_pairs(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, onnx.NodeProto, np.ndarray, np.ndarray]]:
    """Fold, in place, every foldable layer -> BatchNormalization pair (module docstring; refusals are logged,
    not warned), keeping AIMET's names; ``(layer, batchnorm, gamma, beta)`` of each fold, in graph order."""
    folded: list[tuple[onnx.NodeProto, onnx.NodeProto, np.ndarray, np.ndarray]] = []

    def record(index: GraphIndex, match: _Match) -> None:
        gamma, beta = (index.constant_value(name).reshape(-1).copy() for name in match.bn.input[1:3])
        folded.append((match.layer, match.bn, gamma, beta))

    _fold(model, ("BatchNormalization",), warn=False, keep_layer_output=True, on_fold=record)
    return folded


def fold_channel_affine(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Fold every Mul / Add by a per-channel constant into the layer before it (rules in the module docstring),
    and the BatchNormalizations such a fold puts right after a layer (``layer -> Add(bias) -> BN``: the
    Add folds here, after ``fold_batchnorm`` has run, and leaves ``layer -> BN``)."""
    return _fold(model, _AFFINE_OPS + ("BatchNormalization",), warn=False)


def _fold(model: onnx.ModelProto, ops: tuple[str, ...], *, warn: bool, keep_layer_output: bool = False,
          on_fold=None) -> tuple[onnx.ModelProto, bool]:
    modified, refused = False, set()
    while True:  # a second round catches chains (BN -> BN, Mul -> Add) that the first fold exposed
        index = GraphIndex(model)
        constants = constant_names(model)
        folded: list[_Match] = []
        for match in _matches(index, ops):
            reason = _check(index, constants, match)
            if reason is None:
                if on_fold is not None:
                    on_fold(index, match)
                _rewrite(model.graph, index, match, keep_layer_output)
                folded.append(match)
            elif not warn:
                _log.info("%s %s not folded into %s: %s", match.bn.op_type, describe(match.bn), describe(match.layer),
                          reason)
            elif match.bn.name not in refused:
                refused.add(match.bn.name)
                warn_at_caller(f"{match.bn.op_type} {describe(match.bn)} not folded into {describe(match.layer)}: "
                              f"{reason}", PrepareWarning)
        if not folded:
            return model, modified
        _remove(model.graph, folded)
        modified = True


def _matches(index: GraphIndex, ops: tuple[str, ...]) -> list[_Match]:
    found = []
    for position, node in enumerate(index.nodes):
        if node.op_type not in ops or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        inputs = node.input[:1] if node.op_type == "BatchNormalization" else node.input
        for name in inputs:
            entry = index.producer.get(name)
            if entry and entry[1] == 0 and entry[0].op_type in _LAYERS and entry[0].domain in ("", "ai.onnx"):
                found.append(_Match(node, entry[0], position))
                break
    return found


def _check(index: GraphIndex, constants: set[str], match: _Match) -> str | None:
    bn, layer = match.bn, match.layer
    is_bn = bn.op_type == "BatchNormalization"
    if is_bn and (node_attributes(bn).get("training_mode", 0) or sum(1 for name in bn.output if name) != 1):
        return "it is in training mode (more than one output)"
    between = layer.output[0]
    others = [use.node for use in index.uses(between) if use.node is not bn]
    if between in index.graph_outputs:
        return f'the layer output "{between}" is also a graph output'
    if others or list(bn.input).count(between) != 1:
        return f'the layer output "{between}" also feeds {", ".join(describe(n) for n in others) or "both operands"}'
    roles = ("scale", "B", "mean", "var") if is_bn else ("constant operand",)
    for role, name in zip(roles, match.parameters):
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
    if not is_bn:
        return _check_channel_constant(index.initializers[match.parameters[0]], layer, tuple(weight.dims), channels)
    for role, name in zip(roles, match.parameters):
        if int(np.prod(index.initializers[name].dims)) != channels:
            return f'its {role} "{name}" has shape {tuple(index.initializers[name].dims)}, not [{channels}]'
    return None


def _check_channel_constant(tensor: onnx.TensorProto, layer: onnx.NodeProto, weight_shape: tuple, channels: int):
    """Refusal reason unless ``tensor`` is a float constant broadcasting per channel onto the layer output."""
    if tensor.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
        return f'the constant "{tensor.name}" is not floating point'
    out_rank = 2 if layer.op_type == "Gemm" else len(weight_shape)
    dims = tuple(tensor.dims)
    if len(dims) > out_rank:
        return f'the constant "{tensor.name}" of shape {dims} would broadcast the layer output to a higher rank'
    aligned = (1,) * (out_rank - len(dims)) + dims  # numpy broadcasting aligns from the right
    if any(d != 1 for axis, d in enumerate(aligned) if axis != 1) or aligned[1] not in (1, channels):
        return f'the constant "{tensor.name}" of shape {dims} is not one value per output channel'
    return None


def _scale_shift(index: GraphIndex, match: _Match, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel ``(s, t)`` of the folded node (float64, shape ``[channels]``)."""
    bn = match.bn
    if bn.op_type == "BatchNormalization":
        gamma, beta, mean, var = (index.constant_value(n).astype(np.float64).reshape(-1) for n in bn.input[1:5])
        scale = gamma / np.sqrt(var + node_attributes(bn).get("epsilon", 1e-5))
        return scale, beta - scale * mean
    value = np.broadcast_to(index.constant_value(match.parameters[0]).astype(np.float64).reshape(-1), (channels,))
    if bn.op_type == "Mul":
        return value, np.zeros(channels)
    return np.ones(channels), value


def output_channels(layer: onnx.NodeProto, shape: tuple[int, ...]) -> int | None:
    """Output channels of a Conv / ConvTranspose / Gemm whose weight has ``shape`` (None: the shape does not fit)."""
    return _output_channels(layer, shape)


def _output_channels(layer: onnx.NodeProto, shape: tuple[int, ...]) -> int | None:
    if layer.op_type == "Conv":
        return shape[0] if len(shape) >= 3 else None
    if layer.op_type == "ConvTranspose":
        group = node_attributes(layer).get("group", 1)
        return group * shape[1] if len(shape) >= 3 and shape[0] % group == 0 else None
    if len(shape) != 2:
        return None
    return shape[0] if node_attributes(layer).get("transB", 0) else shape[1]


def _rewrite(graph: onnx.GraphProto, index: GraphIndex, match: _Match, keep_layer_output: bool = False) -> None:
    bn, layer = match.bn, match.layer
    weight_tensor = index.initializers[layer.input[1]]
    weight = tensor_values(weight_tensor)
    dtype = weight.dtype
    channels = _output_channels(layer, weight.shape)
    assert channels is not None  # checked when the fold was matched
    scale, shift = _scale_shift(index, match, channels)
    if np.any(scale != 1.0):
        folded = _scale_weight(layer, weight.astype(np.float64), scale)
        weight_tensor.CopyFrom(numpy_helper.from_array(folded.astype(dtype), weight_tensor.name))
    has_bias = len(layer.input) > 2 and layer.input[2]
    bias = index.constant_value(layer.input[2]).astype(np.float64) if has_bias else np.zeros(1)
    if layer.op_type == "Gemm":
        bias = node_attributes(layer).get("beta", 1.0) * bias if has_bias else np.zeros(1)
        _set_attr(layer, "beta", 1.0)
    new_bias = (bias * scale + shift).astype(dtype)
    if has_bias:
        index.initializers[layer.input[2]].CopyFrom(numpy_helper.from_array(new_bias, layer.input[2]))
    elif np.any(shift != 0.0):
        name = index.fresh_name(f"{layer.name or layer.output[0]}.bias")
        graph.initializer.append(numpy_helper.from_array(new_bias, name))
        layer.input.append(name)
    if keep_layer_output and bn.output[0] not in index.graph_outputs:
        renames = {bn.output[0]: layer.output[0]}
        for node in graph.node:
            node.input[:] = [renames.get(name, name) for name in node.input]
            rename_outer_references(node, renames)
        drop_value_info(graph, {bn.output[0]})
        return
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
    drop_unused_initializers(graph, {name for m in folded for name in m.parameters})


def _set_attr(node: onnx.NodeProto, name: str, value) -> None:
    for position, attr in enumerate(node.attribute):
        if attr.name == name:
            del node.attribute[position]
            break
    node.attribute.append(helper.make_attribute(name, value))
