"""Encodings from what quantizers saw: constants' values or streamed statistics, through the registered
calibration schemes (`quantsim.calibration.schemes`).

Plain data in, encodings out: each item is ``(scheme, request, values or stats)``. Items of one scheme
go to its batched form when it has one (TF-enhanced shares its searches). A fixed range (config
``encoding_constraints``) replaces the observed bounds it names whatever the scheme, and a range
symmetric about zero then makes the grid symmetric (AIMET's rule). A float8 request a scheme answers with
an integer grid gets the float8 encoding of that grid's largest magnitude (`fp8_encodings.fp8_encoding_from_grid`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from quantsim.calibration.run import TensorStats
from quantsim.calibration.schemes import CalibrationScheme, EncodingRequest
from quantsim.core.fp8_encodings import fp8_encoding_from_grid, fp8_encoding_from_range
from quantsim.core.numerics import Encoding, encoding_from_range

__all__ = ["encodings_for_values", "encodings_for_stats", "fixed_range_encoding"]


def fixed_range_encoding(request: EncodingRequest, stats: TensorStats) -> Encoding:
    """The encoding of a request with a fixed range, observed bounds filling the ends it leaves open."""
    assert request.fixed_range is not None
    lo = stats.min if request.fixed_range[0] is None else request.fixed_range[0]
    hi = stats.max if request.fixed_range[1] is None else request.fixed_range[1]
    if request.fp8 is not None:
        return fp8_encoding_from_range(lo, hi, request.fp8)
    flags = dict(request.grid_flags)
    if lo == -hi:
        flags["symmetric"] = True
    return encoding_from_range(lo, hi, request.bits, **flags)


def _per_scheme(items: Sequence[tuple[CalibrationScheme, EncodingRequest, Any]], batched: Callable,
                single: Callable) -> list[Encoding]:
    """Each scheme's items through its batched form (``batched(scheme)``, when not None) or one by one."""
    groups: dict[str, tuple[CalibrationScheme, list[int]]] = {}
    for i, (scheme, _, _) in enumerate(items):
        groups.setdefault(scheme.name, (scheme, []))[1].append(i)
    out: dict[int, Encoding] = {}
    for scheme, members in groups.values():
        pairs = [(items[i][1], items[i][2]) for i in members]
        batch = batched(scheme)
        results = batch(pairs) if batch is not None else [single(scheme)(request, x) for request, x in pairs]
        out.update((i, _as_requested(pair[0], e)) for i, pair, e in zip(members, pairs, results))
    return [out[i] for i in range(len(items))]


def _as_requested(request: EncodingRequest, encoding: Encoding) -> Encoding:
    """A float8 request's encoding from the integer grid a scheme chose (module docstring)."""
    if request.fp8 is None or encoding.fp8 is not None:
        return encoding
    return fp8_encoding_from_grid(encoding, request.fp8)


def encodings_for_values(items: Sequence[tuple[CalibrationScheme, EncodingRequest, np.ndarray]]) -> list[Encoding]:
    """Encodings of constants (weights, biases, constant operands)."""
    return _per_scheme(items, lambda s: s.batch_from_values, lambda s: s.from_values)


def encodings_for_stats(items: Sequence[tuple[CalibrationScheme, EncodingRequest, TensorStats]]) -> list[Encoding]:
    """Encodings of activations from their streamed statistics (fixed ranges first, whatever the scheme)."""
    out = {i: fixed_range_encoding(request, stats) for i, (_, request, stats) in enumerate(items)
           if request.fixed_range is not None}
    free = [i for i in range(len(items)) if i not in out]
    out.update(zip(free, _per_scheme([items[i] for i in free], lambda s: s.batch_from_stats, lambda s: s.from_stats)))
    return [out[i] for i in range(len(items))]
