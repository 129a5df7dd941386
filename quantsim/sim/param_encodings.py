"""The encodings of a sim's constants (weights, biases, constant operands) from their values.

Computed in batches of bounded size, so a large model's weights are never all converted at once. A sim whose
weights are mapped from a preparation-cache entry (large models) keeps them in the entry's store
(`quantsim.graph.weight_store`) for later processes, keyed by the quantizer's tensors, built-in scheme and
request: for TF-enhanced, whose per-channel histogram searches over a large model's weights cost about as much
CPU as a pass over the calibration data, a later process computes nothing, and reads none of the weights.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from quantsim.calibration.encode import encodings_for_values
from quantsim.graph.index import CONSTANT_CACHE_BYTES
from quantsim.graph.large_models import value_bytes
from quantsim.graph.mapped import is_mapped
from quantsim.graph.weight_store import FakeQuantStore, fake_quant_store

if TYPE_CHECKING:
    from quantsim.sim.model import QuantizationSimModel
    from quantsim.sim.quantizer import QcQuantizeOp

__all__ = ["compute_constant_encodings"]


def compute_constant_encodings(sim: QuantizationSimModel, only_missing: bool) -> None:
    """Set the encoding of every enabled, unfrozen integer quantizer of constants (those without one only, with
    ``only_missing``) from the constants' values, or from the entry's store where it holds them."""
    todo = [q for q in sim.quantizers  # the cheap test first: every capture asks for the missing ones only
            if not (only_missing and q.encoding is not None)
            and q.enabled and not q.spec.is_float and not q.is_encoding_frozen() and sim._is_constant_quantizer(q)]
    store = fake_quant_store(sim._weights.folder) if sim._weights is not None and todo else None
    names: dict[str, str] = {}
    if store is not None:
        names = {q.name: name for q in todo if (name := _name(sim, store, q)) is not None}
        found = {q.name: store.load_encoding(names[q.name]) for q in todo if q.name in names}
        for q in todo:
            if found.get(q.name) is not None:
                q.set_encoding(found[q.name])
        todo = [q for q in todo if found.get(q.name) is None]
    start, size = 0, 0
    for end, q in enumerate(todo, 1):
        size += value_bytes(sim.graph_index.initializers[t] for t in q.tensors)
        if size >= CONSTANT_CACHE_BYTES or end == len(todo):
            batch = todo[start:end]
            items = [(q.calibration_scheme, q.encoding_request(), sim._constant_values(q)) for q in batch]
            for q, encoding in zip(batch, encodings_for_values(items)):
                q.set_encoding(encoding)
                if store is not None and q.name in names:
                    store.save_encoding(names[q.name], encoding)
            start, size = end, 0


def _name(sim: QuantizationSimModel, store: FakeQuantStore, q: QcQuantizeOp) -> str | None:
    """The store's name for ``q``'s encoding; None unless its values are all the entry's (mapped from it, not
    replaced) and its scheme is built in (a user's scheme's code is not known)."""
    tensors = [sim.graph_index.initializers.get(t) for t in q.tensors]
    if not all(tensor is not None and is_mapped(tensor) for tensor in tensors):
        return None
    scheme = q.calibration_scheme
    functions = (scheme.from_values, scheme.batch_from_values)
    if not all(f is None or getattr(f, "__module__", "").startswith("quantsim.") for f in functions):
        return None
    return store.encoding_name((tuple(q.tensors), scheme.name, repr(q.encoding_request())))
