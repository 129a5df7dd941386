"""What the sim computes for a quantized constant, whole or in blocks of rows.

`fake_values` is the float16 round trip for a constant without an encoding (FP16), else its fake
quantization (`numerics.fake_quantize`). `FakeValues` is the same as a deferred computation
(`quantsim.graph.deferred.RowParts`): called, it returns the whole array; its ``parts`` make the same values in
blocks of whole rows, which a session's weight file takes one at a time while each is in the CPU's cache
(`quantsim.graph.session`), instead of filling a tensor-sized array and copying it to the file.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from quantsim.core.numerics import Encoding, fake_quantize, fake_quantize_parts, fp16_round_trip

__all__ = ["fake_values", "FakeValues"]


def fake_values(values: np.ndarray, enc: Encoding | None) -> np.ndarray:
    """What the sim computes for a quantized constant: float16's round trip without an encoding (FP16),
    else its fake quantization (float32)."""
    return fp16_round_trip(values) if enc is None else fake_quantize(values, enc)


class FakeValues:
    """`fake_values` of ``values`` under ``enc`` in ``values``' own dtype, computed when called (whole) or when
    ``parts`` is iterated (blocks of whole rows, bit for bit the whole array's rows)."""

    __slots__ = ("values", "enc")

    def __init__(self, values: np.ndarray, enc: Encoding | None):
        self.values, self.enc = values, enc

    def __call__(self) -> np.ndarray:
        return fake_values(self.values, self.enc).astype(self.values.dtype, copy=False)

    def parts(self) -> Iterator[np.ndarray]:
        if self.enc is None or np.ndim(self.values) == 0:
            yield self()
            return
        for part in fake_quantize_parts(self.values, self.enc):
            yield part.astype(self.values.dtype, copy=False)
