"""Additive attention masks, found from the graph's structure whatever the exporter wrote. Read-only.

A mask gives masked positions a *fill* value so negative that the Softmax weight ``exp(fill - max)``
vanishes; one 8-bit grid over ``[fill + scores, scores]`` then has steps far wider than the scores
themselves (``(1 - mask) * -10000`` gives delta 40 over scores of +-10: every row becomes uniform, and a
MiniLM-style sentence embedding falls to cosine 0.3 from FP32). So the mask arithmetic and the masked scores
stay float; the scores themselves, and the Softmax output, are quantized as usual (AIMET's MaskedSoftmax
pass leaves the same tensors unquantized).

How a mask is recognised (no exporter's constants or names are involved):

* **Fill seeds**: float constants (initializers, ``ConstantOfShape`` values) holding a value of magnitude
  at least `MASK_FILL_MAGNITUDE`, or +-inf. The threshold is where a fill starts to mask: ``exp(-87.3)``
  is float32's smallest normal number, so any fill at least that large removes its position from the
  Softmax exactly as far as float32 can tell (-1e4, -1e9, -3.4e38 = finfo.min and -inf all qualify).
  Smaller offsets are a bias, not a mask, and leave an 8-bit grid usable.
* **Mask-side tensors** (``mask_side``): computed only from graph inputs and constants through mask-building
  ops (`MASK_BUILDING_OPS`: casts, comparisons, elementwise arithmetic, data movement), never from a weighted
  op or another Softmax: the 0/1 mask, its inversion, a causal triangle, their broadcasts.
* **Fill-carrying tensors**: a seed, or the output of a mask-building op with a fill-carrying input whose
  other float inputs are mask-side (``(1 - m) * fill``, ``Where(m == 0, -inf, 0)``, ``Expand``,
  ``Unsqueeze``, ``Cast`` in any order). A huge constant that multiplies or bounds *scores*
  (a logit scale, ``Max(x, finfo.min)``) is not a fill: its other operand is not mask-side.
* **Masked scores**: an Add, Sub or Where joining a fill-carrying operand with a computed one that carries
  no fill (the scores), whose output reaches a Softmax/LogSoftmax input through data movement (`GRID_MOVEMENT_OPS`,
  Cast) and further additive biases.

Left float: the masked scores, the data movement up to the Softmax, and the fill-carrying tensors that
feed them (not fill-carrying tensors used elsewhere).
"""
from __future__ import annotations

import math

import numpy as np
from onnx import numpy_helper

from quantsim.graph.index import GraphIndex, node_attributes
from quantsim.graph.op_facts import GRID_MOVEMENT_OPS

__all__ = ["MASK_FILL_MAGNITUDE", "MASK_BUILDING_OPS", "MaskedSoftmax", "find_masked_softmaxes", "find_constant_fills"]

MASK_FILL_MAGNITUDE = -math.log(float(np.finfo(np.float32).tiny))  # 87.34: exp(-fill) leaves float32's range

MASK_BUILDING_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Where", "Cast", "Not", "And", "Or", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "Min", "Max", "Expand", "Unsqueeze", "Squeeze", "Reshape", "Flatten",
    "Transpose", "Slice", "Gather", "Tile", "Concat", "Identity", "Trilu", "Range", "Shape", "Size",
    "ConstantOfShape", "CumSum",
})
_FILL_CARRYING = MASK_BUILDING_OPS - {"Not", "And", "Or", "Equal", "Less", "Greater", "LessOrEqual",
                                      "GreaterOrEqual", "Shape", "Size", "Range", "Div"}
_SCATTERS = frozenset({"ScatterElements", "ScatterND", "Scatter"})
_JOINS = frozenset({"Add", "Sub", "Where"})
_SINKS = frozenset({"Softmax", "LogSoftmax"})
_MOVES = GRID_MOVEMENT_OPS | {"Cast"}


class MaskedSoftmax:
    """One masked Softmax: its node, the masked-scores tensor and every tensor left float for it."""

    def __init__(self, softmax: str, masked_scores: str, tensors: frozenset[str]):
        self.softmax = softmax
        self.masked_scores = masked_scores
        self.tensors = tensors

    def __repr__(self) -> str:
        return f"MaskedSoftmax({self.softmax!r}, {self.masked_scores!r}, {len(self.tensors)} tensors)"


def _holds_fill(values: np.ndarray) -> bool:
    values = np.asarray(values)
    if not values.size or not np.issubdtype(values.dtype, np.floating):
        return False
    # in the tensor's own type, no float64 copy (a transformer's large Add operands are scanned at every sim
    # construction): infinities compare >= the fill magnitude, NaN compares false
    return bool(np.any(np.abs(values) >= MASK_FILL_MAGNITUDE))


