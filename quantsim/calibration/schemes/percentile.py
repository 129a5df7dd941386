"""Percentile: the range holding ``percentile`` % of the histogram's mass (100 = its full range)."""
from __future__ import annotations

from quantsim.calibration.run import TensorStats
from quantsim.calibration.schemes.registry import CalibrationScheme, EncodingRequest, register_scheme
from quantsim.core.dtypes import QuantScheme
from quantsim.core.numerics import Encoding, encoding_from_range

__all__ = ["PERCENTILE"]

DEFAULT_PERCENTILE = 100.0


def _from_stats(request: EncodingRequest, stats: TensorStats) -> Encoding:
    if stats.histogram is None:
        return encoding_from_range(stats.min, stats.max, request.bits, **request.grid_flags)
    percentile = request.parameters.get("percentile", DEFAULT_PERCENTILE)
    return stats.histogram.percentile_encoding(request.bits, percentile, **request.grid_flags)


PERCENTILE = register_scheme(CalibrationScheme(
    "percentile", _from_stats, needs_histogram=True, aliases=("post_training_percentile",),
    parameters={"percentile": DEFAULT_PERCENTILE}, quant_scheme=QuantScheme.post_training_percentile,
    description="central percentile of a histogram",
))
