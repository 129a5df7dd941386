"""Version strings of the encodings formats, compared as integer tuples (never as strings)."""
from __future__ import annotations

from typing import Any

from quantsim.encodings.validate import Where

__all__ = ["SUPPORTED_VERSIONS", "READABLE_LAYOUTS", "parse_version", "layout_for_reading", "layout_for_writing"]

SUPPORTED_VERSIONS = ("0.6.1", "1.0.0", "2.0.0")
# version read -> layout (module) that parses it; AIMET's loaders accept 2.1.0 with the 2.0.0 layout.
READABLE_LAYOUTS = {(0, 6, 1): "0.6.1", (1, 0, 0): "1.0.0", (2, 0, 0): "2.0.0", (2, 1, 0): "2.0.0"}


def parse_version(where: Where, value: Any) -> tuple[int, int, int]:
    """``"1.0.0"`` -> ``(1, 0, 0)``; missing trailing parts are zero (``"2.0"`` == ``"2.0.0"``)."""
    if not isinstance(value, str):
        raise where.error(f"'version' must be a string such as \"1.0.0\", got {value!r}")
    parts = value.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(part.isdigit() for part in parts):
        raise where.error(f"malformed encodings version {value!r}")
    numbers = [int(part) for part in parts] + [0] * (3 - len(parts))
    return numbers[0], numbers[1], numbers[2]


def layout_for_reading(where: Where, value: Any) -> str:
    """The layout to parse a file of version ``value`` with; unknown versions are an error."""
    layout = READABLE_LAYOUTS.get(parse_version(where, value))
    if layout is None:
        raise where.error(
            f"unsupported encodings version {value!r} (readable: {', '.join(SUPPORTED_VERSIONS)} and 2.1.0)"
        )
    return layout


def layout_for_writing(where: Where, value: Any) -> str:
    """The canonical spelling of a writable version; anything else is an error."""
    wanted = parse_version(where, value)
    for version in SUPPORTED_VERSIONS:
        if parse_version(where, version) == wanted:
            return version
    raise where.error(f"cannot write encodings version {value!r} (supported: {', '.join(SUPPORTED_VERSIONS)})")
