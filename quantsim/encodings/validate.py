"""Field checks shared by the readers: each failure names the source, the entry and the problem."""
from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantsim.errors import EncodingFormatError

__all__ = [
    "Where",
    "MISSING",
    "require",
    "as_str",
    "as_int",
    "as_number",
    "as_bool",
    "numeric_array",
    "positive_scales",
    "integral",
    "entry_label",
    "check_unique_names",
]

MISSING = object()


@dataclass(frozen=True)
class Where:
    """A place in a file: ``source`` (path or label) and ``entry`` (tensor or slot), for error messages."""

    source: str
    entry: str | None = None

    def error(self, problem: str) -> EncodingFormatError:
        return EncodingFormatError(self.source, self.entry, problem)

    def at(self, entry: str) -> Where:
        return Where(self.source, entry)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def require(where: Where, mapping: Any, key: str, default: Any = MISSING) -> Any:
    """``mapping[key]``; a missing key is an error unless a default is given."""
    if not isinstance(mapping, dict):
        raise where.error(f"expected a JSON object, got {type(mapping).__name__}")
    if key in mapping:
        return mapping[key]
    if default is MISSING:
        raise where.error(f"missing required field '{key}'")
    return default


def as_str(where: Where, value: Any, field: str) -> str:
    """The value as a string, or an error naming the entry and field."""
    if not isinstance(value, str) or not value:
        raise where.error(f"'{field}' must be a non-empty string, got {value!r}")
    return value


def as_int(where: Where, value: Any, field: str, *, minimum: int | None = None) -> int:
    """A JSON integer (booleans and floats are refused)."""
    if not isinstance(value, (numbers.Integral, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise where.error(f"'{field}' must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise where.error(f"'{field}' must be >= {minimum}, got {value}")
    return value


def as_number(where: Where, value: Any, field: str) -> float:
    """The value (a JSON number) as a float, or an error naming the entry and field."""
    if not _is_real(value):
        raise where.error(f"'{field}' must be a number, got {value!r}")
    return float(value)


def as_bool(where: Where, value: Any, field: str, *, allow_strings: bool = False) -> bool:
    """A JSON boolean; with ``allow_strings`` also AIMET 0.6.1's "True"/"False" strings."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if allow_strings and value in ("True", "False"):
        return value == "True"
    allowed = 'true/false or the strings "True"/"False"' if allow_strings else "true or false"
    raise where.error(f"'{field}' must be {allowed}, got {value!r}")


def _shape_of(where: Where, value: Any, field: str, depth: int) -> tuple[int, ...]:
    if _is_real(value):
        return ()
    if depth > 8 or not isinstance(value, (list, tuple)):
        raise where.error(f"'{field}' must be a number or a (nested) list of numbers, got {value!r:.80}")
    if not value:
        raise where.error(f"'{field}' must not be an empty list")
    shapes = {_shape_of(where, item, field, depth + 1) for item in value}
    if len(shapes) != 1:
        raise where.error(f"'{field}' is a ragged nested list")
    return (len(value),) + shapes.pop()


def numeric_array(where: Where, value: Any, field: str, *, ndim: int | None = None) -> np.ndarray:
    """A number or rectangular nested list of numbers as float64 (optionally of a given rank)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    shape = _shape_of(where, value, field, 0)
    if ndim is not None and len(shape) != ndim:
        kind = "a number" if ndim == 0 else "a list of numbers" if ndim == 1 else f"a rank-{ndim} list"
        raise where.error(f"'{field}' must be {kind}, got {value!r:.80}")
    return np.array(value, dtype=np.float64).reshape(shape)


_SMALLEST_SCALE = float(np.finfo(np.float32).tiny)  # normal float32: x / scale stays finite for |x| <= 1


def positive_scales(where: Where, scales: np.ndarray, field: str = "scale") -> np.ndarray:
    """Scales must be finite and strictly positive."""
    bad = ~np.isfinite(scales) | ~(scales > 0)
    if np.any(bad):
        first = float(scales[bad].flat[0])
        raise where.error(f"'{field}' values must be finite and > 0, got {first!r}")
    # the sim computes in float32: a scale, and the widest (16-bit) grid it spans, must be finite and
    # non-zero there, and x / scale must not overflow for values of the grid's range
    with np.errstate(over="ignore", under="ignore"):
        as_float32 = scales.astype(np.float32)
        unusable = ~(as_float32 >= _SMALLEST_SCALE) | ~np.isfinite(as_float32 * np.float32(1 << 16))
    if np.any(unusable):
        first = float(scales[unusable].flat[0])
        raise where.error(f"'{field}' value {first!r} is outside what float32, which the sim computes in, can use "
                          f"({_SMALLEST_SCALE:.3g} .. {float(np.finfo(np.float32).max) / (1 << 16):.3g})")
    return scales


def integral(where: Where, values: np.ndarray, field: str) -> np.ndarray:
    """Whole numbers (e.g. offsets, zero points) as int64; fractional values are refused."""
    if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
        bad = float(values[~np.isfinite(values) | (values != np.round(values))].flat[0])
        raise where.error(
            f"'{field}' values must be whole numbers, got {bad!r} (zero-point shift is not supported)"
        )
    if np.any(np.abs(values) > 2.0**53):
        raise where.error(f"'{field}' value {float(values[np.abs(values) > 2.0**53].flat[0])!r} is out of range")
    return values.astype(np.int64)


def entry_label(section: str, index: int, raw: Any, name_key: str = "name") -> str:
    """``"<section> entry 'name'"`` when the entry has a usable name, else ``"<section>[index]"``."""
    if isinstance(raw, dict) and isinstance(raw.get(name_key), str) and raw.get(name_key):
        return f"{section} entry {raw[name_key]!r}"
    return f"{section}[{index}]"


def check_unique_names(source: str, records: Iterable[Any]) -> None:
    """Every tensor name may appear once in a file."""
    seen: set[str] = set()
    for record in records:
        if record.name in seen:
            raise EncodingFormatError(source, f"tensor {record.name!r}", "duplicate encoding name")
        seen.add(record.name)
