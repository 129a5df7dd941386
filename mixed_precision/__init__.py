"""Mixed precision built on quantsim's public API: precision presets and per-layer overrides (by exact node
name, regular expression, op type or default), as a Python API and as a JSON file; per-layer analysis and its
self-contained HTML reports (inline SVG charts, `mixed_precision.svg`)."""
from mixed_precision.analysis import GroupScore, TensorHealth, group_sensitivity, report_dict, tensor_health
from mixed_precision.html_page import write_analysis_html, write_pareto_html
from mixed_precision.overrides import OverrideConflictError, PrecisionOverrides, apply_precision_overrides, load_overrides
from mixed_precision.presets import PRESETS, Precision, preset

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
]
