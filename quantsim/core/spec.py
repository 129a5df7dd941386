"""Quantizer specifications: data type, granularity and grid flavour, as frozen values.

Granularity is data (after torchao's ``PerAxis``): `PerTensor`, `PerChannel(axis)` and
`PerBlock(axis, block_size)` where ``axis`` is the channel (output) axis and blocks run along the
other reduction axis given by ``block_axis``; `LPBQ` is a `PerBlock` whose block scales are themselves
quantized to ``scale_bits``-bit integers under one float scale per channel (low-power blockwise
quantization, AIMET's ``QSpec.lpbq``). `QSpec` bundles a `qtype` with a granularity and the
symmetric / strict / unsigned-symmetric flags; every change to a quantizer produces a new QSpec.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from quantsim.core.dtypes import qtype
from quantsim.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["PerTensor", "PerChannel", "PerBlock", "LPBQ", "Granularity", "QSpec"]


@dataclass(frozen=True)
class PerTensor:
    """One scale for the whole tensor."""

    def describe(self) -> str:
        return "per-tensor"


@dataclass(frozen=True)
class PerChannel:
    """One scale per slice along ``axis`` (ONNX's per-axis quantization)."""

    axis: int

    def describe(self) -> str:
        return f"per-channel(axis={self.axis})"


@dataclass(frozen=True)
class PerBlock:
    """One scale per (channel, block): channels along ``axis``, blocks of ``block_size`` along ``block_axis``."""

    axis: int
    block_axis: int
    block_size: int

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise InvalidArgumentError(f"block_size must be positive, got {self.block_size}")
        if self.axis == self.block_axis:
            raise InvalidArgumentError("the channel axis and the block axis must differ")

    def describe(self) -> str:
        return f"per-block(axis={self.axis}, block_axis={self.block_axis}, block_size={self.block_size})"


@dataclass(frozen=True)
class LPBQ(PerBlock):
    """Low-power blockwise quantization: a `PerBlock` grid whose block scales are
    ``int_scale * channel_scale`` with ``int_scale`` in ``[1, 2^scale_bits]`` and one float
    ``channel_scale`` per channel (`quantsim.core.lpbq`). AIMET calls ``bits + scale_bits`` the
    decompressed bitwidth. Symmetric integer grids only."""

    scale_bits: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.scale_bits, bool) or not isinstance(self.scale_bits, int) or not 1 <= self.scale_bits <= 16:
            raise InvalidArgumentError(f"LPBQ scale_bits must be an integer in 1..16, got {self.scale_bits!r}")

    def describe(self) -> str:
        return (f"lpbq(axis={self.axis}, block_axis={self.block_axis}, block_size={self.block_size}, "
                f"scale_bits={self.scale_bits})")


Granularity = PerTensor | PerChannel | PerBlock


@dataclass(frozen=True)
class QSpec:
    """What a quantizer does: ``dtype`` on a ``granularity``, symmetric or not.

    ``strict_symmetric`` drops the most negative code (int8 grid -127..127); ``unsigned_symmetric``
    lets a symmetric quantizer use an unsigned grid with zero point 0 when the observed range is
    non-negative. Float dtypes ignore all of these: float16 is a cast, float8 always symmetric about zero.
    """

    dtype: qtype
    granularity: Granularity = PerTensor()
    symmetric: bool = False
    strict_symmetric: bool = False
    unsigned_symmetric: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, qtype):
            object.__setattr__(self, "dtype", qtype.as_qtype(self.dtype))
        if not isinstance(self.granularity, (PerTensor, PerChannel, PerBlock)):
            raise InvalidTypeError(f"unknown granularity {self.granularity!r}")
        if isinstance(self.granularity, LPBQ) and not self.dtype.is_float and not self.symmetric:
            raise InvalidArgumentError(f"LPBQ needs a symmetric grid, got {self.describe()}")

    @classmethod
    def per_tensor(cls, dtype: qtype | str, *, symmetric: bool = False) -> QSpec:
        return cls(qtype.as_qtype(dtype), PerTensor(), symmetric)

    @classmethod
    def per_channel(cls, dtype: qtype | str, axis: int = 0, *, symmetric: bool = True) -> QSpec:
        return cls(qtype.as_qtype(dtype), PerChannel(axis), symmetric)

    @classmethod
    def blockwise(
        cls, dtype: qtype | str, block_size: int, *, axis: int = 0, block_axis: int = 1, symmetric: bool = True
    ) -> QSpec:
        return cls(qtype.as_qtype(dtype), PerBlock(axis, block_axis, block_size), symmetric)

    @classmethod
    def lpbq(cls, dtype: qtype | str, block_size: int = 64, scale_bits: int = 4, *, axis: int = 0,
             block_axis: int = 1) -> QSpec:
        """Symmetric `LPBQ` (AIMET's ``QSpec.lpbq(dtype, block_size=64, scale_bits=4)``)."""
        return cls(qtype.as_qtype(dtype), LPBQ(axis, block_axis, block_size, scale_bits), True)

    def with_(self, **changes) -> QSpec:
        """A copy with some fields changed."""
        return replace(self, **changes)

    @property
    def is_float(self) -> bool:
        """Whether this is simulated by a plain cast (float16), with no encoding and no calibration. False for the float8 formats,
        which have encodings (a scale per tensor or channel) like integer grids: see `is_fp8`."""
        return self.dtype.is_cast_float

    @property
    def is_fp8(self) -> bool:
        """A scaled float8 format (float8e4m3fn, float8e5m2)."""
        return self.dtype.is_fp8

    def describe(self) -> str:
        if self.is_float:
            return str(self.dtype)
        if self.is_fp8:
            return f"{self.dtype} {self.granularity.describe()}"
        flavour = "sym" if self.symmetric else "asym"
        if self.symmetric and self.strict_symmetric:
            flavour = "strict-sym"
        return f"{self.dtype} {flavour} {self.granularity.describe()}"
