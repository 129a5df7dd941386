"""AIMET's class entry point ``Adaround.apply_adaround``, in both of its forms, told apart by the first
argument (positional or keyword):

* aimet-onnx 2.x: ``Adaround.apply_adaround(sim, inputs, num_iterations=10000, nodes_to_include=None, *,
  node_names_to_optimize=None)``: exactly `adaround.apply_adaround` (in 2.42 the module-level function
  *is* this method), in place on the sim. It returns the `LayerReport` list (AIMET returns None).
* aimet-onnx 1.x: ``Adaround.apply_adaround(model, params, path, filename_prefix, default_param_bw=4,
  param_bw_override_list=None, ignore_quant_ops_list=None, default_quant_scheme=tf_enhanced,
  default_config_file=None, use_cuda=True, device=0, user_onnx_libs=None)``. It builds its own sim
  (``default_param_bw``-bit weights, ``default_quant_scheme``, config file), rounds every weighted
  layer but those in ``ignore_quant_ops_list`` (activation quantizers stay uncalibrated, so layers see
  float inputs, as in AIMET), writes ``<path>/<prefix>.encodings`` with the parameter encodings only,
  and returns the prepared float model holding the rounded weights. Build the deployment sim from that
  model and call ``sim.set_and_freeze_param_encodings(<path>/<prefix>.encodings)``.
  ``use_cuda=True`` / ``device``: AIMET ran its PyTorch optimisation on that GPU; this AdaRound is numpy
  on the CPU, so passing either (other than ``use_cuda=False``) warns once that it has no effect.
  ``user_onnx_libs`` goes to the sim, which refuses custom-op libraries with a clear error.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, overload

import numpy as np
import onnx

from adaround.apply import LayerReport, apply_adaround
from adaround.feeds import as_feeds, model_inputs
from adaround.params import AdaroundParameters
from quantsim import InvalidArgumentError, InvalidTypeError, QuantizationSimModel, QuantScheme, QuantsimWarning, qtype
from quantsim.errors import warn_at_caller

__all__ = ["Adaround", "apply_adaround_to_model"]

_LEGACY_NAMES = ("model", "params", "path", "filename_prefix", "default_param_bw", "param_bw_override_list",
                 "ignore_quant_ops_list", "default_quant_scheme", "default_config_file", "use_cuda", "device",
                 "user_onnx_libs", "executor")


def apply_adaround_to_model(model: onnx.ModelProto | str | os.PathLike, params: AdaroundParameters,
                            path: str | os.PathLike, filename_prefix: str, default_param_bw: int = 4,
                            param_bw_override_list: Iterable[tuple[str, int]] | None = None,
                            ignore_quant_ops_list: Iterable[str] | None = None,
                            default_quant_scheme: QuantScheme | str = QuantScheme.post_training_tf_enhanced,
                            default_config_file: str | None = None, use_cuda: bool | None = None,
                            device: int | None = None, user_onnx_libs: list[str] | None = None, *,
                            executor: Executor | None = None) -> onnx.ModelProto:
    """AIMET 1.x's ``Adaround.apply_adaround(model, params, path, filename_prefix, ...)`` (module docstring).

    ``param_bw_override_list``: ``(node or weight name, bitwidth)`` pairs. ``executor`` (not AIMET's): as
    `adaround.apply_adaround`'s, independent layers optimised at once with the local run's result.
    """
    if not isinstance(params, AdaroundParameters):
        raise InvalidTypeError(f"Adaround.apply_adaround(model, params, ...): params must be AdaroundParameters, "
                               f"got {type(params).__name__}")
    ignored = [name for name, value in (("use_cuda", use_cuda), ("device", device))
               if value is not None and not (name == "use_cuda" and value is False)]
    if ignored:
        warn_at_caller(f"Adaround.apply_adaround: {' and '.join(ignored)} {'has' if len(ignored) == 1 else 'have'} "
                       "no effect: there is no GPU path (AdaRound here is numpy on the CPU; AIMET 1.x ran its "
                       "PyTorch optimisation there)")
    sim = QuantizationSimModel(model, param_type=qtype.int(default_param_bw), quant_scheme=default_quant_scheme,
                               config_file=default_config_file, user_onnx_libs=user_onnx_libs,
                               fold_batchnorm=True, range_health=True, depthwise_supergroups=True)  # said: no warnings
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
    feeds = as_feeds(params.data_loader, model_inputs(sim), "AdaroundParameters.data_loader", params.num_batches)
    if len(feeds) < params.num_batches:
        raise InvalidArgumentError(f"AdaroundParameters.data_loader yielded {len(feeds)} batches, num_batches is "
                                   f"{params.num_batches}")
    with warnings.catch_warnings():  # float layer inputs are this API's documented behaviour, as in AIMET
        warnings.filterwarnings("ignore", message=".*activation quantizer.*uncalibrated", category=QuantsimWarning)
        apply_adaround(sim, feeds, settings.num_iterations, [n for n in layers if n not in ignore],
                       reg_param=settings.reg_param, beta_range=settings.beta_range, warm_start=settings.warm_start,
                       executor=executor)
    with sim.temporary_state():
        for q in sim.quantizers:
            if q.role != "param":
                q.enabled = False
        sim.export(path, filename_prefix, export_model=False)
    rounded = onnx.ModelProto()
    rounded.CopyFrom(sim.model.model)
    return rounded


class Adaround:
    """AIMET's class-style API: ``Adaround.apply_adaround`` in its 2.x form (on a sim) and its 1.x form
    (on a model), told apart by the first argument (see the module docstring)."""

    @overload
    @staticmethod
    def apply_adaround(sim: QuantizationSimModel,
                       inputs: Iterable[Mapping[str, np.ndarray] | np.ndarray | Sequence[np.ndarray]],
                       num_iterations: int = ..., nodes_to_include: Iterable[str] | None = ...,
                       **options: Any) -> list[LayerReport]: ...

    @overload
    @staticmethod
    def apply_adaround(model: onnx.ModelProto | str | os.PathLike, params: AdaroundParameters,
                       path: str | os.PathLike, filename_prefix: str, default_param_bw: int = ...,
                       **options: Any) -> onnx.ModelProto: ...

    @staticmethod
    def apply_adaround(*args: Any, **kwargs: Any) -> list[LayerReport] | onnx.ModelProto:
        """2.x: ``(sim, inputs, num_iterations=10000, nodes_to_include=None, *, node_names_to_optimize=None,
        ...)`` = `adaround.apply_adaround`, in place, returns the reports. 1.x: ``(model, params, path,
        filename_prefix, default_param_bw=4, param_bw_override_list=None, ignore_quant_ops_list=None,
        default_quant_scheme=tf_enhanced, default_config_file=None, use_cuda=True, device=0,
        user_onnx_libs=None, *, executor=None)`` = `apply_adaround_to_model`, returns the model with rounded
        weights. Both forms take ``executor=`` (a `concurrent.futures.Executor`; the local run's result)."""
        first = args[0] if args else kwargs.get("sim", kwargs.get("model"))
        if isinstance(first, QuantizationSimModel):
            if "model" in kwargs:
                raise InvalidArgumentError("Adaround.apply_adaround: 'model' belongs to the 1.x form; the 2.x form "
                                           "takes (sim, inputs, num_iterations, nodes_to_include)")
            return apply_adaround(*args, **kwargs)
        if isinstance(first, (onnx.ModelProto, str, os.PathLike)):
            unknown = sorted(set(kwargs) - set(_LEGACY_NAMES))
            if unknown:
                raise InvalidArgumentError(f"Adaround.apply_adaround(model, params, path, filename_prefix, ...) got "
                                           f"unexpected argument(s) {unknown}; it takes {list(_LEGACY_NAMES)}")
            return apply_adaround_to_model(*args, **kwargs)
        raise InvalidTypeError("Adaround.apply_adaround: the first argument must be a QuantizationSimModel "
                               "(aimet-onnx 2.x form: sim, inputs, num_iterations) or an ONNX model / path (1.x "
                               f"form: model, params, path, filename_prefix), got {type(first).__name__}")
