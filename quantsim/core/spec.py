"""Quantizer specifications: data type, granularity and grid flavour, as frozen values.

Granularity is data (after torchao's ``PerAxis``): `PerTensor`, `PerChannel(axis)` and
`PerBlock(axis, block_size)` where ``axis`` is the channel (output) axis and blocks run along the
other reduction axis given by ``block_axis``. `QSpec` bundles a `qtype` with a granularity and the
symmetric / strict / unsigned-symmetric flags; every change to a quantizer produces a new QSpec.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from quantsim.core.dtypes import qtype
from quantsim.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["PerTensor", "PerChannel", "PerBlock", "Granularity", "QSpec"]


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
