"""Splitting a tied quantizer: one quantizer per tensor, each starting from the shared state.

Placement ties tensors to one quantizer (a Concat's inputs share its output's grid, a Relu's output its
input's); calibration may untie a Concat whose inputs' ranges differ by orders of magnitude
(`quantsim.sim.decisions`). An encodings file has one entry per tensor, so it can say that tensors a fresh
sim ties have grids of their own (or that some of them are float): loading such a file onto a sim that
ties them must split the tie, else one entry silently overwrites the others
(`quantsim.encodings.transfer.load_records`).

`split_tied` gives every tensor of a quantizer its own quantizer, each a copy of the shared one (spec,
enabled, encoding, frozen state, calibration scheme, fixed range, target guard): the split alone changes
nothing the sim computes. The original keeps its name and the tensor it is named after.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from quantsim.sim.quantizer import QcQuantizeOp

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel

__all__ = ["split_tied", "tied_encodings_differ"]


def _copy(sim: QuantizationSimModel, like: QcQuantizeOp, tensor: str) -> QcQuantizeOp:
    fresh = QcQuantizeOp(tensor, like.role, like.spec, enabled=like.enabled, tensors=(tensor,), shape=like.shape,
                         channel_axis=like.channel_axis, quant_scheme=like.calibration_scheme,
                         percentile=like.percentile_value, notify=sim._invalidate, param_type=like.param_type,
                         fixed_range=like.fixed_range)
    fresh.guard = like.guard
    fresh.set_encoding(like.encoding)
    if like.is_encoding_frozen():
        fresh.freeze_encodings()
    return fresh


def split_tied(sim: QuantizationSimModel, q: QcQuantizeOp) -> list[QcQuantizeOp]:
    """Give each tensor of ``q`` (one of ``sim``'s quantizers) a quantizer of its own, a copy of ``q``;
    returns the new ones (empty when ``q`` covers one tensor). ``q`` keeps the tensor it is named after (its
    first tensor if none); the new ones follow it in the sim's quantizer order."""
    if len(q.tensors) < 2:
        return []
    kept = q.name if q.name in q.tensors else q.tensors[0]
    fresh = [_copy(sim, q, t) for t in q.tensors if t != kept]
    position = sim._quantizers.index(q)
    q.tensors = (kept,)
    q.name = kept
    sim._quantizers[position + 1:position + 1] = fresh
    for p in [q, *fresh]:
        sim.qc_quantize_op_dict[p.name] = p
    sim._invalidate()
    return fresh


def tied_encodings_differ(entries: list[tuple[object, object]]) -> bool:
    """Whether ``(spec, encoding)`` pairs (loaded for tensors that share one quantizer) are not all the same
    grid."""
    first_spec, first = entries[0]
    for spec, encoding in entries[1:]:
        if spec != first_spec or (encoding is None) != (first is None):
            return True
        if encoding is not None and not _same_encoding(first, encoding):
            return True
    return False


def _same_encoding(a, b) -> bool:
    fields = ("bits", "signed", "qmin", "qmax", "symmetric", "axis", "block_axis", "block_size", "fp8")
    return (all(getattr(a, f) == getattr(b, f) for f in fields) and np.array_equal(a.scale, b.scale)
            and np.array_equal(a.zero_point, b.zero_point))
