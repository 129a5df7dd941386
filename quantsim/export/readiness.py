"""Is a sim calibrated enough to export? One policy for the QDQ and the integer exports.

An export of a sim none of whose enabled activation quantizers has an encoding would hold no activation
grid at all: that is an error (the user forgot ``compute_encodings`` or ``load_encodings_to_sim``). When only
some lack one (calibration saw nothing but NaN/Inf there, e.g. a Sqrt of negative values, and warned), the
sim passes those tensors through in float, and so does the export: a warning names them.
"""
from __future__ import annotations

from quantsim.errors import InvalidStateError, QuantsimError, warn_at_caller

__all__ = ["check_activations_calibrated"]


def check_activations_calibrated(sim, what: str, error: type[QuantsimError] = InvalidStateError) -> None:
    """Raise ``error`` when no enabled (integer-grid) activation quantizer of ``sim`` has an encoding; warn, naming
    them, when only some lack one."""
    activations = [q for q in sim.quantizers if q.enabled and q.role == "activation" and not q.spec.is_float]
    missing = [q.name for q in activations if q.encoding is None]
    if not missing:
        return
    if len(missing) == len(activations):
        raise error(f"{what}: no activation quantizer has an encoding (e.g. {missing[:3]}); call compute_encodings "
                    "(or load encodings) first")
    warn_at_caller(f"{what}: {len(missing)} enabled activation quantizer(s) have no encoding (calibration saw no "
                   f"finite values there) and stay float, as in the sim, e.g. {missing[:3]}", RuntimeWarning)
