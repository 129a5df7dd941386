"""Calibration schemes: the registry and the built-in schemes (min-max, TF-enhanced, percentile).

Adding a scheme is one module that calls `register_scheme` (import it, or add it to the imports below).
"""
from quantsim.calibration.schemes import min_max, percentile, tf_enhanced  # noqa: F401 - they register themselves
from quantsim.calibration.schemes.registry import (
    CalibrationScheme,
    EncodingRequest,
    get_scheme,
    min_max_from_values,
    register_scheme,
    registered_schemes,
)

__all__ = [
    "CalibrationScheme",
    "EncodingRequest",
    "get_scheme",
    "register_scheme",
    "registered_schemes",
    "min_max_from_values",
]
