"""AIMET's lite mixed precision: ``flip_layers_to_higher_precision``.

The least-scoring ``percent_to_flip`` percent of the layers (lowest sensitivity score first, as AIMET's
``analyze_per_layer_sensitivity`` scores them: higher is better) move to a higher precision, on the
quantizers each node owns as aimet-onnx 2.42 attributes them (`mixed_precision.layer_sensitivity`): its
model-input and constant-input quantizers and its output quantizers to the activation type, its weight
quantizers to the parameter type. A tensor another node produces belongs to that node; a Conv whose output
grid sits after its Relu (one fused output quantizer) leaves that grid to the Relu node, which the sensitivity
dict scores on its own. Disabled quantizers, biases (added in 32-bit arithmetic on integer hardware) and
frozen quantizers keep their spec. Changed quantizers drop their encodings: calibrate afterwards.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from mixed_precision.analysis import GroupScore
from mixed_precision.layer_sensitivity import node_quantizers
from mixed_precision.presets import PRESETS, Precision, preset
from quantsim import InvalidArgumentError, QuantizationSimModel, qtype

__all__ = ["flip_layers_to_higher_precision"]


def _override(value: qtype | str | Precision | tuple) -> tuple[qtype, qtype]:
    """``(param type, activation type)`` from a qtype (both), a preset, or a ``(param, activation)`` pair."""
    if isinstance(value, Precision):
        return value.param_type, value.activation_type
    if isinstance(value, tuple):
        if len(value) != 2:
            raise InvalidArgumentError(f"override_precision {value!r}: expected (param_type, activation_type)")
        return qtype.as_qtype(value[0]), qtype.as_qtype(value[1])
    if isinstance(value, str) and value.strip().upper() in PRESETS:
        found = preset(value)
        return found.param_type, found.activation_type
    dtype = qtype.as_qtype(value)
    return dtype, dtype


def flip_layers_to_higher_precision(sim: QuantizationSimModel,
                                    layer_sensitivity_dict: Mapping[str, float] | Iterable[GroupScore],
                                    percent_to_flip: float = 10.0,
                                    override_precision: qtype | str | Precision | tuple = "float16") -> list[str]:
    """Flip the most sensitive ``percent_to_flip`` % of the layers (module docstring); returns their names,
    most sensitive first. ``layer_sensitivity_dict`` maps node names to scores (or is `group_sensitivity`'s
    list, scored by ``alone``); ``override_precision`` is float16, a preset or ``(param_type,
    activation_type)`` whose activation type has at least 16 bits (AIMET: int16 or float16)."""
    if isinstance(layer_sensitivity_dict, Mapping):
        scores = {str(k): float(v) for k, v in layer_sensitivity_dict.items()}
    else:
        scores = {node: float(g.alone) for g in layer_sensitivity_dict for node in g.nodes}
    if isinstance(percent_to_flip, bool) or not isinstance(percent_to_flip, (int, float)) \
            or not 0 <= percent_to_flip <= 100:
        raise InvalidArgumentError(f"percent_to_flip must be in [0, 100], got {percent_to_flip!r}")
    param_type, activation_type = _override(override_precision)
    if activation_type.bits < 16:
        raise InvalidArgumentError(f"override_precision {override_precision!r}: the activation type {activation_type} "
                                   "is not a higher precision (use int16 or float16)")
    owned = node_quantizers(sim)
    unknown = sorted(set(scores) - set(owned))
    if unknown:
        raise InvalidArgumentError(f"layer_sensitivity_dict names node(s) {unknown[:5]} not in the prepared model")
    ordered = sorted(scores, key=lambda name: scores[name])  # ties keep the dict's order, as in AIMET
    chosen = ordered[:math.ceil(len(ordered) * percent_to_flip / 100)]
    with sim.transaction():
        for name in chosen:
            node = owned[name]
            for q, dtype in [*((q, activation_type) for q in (*node.inputs, *node.outputs)),
                             *((q, param_type) for q in node.params if q.param_type != "bias")]:
                if not q.is_encoding_frozen() and q.precision() != dtype:
                    q.set_precision(dtype)
    return chosen
