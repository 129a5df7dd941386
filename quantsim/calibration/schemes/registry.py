"""The registry of calibration schemes: how a quantizer's statistics or values become an encoding.

A scheme is one module that builds a `CalibrationScheme` and calls `register_scheme` at import time
(`quantsim.calibration.schemes` imports the built-in ones). Calibration hands each scheme plain data,
an `EncodingRequest` (bits, grid flags, granularity, parameters) plus either the constant's values or
the streamed `TensorStats`; it never sees quantizer objects. A scheme may also answer many requests at
once (``batch_from_stats`` / ``batch_from_values``), which TF-enhanced uses to share its searches.

A float8 request (``fp8`` set, ``bits`` 8) may be answered by the scheme with a float8 encoding (min-max
does: ``scale = max(|min|, |max|) / max_value`` of the observed range); any other scheme answers with its
8-bit integer grid, whose largest magnitude then gives the float8 scale (`calibration.encode`), which is what
AIMET 2.42 does for TF-enhanced and percentile.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quantsim.calibration.run import TensorStats
from quantsim.core.dtypes import QuantScheme
from quantsim.core.fp8_encodings import fp8_encoding_from_range
from quantsim.core.numerics import Encoding, encoding_from_range, reduce_min_max
from quantsim.errors import InvalidArgumentError

__all__ = [
    "EncodingRequest",
    "CalibrationScheme",
    "register_scheme",
    "get_scheme",
    "registered_schemes",
    "min_max_from_values",
]


@dataclass(frozen=True)
class EncodingRequest:
    """What an encoding must be: ``bits``, grid flags, granularity (``axis`` for per channel; plus
    ``block_axis``/``block_size`` for per block), the scheme's parameters (e.g. ``percentile``) and a
    fixed range that replaces the observed bounds it names. ``fp8`` names a float8 format for a float8
    quantizer (module docstring)."""

    bits: int
    symmetric: bool
    strict: bool = False
    unsigned_symmetric: bool = False
    axis: int | None = None
    block_axis: int | None = None
    block_size: int | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    fixed_range: tuple[float | None, float | None] | None = None  # config encoding_constraints
    fp8: str | None = None

    @property
    def grid_flags(self) -> dict[str, bool]:
        return {"symmetric": self.symmetric, "strict": self.strict, "unsigned_symmetric": self.unsigned_symmetric}

    @property
    def batch_key(self) -> tuple:
        """Requests with equal keys can share one batched computation."""
        return (self.bits, self.symmetric, self.strict, self.unsigned_symmetric)


def min_max_from_values(request: EncodingRequest, values: np.ndarray) -> Encoding:
    """Min-max encoding of a constant at the request's granularity (per tensor, channel or block)."""
    if request.fp8 is not None and request.block_size is None:
        lo, hi = reduce_min_max(values, request.axis)
        return fp8_encoding_from_range(lo, hi, request.fp8, axis=request.axis)
    if request.block_size is not None:
        lo, hi = reduce_min_max(values, request.axis, request.block_axis, request.block_size)
        return encoding_from_range(lo, hi, request.bits, axis=request.axis, block_axis=request.block_axis,
                                   block_size=request.block_size, **request.grid_flags)
    if request.axis is not None:
        lo, hi = reduce_min_max(values, request.axis)
        return encoding_from_range(lo, hi, request.bits, axis=request.axis, **request.grid_flags)
    lo, hi = reduce_min_max(values)
    return encoding_from_range(lo, hi, request.bits, **request.grid_flags)


@dataclass(frozen=True)
class CalibrationScheme:
    """One calibration scheme.

    ``from_stats(request, stats)`` gives an activation's encoding; ``from_values(request, values)`` a
    constant's (default: min-max). ``needs_histogram`` asks calibration for a streamed histogram in
    ``stats.histogram``. ``parameters`` maps each parameter the scheme reads from
    ``request.parameters`` to its default. ``quant_scheme`` is the AIMET enum member, if there is one.
    """

    name: str
    from_stats: Callable[[EncodingRequest, TensorStats], Encoding]
    needs_histogram: bool = False
    from_values: Callable[[EncodingRequest, np.ndarray], Encoding] = min_max_from_values
    batch_from_stats: Callable[[Sequence[tuple[EncodingRequest, TensorStats]]], list[Encoding]] | None = None
    batch_from_values: Callable[[Sequence[tuple[EncodingRequest, np.ndarray]]], list[Encoding]] | None = None
    aliases: tuple[str, ...] = ()
    parameters: dict[str, Any] = field(default_factory=dict)
    quant_scheme: QuantScheme | None = None
    description: str = ""


_REGISTRY: dict[str, CalibrationScheme] = {}
_BY_ENUM: dict[QuantScheme, CalibrationScheme] = {}


def register_scheme(scheme: CalibrationScheme) -> CalibrationScheme:
    """Add ``scheme`` under its name and aliases (a name already taken by another scheme is an error)."""
    keys = [key.lower() for key in (scheme.name, *scheme.aliases)]
    for key in keys:
        if key in _REGISTRY and _REGISTRY[key].name != scheme.name:
            raise InvalidArgumentError(f"calibration scheme name {key!r} is already taken by {_REGISTRY[key].name!r}")
    for key in keys:
        _REGISTRY[key] = scheme
    if scheme.quant_scheme is not None:
        _BY_ENUM[scheme.quant_scheme] = scheme
    return scheme


def get_scheme(scheme: QuantScheme | str | CalibrationScheme) -> CalibrationScheme:
    """The registered scheme for an AIMET enum member, a name or alias, or a scheme itself."""
    if isinstance(scheme, CalibrationScheme):
        return scheme
    if isinstance(scheme, QuantScheme):
        found = _BY_ENUM.get(scheme)
    else:
        found = _REGISTRY.get(str(scheme).strip().lower())
    if found is None:
        names = sorted({s.name for s in _REGISTRY.values()})
        raise InvalidArgumentError(f"unknown calibration scheme {scheme!r}; registered: {', '.join(names)}")
    return found


def registered_schemes() -> list[CalibrationScheme]:
    """Every registered scheme, once each."""
    return list({s.name: s for s in _REGISTRY.values()}.values())
