"""Encodings for one quantizer from what it saw: weights (values), constants, or streamed statistics.

Pure numpy on top of `numerics` and `observers`: the quant scheme picks min-max, TF-enhanced (SQNR
search over the histogram) or percentile; weights use min-max per tensor/channel/block (TF-enhanced
per tensor or channel when that scheme is chosen).
"""
from __future__ import annotations

import numpy as np

from quantsim.calibration.run import TensorStats
from quantsim.core.dtypes import QuantScheme
from quantsim.core.numerics import Encoding, encoding_from_range, reduce_min_max
from quantsim.calibration.histograms import (
    tf_enhanced_encoding_of,
    tf_enhanced_encodings,
    tf_enhanced_encodings_of,
)
from quantsim.sim.quantizer import QcQuantizeOp
from quantsim.core.spec import PerBlock, PerChannel

__all__ = ["encoding_for_values", "encoding_for_stats", "encodings_for_values", "encodings_for_stats"]


def _grid_flags(q: QcQuantizeOp) -> dict:
    spec = q.spec
    return {
        "symmetric": spec.symmetric,
        "strict": spec.strict_symmetric,
        "unsigned_symmetric": spec.unsigned_symmetric,
    }


def encoding_for_values(q: QcQuantizeOp, values: np.ndarray) -> Encoding:
    """Encoding of a constant tensor (a weight, bias or constant operand) under ``q``'s spec."""
    spec = q.spec
    granularity = spec.granularity
    bits = spec.dtype.bits
    if q.quant_scheme is QuantScheme.post_training_tf_enhanced and not isinstance(granularity, PerBlock):
        axis = granularity.axis if isinstance(granularity, PerChannel) else None
        return tf_enhanced_encoding_of(values, bits, axis=axis, **_grid_flags(q))
    if isinstance(granularity, PerBlock):
        lo, hi = reduce_min_max(values, granularity.axis, granularity.block_axis, granularity.block_size)
        return encoding_from_range(
            lo, hi, bits, axis=granularity.axis, block_axis=granularity.block_axis,
            block_size=granularity.block_size, **_grid_flags(q),
        )
    if isinstance(granularity, PerChannel):
        lo, hi = reduce_min_max(values, granularity.axis)
        return encoding_from_range(lo, hi, bits, axis=granularity.axis, **_grid_flags(q))
    lo, hi = reduce_min_max(values)
    return encoding_from_range(lo, hi, bits, **_grid_flags(q))


def encoding_for_stats(q: QcQuantizeOp, stats: TensorStats) -> Encoding:
    """Encoding of an activation quantizer from its streamed statistics and its quant scheme; a fixed
    range (config ``encoding_constraints``) replaces the observed bounds it names, and a range
    symmetric about zero makes the grid symmetric (AIMET's rule)."""
    bits = q.spec.dtype.bits
    if q.fixed_range is not None:
        lo = stats.min if q.fixed_range[0] is None else q.fixed_range[0]
        hi = stats.max if q.fixed_range[1] is None else q.fixed_range[1]
        flags = _grid_flags(q)
        if lo == -hi:
            flags["symmetric"] = True
        return encoding_from_range(lo, hi, bits, **flags)
    scheme = q.quant_scheme
    if scheme is QuantScheme.post_training_tf_enhanced and stats.histogram is not None:
        return stats.histogram.tf_enhanced_encoding(bits, **_grid_flags(q))
    if scheme is QuantScheme.post_training_percentile and stats.histogram is not None:
        return stats.histogram.percentile_encoding(bits, q.percentile_value, **_grid_flags(q))
    return encoding_from_range(stats.min, stats.max, bits, **_grid_flags(q))


def _tf_enhanced_key(q: QcQuantizeOp) -> tuple:
    return (q.spec.dtype.bits, tuple(sorted(_grid_flags(q).items())))


def encodings_for_values(quantizers, values_of) -> list[Encoding]:
    """`encoding_for_values` of many constants (``values_of(q)`` gives each one's values, fetched when
    needed); TF-enhanced weights share their searches: the same encodings, far less overhead."""
    out, groups = [None] * len(quantizers), {}
    for i, q in enumerate(quantizers):
        granularity = q.spec.granularity
        if q.quant_scheme is QuantScheme.post_training_tf_enhanced and not isinstance(granularity, PerBlock):
            axis = granularity.axis if isinstance(granularity, PerChannel) else None
            groups.setdefault(_tf_enhanced_key(q), []).append((i, q, axis))
        else:
            out[i] = encoding_for_values(q, values_of(q))
    for (bits, flags), members in groups.items():
        tensors = ((values_of(q), axis) for _, q, axis in members)
        for (i, _, _), encoding in zip(members, tf_enhanced_encodings_of(tensors, bits, **dict(flags))):
            out[i] = encoding
    return out


def encodings_for_stats(items) -> list[Encoding]:
    """`encoding_for_stats` of many ``(quantizer, stats)`` pairs; TF-enhanced histograms share their searches."""
    out, groups = [None] * len(items), {}
    for i, (q, stats) in enumerate(items):
        if (q.fixed_range is None and q.quant_scheme is QuantScheme.post_training_tf_enhanced
                and stats.histogram is not None):
            groups.setdefault(_tf_enhanced_key(q), []).append((i, stats.histogram))
        else:
            out[i] = encoding_for_stats(q, stats)
    for (bits, flags), members in groups.items():
        for (i, _), encoding in zip(members, tf_enhanced_encodings([h for _, h in members], bits, **dict(flags))):
            out[i] = encoding
    return out
