"""`TensorEncoding`: the format-independent form every reader returns and every writer takes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantsim.core.numerics import Encoding
from quantsim.errors import InvalidArgumentError

__all__ = ["TensorEncoding", "KINDS", "FLOAT16_BITS", "INT32_BITS"]

KINDS = ("param", "activation", None)
FLOAT16_BITS = 16
INT32_BITS = 32


@dataclass(frozen=True)
class TensorEncoding:
    """What one encodings-file entry says about one tensor.

    ``kind`` is "param", "activation" or None (2.0.0 files do not separate them). Integer grids carry an
    `Encoding` (ONNX convention: ``zero_point = -offset`` on unsigned grids) and ``bits`` equal to its
    bitwidth (2..16, or 32 for int32 bias entries); float16 simulation has ``is_float`` set, ``bits`` 16
    and no encoding. ``shape`` is the tensor's shape where known: writing a blockwise encoding in the
    2.0.0 layout needs it. ``lpbq_scale_bits`` is set for an LPBQ weight (`quantsim.core.spec.LPBQ`): its
    blockwise encoding's block scales are ``int_scale * channel_scale`` with ``lpbq_scale_bits``-bit
    ``int_scale`` (AIMET's decompressed bitwidth is ``bits + lpbq_scale_bits``).
    """

    name: str
    kind: str | None
    bits: int
    is_float: bool
    encoding: Encoding | None
    shape: tuple[int, ...] | None = None
    lpbq_scale_bits: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentError(f"tensor name must be a non-empty string, got {self.name!r}")
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"{self.name}: kind must be 'param', 'activation' or None, got {self.kind!r}")
        if self.is_float:
            if self.encoding is not None or self.bits != FLOAT16_BITS:
                raise InvalidArgumentError(f"{self.name}: a float record has bits 16 and no encoding")
        else:
            if not isinstance(self.encoding, Encoding):
                raise InvalidArgumentError(f"{self.name}: an integer record needs an Encoding")
            if self.bits != self.encoding.bits:
                raise InvalidArgumentError(f"{self.name}: bits {self.bits} != encoding bits {self.encoding.bits}")
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.lpbq_scale_bits is not None:
            enc = self.encoding
            if enc is None or enc.block_size is None or not enc.signed or np.any(enc.zero_point != 0):
                raise InvalidArgumentError(f"{self.name}: an LPBQ record needs a symmetric signed blockwise encoding")

    @property
    def grid(self) -> Encoding:
        """The encoding of an integer record (a float record has none: an error naming the tensor)."""
        if self.encoding is None:
            raise InvalidArgumentError(f"{self.name}: a float16 record has no integer grid")
        return self.encoding

    @classmethod
    def from_encoding(
        cls, name: str, encoding: Encoding, kind: str | None = None, shape: tuple[int, ...] | None = None,
        lpbq_scale_bits: int | None = None,
    ) -> TensorEncoding:
        """An integer-grid record (``bits`` taken from the encoding)."""
        return cls(name, kind, encoding.bits, False, encoding, shape, lpbq_scale_bits)

    @classmethod
    def float16(cls, name: str, kind: str | None = None, shape: tuple[int, ...] | None = None) -> TensorEncoding:
        """A float16-simulation record (no grid)."""
        return cls(name, kind, FLOAT16_BITS, True, None, shape)

    def same_as(self, other: TensorEncoding) -> bool:
        """Exact equality, comparing encodings with `Encoding.same_as`."""
        if not isinstance(other, TensorEncoding):
            return False
        if (self.name, self.kind, self.bits, self.is_float, self.shape, self.lpbq_scale_bits) != (
            other.name, other.kind, other.bits, other.is_float, other.shape, other.lpbq_scale_bits
        ):
            return False
        if self.encoding is None or other.encoding is None:
            return self.encoding is other.encoding
        return self.encoding.same_as(other.encoding)
