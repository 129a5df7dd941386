"""Mixed precision built on quantsim's public API: precision presets and per-layer overrides (by exact node
name, regular expression, op type or default), as a Python API and as a JSON file; per-group sensitivity and
tensor health with their self-contained HTML reports (inline SVG charts, `mixed_precision.svg`); automatic
mixed precision (AIMET's ``choose_mixed_precision``, returning AIMET's pareto list) and its lite form
(``flip_layers_to_higher_precision`` with ``analyze_per_layer_sensitivity``, as aimet-onnx attributes quantizers to
nodes); AIMET's ``QuantAnalyzer`` (JSON files and one HTML page); ``auto_quantize`` (the cheapest configuration
within an accuracy budget, chaining every technique of this package and ``adaround``)."""
from mixed_precision.amp import AMPSearchAlgo, CallbackFunc, choose_mixed_precision
from mixed_precision.amp_cache import AmpCacheError
from mixed_precision.amp_result import AmpResult, ParetoEntry, ParetoPoint, aimet_candidate
from mixed_precision.analysis import GroupScore, TensorHealth, group_sensitivity, report_dict, tensor_health
from mixed_precision.auto_quant import auto_quantize
from mixed_precision.auto_quant_result import AutoQuantResult, AutoQuantStep, write_auto_quant_report
from mixed_precision.bitops import (
    FLOAT_BITS_FACTOR,
    LayerCost,
    bit_operations,
    layer_costs,
    simulated_bit_operations,
    simulated_dtypes,
)
from mixed_precision.html_page import write_analysis_html, write_pareto_html
from mixed_precision.layer_sensitivity import NodeQuantizers, analyze_per_layer_sensitivity, node_quantizers
from mixed_precision.lite import flip_layers_to_higher_precision
from mixed_precision.overrides import OverrideConflictError, PrecisionOverrides, apply_precision_overrides, load_overrides
from mixed_precision.presets import PRESETS, Precision, candidate, preset
from mixed_precision.quant_analyzer import QuantAnalyzer
from mixed_precision.sqnr import power_sqnr_db

__all__ = [
    "power_sqnr_db",
    "Precision",
    "PRESETS",
    "preset",
    "PrecisionOverrides",
    "OverrideConflictError",
    "load_overrides",
    "apply_precision_overrides",
    "GroupScore",
    "TensorHealth",
    "group_sensitivity",
    "tensor_health",
    "report_dict",
    "write_analysis_html",
    "write_pareto_html",
    "candidate",
    "choose_mixed_precision",
    "AMPSearchAlgo",
    "CallbackFunc",
    "AmpResult",
    "ParetoPoint",
    "ParetoEntry",
    "aimet_candidate",
    "analyze_per_layer_sensitivity",
    "node_quantizers",
    "NodeQuantizers",
    "flip_layers_to_higher_precision",
    "auto_quantize",
    "AutoQuantResult",
    "AutoQuantStep",
    "write_auto_quant_report",
    "FLOAT_BITS_FACTOR",
    "LayerCost",
    "layer_costs",
    "bit_operations",
    "simulated_bit_operations",
    "simulated_dtypes",
    "AmpCacheError",
    "QuantAnalyzer",
]
