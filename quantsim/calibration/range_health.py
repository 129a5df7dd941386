"""Range health: does a calibrated grid still tell a tensor's values apart? PURE numpy.

A grid whose range is set by a few far-away values (an attention fill of -1e4, an outlier channel, a
detector's pixel coordinates next to probabilities) maps everything else onto a handful of codes: the
tensor has *collapsed*. The check runs on a sample of the calibration values (`RANGE_SAMPLE` values per
tensor, `quantsim.calibration.run`):

    collapsed  <=>  codes used < FEW_CODES <= distinct values in the sample

i.e. the data holds at least `FEW_CODES` different values but the grid distinguishes fewer than that. A
tensor that really holds few values (a 0/1 mask, a one-hot, a saturated gate) is not collapsed however
few codes it uses, and 16 codes is 4 bits of resolution: below it the quantization error is a large part
of every value. The fix (`health_fix`): the tensor's 16-bit grid from the same statistics when that one is
healthy, otherwise float.
"""
from __future__ import annotations

import numpy as np

from quantsim.core.numerics import Encoding, quantize

__all__ = ["FEW_CODES", "codes_used", "is_collapsed"]

FEW_CODES = 16
"""A tensor whose values hold at least this many distinct values but fall on fewer codes has collapsed."""


def codes_used(values: np.ndarray, encoding: Encoding) -> int:
    """How many distinct codes of the per-tensor ``encoding`` the finite ``values`` fall on."""
    finite = np.asarray(values)[np.isfinite(values)]
    return int(np.unique(quantize(finite, encoding)).size) if finite.size else 0


def is_collapsed(values: np.ndarray, encoding: Encoding) -> bool:
    """True when ``values`` hold at least `FEW_CODES` distinct values but use fewer codes of ``encoding``."""
    finite = np.asarray(values)[np.isfinite(values)]
    if np.unique(finite).size < FEW_CODES:
        return False
    return codes_used(finite, encoding) < FEW_CODES
