"""The phase-1 proxy of `auto_quantize`: how closely a session's outputs follow the float model's.

AMP's phase 1 scores every quantizer group alone at every cheaper candidate (hundreds of evaluations on a
real model) to rank the flips; phase 2 judges the budget. With the user's callback in phase 1 each of those
evaluations costs a full pass over the user's evaluation data. `OutputSQNR` ranks them instead by the
signal-to-quantization-noise ratio of the outputs on a few calibration feeds (the first batch, by
default), against the float model's outputs computed once when it is built:

    SQNR of one output = 10 log10(sum(reference^2) / sum((reference - output)^2))   (dB)

averaged over the model's outputs (so outputs of very different scales weigh the same), each clipped to
``[-MAX_DB, MAX_DB]``: an output the quantizers do not change at all scores ``MAX_DB`` rather than ``inf``
(AMP's scores must be finite numbers), and an output whose shape differs from the float one (data-dependent
shapes, e.g. after non-maximum suppression) scores 0 dB (as much noise as signal). Only finite reference
entries count; a non-finite output where the reference is finite scores ``-MAX_DB``. Higher is better, as
AMP expects. The object holds plain arrays and output names, so it pickles for process and Dask executors.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from mixed_precision.auto_quant_inputs import float_session
from mixed_precision.sqnr import power_sqnr_db

__all__ = ["OutputSQNR", "MAX_DB", "sqnr_db"]

MAX_DB = 200.0
"""The largest (and, negated, smallest) SQNR an output can score: an unchanged output is not ``inf``."""


def _one(reference: np.ndarray, output: np.ndarray) -> float:
    ref = np.asarray(reference, dtype=np.float64)
    got = np.asarray(output, dtype=np.float64)
    if ref.shape != got.shape:
        return 0.0
    keep = np.isfinite(ref)
    difference = ref[keep] - got[keep]
    if not np.all(np.isfinite(difference)):  # the quantized output overflowed or is NaN where the float one is not
        return -MAX_DB
    signal = float(np.sum(ref[keep] ** 2))
    noise = float(np.sum(difference ** 2))
    return float(min(MAX_DB, max(-MAX_DB, power_sqnr_db(signal, noise))))


def sqnr_db(reference: Sequence[Sequence[np.ndarray]], outputs: Sequence[Sequence[np.ndarray]]) -> float:
    """Mean over the outputs of each output's SQNR (module docstring) over every feed; ``reference[i][j]``
    is output ``j`` on feed ``i``."""
    if len(reference) != len(outputs) or not reference:
        raise ValueError(f"sqnr_db: {len(reference)} reference feeds, {len(outputs)} output feeds")
    per_output: list[float] = []
    for j in range(len(reference[0])):
        refs = [r[j] for r in reference]
        gots = [o[j] for o in outputs]
        if all(np.shape(a) == np.shape(b) for a, b in zip(refs, gots)):
            per_output.append(_one(np.concatenate([np.ravel(a) for a in refs]),
                                   np.concatenate([np.ravel(b) for b in gots])))
        else:
            per_output.append(0.0)
    return float(np.mean(per_output))


class OutputSQNR:
    """Score ``session`` by the SQNR (dB) of its outputs against ``model``'s on ``feeds`` (module docstring).
    The float outputs are computed once, here, in an onnxruntime CPU session of ``model``
    (`auto_quant_inputs.float_session`, the session the search scores the float model in)."""

    def __init__(self, model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]]):
        if not feeds:
            raise ValueError("OutputSQNR needs at least one feed")
        session = float_session(model)
        self.names = [o.name for o in session.get_outputs()]
        self.feeds = [dict(f) for f in feeds]
        self.reference = [session.run(self.names, f) for f in self.feeds]

    def __call__(self, session: Any) -> float:
        return sqnr_db(self.reference, [session.run(self.names, f) for f in self.feeds])
