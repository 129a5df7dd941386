"""Where the sim builder puts its big weights: deferred (computed when written), held beside the model, or in it.

A weight the builder computes from the source model (a constant's fake-quantized values, a QDQ export's
integer codes, a mapped weight copied unchanged) is deferred through one contract, `WeightDeferral.defer`: the
model gets a placeholder initializer (name, type, dims) and its holder a `DeferredArray` of the function
computing the values, keyed ``(name, key)`` where ``key`` is everything the values depend on besides the source
weights (equal keys, equal values). Nothing is computed while building; whoever writes the model computes each
value as it writes it, one at a time (`quantsim.graph.deferred`). One holder per build:

* exports (``deferred``, a `DeferredWeights`): every weight `DeferredWeights.accepts`; writers stream them to
  disk. An export writes every weight, so its keys go unused.
* sessions (``external``, the arrays `session.make_session` takes beside the model): weights computed from
  mapped source weights (`quantsim.graph.mapped`: immutable, and never in memory) in builds that keep no
  ``memo``, where `model_io.in_memory_placeholder` takes them. The session computes them while writing its
  weight files, and `session.WeightFiles` reuses a file whose value's key is unchanged: rebuilds and later
  processes recompute only what changed.

A weight not deferred is computed now: a session build still keeps a big one out of the model (`hold`) and
shares it between builds through ``memo`` (`remembered`); other builds put it in the model. An initializer
that is also a graph input (it can be fed) is never replaced by a placeholder.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from quantsim.graph.deferred import DeferredArray, DeferredWeights
from quantsim.graph.mapped import is_mapped
from quantsim.graph.model_io import in_memory_placeholder

__all__ = ["WeightDeferral"]


class WeightDeferral:
    """The holders of one build's big weights (module docstring): ``external`` (sessions: name -> array or
    `DeferredArray`, filled here), ``memo`` (sessions: name -> (key, array), kept by the caller across builds,
    used only with ``external``), ``deferred`` (exports, used only without ``external``). ``declared_inputs``:
    the model's graph inputs."""

    def __init__(self, external: dict | None, memo: dict[str, tuple] | None, deferred: DeferredWeights | None,
                 declared_inputs: set[str]):
        self.external = external
        self.memo = memo if external is not None else None
        self.deferred = deferred if external is None else None
        self.declared_inputs = declared_inputs

    def defer(self, name: str, elem_type: int, source: onnx.TensorProto, key: tuple,
              compute: Callable[[], np.ndarray]) -> TensorProto | None:
        """The placeholder ``name`` of a weight of ``elem_type``, shaped as initializer ``source`` it is computed
        from, whose values ``compute()`` returns when written (any dtype: they are cast), under ``key`` (what
        they depend on besides ``source``'s values); None if this build computes it now."""
        shape = tuple(int(d) for d in source.dims)
        if source.name in self.declared_inputs:
            return None
        if self.deferred is not None:
            if not self.deferred.accepts(elem_type, shape):
                return None
            return self.deferred.put(name, self._values(name, elem_type, shape, key, compute))
        if self.external is None or self.memo is not None or not is_mapped(source):
            return None
        return self.hold(name, self._values(name, elem_type, shape, key, compute))

    @staticmethod
    def _values(name: str, elem_type: int, shape: tuple[int, ...], key: tuple,
                compute: Callable[[], np.ndarray]) -> DeferredArray:
        return DeferredArray(shape, helper.tensor_dtype_to_np_dtype(elem_type), compute, key=(name, key))

    def hold(self, name: str, values: np.ndarray | DeferredArray) -> TensorProto | None:
        """With ``external``: the placeholder of ``name`` for ``values`` (recorded there), if they may leave the
        model (`model_io.in_memory_placeholder`) and ``name`` is no graph input; else None."""
        if self.external is None or name in self.declared_inputs:
            return None
        placeholder = in_memory_placeholder(name, values)
        if placeholder is not None:
            self.external[name] = values
        return placeholder

    def remembered(self, name: str, key: tuple, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """``compute()``, or the array an earlier build made for ``name`` under the same ``key`` (with ``memo``):
        the sim and calibration sessions then hold one copy of big weights between them."""
        if self.memo is None:
            return compute()
        known = self.memo.get(name)
        if known is not None and known[0] == key:
            return known[1]
        value = compute()
        self.memo[name] = (key, value)
        return value
