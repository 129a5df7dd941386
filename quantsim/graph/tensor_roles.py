"""Tensors that carry something other than activations, found by graph analysis. Read-only.

* **Index tensors**: shape and index arithmetic. Tensors in the shape/index slots of `SHAPE_SLOTS`
  (Reshape's shape, Gather's indices, Range's bounds, ...) and everything computed only from Shape/Size
  outputs (and constants). Only float tensors matter here (integer tensors are never quantized); an
  embedding table gathered by token ids, or logits ranked by TopK, stay data. Quantizing them would change shapes or counts
  (a float
  Range step of 1.0 rounded to 0.999999 changes the number of anchors).
  Also float values that become indices: a tensor whose every use converts it to an integer type (``Cast``)
  or reaches such a use, or an index slot, only through rounding, elementwise arithmetic and data movement
  (`INDEX_VALUE_OPS`): a voxel or grid cell ``Cast(Floor(pos / size), int64)`` that a Scatter pools by, whose
  cell 1.0 quantized to 0.99999994 truncates to cell 0. Ranking ops (TopK, ArgMax) end the walk: what they
  rank is data.
* **Normalization statistics**: the per-row mean, variance and 1/std inside a decomposed normalization
  layer, i.e. the tensors on a path from a reduction (ReduceMean, ReduceSum, ReduceSumSquare, ReduceL2)
  to a Sqrt or Reciprocal (both ends included), plus what is computed only to be reduced into them
  (the ``x * x`` before the ReduceSum of a variance). The path never runs through a shape edge (a
  ``Shape`` node's input, a Reshape's shape): a Sqrt of a dimension (TorchScript's attention scale
  ``1 / sqrt(sqrt(head_dim))`` from ``Shape(q)``) is shape arithmetic, not a statistic of the data.
  Fused LayerNormalization kernels keep these in float or int32; on an 8-bit grid the variance computed
  as ``E[x^2] - E[x]^2`` cancels to noise (magika's LayerNorm drops to 34% top-1 agreement from that one
  tensor). They are per-row scalars, so keeping them float costs nothing.
* **Mask fill arithmetic**: additive attention masks and the masked scores, found structurally by
  `quantsim.graph.attention_masks` (any fill value, any construction).
* **Non-negative tensors**: outputs of Relu, Sigmoid, Softmax, Exp, Abs, Clip with a constant lower
  bound >= 0, ..., and of value-preserving or averaging ops over non-negative inputs. Calibration needs
  no minimum for them: encodings include zero, so an observed minimum >= 0 is the same as 0.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from quantsim.graph.index import GraphIndex, node_attributes

__all__ = ["SHAPE_SLOTS", "SHAPE_SOURCES", "INDEX_VALUE_OPS", "STATISTIC_REDUCTIONS", "find_index_tensors",
           "find_normalization_statistics", "find_nonnegative_tensors"]

SHAPE_SLOTS: dict[str, frozenset[int]] = {
    op: frozenset(slots)
    for op, slots in {
        "Reshape": {1}, "Expand": {1}, "Tile": {1}, "Slice": {1, 2, 3, 4}, "Range": {0, 1, 2},
        "Gather": {1}, "GatherElements": {1}, "GatherND": {1}, "Scatter": {1}, "ScatterElements": {1},
        "ScatterND": {1}, "TopK": {1}, "ConstantOfShape": {0}, "Resize": {1, 2, 3}, "Upsample": {1},
        "Pad": {1, 3}, "Unsqueeze": {1}, "Squeeze": {1}, "Split": {1}, "OneHot": {0, 1}, "CumSum": {1},
        "NonMaxSuppression": {2, 3, 4}, "RoiAlign": {2}, "Trilu": {1}, "MaxUnpool": {2}, "ReduceSum": {1},
        "ReduceMean": {1}, "ReduceMax": {1}, "ReduceMin": {1}, "ReduceProd": {1}, "ReduceL1": {1},
        "ReduceL2": {1}, "ReduceLogSumExp": {1}, "ReduceSumSquare": {1}, "ReduceLogSum": {1},
    }.items()
}
SHAPE_SOURCES = frozenset({"Shape", "Size"})
INDEX_VALUE_OPS = frozenset({
    "Floor", "Ceil", "Round", "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Clip", "Min", "Max", "Cast",
    "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Expand", "Tile", "Concat", "Slice", "Identity",
})
"""Ops through which a float value on its way to an integer index stays index arithmetic (`find_index_tensors`)."""
_INTEGER_TYPES = frozenset({TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                            TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64})


def find_index_tensors(index: GraphIndex) -> frozenset[str]:
    """Tensors on shape/index arithmetic (module docstring): the values in shape/index slots, and
    everything computed only from Shape/Size outputs (and constants). Data that merely selects or is
    selected by indices (an embedding table, the logits TopK ranks) is not index arithmetic."""
    marked: set[str] = set()
    derived: set[str] = set()  # computed only from Shape/Size (and constants)
    for node in index.nodes:
        slots = SHAPE_SLOTS.get(node.op_type, ())
        marked.update(name for pos, name in enumerate(node.input) if name and pos in slots)
        inputs = [n for n in node.input if n]
        if node.op_type in SHAPE_SOURCES or (
            inputs and any(n in derived for n in inputs) and all(n in derived or index.is_constant(n) for n in inputs)
        ):
            derived.update(o for o in node.output if o)
    return frozenset(marked | derived | _values_becoming_indices(index, marked | derived))


def _values_becoming_indices(index: GraphIndex, known: set[str]) -> set[str]:
    """Float tensors whose every use ends as an integer index (module docstring), walked back from the uses
    in reverse topological order, so a tensor is decided after everything that reads it."""
    found: set[str] = set()

    def index_use(use) -> bool:
        node = use.node
        if use.index < 0:
            return False
        if use.index in SHAPE_SLOTS.get(node.op_type, ()):
            return True
        if node.op_type == "Cast" and node_attributes(node).get("to") in _INTEGER_TYPES:
            return True
        outputs = [o for o in node.output if o]
        return node.op_type in INDEX_VALUE_OPS and bool(outputs) and all(o in found or o in known for o in outputs)

    def decide(name: str) -> None:
        uses = index.uses(name)
        if (name and name not in known and index.is_float(name) and uses and name not in index.graph_outputs
                and all(index_use(u) for u in uses)):
            found.add(name)

    for node in reversed(index.nodes):
        for name in node.output:
            decide(name)
    for name in [*index.graph_inputs, *index.initializers]:  # a cell size divided by stays exact too
        decide(name)
    return found


STATISTIC_REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2"})
_ROOT_OPS = frozenset({"Sqrt", "Reciprocal"})
_LINEAR_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "MatMulInteger", "ConvInteger", "Einsum"})


def _shape_edge(node: onnx.NodeProto, slot: int) -> bool:
    """Input ``slot`` of ``node`` is read for its shape (a Shape/Size input, a Reshape's shape, ...), not its
    values: no statistic flows along it, in either direction."""
    return node.op_type in SHAPE_SOURCES or slot in SHAPE_SLOTS.get(node.op_type, ())


def find_normalization_statistics(index: GraphIndex, *, per_layer: bool = False) -> frozenset[str]:
    """Tensors on a path from a reduction's output to a Sqrt/Reciprocal output (module docstring). With
    ``per_layer`` a path ends at its last Sqrt/Reciprocal (Sqrt -> Reciprocal) and goes through neither the
    op that applies that 1/std, nor a Conv/Gemm/MatMul (no norm layer holds one), nor a shape edge, so the
    statistics of one norm layer do not run on through the normalized output and the layers after it to the
    next norm layer's statistics; what is computed only to be reduced must feed nothing but reductions."""
    forward: set[str] = set()
    roots = {o for n in index.nodes if n.op_type in _ROOT_OPS for o in n.output if o}

    def continues(node: onnx.NodeProto, slot: int) -> bool:
        if _shape_edge(node, slot):
            return False  # what follows is shape arithmetic, not a statistic
        return not per_layer or node.op_type in _ROOT_OPS or (
            node.op_type not in _LINEAR_OPS and not any(i in roots for i in node.input))

    frontier = [o for n in index.nodes if n.op_type in STATISTIC_REDUCTIONS for o in n.output if o]
    while frontier:
        name = frontier.pop()
        if name in forward:
            continue
        forward.add(name)
        if per_layer and name in roots:  # a 1/std: only a Reciprocal of it (Sqrt -> Reciprocal) goes on
            frontier.extend(o for use in index.uses(name) if use.node.op_type in _ROOT_OPS for o in use.node.output if o)
            continue
        frontier.extend(o for use in index.uses(name) if use.index >= 0 and continues(use.node, use.index)
                        for o in use.node.output if o)
    backward: set[str] = set()
    frontier = [o for n in index.nodes if n.op_type in _ROOT_OPS for o in n.output if o]
    while frontier:
        name = frontier.pop()
        if name in backward or name not in forward:
            continue
        backward.add(name)
        producer = index.producer_of(name)
        if producer is not None:  # not back through a shape edge: 1/sqrt(sqrt(d)) from Shape(q) is no statistic
            frontier.extend(n for slot, n in enumerate(producer.input) if n and not _shape_edge(producer, slot))
    # what is computed only to be reduced into a statistic (x * x before ReduceSum) is part of it; per layer,
    # only what feeds nothing but the reductions (else a norm's input, read only by the mean and x - mean,
    # would pull in the layers before it)
    reduced_only = (lambda u: u.node.op_type in STATISTIC_REDUCTIONS) if per_layer else (lambda u: True)
    changed = True
    while changed:
        changed = False
        for node in index.nodes:
            if not all(o in backward for o in node.output if o):
                continue
            for name in node.input:
                uses = index.uses(name)
                if (name and name not in backward and index.producer_of(name) is not None and uses
                        and name not in index.graph_outputs
                        and all(u.index >= 0 and reduced_only(u) and all(o in backward for o in u.node.output if o)
                                for u in uses)):
                    backward.add(name)
                    changed = True
    return frozenset(backward)


_NONNEGATIVE_OPS = frozenset({"Relu", "Sigmoid", "Softmax", "Exp", "Abs", "HardSigmoid", "Softplus", "ReduceL2",
                              "ReduceSumSquare", "Sqrt"})
_PRESERVE_SIGN = frozenset({"MaxPool", "GlobalMaxPool", "AveragePool", "GlobalAveragePool", "Reshape", "Flatten",
                            "Transpose", "Squeeze", "Unsqueeze", "Slice", "Resize", "Upsample", "Identity", "Concat",
                            "Split", "Expand", "Tile", "DepthToSpace", "SpaceToDepth", "Gather", "ReduceMax",
                            "ReduceMean", "Mul", "Add"})


def find_nonnegative_tensors(index: GraphIndex) -> frozenset[str]:
    """Float tensors provably >= 0 (module docstring), in one pass over the topologically sorted nodes."""
    found: set[str] = set()

    def nonnegative_constant(name: str) -> bool:
        values = index.constant_value(name).reshape(-1)
        if values.size > 1024 and not np.all(values[:1024] >= 0):  # cheap early answer for big constants
            return False
        return bool(np.all(values >= 0))

    for node in index.nodes:
        outputs = [o for o in node.output if o]
        if node.op_type in _NONNEGATIVE_OPS:
            found.update(outputs[:1])
        elif node.op_type == "Clip":
            lower = node.input[1] if len(node.input) > 1 else ""
            if lower and index.is_constant(lower) and nonnegative_constant(lower):
                found.update(outputs)
        elif node.op_type in _PRESERVE_SIGN:
            data = [n for i, n in enumerate(node.input) if n and (i == 0 or node.op_type in ("Concat", "Mul", "Add"))]
            constants = [n for n in data if index.is_constant(n)]
            # computed inputs first: a constant is only converted when the answer depends on it
            if (data and all(n in found for n in data if not index.is_constant(n))
                    and all(nonnegative_constant(n) for n in constants)):
                found.update(outputs if node.op_type != "MaxPool" else outputs[:1])
    return frozenset(found)
