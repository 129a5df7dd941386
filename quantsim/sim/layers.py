"""The sim's weighted layers and their weights: what weight-side algorithms (AdaRound, Sequential MSE)
read and write.

A weighted layer is a Conv, ConvTranspose, Gemm or MatMul node of the prepared model whose slot-1 input
is a constant (`quantsim.graph.op_facts.WEIGHTED_OPS`). Its record names the data input, weight, bias and
output tensors, the weight's quantizer, the quantizer whose grid the data input carries (its own, or the
closest enabled one upstream through grid-preserving ops, see `quantsim.sim.groups`), and the
nonlinearity that follows it when the output has exactly one consumer and that consumer is an elementwise
activation (constant operands such as Clip's bounds are resolved into ``attributes``). Layers come in the
graph's topological order.

``batchnorm`` (a `FollowingBatchNorm`) describes an unfolded inference-mode BatchNormalization that is the layer
output's only consumer (``fold_batchnorm=False``, or a fold refused): its per-channel map ``y = scale * z + shift``
and the activation that alone reads its output. The network sees the layer's output error through it, so
weight-side algorithms optimise the error after it (AdaRound on the layer as if folded, activation included;
Sequential MSE weighs each channel's error by ``scale**2``). ``activation`` stays None for such a layer (the
BatchNormalization, not an activation, reads its output).

`write_weight` replaces an initializer's values in place in the prepared model, so every session built
afterwards sees them; the sim's version moves on so that stale sessions are rebuilt.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper

from quantsim.errors import InvalidArgumentError
from quantsim.graph.index import GraphIndex, node_attributes
from quantsim.graph.op_facts import WEIGHTED_OPS, facts_of
from quantsim.sim.groups import reading_quantizer

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel
    from quantsim.sim.quantizer import QcQuantizeOp

__all__ = ["WeightedLayer", "FollowingActivation", "FollowingBatchNorm", "find_weighted_layers", "read_weight",
           "write_weight", "FOLLOWING_ACTIVATIONS"]

#: elementwise ops whose effect on a layer's output AdaRound reproduces on both sides of its loss
FOLLOWING_ACTIVATIONS = frozenset(
    {"Relu", "Clip", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "LeakyRelu", "Softmax", "PRelu", "Elu", "Gelu"}
)


@dataclass(frozen=True)
class FollowingActivation:
    """The activation applied to a layer's output: op type, attributes (constant operands resolved:
    Clip ``min``/``max``, PRelu ``slope``) and the tensor it writes."""

    op_type: str
    attributes: dict[str, Any]
    output: str


@dataclass(frozen=True)
class WeightedLayer:
    """A Conv/ConvTranspose/Gemm/MatMul node with a constant weight (names are the prepared model's)."""

    node: str
    op_type: str
    attributes: dict[str, Any]
    input: str
    weight: str
    bias: str | None
    output: str
    weight_quantizer: QcQuantizeOp | None
    activation: FollowingActivation | None = None
    shared_weight: bool = False  # the weight initializer feeds other nodes too
    input_quantizer: QcQuantizeOp | None = None  # the enabled quantizer whose grid the data input carries
    batchnorm: FollowingBatchNorm | None = field(default=None, compare=False)  # an unfolded BN reading the output


@dataclass(frozen=True)
class FollowingBatchNorm:
    """An unfolded inference-mode BatchNormalization alone reading a layer's output: per output channel
    ``y = scale * z + shift`` (``scale = gamma / sqrt(var + eps)``, ``shift = beta - scale * mean``; float64,
    one value per channel of the layer), the tensor it writes, and the activation that alone reads that."""

    node: str
    scale: np.ndarray = field(compare=False)
    shift: np.ndarray = field(compare=False)
    output: str
    activation: FollowingActivation | None = None


def _following_batchnorm(index: GraphIndex, node: onnx.NodeProto) -> FollowingBatchNorm | None:
    """The BatchNormalization that alone reads the layer's output as its data input, in inference mode with
    constant parameters, when its channel axis (1) is the layer's output-channel axis (a MatMul's only for a
    2-D output); None otherwise."""
    output = node.output[0]
    if node.op_type == "MatMul" and len(index.shape.get(output) or ()) != 2:
        return None
    bn = index.single_consumer(output)
    if bn is None or bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx") or bn.input[0] != output:
        return None
    attrs = node_attributes(bn)
    if attrs.get("training_mode", 0) or len(bn.input) < 5 or not all(index.is_constant(n) for n in bn.input[1:5]):
        return None
    gamma, beta, mean, var = (np.asarray(index.constant_value(n), np.float64).reshape(-1) for n in bn.input[1:5])
    if not gamma.shape == beta.shape == mean.shape == var.shape:
        return None
    scale = gamma / np.sqrt(var + attrs.get("epsilon", 1e-5))
    shift = beta - scale * mean
    if not (np.isfinite(scale).all() and np.isfinite(shift).all()):
        return None
    return FollowingBatchNorm(bn.name, scale, shift, bn.output[0], _resolved_activation(index, bn.output[0]))


def _resolved_activation(index: GraphIndex, output: str) -> FollowingActivation | None:
    consumer = index.single_consumer(output)
    if consumer is None or consumer.op_type not in FOLLOWING_ACTIVATIONS or consumer.input[0] != output:
        return None
    attrs = dict(node_attributes(consumer))
    if consumer.op_type == "Clip":
        for slot, key in ((1, "min"), (2, "max")):
            if len(consumer.input) > slot and consumer.input[slot]:
                if not index.is_constant(consumer.input[slot]):
                    return None
                attrs[key] = float(index.constant_value(consumer.input[slot]))
    if consumer.op_type == "PRelu":
        if not index.is_constant(consumer.input[1]):
            return None
        attrs["slope"] = np.array(index.constant_value(consumer.input[1]), dtype=np.float32)
    return FollowingActivation(consumer.op_type, attrs, consumer.output[0])


def find_weighted_layers(sim: QuantizationSimModel) -> list[WeightedLayer]:
    """Every weighted layer of the sim's prepared model, in topological order."""
    index = sim.graph_index
    layers = []
    for node in index.nodes:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2 or not index.is_constant(node.input[1]):
            continue
        if index.is_constant(node.input[0]):
            continue
        bias_slot = facts_of(node.op_type).bias_slot
        bias = node.input[bias_slot] if bias_slot is not None and len(node.input) > bias_slot else None
        if bias and not index.is_constant(bias):
            continue
        weight = node.input[1]
        layers.append(WeightedLayer(
            node=node.name, op_type=node.op_type, attributes=dict(node_attributes(node)), input=node.input[0],
            weight=weight, bias=bias or None, output=node.output[0],
            weight_quantizer=sim.qc_quantize_op_dict.get(weight),
            activation=_resolved_activation(index, node.output[0]),
            shared_weight=len(index.uses(weight)) > 1,
            input_quantizer=reading_quantizer(sim, node.input[0]),
            batchnorm=_following_batchnorm(index, node),
        ))
    return layers


def read_weight(sim: QuantizationSimModel, name: str) -> np.ndarray:
    """A writable float copy of initializer ``name`` of the prepared model."""
    if not sim.graph_index.is_constant(name):
        raise InvalidArgumentError(f"{name!r} is not a constant of the prepared model (see sim.param_names)")
    return np.array(sim.graph_index.constant_value(name))


def write_weight(sim: QuantizationSimModel, name: str, values: np.ndarray) -> None:
    """Replace initializer ``name``'s values in place (same shape and dtype), invalidating sessions."""
    tensor = sim.graph_index.initializers[name]
    old = sim.graph_index.constant_value(name)
    values = np.asarray(values)
    if values.shape != old.shape:
        raise InvalidArgumentError(f"new values for {name!r} have shape {values.shape}, the weight has {old.shape}")
    if not np.isfinite(values).all():
        raise InvalidArgumentError(f"new values for {name!r} are not all finite")
    tensor.CopyFrom(numpy_helper.from_array(values.astype(old.dtype, copy=False), name))
