"""One calibration of a sim, as a context manager: what ``sim.compute_encodings`` runs, and AIMET's
module-level ``with compute_encodings(sim): ...`` form.

Entering computes the weight encodings and opens the calibration session (the float model with weight
quantizers applied plus in-graph statistics, see `quantsim.calibration`); while the block runs,
``sim.session`` *is* that session, so a user's own loop ``sim.session.run(None, feed)`` collects
statistics, as in AIMET. Leaving turns the statistics into activation encodings, then runs the
calibrated rules of `quantsim.sim.decisions` (untied Concats, range health; with ``sim.range_health`` on)
on the statistics just collected, and last widens the weight scales whose int32 bias would overflow
``s_in * s_w`` on the final input grids (`bias_fit`). Frozen encodings are never touched; an exception
inside (or a calibration that saw no usable batch) leaves every encoding as it was. Nested use is a
no-op, as in AIMET.

At DEBUG level, logger ``quantsim.sim.calibrate`` records each step's wall and process CPU time (all threads):
the weight encodings, the calibration session (graph, fake-quantized weights written or found, onnxruntime's
session creation), the batches and the activation encodings.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from quantsim.calibration.encode import encodings_for_stats
from quantsim.calibration.run import CalibrationSession
from quantsim.errors import warn_at_caller
from quantsim.graph.timing import timed
from quantsim.sim.aimet_differences import announce_calibrated_decisions
from quantsim.sim.bias_fit import fit_biases_to_int32
from quantsim.sim.decisions import apply_calibrated_rules

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel

__all__ = ["calibration_context", "compute_encodings", "RELEASE_CALIBRATION_SESSION_BYTES"]

_log = logging.getLogger(__name__)

RELEASE_CALIBRATION_SESSION_BYTES = 256 << 20
"""Models with at least this many bytes of initializers drop their calibration session after each
calibration: onnxruntime keeps its own copy of the weights per session, and a second session alive next
to ``sim.session`` would double it. Smaller models keep it for the next calibration, unless their weights are
mapped (`QuantizationSimModel.model`): each of their sessions holds its own packed copy."""


@contextmanager
def calibration_context(sim: QuantizationSimModel) -> Iterator[CalibrationSession]:
    """Calibrate ``sim`` with whatever runs the yielded session (module docstring)."""
    active = sim._active_calibration
    if active is not None:  # nested: the outer block calibrates
        yield active
        return
    snapshot = [(q, q.encoding) for q in sim.quantizers]
    version = sim._version
    try:
        with sim.graph_index.cached_constants():  # each weight converted once for encodings and graph
            with timed(_log, "calibration: weight encodings"):
                sim._compute_constant_encodings(only_missing=False)
            observed = [q for q in sim.quantizers if q.enabled and not q.spec.is_float
                        and not q.is_encoding_frozen() and not sim._is_constant_quantizer(q)]
            with timed(_log, "calibration: session"):
                session = sim._calibration_session(observed)
        sim._active_calibration = session
        try:
            with timed(_log, "calibration: batches"):
                yield session
        finally:
            sim._active_calibration = None
        stats = session.finish()
        for q in observed:
            if q.name not in stats:
                warn_at_caller(f"quantizer {q.name!r} saw no data during calibration; left uncalibrated",
                               RuntimeWarning)
        seen = [q for q in observed if q.name in stats]
        items = [(q.calibration_scheme, q.encoding_request(), stats[q.name]) for q in seen]
        with timed(_log, "calibration: activation encodings"):
            new = {q.name: e for q, e in zip(seen, encodings_for_stats(items))}
    except BaseException:
        for q, encoding in snapshot:
            q._encoding = encoding  # restore without validation: these were valid before
        sim._version = version + 1
        raise
    for q in observed:
        if q.name in new:
            q.set_encoding(new[q.name])
    if sim.range_health:
        decisions = apply_calibrated_rules(sim, session, [q for q in observed if q.name in new])
        sim._record_decisions(decisions)
        announce_calibrated_decisions(sim, decisions)
    fit_biases_to_int32(sim)  # input grids are final now: no int32 bias may overflow s_in * s_w
    if sim.graph_index.initializer_bytes() >= RELEASE_CALIBRATION_SESSION_BYTES or sim.graph_index.weights is not None:
        sim._calibration_cache = None


def compute_encodings(sim: QuantizationSimModel):
    """AIMET's module-level form: ``with compute_encodings(sim): for feed in data: sim.session.run(None,
    feed)``; encodings are computed when the block ends (module docstring)."""
    return calibration_context(sim)
