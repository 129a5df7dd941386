"""Mixed precision built on quantsim's public API: precision presets and per-layer overrides (by exact node
name, regular expression, op type or default), as a Python API and as a JSON file; per-group sensitivity and
tensor health with their self-contained HTML reports (inline SVG charts, `mixed_precision.svg`); automatic
mixed precision (AIMET's ``choose_mixed_precision``) and its lite form (``flip_layers_to_higher_precision``);
AIMET's ``QuantAnalyzer`` (JSON files and one HTML page)."""
from mixed_precision.amp import AMPSearchAlgo, CallbackFunc, choose_mixed_precision
from mixed_precision.amp_result import AmpResult, ParetoPoint
from mixed_precision.analysis import GroupScore, TensorHealth, group_sensitivity, report_dict, tensor_health
from mixed_precision.bitops import FLOAT_BITS_FACTOR, LayerCost, bit_operations, layer_costs
from mixed_precision.html_page import write_analysis_html, write_pareto_html
from mixed_precision.lite import flip_layers_to_higher_precision
from mixed_precision.overrides import OverrideConflictError, PrecisionOverrides, apply_precision_overrides, load_overrides
from mixed_precision.presets import PRESETS, Precision, candidate, preset
from mixed_precision.quant_analyzer import QuantAnalyzer

__all__ = [
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
    "flip_layers_to_higher_precision",
    "FLOAT_BITS_FACTOR",
    "LayerCost",
    "layer_costs",
    "bit_operations",
    "QuantAnalyzer",
]
