"""Weight scales widened so every int32 bias fits its accumulator grid (applied after calibration).

An integer Conv/ConvTranspose/Gemm/MatMul+Add adds its bias as ``round(b / (s_in s_w))`` in int32
(`quantsim.core.bias`). When ``|b| / (s_in s_w)`` exceeds ``2^31 - 1`` the bias cannot be represented:
the QDQ export would saturate it and the integer export would leave the layer in float. After
calibration (input scales known) the sim therefore widens the weight scale of the affected output
channels (`int32_fitting_weight_scale`, as onnxruntime's ``quantize_static`` does) and installs it as the
weight quantizer's encoding, so the sim, the encodings files, the QDQ export and the integer export all
use the same grid. Frozen or loaded-then-frozen weight encodings are left alone.

The input grid is the one the layer's input is on, through data movement as the exports find it (a Conv
reading one output of a Split is on the Split input's grid). A bias left float where the exports see a
dequantized input and weight is not left alone by onnxruntime: its BiasQuantization rewrite (any session
with QDQ optimizations, the default) recomputes ``round(b / (s_in s_w))`` and casts it to int32 without a
range check, so an overflowing bias becomes INT32_MIN or garbage (YOLOv8n at W16A16: seven C2f bottleneck
convolutions after a Split, output SQNR to FP32 44 dB in the sim, 19 dB in onnxruntime).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import numpy as np

from quantsim.core.bias import int32_fitting_weight_scale
from quantsim.sim.int32_bias import input_grid_quantizer
from quantsim.sim.layers import WeightedLayer, find_weighted_layers

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel

__all__ = ["fit_biases_to_int32"]

_log = logging.getLogger(__name__)


def _layer_bias(sim: QuantizationSimModel, layer: WeightedLayer) -> np.ndarray | None:
    """The float bias the integer kernel adds (Gemm: ``beta * C``; MatMul: a constant bias Add after it)."""
    index = sim.graph_index
    if layer.op_type == "MatMul":
        pair = index.bias_add(layer.output)
        if pair is None or sim.qc_quantize_op_dict.get(layer.output) is not None:
            return None
        return index.constant_value(pair[1])
    if layer.bias is None:
        return None
    bias = np.asarray(index.constant_value(layer.bias), np.float64)
    if layer.op_type == "Gemm":
        bias = bias * float(layer.attributes.get("beta", 1.0)) / float(layer.attributes.get("alpha", 1.0))
    return bias


def fit_biases_to_int32(sim: QuantizationSimModel) -> list[str]:
    """Widen the weight scales whose int32 bias would overflow (module docstring); the weights changed."""
    changed = []
    table = {t: q for q in sim.quantizers for t in q.tensors}
    index = sim.graph_index

    def constant_of(name: str):
        return index.constant_value(name) if index.is_constant(name) else None

    for layer in find_weighted_layers(sim):
        # the input's grid may be set upstream of data movement (a Split's output: the Split's input's grid),
        # as the exports find it: an overflowing bias left float there is what onnxruntime's BiasQuantization
        # then casts to int32 without a range check (module docstring)
        wq, xq = layer.weight_quantizer, input_grid_quantizer(layer.input, index.producer_of, table, constant_of)
        if wq is None or xq is None or not (wq.enabled and xq.enabled) or wq.spec.is_float or xq.spec.is_float \
                or wq.spec.is_fp8 or xq.spec.is_fp8:  # float8: no integer accumulator, no int32 bias
            continue
        w_enc, x_enc = wq.encoding, xq.encoding
        if w_enc is None or x_enc is None or not x_enc.is_per_tensor or w_enc.block_size is not None \
                or wq.is_encoding_frozen():
            continue
        bias = _layer_bias(sim, layer)
        if bias is None or (not w_enc.is_per_tensor and w_enc.scale.size != np.size(bias)):
            continue
        if layer.op_type == "ConvTranspose" and int(layer.attributes.get("group", 1)) != 1:
            continue
        fitted = int32_fitting_weight_scale(bias, x_enc.scale, w_enc.scale)
        if fitted is None:
            continue
        wq.set_encoding(dataclasses.replace(w_enc, scale=fitted))
        grown = float(np.max(fitted / w_enc.scale))
        _log.info("weight %r: scale widened up to %.3gx so the int32 bias of %r fits s_in * s_w",
                  layer.weight, grown, layer.node)
        changed.append(layer.weight)
    return changed
