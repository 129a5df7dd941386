"""Signal-to-quantization-noise ratio in decibels, from power sums: the one formula behind the analysis page's
per-tensor figures, the command line's output agreement and `auto_quantize`'s phase-1 proxy (which clips it to
a finite range, `auto_quant_proxy.MAX_DB`)."""
from __future__ import annotations

import math

__all__ = ["power_sqnr_db"]


def power_sqnr_db(signal: float, noise: float) -> float:
    """``10 log10(signal / noise)`` for ``signal = sum(reference^2)`` and ``noise = sum((reference - got)^2)``:
    ``inf`` without noise (whatever the signal), ``-inf`` for noise on a zero signal (all noise, no signal)."""
    if noise <= 0:
        return math.inf
    if signal <= 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)
