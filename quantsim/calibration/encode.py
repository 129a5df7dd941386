"""Encodings from what quantizers saw: constants' values or streamed statistics, through the registered
calibration schemes (`quantsim.calibration.schemes`).

Plain data in, encodings out: each item is ``(scheme, request, values or stats)``. Items of one scheme
go to its batched form when it has one (TF-enhanced shares its searches). A fixed range (config
``encoding_constraints``) replaces the observed bounds it names whatever the scheme, and a range
symmetric about zero then makes the grid symmetric (AIMET's rule).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from quantsim.calibration.run import TensorStats
from quantsim.calibration.schemes import CalibrationScheme, EncodingRequest
from quantsim.core.numerics import Encoding, encoding_from_range

__all__ = ["encodings_for_values", "encodings_for_stats", "fixed_range_encoding"]


def fixed_range_encoding(request: EncodingRequest, stats: TensorStats) -> Encoding:
    """The encoding of a request with a fixed range, observed bounds filling the ends it leaves open."""
    assert request.fixed_range is not None
    lo = stats.min if request.fixed_range[0] is None else request.fixed_range[0]
    hi = stats.max if request.fixed_range[1] is None else request.fixed_range[1]
    flags = dict(request.grid_flags)
    if lo == -hi:
        flags["symmetric"] = True
    return encoding_from_range(lo, hi, request.bits, **flags)


def _by_scheme(items) -> dict[str, tuple[CalibrationScheme, list[int]]]:
    groups: dict[str, tuple[CalibrationScheme, list[int]]] = {}
    for i, (scheme, _, _) in enumerate(items):
        groups.setdefault(scheme.name, (scheme, []))[1].append(i)
    return groups


def encodings_for_values(items: Sequence[tuple[CalibrationScheme, EncodingRequest, np.ndarray]]) -> list[Encoding]:
    """Encodings of constants (weights, biases, constant operands)."""
    out: list[Encoding | None] = [None] * len(items)
    for scheme, members in _by_scheme(items).values():
        pairs = [(items[i][1], items[i][2]) for i in members]
        if scheme.batch_from_values is not None:
            results = scheme.batch_from_values(pairs)
        else:
            results = [scheme.from_values(request, values) for request, values in pairs]
        for i, encoding in zip(members, results):
            out[i] = encoding
    return out  # type: ignore[return-value]


def encodings_for_stats(items: Sequence[tuple[CalibrationScheme, EncodingRequest, TensorStats]]) -> list[Encoding]:
    """Encodings of activations from their streamed statistics."""
    out: list[Encoding | None] = [None] * len(items)
    free = []
    for i, (_, request, stats) in enumerate(items):
        if request.fixed_range is not None:
            out[i] = fixed_range_encoding(request, stats)
        else:
            free.append(items[i])
    positions = [i for i, (_, request, _) in enumerate(items) if request.fixed_range is None]
    for scheme, members in _by_scheme(free).values():
        pairs = [(free[m][1], free[m][2]) for m in members]
        if scheme.batch_from_stats is not None:
            results = scheme.batch_from_stats(pairs)
        else:
            results = [scheme.from_stats(request, stats) for request, stats in pairs]
        for m, encoding in zip(members, results):
            out[positions[m]] = encoding
    return out  # type: ignore[return-value]
