"""The two import mappings a research script is run with: aimet-onnx 2.42's names and quantsim's.

A name is looked up only when a step uses it, so a name one side lacks fails that step alone (reported as
``missing: ...``) instead of the whole harness.
"""
from __future__ import annotations

import importlib

AIMET_NAMES: dict[str, tuple[str, ...]] = {
    "QuantizationSimModel": ("aimet_onnx.quantsim:QuantizationSimModel",),
    "compute_encodings": ("aimet_onnx:compute_encodings",),
    "load_encodings_to_sim": ("aimet_onnx.quantsim:load_encodings_to_sim",),
    "encodings_to_onnx_qdq": ("aimet_onnx:encodings_to_onnx_qdq",),
    "set_blockwise_quantization_for_weights": ("aimet_onnx.quantsim:set_blockwise_quantization_for_weights",),
    "set_lpbq_for_params": ("aimet_onnx.quantsim:set_lpbq_for_params",),
    "set_grouped_blockwise_quantization_for_weights":
        ("aimet_onnx.quantsim:set_grouped_blockwise_quantization_for_weights",),
    "clamp_activation_encodings": ("aimet_onnx.quantsim:clamp_activation_encodings",),
    "set_param_type": ("aimet_onnx.quantsim:set_param_type",),
    "QuantScheme": ("aimet_onnx.common.defs:QuantScheme",),
    "int4": ("aimet_onnx:int4",), "int8": ("aimet_onnx:int8",), "int16": ("aimet_onnx:int16",),
    "float16": ("aimet_onnx:float16",), "float8e4m3fn": ("aimet_onnx:float8e4m3fn",),
    "float8e5m2": ("aimet_onnx:float8e5m2",),
    "apply_adaround": ("aimet_onnx:apply_adaround",),
    "Adaround": ("aimet_onnx.adaround.adaround_weight:Adaround",),
    "apply_seq_mse": ("aimet_onnx:apply_seq_mse",),
    "SeqMseParams": ("aimet_onnx.sequential_mse.seq_mse:SeqMseParams",),
    "equalize_model": ("aimet_onnx.cross_layer_equalization:equalize_model",),
    "fold_all_batch_norms_to_weight": ("aimet_onnx.batch_norm_fold:fold_all_batch_norms_to_weight",),
    "analyze_per_layer_sensitivity": ("aimet_onnx:analyze_per_layer_sensitivity",),
    "QuantAnalyzer": ("aimet_onnx.quant_analyzer:QuantAnalyzer",),
    "choose_mixed_precision": ("aimet_onnx.mixed_precision:choose_mixed_precision",),
    "flip_layers_to_higher_precision": ("aimet_onnx.lite_mp:flip_layers_to_higher_precision",),
    "CallbackFunc": ("aimet_onnx.common.defs:CallbackFunc",),
}

QUANTSIM_NAMES: dict[str, tuple[str, ...]] = {
    "QuantizationSimModel": ("quantsim:QuantizationSimModel",),
    "compute_encodings": ("quantsim:compute_encodings",),
    "load_encodings_to_sim": ("quantsim:load_encodings_to_sim",),
    "encodings_to_onnx_qdq": ("quantsim:encodings_to_onnx_qdq",),
    "set_blockwise_quantization_for_weights": ("quantsim:set_blockwise_quantization_for_weights",),
    "set_lpbq_for_params": ("quantsim:set_lpbq_for_params",),
    "set_grouped_blockwise_quantization_for_weights": ("quantsim:set_grouped_blockwise_quantization_for_weights",),
    "clamp_activation_encodings": ("quantsim:clamp_activation_encodings",),
    "set_param_type": ("quantsim:set_param_type",),
    "QuantScheme": ("quantsim:QuantScheme",),
    "int4": ("quantsim:int4",), "int8": ("quantsim:int8",), "int16": ("quantsim:int16",),
    "float16": ("quantsim:float16",), "float8e4m3fn": ("quantsim:float8e4m3fn",),
    "float8e5m2": ("quantsim:float8e5m2",),
    "apply_adaround": ("adaround:apply_adaround",),
    "Adaround": ("adaround:Adaround",),
    "apply_seq_mse": ("adaround:apply_seq_mse",),
    "SeqMseParams": ("adaround:SeqMseParams",),
    "equalize_model": ("adaround:equalize_model",),
    "fold_all_batch_norms_to_weight": ("quantsim.batch_norm_fold:fold_all_batch_norms_to_weight",
                                       "quantsim:fold_all_batch_norms_to_weight"),
    "analyze_per_layer_sensitivity": ("mixed_precision:analyze_per_layer_sensitivity",),
    "QuantAnalyzer": ("mixed_precision:QuantAnalyzer",),
    "choose_mixed_precision": ("mixed_precision:choose_mixed_precision",),
    "flip_layers_to_higher_precision": ("mixed_precision:flip_layers_to_higher_precision",),
    "CallbackFunc": ("mixed_precision:CallbackFunc",),
}


class MissingName(AttributeError):
    """A name the step needs is not in this side's package."""


AIMET_SWITCHES = {"fold_batchnorm": False, "range_health": False, "depthwise_supergroups": False, "int32_bias": False}
"""The constructor switches that turn quantsim's accuracy and deployment defaults into aimet-onnx's behaviour
(the first three warned about by an AimetDifferenceWarning when left at their default; ``int32_bias``, the
biases added on the int32 grid every integer runtime uses, is documented instead: it moves a result by less
than an output step)."""


class _WithSwitches:
    """`QuantizationSimModel` constructed with `AIMET_SWITCHES` unless the step sets them itself."""

    def __init__(self, cls):
        self._cls = cls

    def __call__(self, *args, **kwargs):
        return self._cls(*args, **{**AIMET_SWITCHES, **kwargs})

    def __getattr__(self, name: str):
        return getattr(self._cls, name)


class Api:
    """Attribute access resolves a name through one side's mapping (first candidate that imports)."""

    def __init__(self, side: str, names: dict[str, tuple[str, ...]], aimet_switches: bool = False):
        self.side = side
        self._names = names
        self._switches = aimet_switches

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "QuantizationSimModel" and self._switches:
            return _WithSwitches(self._resolve(name))
        return self._resolve(name)

    def _resolve(self, name: str):
        tried = []
        for spec in self._names.get(name, ()):
            module, attr = spec.split(":")
            tried.append(f"{module}.{attr}")
            try:
                return getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError):
                continue
        raise MissingName(f"missing: {' / '.join(tried) or name}")


def aimet_api() -> Api:
    """aimet-onnx 2.42's public names."""
    return Api("aimet", AIMET_NAMES)


def quantsim_api(aimet_switches: bool = False) -> Api:
    """The names the README's import mapping gives; with ``aimet_switches``, sims get `AIMET_SWITCHES`."""
    return Api("quantsim", QUANTSIM_NAMES, aimet_switches)
