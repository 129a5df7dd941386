"""Quantized data types: what a quantizer produces, independent of how it is calibrated.

`qtype` is a frozen value: ``qtype.int(8)`` (an n-bit integer grid, 2..16 bits here) or
``qtype.float(5, 10)`` (float16, the only float simulation the sim offers besides float32 = off).
Signedness is not part of the type: symmetric encodings use a signed grid, asymmetric ones an unsigned
grid (AIMET does the same). ``storage_type`` names the ONNX element type that carries the grid in a
QuantizeLinear/DequantizeLinear pair; bitwidths without a native ONNX type ride in the next wider
container behind a Clip (see `numerics.grid_bounds`).
"""
from __future__ import annotations

import builtins
import enum
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from quantsim.errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "qtype",
    "int2",
    "int4",
    "int8",
    "int16",
    "float16",
    "float32",
    "QuantizationDataType",
    "QuantScheme",
    "MIN_INT_BITS",
    "MAX_INT_BITS",
    "as_bitwidth",
]

MIN_INT_BITS = 2
MAX_INT_BITS = 16

# bits -> (signed ONNX type, unsigned ONNX type, minimum opset) for grids ONNX carries natively.
_NATIVE_CONTAINERS = {
    4: (TensorProto.INT4, TensorProto.UINT4, 21),
    8: (TensorProto.INT8, TensorProto.UINT8, 10),
    16: (TensorProto.INT16, TensorProto.UINT16, 21),
}


def as_bitwidth(value: object, what: str = "bitwidth") -> builtins.int:
    """``value`` as an integer bitwidth: ints and integral floats (``8.0``) pass; fractions (``4.5``),
    booleans and non-numbers are an error naming ``what`` (never truncated to a smaller grid)."""
    if isinstance(value, bool) or not isinstance(value, (builtins.int, builtins.float, np.integer, np.floating)):
        raise InvalidTypeError(f"{what} must be an integer number of bits, got {value!r} ({type(value).__name__})")
    if not np.isfinite(value) or builtins.int(value) != value:
        raise InvalidArgumentError(f"{what} must be a whole number of bits, got {value!r}")
    return builtins.int(value)


class QuantizationDataType(enum.Enum):
    """AIMET's legacy data-type switch: integer grid or float simulation."""

    undefined = 0
    int = 1
    float = 2


