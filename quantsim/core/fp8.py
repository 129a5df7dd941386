"""The scaled 8-bit float formats: their values and rounding onto them. PURE: numpy only, no I/O, no ONNX.

A format with ``e`` exponent bits, ``m`` mantissa bits and bias ``2^(e-1) - 1`` holds zero, the subnormals
``k * 2^(1 - bias - m)`` (``0 < k < 2^m``) and the normals ``(1 + f / 2^m) * 2^E`` for ``1 - bias <= E <= Emax``:

* float8e4m3fn (OCP E4M3, ``finite``): no infinities; the top exponent holds numbers except its all-ones
  mantissa, which is NaN: ``Emax = 8``, largest ``(2 - 2^(1-m)) * 2^8 = 448``, smallest subnormal ``2^-9``;
* float8e5m2 (IEEE-like): the top exponent holds inf/NaN: ``Emax = 15``, largest ``1.75 * 2^15 = 57344``,
  smallest subnormal ``2^-16``.

`round_to_format` is ONNX's saturating cast (QuantizeLinear with a float8 zero point and ``saturate=1``,
the default, which is also what AIMET 2.42's kernel computes): round to the nearest value, ties to the even
mantissa; magnitudes beyond the largest finite value (infinities included) saturate to it; NaN stays NaN;
the sign of zero is kept. ``x`` is taken as float32 first, like onnxruntime does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Fp8Format", "FP8_FORMATS", "fp8_format", "round_to_format", "format_values"]


@dataclass(frozen=True)
class Fp8Format:
    """One float8 layout: ``name`` is ONNX's ("float8e4m3fn"), the rest follows from the bit fields."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    finite: bool

    @property
    def bias(self) -> int:
        return (1 << (self.exponent_bits - 1)) - 1

    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal number (subnormals share its step)."""
        return 1 - self.bias

    @property
    def max_exponent(self) -> int:
        top = (1 << self.exponent_bits) - 1  # all-ones exponent field
        return top - self.bias if self.finite else top - 1 - self.bias

    @property
    def max_value(self) -> float:
        """Largest finite value (AIMET's ``max_representable``): 448 for E4M3FN, 57344 for E5M2."""
        unit = 2.0 ** -self.mantissa_bits
        mantissa = 2.0 - 2.0 * unit if self.finite else 2.0 - unit
        return mantissa * 2.0 ** self.max_exponent

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.min_exponent - self.mantissa_bits)


FP8_FORMATS = {
    "float8e4m3fn": Fp8Format("float8e4m3fn", 4, 3, True),
    "float8e5m2": Fp8Format("float8e5m2", 5, 2, False),
}


def fp8_format(name: str) -> Fp8Format:
    """The format called ``name`` ("float8e4m3fn" or "float8e5m2")."""
    return FP8_FORMATS[name]


def round_to_format(x: np.ndarray, fmt: Fp8Format) -> np.ndarray:
    """``x`` (as float32) rounded onto ``fmt``'s values as float32 (module docstring: ties to even, saturating).

    The step at a magnitude ``|x|`` of exponent ``E`` (``2^E <= |x| < 2^(E+1)``, ``E`` at least the smallest
    normal exponent) is ``2^(E - m)``; ``|x| / step`` is exact in float32 (a power of two), so ``rint`` of it
    is the tie-to-even rounding of the mantissa, and a carry into the next binade lands on its first value.
    """
    x = np.asarray(x, dtype=np.float32)
    magnitude = np.abs(x)
    _, exponent = np.frexp(magnitude)  # magnitude = f * 2^exponent, 0.5 <= f < 1 (exponent 0 for 0, inf, NaN)
    exponent = np.maximum(exponent.astype(np.int32) - 1, fmt.min_exponent)
    step = np.ldexp(np.float32(1.0), exponent - fmt.mantissa_bits).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        rounded = np.rint(magnitude / step) * step
        rounded = np.where(magnitude > fmt.max_value, np.float32(fmt.max_value), rounded)  # inf too; NaN stays
        rounded = np.minimum(rounded, np.float32(fmt.max_value))
    return np.copysign(rounded, x).astype(np.float32)[()]


def format_values(fmt: Fp8Format) -> np.ndarray:
    """Every finite value of ``fmt``, ascending, as float64 (zero once): decoded from the bit fields, an
    independent table for tests of `round_to_format`."""
    values: set[float] = set()
    for exponent_field in range(1 << fmt.exponent_bits):
        for mantissa_field in range(1 << fmt.mantissa_bits):
            top = exponent_field == (1 << fmt.exponent_bits) - 1
            if top and (not fmt.finite or mantissa_field == (1 << fmt.mantissa_bits) - 1):
                continue  # inf/NaN (E5M2) or the NaN code (E4M3FN)
            if exponent_field == 0:
                value = mantissa_field * 2.0 ** (1 - fmt.bias - fmt.mantissa_bits)
            else:
                value = (1 + mantissa_field / (1 << fmt.mantissa_bits)) * 2.0 ** (exponent_field - fmt.bias)
            values.update((value, -value))
    return np.array(sorted(values), dtype=np.float64)
