"""Named precisions: a weight type and an activation type (AIMET's ``(param_type, activation_type)``)."""
from __future__ import annotations

from dataclasses import dataclass

from quantsim import InvalidArgumentError, float16, int4, int8, int16, qtype

__all__ = ["Precision", "PRESETS", "preset"]


@dataclass(frozen=True)
class Precision:
    """What a node's parameters and output activations are simulated in."""

    name: str
    param_type: qtype
    activation_type: qtype


PRESETS: dict[str, Precision] = {p.name: p for p in (
    Precision("W8A8", int8, int8),
    Precision("W4A8", int4, int8),
    Precision("W8A16", int8, int16),
    Precision("W16A16", int16, int16),
    Precision("FP16", float16, float16),
)}


def preset(name: str | Precision) -> Precision:
    """The preset called ``name`` (case-insensitive); an error lists the known ones."""
    if isinstance(name, Precision):
        return name
    found = PRESETS.get(str(name).strip().upper())
    if found is None:
        raise InvalidArgumentError(f"unknown precision {name!r}; presets: {', '.join(PRESETS)}")
    return found
