"""Range health: does a calibrated grid still tell a tensor's values apart? PURE numpy.

A grid whose range is set by a few far-away values (an attention fill of -1e4, an outlier channel, a
detector's pixel coordinates next to probabilities) maps everything else onto a handful of codes: the
tensor has *collapsed*. The check runs on a sample of the calibration values (`RANGE_SAMPLE` values per
tensor, `quantsim.calibration.run`) and counts levels by mass, not by presence: the *effective number* of
codes is ``exp(entropy)`` of the codes' share of the values (a stray value on its own code adds almost
nothing; a uniform spread over k codes gives k). Then

    collapsed  <=>  effective codes on the grid < COLLAPSED_CODES  and  effective distinct values >= FEW_CODES

i.e. the data holds at least `FEW_CODES` levels' worth of different values (4 bits) but the grid keeps
fewer than `COLLAPSED_CODES` (2 bits: almost every value on one or two codes). The threshold is set for
the failures that break models, not for ordinary heavy tails: on the benchmark suite, PP-OCR's
HardSwish outputs keep 4-15 effective codes at 8 bits and lose little, while MiniLM's first FFN output
(outliers of 198 next to values of order 1) keeps 1.4 and costs the sentence embedding 0.09 of cosine,
and an additive -1e4 mask on the scores keeps about 2. A tensor that really holds few values (a 0/1
mask, a one-hot, a gate saturated to 0 or 1 up to a few stray values) is not collapsed however few codes
it uses. The fix, applied by the sim
(`quantsim.sim.decisions`): the tensor's 16-bit grid from the same statistics when that one is not
collapsed, otherwise float.
"""
from __future__ import annotations

import math

import numpy as np

from quantsim.core.numerics import Encoding, quantize

__all__ = ["FEW_CODES", "COLLAPSED_CODES", "effective_codes", "is_collapsed"]

FEW_CODES = 16
"""Data with at least this many effective distinct values (4 bits' worth) has levels a grid can lose."""
COLLAPSED_CODES = 4
"""A grid keeping fewer effective codes than this (2 bits' worth) of such data has collapsed."""


def effective_codes(values: np.ndarray, encoding: Encoding | None = None) -> float:
    """``exp(entropy)`` of how the finite ``values`` spread over the codes of a per-tensor ``encoding`` (over
    their distinct values when ``encoding`` is None); 0 for no values."""
    values = np.asarray(values)
    finite = values if math.isfinite(values.min(initial=0.0)) and math.isfinite(values.max(initial=0.0)) \
        else values[np.isfinite(values)]
    if not finite.size:
        return 0.0
    if encoding is None or encoding.fp8 is not None:
        levels = finite if encoding is None else quantize(finite, encoding)
        _, counts = np.unique(levels, return_counts=True)
    else:  # integer codes: counted by bincount, in ascending order as np.unique would list them
        codes = quantize(finite.reshape(-1), encoding)
        counts = np.bincount(codes - codes.min())
        counts = counts[counts > 0]
    share = counts / counts.sum()
    return float(np.exp(-np.sum(share * np.log(share))))


def is_collapsed(values: np.ndarray, encoding: Encoding) -> bool:
    """True when ``encoding`` keeps fewer than `COLLAPSED_CODES` effective codes of data holding at least
    `FEW_CODES` effective distinct values."""
    return effective_codes(values, encoding) < COLLAPSED_CODES and effective_codes(values) >= FEW_CODES
