"""`QuantizerDict`: the sim's ``qc_quantize_op_dict``, a plain ``dict`` whose missing-key error helps.

AIMET scripts index ``sim.qc_quantize_op_dict[name]`` with the names of their original model; after
preparation (renamed, folded or fused tensors) some of those names no longer exist. A missing name raises
`UnknownQuantizerError` (a ``KeyError`` and a ``QuantsimError``) listing the closest names that do exist.
``get``, ``in``, iteration and everything else behave exactly as on a ``dict``.
"""
from __future__ import annotations

import difflib
from typing import Any

from quantsim.errors import UnknownQuantizerError

__all__ = ["QuantizerDict", "closest_names"]


def closest_names(name: str, names: list[str], count: int = 5) -> list[str]:
    """Up to ``count`` of ``names`` closest to ``name`` (difflib ratio), best first; substring matches count."""
    close = difflib.get_close_matches(name, names, n=count, cutoff=0.5)
    if len(close) < count and name:
        close += [n for n in names if (name in n or n in name) and n not in close][:count - len(close)]
    return close


class QuantizerDict(dict):
    """``{tensor name: quantizer}``; an unknown name raises `UnknownQuantizerError` naming the closest ones."""

    def __missing__(self, key: Any):
        names = [str(k) for k in self]
        close = closest_names(str(key), names)
        hint = (f"closest: {', '.join(repr(n) for n in close)}" if close
                else f"it has {len(names)} quantizers, e.g. {', '.join(repr(n) for n in names[:5])}")
        raise UnknownQuantizerError(
            f"no quantizer for tensor {key!r}; {hint} (sim.param_names and sim.activation_names list them all; "
            "`quantsim inspect MODEL` shows the prepared names and where they came from)")
