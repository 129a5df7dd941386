"""AIMET's older AdaRound entry point: ``Adaround.apply_adaround(model, params, path, prefix, ...)``.

It builds its own sim (``default_param_bw``-bit weights, ``default_quant_scheme``, config file), rounds
every weighted layer but those in ``ignore_quant_ops_list`` (activation quantizers stay uncalibrated,
so layers see float inputs, as in AIMET), writes ``<path>/<prefix>.encodings`` with the parameter
encodings only, and returns the prepared float model holding the rounded weights. Build the deployment
sim from that model and call ``sim.set_and_freeze_param_encodings(<path>/<prefix>.encodings)``.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx

from adaround.apply import apply_adaround
from adaround.params import AdaroundParameters
from quantsim import InvalidArgumentError, QuantizationSimModel, QuantScheme, QuantsimWarning, qtype

__all__ = ["Adaround"]


def _feeds(params: AdaroundParameters, input_names: list[str]) -> list[Mapping[str, np.ndarray]]:
    feeds = []
    for number, item in enumerate(params.data_loader):
        if number >= params.num_batches:
            break
        if isinstance(item, Mapping):
            feeds.append(item)
        elif len(input_names) == 1:
            feeds.append({input_names[0]: np.asarray(item[0] if isinstance(item, (tuple, list)) else item)})
        else:
            raise InvalidArgumentError(f"data_loader item {number} is not a dict and the model has inputs {input_names}")
    if len(feeds) < params.num_batches:
        raise InvalidArgumentError(f"data_loader yielded {len(feeds)} batches, num_batches is {params.num_batches}")
    return feeds


class Adaround:
    """AIMET's class-style API (its only method is static)."""

    @staticmethod
    def apply_adaround(model: onnx.ModelProto | str | os.PathLike, params: AdaroundParameters, path: str | os.PathLike,
                       filename_prefix: str, default_param_bw: int = 4,
                       param_bw_override_list: Iterable[tuple[str, int]] | None = None,
                       ignore_quant_ops_list: Iterable[str] | None = None,
                       default_quant_scheme: QuantScheme | str = QuantScheme.post_training_tf_enhanced,
                       default_config_file: str | None = None, **ignored: Any) -> onnx.ModelProto:
        """Round ``model``'s weights; write the parameter encodings; return the model with rounded weights.

        ``param_bw_override_list``: ``(node or weight name, bitwidth)`` pairs. ``use_cuda``, ``device`` and
        ``user_onnx_libs`` are accepted and ignored (the sim runs on any onnxruntime provider).
        """
        unknown = set(ignored) - {"use_cuda", "device", "user_onnx_libs"}
        if unknown:
            raise InvalidArgumentError(f"Adaround.apply_adaround got unexpected argument(s) {sorted(unknown)}")
        sim = QuantizationSimModel(model, param_type=qtype.int(default_param_bw), quant_scheme=default_quant_scheme,
                                   config_file=default_config_file)
        layers = {layer.node: layer for layer in sim.weighted_layers()}
        for name, bits in param_bw_override_list or ():
            weight = layers[name].weight if name in layers else name
            if weight not in sim.qc_quantize_op_dict:
                raise InvalidArgumentError(f"param_bw_override_list: {name!r} is neither a weighted node nor a parameter")
            sim.qc_quantize_op_dict[weight].set_bitwidth(bits)
        ignore = set(ignore_quant_ops_list or ())
        missing = ignore - set(layers)
        if missing:
            raise InvalidArgumentError(f"ignore_quant_ops_list: {sorted(missing)} are not weighted nodes")
        widths = [q.bitwidth for q in sim.quantizers if q.role == "param" and q.enabled and not q.spec.is_float]
        settings = params.settings(min(widths, default=8))
        feeds = _feeds(params, [i.name for i in sim.session.get_inputs()])
        with warnings.catch_warnings():  # float layer inputs are this API's documented behaviour, as in AIMET
            warnings.filterwarnings("ignore", message=".*activation quantizer.*uncalibrated", category=QuantsimWarning)
            apply_adaround(sim, feeds, settings.num_iterations, [n for n in layers if n not in ignore],
                           reg_param=settings.reg_param, beta_range=settings.beta_range, warm_start=settings.warm_start)
        with sim.temporary_state():
            for q in sim.quantizers:
                if q.role != "param":
                    q.enabled = False
            sim.export(path, filename_prefix, export_model=False)
        rounded = onnx.ModelProto()
        rounded.CopyFrom(sim.model.model)
        return rounded
