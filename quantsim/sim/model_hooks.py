"""The sim's extension hooks (what ``adaround`` and ``mixed_precision`` build on), as a mixin of
`QuantizationSimModel`: weighted layers, reading and replacing weights, capturing tensors, quantizer groups,
and snapshots/transactions of the sim's state. Each method delegates to the module that does the work."""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from quantsim.core.numerics import Encoding
from quantsim.errors import InvalidArgumentError, InvalidStateError
from quantsim.sim.capture import Capturer, iter_tensors, make_capturer
from quantsim.sim.groups import QuantizerGroup, find_quantizer_groups
from quantsim.sim.layers import WeightedLayer, find_weighted_layers, read_weight, write_weight
from quantsim.sim.state import SimState, record_weight, restore, snapshot, temporary_state, transaction

if TYPE_CHECKING:
    from quantsim.graph.index import GraphIndex
    from quantsim.graph.session import WeightFiles
    from quantsim.sim.model import QuantizationSimModel
    from quantsim.sim.quantizer import QcQuantizeOp

__all__ = ["SimHooks"]


def _sim(hooks: SimHooks) -> QuantizationSimModel:
    """The sim the mixin is part of (for the typed helpers that take the whole sim)."""
    return cast("QuantizationSimModel", hooks)


class SimHooks:
    """Extension hooks of `QuantizationSimModel` (see the module docstring)."""

    if TYPE_CHECKING:
        _index: GraphIndex
        _constant_memo: dict[str, tuple]
        _weight_files: WeightFiles | None
        _calibration_cache: tuple | None
        qc_quantize_op_dict: dict[str, QcQuantizeOp]

        def _invalidate(self) -> None: ...
        def _ensure_param_encodings(self) -> None: ...

    def weighted_layers(self) -> list[WeightedLayer]:
        """Conv/ConvTranspose/Gemm/MatMul nodes with a constant weight, in topological order, with their
        tensors, weight quantizer and following activation (see `quantsim.sim.layers`)."""
        return find_weighted_layers(_sim(self))

    def get_weight(self, name: str) -> np.ndarray:
        """A float copy of constant ``name`` of the prepared model (before fake quantization)."""
        return read_weight(_sim(self), name)

    def replace_weight(self, name: str, values: np.ndarray, *, encoding: Encoding | None = None,
                       freeze: bool = False) -> None:
        """Replace constant ``name``'s values (same shape); optionally install ``encoding`` on its quantizer
        and freeze it. Sessions that depend on it are rebuilt on next use; open snapshots can undo it."""
        old = read_weight(_sim(self), name)
        q = self.qc_quantize_op_dict.get(name)
        if (encoding is not None or freeze) and q is None:
            raise InvalidArgumentError(f"{name!r} has no quantizer to take an encoding or be frozen")
        if encoding is not None and q is not None and q.is_encoding_frozen():
            raise InvalidStateError(f"quantizer {q.name!r} is frozen: its encoding cannot change")
        record_weight(_sim(self), name, old)
        self._write_weight(name, values)
        if encoding is not None and q is not None:
            q.set_encoding(encoding)
        if freeze and q is not None:
            q.freeze_encodings()

    def _write_weight(self, name: str, values: np.ndarray) -> None:
        write_weight(_sim(self), name, values)
        self._constant_memo.clear()
        if self._weight_files is not None:
            self._weight_files.forget(name)
        self._calibration_cache = None  # its key holds quantizer state, not weight values
        self._invalidate()

    def capture(self, tensors, inputs, *, quantized: bool = True):
        """Yield ``{tensor: array}`` per feed dict of ``inputs``: the values of ``tensors`` in the sim
        (after their quantizers) or, with ``quantized=False``, in the float model. Streamed: nothing is
        kept between batches (keep what you need, e.g. in a `quantsim.TensorCache`)."""
        return iter_tensors(_sim(self), tensors, inputs, quantized=quantized)

    def capturer(self, tensors, *, quantized: bool = True) -> Capturer:
        """A callable ``capturer(inputs)`` like `capture`, bound to the sim (or float model) as it is now:
        later changes to the sim do not reach it (e.g. float targets while weights are being replaced)."""
        return make_capturer(_sim(self), tensors, quantized=quantized)

    def quantizer_groups(self) -> list[QuantizerGroup]:
        """Each weighted op's parameter quantizers with the activation quantizers it reads; every enabled
        quantizer in exactly one group (see `quantsim.sim.groups`)."""
        return find_quantizer_groups(_sim(self))

    def snapshot(self) -> SimState:
        """The sim's state (quantizers, replaced weights, sessions), for `restore`."""
        return snapshot(_sim(self))

    def restore(self, state: SimState) -> None:
        """Put the sim back exactly into a `snapshot` (no session rebuild when nothing else changed)."""
        restore(_sim(self), state)

    def temporary_state(self):
        """Context manager: change quantizers or weights inside it; on exit the sim is restored exactly."""
        return temporary_state(_sim(self))

    def transaction(self):
        """Context manager: changes inside it stay if the block completes; an exception (KeyboardInterrupt
        included) restores the sim exactly as it was."""
        return transaction(_sim(self))

    def compute_param_encodings(self) -> None:
        """Encodings of enabled parameter quantizers that have none yet, from the weights (no data needed)."""
        with self._index.cached_constants():
            self._ensure_param_encodings()
