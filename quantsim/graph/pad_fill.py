"""Whether a Pad keeps its input on an integer grid: the one value it writes, and whether a grid holds it.

Reflect / edge / wrap modes copy input values; constant mode writes its constant (an input from opset 11, an
attribute before, 0 by default). The QDQ export gives a Pad a derived Q/DQ pair only when that value lies on
the input's grid (`quantsim.export.qdq.add_derived_qdq`), and the sim's int32 biases follow the same Pads
(`quantsim.sim.int32_bias.input_grid_quantizer`): both ask here.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from quantsim.graph.index import node_attributes

__all__ = ["pad_fill_value", "on_integer_grid"]


def pad_fill_value(pad: onnx.NodeProto, constant_of: Callable[[str], np.ndarray | None]) -> float | None:
    """The one new value ``pad`` writes: 0.0 for the modes that copy input values, its constant otherwise;
    None when that constant is not a known scalar (``constant_of``: name -> value, None when not a constant)."""
    attrs = node_attributes(pad)
    mode = attrs.get("mode", b"constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        return 0.0
    if len(pad.input) > 2 and pad.input[2]:
        value = constant_of(pad.input[2])
        return None if value is None or np.size(value) != 1 else float(np.asarray(value).reshape(-1)[0])
    return float(attrs.get("value", 0.0))  # opset < 11 keeps it in an attribute


def on_integer_grid(value: float, scale: float, zero_point: int, qmin: int, qmax: int) -> bool:
    """True when ``value`` survives a float32 round trip through the per-tensor grid (scale, zero point,
    codes ``qmin..qmax``)."""
    if not np.isfinite(value):
        return False
    scale32 = np.float32(scale)
    code = np.clip(np.rint(np.float32(value) / scale32) + zero_point, qmin, qmax)
    return bool(np.float32((code - zero_point) * scale32) == np.float32(value))
