"""Bit operations (BOPs): the cost axis of automatic mixed precision.

Every weighted layer of the sim (Conv, ConvTranspose, Gemm, MatMul with a constant weight,
`QuantizationSimModel.weighted_layers`) costs its multiply-accumulates times the bits of both operands::

    BOPs = sum over layers of MACs(layer) * bits(input quantizer) * bits(weight quantizer)

* ``MACs`` per inference, from the prepared model's inferred shapes: each output element of a Conv, Gemm or
  MatMul is a dot product of length ``weight.size / out_channels`` (out channels on axis 1 for Conv, the last
  axis for Gemm and MatMul), so ``MACs = numel(output) * weight.size / out_channels``; a ConvTranspose
  spreads each input element over ``weight.size / in_channels`` outputs. Given a sample feed, the model's
  symbolic input dimensions (batch, sequence length, image size) take its shapes and shapes are inferred
  again, on the model's skeleton (weights as references: models over 2 GiB too, no copy of the weights);
  dimensions still unknown count as 1 (a layer whose output shape is unknown counts one position).
* ``bits``: an integer grid's bitwidth; a float16 operand counts ``16 * FLOAT_BITS_FACTOR`` and an
  unquantized (float32) one ``32 * FLOAT_BITS_FACTOR``, so that a float MAC costs 1.5 times an integer MAC of
  the same width (AIMET's weighting).
* The input quantizer is the one whose grid the layer's data input carries (`WeightedLayer.input_quantizer`).
* What the sim runs is what counts: `simulated_bit_operations` reads each layer's operands from the sim's
  quantizers as they are after calibration and its automatic decisions (range health can move an 8-bit
  activation to int16 or leave it float; a Concat can be untied), not from what was asked of them.

AMP reports BOPs relative to the configuration with every quantizer group at the costliest candidate.
Elementwise ops, normalisations and data movement are not counted: their cost is not in multiplications.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnx

from quantsim import QuantizationSimModel, qtype
from quantsim.prepare import skeleton

__all__ = ["FLOAT_BITS_FACTOR", "LayerCost", "layer_costs", "operand_bits", "bit_operations", "simulated_dtypes",
           "simulated_bit_operations"]

_log = logging.getLogger(__name__)

FLOAT_BITS_FACTOR = math.sqrt(1.5)
"""A float operand counts its width times this (a float MAC costs 1.5 times an integer one of the same width)."""


@dataclass(frozen=True)
class LayerCost:
    """One weighted layer: its MACs per inference and the quantizers (by name) of its two operands."""

    node: str
    macs: int
    input_quantizer: str | None
    weight_quantizer: str | None


def _shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    graph = model.graph
    shapes = {}
    for info in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor_type = info.type.tensor_type
        if tensor_type.HasField("shape"):
            shapes[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    return shapes


def _sample_shapes(model: onnx.ModelProto, sample: Mapping[str, Any]) -> dict[str, list[int | None]]:
    """Shapes inferred again with the graph inputs' dimensions taken from a sample feed, on the model's
    skeleton (`quantsim.prepare.skeleton`: inference needs the weights' shapes, not their values; a copy of
    the whole model would double its memory and cannot be inferred over 2 GiB)."""
    source = skeleton(model)
    del source.graph.value_info[:]
    for graph_input in source.graph.input:
        value = sample.get(graph_input.name)
        if value is None or not hasattr(value, "shape"):
            continue
        dims = graph_input.type.tensor_type.shape.dim
        if len(dims) == len(value.shape):
            for dim, size in zip(dims, value.shape):
                dim.Clear()
                dim.dim_value = int(size)
    try:
        inferred = onnx.shape_inference.infer_shapes(source, strict_mode=False)
    except Exception as error:  # noqa: BLE001 - any inference failure falls back to the stored shapes
        _log.debug("BOPs: shape inference with the sample feed failed (%s); symbolic dimensions count as 1", error)
        return {}
    return _shapes(inferred)


def _numel(shape: list[int | None]) -> int:
    return math.prod(d if d and d > 0 else 1 for d in shape)


def layer_costs(sim: QuantizationSimModel, sample: Mapping[str, Any] | None = None) -> list[LayerCost]:
    """MACs and operand quantizers of every weighted layer, in graph order; ``sample`` (one feed dict) fixes
    the symbolic input dimensions (module docstring)."""
    shapes = _shapes(sim.model.model)
    if sample is not None:
        shapes.update(_sample_shapes(sim.model.model, sample))
    dims = {t.name: tuple(t.dims) for t in sim.model.graph.initializer}  # shapes only: no weight is read
    costs = []
    for layer in sim.weighted_layers():
        weight_shape = dims[layer.weight] if layer.weight in dims else sim.get_weight(layer.weight).shape
        size = math.prod(weight_shape)
        if layer.op_type == "ConvTranspose":
            macs = _numel(shapes.get(layer.input) or [1]) * size // max(weight_shape[0], 1)
        else:
            out_shape = shapes.get(layer.output)
            if out_shape is None:
                _log.debug("BOPs: %s has no inferred output shape; counting one output position", layer.node)
            channels = weight_shape[0] if layer.op_type == "Conv" else weight_shape[-1]
            if layer.op_type == "Gemm" and layer.attributes.get("transB"):
                channels = weight_shape[0]
            per_output = size // max(channels, 1)
            macs = (_numel(out_shape) if out_shape is not None else channels) * per_output
        costs.append(LayerCost(layer.node, int(macs), layer.input_quantizer.name if layer.input_quantizer else None,
                               layer.weight_quantizer.name if layer.weight_quantizer is not None
                               and layer.weight_quantizer.enabled else None))
    return costs


def operand_bits(dtype: qtype | None) -> float:
    """The bits one operand of a MAC counts: integer width, float width times `FLOAT_BITS_FACTOR`; ``None``
    (unquantized) is float32."""
    if dtype is None:
        return 32 * FLOAT_BITS_FACTOR
    return dtype.bits * FLOAT_BITS_FACTOR if dtype.is_float else float(dtype.bits)


def bit_operations(costs: list[LayerCost], dtypes: Mapping[str, qtype | None]) -> float:
    """BOPs of the layers when each quantizer named in ``dtypes`` has that type (None or absent: float32)."""
    total = 0.0
    for cost in costs:
        a = dtypes.get(cost.input_quantizer) if cost.input_quantizer else None
        w = dtypes.get(cost.weight_quantizer) if cost.weight_quantizer else None
        total += cost.macs * operand_bits(a) * operand_bits(w)
    return total


def simulated_dtypes(sim: QuantizationSimModel) -> dict[str, qtype | None]:
    """The type every quantizer of ``sim`` simulates now, by name: its precision, or None when it is disabled
    (the tensor stays float32). Read after calibration, this includes the sim's automatic decisions."""
    return {q.name: q.precision() if q.enabled else None for q in sim.quantizers}


def simulated_bit_operations(sim: QuantizationSimModel, costs: list[LayerCost]) -> float:
    """BOPs of the layers of ``costs`` as ``sim`` simulates them now: each layer's operands are read again
    from the sim (`QuantizationSimModel.weighted_layers`: the enabled quantizer deciding its data input, its
    weight quantizer if enabled), so decisions taken since ``costs`` was built (a grid promoted, a tensor left
    float, a Concat untied) count."""
    layers = {layer.node: layer for layer in sim.weighted_layers()}
    total = 0.0
    for cost in costs:
        layer = layers.get(cost.node)
        if layer is None:
            continue
        a = layer.input_quantizer.precision() if layer.input_quantizer is not None else None
        w = layer.weight_quantizer
        total += cost.macs * operand_bits(a) * operand_bits(w.precision() if w is not None and w.enabled else None)
    return total
