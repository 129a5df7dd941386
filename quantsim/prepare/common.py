"""What the preparation passes share: their error and warning types."""
from __future__ import annotations

__all__ = ["PrepareError", "PrepareWarning"]


class PrepareError(ValueError):
    """The model cannot be prepared; the message names the offending nodes, values or versions."""


class PrepareWarning(UserWarning):
    """Preparation went on with less than it wanted (no shapes, a refused fold, a cache entry dropped)."""
