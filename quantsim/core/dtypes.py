"""Quantized data types: what a quantizer produces, independent of how it is calibrated.

`qtype` is a frozen value: ``qtype.int(8)`` (an n-bit integer grid, 2..16 bits here),
``qtype.float(5, 10)`` (float16, simulated by a cast; float32 = off) or one of the two scaled 8-bit float
formats, ``float8e4m3fn`` (``qtype.float(4, 3, finite=True)``, OCP E4M3: no infinities, max 448) and
``float8e5m2`` (``qtype.float(5, 2)``, IEEE-like E5M2, max 57344), which quantize ``x / scale`` onto the
format's values (`quantsim.core.fp8`) and carry an ONNX float8 zero point in QuantizeLinear (opset 19).
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
    "float8e4m3fn",
    "float8e5m2",
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

# (exponent bits, mantissa bits, finite, unsigned zero) -> ONNX element type of the scaled float formats
_FP8_TYPES = {(4, 3, True, False): TensorProto.FLOAT8E4M3FN, (5, 2, False, False): TensorProto.FLOAT8E5M2}
_FP8_MIN_OPSET = 19  # QuantizeLinear / DequantizeLinear with float8 zero points


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

    For floats, ``exponent_bits``/``mantissa_bits`` describe the format (float16 = 5/10), ``finite`` says it
    has no infinities (its top exponent holds numbers) and ``unsigned_zero`` that it has no negative zero
    (AIMET's four fields; only float8e4m3fn is finite here, no supported format has an unsigned zero).
    """

    kind: str
    bits: int
    exponent_bits: int = 0
    mantissa_bits: int = 0
    finite: bool = False
    unsigned_zero: bool = False

    def __post_init__(self) -> None:
        if self.kind == "int":
            if not MIN_INT_BITS <= self.bits <= MAX_INT_BITS:
                raise InvalidArgumentError(
                    f"integer bitwidth {self.bits} is outside the supported {MIN_INT_BITS}..{MAX_INT_BITS}"
                )
        elif self.kind == "float":
            layout = (self.exponent_bits, self.mantissa_bits, self.finite, self.unsigned_zero)
            if layout not in ((5, 10, False, False), (8, 23, False, False), *_FP8_TYPES):
                raise InvalidArgumentError(
                    f"{self._float_name()} is not supported: only float16 simulation, float32 (no quantization), "
                    "float8e4m3fn (qtype.float(4, 3, finite=True)) and float8e5m2 (qtype.float(5, 2))"
                )
        else:
            raise InvalidArgumentError(f"qtype kind must be 'int' or 'float', got {self.kind!r}")

    # constructors -------------------------------------------------------------------------------
    @classmethod
    def int(cls, bits: int) -> qtype:
        """An integer grid of ``bits`` bits (2..16)."""
        return cls("int", as_bitwidth(bits))

    @classmethod
    def float(cls, exponent_bits: builtins.int, mantissa_bits: builtins.int, finite: bool = False,
              unsigned_zero: bool = False) -> qtype:
        """A float format: float16 (5, 10), float32 (8, 23), float8e4m3fn (4, 3, finite=True) or
        float8e5m2 (5, 2) (AIMET's signature)."""
        return cls("float", exponent_bits + mantissa_bits + 1, exponent_bits, mantissa_bits, bool(finite),
                   bool(unsigned_zero))

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
            if bits == 8:  # AIMET's choice among the 8-bit formats: OCP E4M3
                return float8e4m3fn
            raise InvalidArgumentError(f"float bitwidth {bits} is not supported (8, 16 or 32)")
        return cls.int(bits)

    def to_legacy_repr(self) -> tuple[QuantizationDataType, builtins.int]:
        """The ``(QuantizationDataType, bitwidth)`` pair AIMET's older API uses."""
        kind = QuantizationDataType.int if self.kind == "int" else QuantizationDataType.float
        return kind, self.bits

    # properties ---------------------------------------------------------------------------------
    @property
    def is_float(self) -> bool:
        """Any float format (float16/float32 simulated by a cast, or a scaled float8)."""
        return self.kind == "float"

    @property
    def is_fp8(self) -> bool:
        """Whether this is a scaled 8-bit float format (float8e4m3fn, float8e5m2), with a calibrated scale and
        ONNX float8 Q/DQ."""
        return self.kind == "float" and self.bits == 8

    @property
    def is_cast_float(self) -> bool:
        """A float format simulated by a plain cast, without an encoding (float16; float32 = off)."""
        return self.kind == "float" and self.bits != 8

    @property
    def onnx_name(self) -> str:
        """The ONNX element type's name in lower case ("float8e4m3fn"; "int8"/"float16" for the others)."""
        if self.is_fp8:
            return TensorProto.DataType.Name(_FP8_TYPES[self._layout()]).lower()
        return repr(self)

    def _layout(self) -> tuple[builtins.int, builtins.int, bool, bool]:
        return self.exponent_bits, self.mantissa_bits, self.finite, self.unsigned_zero

    def _float_name(self) -> str:
        fn, uz = "fn" if self.finite else "", "uz" if self.unsigned_zero else ""
        return f"float{self.bits}e{self.exponent_bits}m{self.mantissa_bits}{fn}{uz}"

    def storage_type(self, signed: bool) -> builtins.int:
        """ONNX element type of the Q/DQ container for this grid (next native width up); a float8 format's own
        type (``signed`` does not apply)."""
        if self.is_fp8:
            return _FP8_TYPES[self._layout()]
        if self.is_float:
            raise InvalidArgumentError(f"{self} has no integer storage type")
        for bits in sorted(_NATIVE_CONTAINERS):
            if self.bits <= bits:
                signed_type, unsigned_type, _ = _NATIVE_CONTAINERS[bits]
                return signed_type if signed else unsigned_type
        raise AssertionError("unreachable: bits validated in __post_init__")

    def storage_bits(self) -> builtins.int:
        """Width of the native container carrying this grid (4, 8 or 16; 8 for float8)."""
        if self.is_fp8:
            return 8
        return next(b for b in sorted(_NATIVE_CONTAINERS) if self.bits <= b)

    def min_opset(self) -> builtins.int:
        """Lowest ai.onnx opset whose QuantizeLinear carries this type."""
        if self.is_fp8:
            return _FP8_MIN_OPSET
        if self.is_float:
            return 1
        return _NATIVE_CONTAINERS[self.storage_bits()][2]

    def __repr__(self) -> str:
        if self.kind == "int":
            return f"int{self.bits}"
        if self.is_fp8:
            return self._float_name()
        return f"float{self.bits}"

    __str__ = __repr__


int2 = qtype.int(2)
int4 = qtype.int(4)
int8 = qtype.int(8)
int16 = qtype.int(16)
float16 = qtype.float(5, 10)
float32 = qtype.float(8, 23)
float8e4m3fn = qtype.float(4, 3, finite=True)
float8e5m2 = qtype.float(5, 2)

_ALIASES = {"int2": int2, "int4": int4, "int8": int8, "int16": int16, "float16": float16, "float32": float32,
            "float8e4m3fn": float8e4m3fn, "float8e5m2": float8e5m2}


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
