"""Named op groups a target profile's kernel table may use as keys, read from the library's own tables
(one home per concept: the lists live in `quantsim.graph.op_facts` and `quantsim.export.integer`).

* ``@weighted``: linear ops with a constant weight (`op_facts.WEIGHTED_OPS`);
* ``@data_movement``: ops whose output values are among their input's (`op_facts.GRID_PRESERVING`) plus
  Relu and Clip, which clamp on the grid;
* ``@uint8_direct``: ops onnxruntime runs on uint8 codes directly (`op_facts.UINT8_KERNEL_OPSET`);
* ``@integer_export``: every op type the integer export has a lowering rule for (QLinearConv, QLinearMatMul,
  QGemm, QLinearAdd/Mul/Concat/..., uint8 data movement, lookup tables: `export.integer.export.LOWERINGS`),
  that is, what onnxruntime's CPU execution provider runs on integer kernels;
* ``@normalization``: `op_facts.NORM_OPS`; ``@bounded``: `op_facts.BOUNDED_OUTPUT_OPS`.
"""
from __future__ import annotations

from functools import cache

from quantsim.graph.op_facts import BOUNDED_OUTPUT_OPS, GRID_PRESERVING, NORM_OPS, UINT8_KERNEL_OPSET, WEIGHTED_OPS

__all__ = ["GROUPS", "group_members"]


def _integer_export() -> frozenset[str]:
    from quantsim.export.integer.export import LOWERINGS  # the export's registry, read lazily (it imports ORT)

    return frozenset(LOWERINGS)


GROUPS = {
    "@weighted": lambda: WEIGHTED_OPS,
    "@data_movement": lambda: GRID_PRESERVING | {"Relu", "Clip"},
    "@uint8_direct": lambda: frozenset(UINT8_KERNEL_OPSET),
    "@integer_export": _integer_export,
    "@normalization": lambda: NORM_OPS,
    "@bounded": lambda: BOUNDED_OUTPUT_OPS,
}


@cache
def group_members(name: str) -> frozenset[str]:
    """The op types of group ``name`` (``"@weighted"``, ...)."""
    return frozenset(GROUPS[name]())