@dataclass(frozen=True)
class qtype:  # noqa: N801 - the name users know from AIMET
    """A quantized data type: ``kind`` is "int" or "float"; ``bits`` its width.

    For floats, ``exponent_bits``/``mantissa_bits`` describe the format (float16 = 5/10).
    """

    kind: str
    bits: int
    exponent_bits: int = 0
    mantissa_bits: int = 0

    def __post_init__(self) -> None:
        if self.kind == "int":
            if not MIN_INT_BITS <= self.bits <= MAX_INT_BITS:
                raise InvalidArgumentError(
                    f"integer bitwidth {self.bits} is outside the supported {MIN_INT_BITS}..{MAX_INT_BITS}"
                )
        elif self.kind == "float":
            if (self.exponent_bits, self.mantissa_bits) not in ((5, 10), (8, 23)):
                raise InvalidArgumentError(
                    f"float{self.bits} (e{self.exponent_bits}m{self.mantissa_bits}) is not supported: "
                    "only float16 simulation and float32 (no quantization)"
                )
        else:
            raise InvalidArgumentError(f"qtype kind must be 'int' or 'float', got {self.kind!r}")

    # constructors -------------------------------------------------------------------------------
    @classmethod
    def int(cls, bits: int) -> qtype:
        """An integer grid of ``bits`` bits (2..16)."""
        return cls("int", as_bitwidth(bits))

    @classmethod
    def float(cls, exponent_bits: builtins.int, mantissa_bits: builtins.int) -> qtype:
        """A float format; float16 (5, 10) and float32 (8, 23) are supported."""
        return cls("float", exponent_bits + mantissa_bits + 1, exponent_bits, mantissa_bits)

    @classmethod
    def from_string(cls, name: str) -> qtype:
        """Parse an alias such as ``"int8"`` or ``"float16"``."""
        try:
            return _ALIASES[name.strip().lower()]
        except (KeyError, AttributeError):
            raise InvalidArgumentError(
                f"unknown quantized type {name!r}; expected one of {sorted(_ALIASES)} or qtype.int(n)"
            ) from None

    @classmethod
    def as_qtype(cls, value: qtype | str) -> qtype:
        """Accept a qtype or an alias string."""
        if isinstance(value, qtype):
            return value
        if isinstance(value, str):
            return cls.from_string(value)
        raise InvalidTypeError(f"expected a qtype or a type name, got {type(value).__name__}")

    @classmethod
    def from_legacy_repr(cls, data_type: QuantizationDataType, bits: builtins.int) -> qtype:
        """Map AIMET's legacy ``(QuantizationDataType, bitwidth)`` pair to a qtype."""
        if isinstance(data_type, str):
            data_type = QuantizationDataType[data_type]
        bits = as_bitwidth(bits)
        if data_type == QuantizationDataType.float:
            if bits == 16:
                return float16
            if bits == 32:
                return float32
            raise InvalidArgumentError(f"float bitwidth {bits} is not supported (16 or 32)")
        return cls.int(bits)

    def to_legacy_repr(self) -> tuple[QuantizationDataType, builtins.int]:
        """The ``(QuantizationDataType, bitwidth)`` pair AIMET's older API uses."""
        kind = QuantizationDataType.int if self.kind == "int" else QuantizationDataType.float
        return kind, self.bits

    # properties ---------------------------------------------------------------------------------
    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    def storage_type(self, signed: bool) -> builtins.int:
        """ONNX element type of the Q/DQ container for this grid (next native width up)."""
        if self.is_float:
            raise InvalidArgumentError(f"{self} has no integer storage type")
        for bits in sorted(_NATIVE_CONTAINERS):
            if self.bits <= bits:
                signed_type, unsigned_type, _ = _NATIVE_CONTAINERS[bits]
                return signed_type if signed else unsigned_type
        raise AssertionError("unreachable: bits validated in __post_init__")

    def storage_bits(self) -> builtins.int:
        """Width of the native container carrying this grid (4, 8 or 16)."""
        return next(b for b in sorted(_NATIVE_CONTAINERS) if self.bits <= b)

    def min_opset(self) -> builtins.int:
        """Lowest ai.onnx opset whose QuantizeLinear carries this type."""
        if self.is_float:
            return 1
        return _NATIVE_CONTAINERS[self.storage_bits()][2]

    def __repr__(self) -> str:
        if self.kind == "int":
            return f"int{self.bits}"
        return f"float{self.bits}"

    __str__ = __repr__


int2 = qtype.int(2)
int4 = qtype.int(4)
int8 = qtype.int(8)
int16 = qtype.int(16)
float16 = qtype.float(5, 10)
float32 = qtype.float(8, 23)

_ALIASES = {"int2": int2, "int4": int4, "int8": int8, "int16": int16, "float16": float16, "float32": float32}


class QuantScheme(enum.Enum):
    """How activation (and weight) ranges are chosen from observed data.

    ``min_max`` (alias "tf"): running min/max. ``post_training_tf_enhanced``: SQNR search over a
    histogram. ``post_training_percentile``: histogram percentile (the value is set on the sim or on a
    quantizer with ``set_percentile_value``; 100 by default, like AIMET).
    """

    min_max = 1
    post_training_tf_enhanced = 2
    post_training_percentile = 6

    post_training_tf = 1  # alias of min_max (AIMET's older name)

    @classmethod
    def from_str(cls, name: str | QuantScheme) -> QuantScheme:
        """Parse ``"min_max"``, ``"tf"``, ``"tf_enhanced"`` or ``"percentile"`` (or the enum names)."""
        if isinstance(name, QuantScheme):
            return name
        key = str(name).strip().lower()
        table = {
            "min_max": cls.min_max,
            "tf": cls.min_max,
            "post_training_tf": cls.min_max,
            "tf_enhanced": cls.post_training_tf_enhanced,
            "post_training_tf_enhanced": cls.post_training_tf_enhanced,
            "percentile": cls.post_training_percentile,
            "post_training_percentile": cls.post_training_percentile,
        }
        if key not in table:
            raise InvalidArgumentError(
                f"unknown quant scheme {name!r}; expected one of 'min_max' ('tf'), 'tf_enhanced', 'percentile'"
            )
        return table[key]