def _seeds(index: GraphIndex) -> set[str]:
    found = set()
    for name in index.initializers:
        if index.is_float(name) and any(u.node.op_type in _FILL_CARRYING or u.node.op_type in _SCATTERS
                                        for u in index.uses(name)):
            if _holds_fill(index.constant_value(name)):
                found.add(name)
    for node in index.nodes:
        if node.op_type == "ConstantOfShape" and node.output and node.output[0]:
            value = node_attributes(node).get("value")
            if value is not None and _holds_fill(numpy_helper.to_array(value)):
                found.add(node.output[0])
    return found


def _float_data_inputs(index: GraphIndex, node) -> list[str]:
    slots = range(1, 3) if node.op_type == "Where" else range(len(node.input))
    return [node.input[i] for i in slots if i < len(node.input) and node.input[i] and index.is_float(node.input[i])]


def find_masked_softmaxes(index: GraphIndex) -> list[MaskedSoftmax]:
    """Every Softmax/LogSoftmax fed by masked scores, with the tensors to leave float (module docstring)."""
    seeds = _seeds(index)
    if not seeds:
        return []
    mask_side: set[str] = set(index.graph_inputs)
    fill: set[str] = set(seeds)
    for node in index.nodes:  # topological order
        inputs = [n for n in node.input if n]
        if node.op_type not in MASK_BUILDING_OPS or not all(n in mask_side or index.is_constant(n) for n in inputs):
            continue
        outputs = [o for o in node.output if o]
        mask_side.update(outputs)
        if node.op_type in _FILL_CARRYING and any(n in fill for n in _float_data_inputs(index, node)):
            fill.update(outputs)

    def fill_cone(name: str) -> set[str]:
        cone, frontier = set(), [name]
        while frontier:
            current = frontier.pop()
            if current in cone or current not in fill:
                continue
            cone.add(current)
            producer = index.producer_of(current)
            if producer is not None:
                frontier.extend(n for n in producer.input if n)
        return cone

    def masked_chain(name: str, depth: int = 0) -> tuple[str, set[str]] | None:
        """(masked scores, tensors to keep float) when ``name`` is masked scores or moved/biased from them."""
        producer = index.producer_of(name)
        if producer is None or depth > 64:
            return None
        if producer.op_type in _MOVES and producer.input:
            found = masked_chain(producer.input[0], depth + 1)
            return (found[0], found[1] | {name}) if found else None
        if producer.op_type in _JOINS:
            operands = _float_data_inputs(index, producer)
            carried = [n for n in operands if n in fill]
            scores = [n for n in operands if n not in fill and not index.is_constant(n)]
            if carried and scores:
                kept = {name}.union(*(fill_cone(n) for n in carried))
                return name, kept
            for operand in scores:  # a bias added after the mask: follow the masked side
                found = masked_chain(operand, depth + 1)
                if found:
                    return found[0], found[1] | {name}
        return None

    found = []
    for node in index.nodes:
        if node.op_type in _SINKS and node.input and node.input[0]:
            chain = masked_chain(node.input[0])
            if chain is not None:
                found.append(MaskedSoftmax(node.name, chain[0], frozenset(chain[1])))
    return found



def find_constant_fills(index: GraphIndex) -> frozenset[str]:
    """Computed tensors that hold a fill and are built from constants and index (non-float) tensors alone.

    The identity of a max/min reduction spelled as a scatter (torch's ``scatter_reduce("amax",
    include_self=False)`` through the dynamo exporter resets the touched rows to ``finfo.min`` with a
    ``ScatterElements(reduction="min")`` of a ``ConstantOfShape`` fill, then takes the maximum with the
    data), or a mask made by ``Where(condition, -inf, 0)``: no activation flows into them, so what they hold is
    fixed by the fill and the indices, and one 8-bit grid over ``[finfo.min, 0]`` has steps of 1.3e36. Seeds as
    for masks; the walk goes through the fill-carrying ops and scatters, each with every float input a
    constant or fill-carrying (its index inputs may be anything)."""
    fill = _seeds(index)
    if not fill:
        return frozenset()
    for node in index.nodes:  # topological order
        if node.op_type not in _FILL_CARRYING and node.op_type not in _SCATTERS:
            continue
        floats = _float_data_inputs(index, node)
        if any(n in fill for n in floats) and all(n in fill or index.is_constant(n) for n in floats):
            fill.update(o for o in node.output if o)
    return frozenset(n for n in fill if not index.is_constant(n))
