"""Per-op facts, one record per op type, read by placement, the sim builder, the exports and the
algorithm packages.

Adding support for an op means one entry here plus, where it applies, one integer lowering rule in
`quantsim.export.integer`. The record says:

* ``param_slots``: input slot -> AIMET parameter type ("weight", "bias", ...) of constant inputs the sim
  quantizes as parameters;
* ``bias_slot``: the input that is added to the accumulator (its int32 grid is ``s_in * s_w``);
* ``weight_output_axis``: the axis of the weight (slot 1) that indexes output channels (Conv 0,
  ConvTranspose 1); `channel_axis_of` works the general case out from attributes and shapes;
* ``grid_preserving``: the output's values are among the input's values (or the op only moves or
  selects them), so a quantizer after it would repeat the input's grid;
* ``grid_movement``: stricter, for derived Q/DQ in exports: one quantized data input whose values the
  output only rearranges or selects;
* ``uint8_kernel_opset``: first opset in which onnxruntime runs the op on uint8 codes directly;
* ``weighted``: a linear op with a constant weight on slot 1 (AdaRound, Sequential MSE, CLE candidates).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from quantsim.graph.index import node_attributes

__all__ = [
    "OpFacts",
    "OP_FACTS",
    "facts_of",
    "PARAM_SLOTS",
    "BIAS_SLOT",
    "GRID_PRESERVING",
    "GRID_MOVEMENT_OPS",
    "UINT8_KERNEL_OPSET",
    "WEIGHTED_OPS",
    "RECURRENT_OPS",
    "GATHER_OPS",
    "NORM_OPS",
    "BOUNDED_OUTPUT_OPS",
    "channel_axis_of",
]


@dataclass(frozen=True)
class OpFacts:
    """What the rest of the library needs to know about one op type (see the module docstring)."""

    param_slots: dict[int, str] = field(default_factory=dict)
    bias_slot: int | None = None
    weight_output_axis: int | None = None
    grid_preserving: bool = False
    grid_movement: bool = False
    uint8_kernel_opset: int | None = None
    weighted: bool = False


_NORM = {1: "weight", 2: "bias"}
_RECURRENT = {1: "weight", 2: "weight", 3: "bias"}

OP_FACTS: dict[str, OpFacts] = {
    # linear ops with weights
    "Conv": OpFacts({1: "weight", 2: "bias"}, bias_slot=2, weight_output_axis=0, weighted=True),
    "ConvTranspose": OpFacts({1: "weight", 2: "bias"}, bias_slot=2, weight_output_axis=1, weighted=True),
    "Gemm": OpFacts({1: "weight", 2: "bias"}, bias_slot=2, weighted=True),
    "MatMul": OpFacts({1: "weight"}, weighted=True),
    # normalisation and other parameterised ops
    "BatchNormalization": OpFacts({1: "weight", 2: "bias", 3: "running_mean", 4: "running_var"}),
    "InstanceNormalization": OpFacts(_NORM),
    "LayerNormalization": OpFacts(_NORM),
    "GroupNormalization": OpFacts(_NORM),
    "PRelu": OpFacts({1: "weight"}),
    "LSTM": OpFacts(_RECURRENT),
    "GRU": OpFacts(_RECURRENT),
    "RNN": OpFacts(_RECURRENT),
    # data movement and selection
    "Reshape": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=5),
    "Flatten": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=1),
    "Transpose": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=1),
    "Squeeze": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=1),
    "Unsqueeze": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=1),
    "MaxPool": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=12),
    "GlobalMaxPool": OpFacts(grid_preserving=True, grid_movement=True),
    "Slice": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=1),
    "Expand": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=8),
    "Tile": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=6),
    "Identity": OpFacts(grid_preserving=True, grid_movement=True),
    "DepthToSpace": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=1),
    "SpaceToDepth": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=1),
    "Gather": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=1),
    "Split": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=2),
    "GatherElements": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=11),
    "Pad": OpFacts(grid_preserving=True, uint8_kernel_opset=11),
    "ReduceMax": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=12),
    "ReduceMin": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=12),
    "Resize": OpFacts(uint8_kernel_opset=10),
    "Col2Im": OpFacts(grid_preserving=True),
    "Compress": OpFacts(grid_preserving=True),
    "Dropout": OpFacts(grid_preserving=True),
    "GatherND": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=11),
    "MaxRoiPool": OpFacts(grid_preserving=True),
    "NonZero": OpFacts(grid_preserving=True),
    "SplitToSequence": OpFacts(grid_preserving=True),
    "TopK": OpFacts(grid_preserving=True, grid_movement=True, uint8_kernel_opset=11),
    "Shape": OpFacts(grid_preserving=True),
    "Size": OpFacts(grid_preserving=True),
    "Cast": OpFacts(grid_preserving=True),
}

_NO_FACTS = OpFacts()


def facts_of(op_type: str) -> OpFacts:
    """The record of ``op_type`` (an empty record for ops the library has no special knowledge of)."""
    return OP_FACTS.get(op_type, _NO_FACTS)


PARAM_SLOTS: dict[str, dict[int, str]] = {op: f.param_slots for op, f in OP_FACTS.items() if f.param_slots}
BIAS_SLOT: dict[str, int] = {op: f.bias_slot for op, f in OP_FACTS.items() if f.bias_slot is not None}
GRID_PRESERVING = frozenset(op for op, f in OP_FACTS.items() if f.grid_preserving)
GRID_MOVEMENT_OPS = frozenset(op for op, f in OP_FACTS.items() if f.grid_movement)
UINT8_KERNEL_OPSET: dict[str, int] = {
    op: f.uint8_kernel_opset for op, f in OP_FACTS.items() if f.uint8_kernel_opset is not None
}
WEIGHTED_OPS = frozenset(op for op, f in OP_FACTS.items() if f.weighted)
RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})
GATHER_OPS = frozenset({"Gather", "GatherElements", "GatherND"})
"""Lookups: input 0 is the data (a constant one is a table, e.g. an embedding), input 1 the indices."""
NORM_OPS = frozenset({"BatchNormalization", "InstanceNormalization", "LayerNormalization", "GroupNormalization"})
BOUNDED_OUTPUT_OPS = frozenset({"Softmax", "Sigmoid", "HardSigmoid", "Tanh", "Softsign"})
"""Ops whose output range is the function's own ([0, 1] or [-1, 1]), not set by a few values of the data."""


def channel_axis_of(node: onnx.NodeProto, slot: int, shape: tuple | None) -> int | None:
    """Output-channel axis of a parameter (None when it cannot be per-channel)."""
    if not shape:
        return None
    rank = len(shape)
    if node.op_type in RECURRENT_OPS:
        return 1 if rank >= 2 else 0  # [directions, gates * hidden, ...]
    if slot != 1 or rank == 1:
        return 0
    attrs = node_attributes(node)
    if node.op_type == "Conv" or node.op_type in NORM_OPS or node.op_type == "PRelu":
        return 0
    if node.op_type == "ConvTranspose":
        return 1 if attrs.get("group", 1) == 1 else None
    if node.op_type == "Gemm":
        return 0 if attrs.get("transB", 0) else 1
    if node.op_type == "MatMul":
        return rank - 1
    return None
