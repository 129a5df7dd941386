"""TF-enhanced: AIMET's SQNR search over a streamed histogram (weights: over their own values, per
tensor or per channel; per-block weights fall back to min-max). Requests of equal bits and grid flags
share one batched search (`quantsim.calibration.histograms`)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from quantsim.calibration.histograms import tf_enhanced_encoding_of, tf_enhanced_encodings, tf_enhanced_encodings_of
from quantsim.calibration.run import TensorStats
from quantsim.calibration.schemes.registry import (
    CalibrationScheme,
    EncodingRequest,
    min_max_from_values,
    register_scheme,
)
from quantsim.core.dtypes import QuantScheme
from quantsim.core.numerics import Encoding, encoding_from_range

__all__ = ["TF_ENHANCED"]


def _from_stats(request: EncodingRequest, stats: TensorStats) -> Encoding:
    if stats.histogram is None:
        return encoding_from_range(stats.min, stats.max, request.bits, **request.grid_flags)
    return stats.histogram.tf_enhanced_encoding(request.bits, **request.grid_flags)


def _from_values(request: EncodingRequest, values: np.ndarray) -> Encoding:
    if request.block_size is not None:
        return min_max_from_values(request, values)
    return tf_enhanced_encoding_of(values, request.bits, axis=request.axis, **request.grid_flags)


def _grouped(items: Sequence[tuple[EncodingRequest, object]], searchable) -> tuple[list, dict]:
    out: list[Encoding | None] = [None] * len(items)
    groups: dict[tuple, list[int]] = {}
    for i, (request, item) in enumerate(items):
        if searchable(request, item):
            groups.setdefault(request.batch_key, []).append(i)
    return out, groups


def _batch_from_stats(items: Sequence[tuple[EncodingRequest, TensorStats]]) -> list[Encoding]:
    out, groups = _grouped(items, lambda request, stats: stats.histogram is not None)
    for members in groups.values():
        request = items[members[0]][0]
        histograms = [items[i][1].histogram for i in members]
        for i, encoding in zip(members, tf_enhanced_encodings(histograms, request.bits, **request.grid_flags)):
            out[i] = encoding
    return [e if e is not None else _from_stats(*items[i]) for i, e in enumerate(out)]


def _batch_from_values(items: Sequence[tuple[EncodingRequest, np.ndarray]]) -> list[Encoding]:
    out, groups = _grouped(items, lambda request, values: request.block_size is None)
    for members in groups.values():
        request = items[members[0]][0]
        tensors = ((items[i][1], items[i][0].axis) for i in members)
        for i, encoding in zip(members, tf_enhanced_encodings_of(tensors, request.bits, **request.grid_flags)):
            out[i] = encoding
    return [e if e is not None else _from_values(*items[i]) for i, e in enumerate(out)]


TF_ENHANCED = register_scheme(CalibrationScheme(
    "tf_enhanced", _from_stats, needs_histogram=True, from_values=_from_values,
    batch_from_stats=_batch_from_stats, batch_from_values=_batch_from_values,
    aliases=("post_training_tf_enhanced",), quant_scheme=QuantScheme.post_training_tf_enhanced,
    description="SQNR-optimal clipping over a 512-bin histogram",
))
