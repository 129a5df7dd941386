"""Min-max (AIMET's "tf"): the running minimum and maximum, widened to include zero."""
from __future__ import annotations

from quantsim.calibration.run import TensorStats
from quantsim.calibration.schemes.registry import CalibrationScheme, EncodingRequest, register_scheme
from quantsim.core.dtypes import QuantScheme
from quantsim.core.fp8_encodings import fp8_encoding_from_range
from quantsim.core.numerics import Encoding, encoding_from_range

__all__ = ["MIN_MAX"]


def _from_stats(request: EncodingRequest, stats: TensorStats) -> Encoding:
    if request.fp8 is not None:
        return fp8_encoding_from_range(stats.min, stats.max, request.fp8)
    return encoding_from_range(stats.min, stats.max, request.bits, **request.grid_flags)


MIN_MAX = register_scheme(CalibrationScheme(
    "min_max", _from_stats, aliases=("tf", "post_training_tf"), quant_scheme=QuantScheme.min_max,
    description="observed minimum and maximum",
))
