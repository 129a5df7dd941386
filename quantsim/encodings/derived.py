"""Derived encodings: the entries AIMET's 2.0.0 export adds for outputs of data-movement ops.

aimet-onnx 2.42 writes, in a 2.0.0 file, an entry for the output of every data-movement op (Reshape,
Flatten, Transpose, MaxPool, Slice, ...) whose input is quantized, holding the input's encoding: the op
moves values of that grid without changing them, so the output is on the same grid (its example file
lists ``flat`` for a Flatten). The sim does not quantize these outputs (a Q/DQ pair there is an
identity) and the QDQ export adds derived Q/DQ pairs after the same kind of op
(`quantsim.export.qdq.add_derived_qdq`, `GRID_MOVEMENT_OPS`).

Which ops derive, and from which inputs (aimet-onnx's export-time propagation, `_DATA_INPUTS`):

* the grid-preserving ops (`GRID_MOVEMENT_OPS` and the selections AIMET lists besides: GatherElements,
  GatherND, ReduceMax/Min, TopK, Compress, Dropout, MaxRoiPool, Col2Im): from their first input;
* **Pad**: from its data input, whatever the padding value (AIMET keeps this for models that pad with
  -inf before a max);
* **Clip, Max, Min** (clipping) and **Where** (selection): only when *every* float data input (Clip's
  bounds included, Where's two branches, not its condition) has a record with one and the same encoding;
  an unquantized bound (``Clip(x, 0, 6)`` with plain constants) or branches on different grids derive
  nothing. The sim quantizes these ops' outputs itself unless a user disabled that quantizer.

Rules (the module's one concept, used both ways):

* **writing**: in graph order, a float output of such a node whose data inputs have per-tensor
  activation records as above (the sim's own, or derived themselves), and which has no record of its
  own, gets a record with the (first) input's encoding;
* **reading**: an entry is derived, and is *not* loaded onto a quantizer, when the same rule applied to
  the file's own entries yields it (same encoding as its input's entry) and the sim has no enabled
  quantizer on that tensor. Loading a file written from a sim therefore gives back the same sim: the
  derived tensors stay unquantized, as they were.

A sim whose user enabled a quantizer on such an output with exactly its input's encoding exports the
same file as one that did not; on reload into a fresh sim that quantizer stays disabled (the outputs are
identical: the pair was an identity).
"""
from __future__ import annotations

from quantsim.encodings.record import TensorEncoding
from quantsim.graph.index import GraphIndex
from quantsim.graph.op_facts import GRID_MOVEMENT_OPS

__all__ = ["derived_records", "derived_names", "DERIVING_OPS"]

_SELECTIONS = frozenset({"GatherElements", "GatherND", "ReduceMax", "ReduceMin", "TopK", "Compress", "Dropout",
                         "MaxRoiPool", "Col2Im"})
_FROM_FIRST = (GRID_MOVEMENT_OPS - {"GlobalMaxPool"}) | _SELECTIONS | {"Pad"}
_ALL_DATA = frozenset({"Clip", "Max", "Min"})
DERIVING_OPS = _FROM_FIRST | _ALL_DATA | {"Where"}
"""Op types whose outputs can get a derived entry (module docstring). GlobalMaxPool is not among them:
aimet-onnx 2.42 does not list it as grid-preserving and writes no entry for it."""


def _data_inputs(node) -> list[str]:
    """The inputs whose records must agree for ``node``'s outputs to be derived (module docstring)."""
    if node.op_type in _FROM_FIRST:
        return list(node.input[:1])
    if node.op_type in _ALL_DATA:
        return list(node.input)  # an absent optional bound ("") has no record: nothing is derived
    if node.op_type == "Where":
        return list(node.input[1:3])
    return []


def _deriving_source(record: TensorEncoding | None) -> bool:
    return (record is not None and not record.is_float and record.kind != "param" and record.encoding is not None
            and record.encoding.scale.ndim == 0 and record.bits <= 16)


def _movement_outputs(index: GraphIndex, by_name: dict[str, TensorEncoding]):
    """``(output, source record)`` for the outputs of every `DERIVING_OPS` node whose data inputs have
    deriving records in ``by_name`` that agree (module docstring), in graph order; ``by_name`` is read node
    by node, so records the caller adds meanwhile (a chain of moves) count."""
    for node in index.nodes:
        inputs = _data_inputs(node)
        if not inputs:
            continue
        source = by_name.get(inputs[0])
        if not _deriving_source(source):
            continue
        assert source is not None and source.encoding is not None  # checked by _deriving_source
        others = [by_name.get(name) for name in inputs[1:]]
        if not all(_deriving_source(r) and r.encoding.same_as(source.encoding) for r in others):  # type: ignore[union-attr]
            continue
        for name in node.output:
            if name:
                yield name, source


def derived_records(index: GraphIndex, records: list[TensorEncoding]) -> list[TensorEncoding]:
    """The derived records of ``records`` (module docstring), in graph order; ``records`` is not changed."""
    known = {r.name: r for r in records}
    out: list[TensorEncoding] = []
    for name, source in _movement_outputs(index, known):
        if name in known or not index.is_float(name):
            continue
        shape = index.shape.get(name)
        shape = tuple(shape) if shape and all(isinstance(d, int) for d in shape) else None
        record = TensorEncoding.from_encoding(name, source.encoding, "activation", shape)
        known[name] = record
        out.append(record)
    return out


def derived_names(index: GraphIndex, records: list[TensorEncoding]) -> set[str]:
    """Names of the entries among ``records`` that are derived from the others (module docstring)."""
    by_name = {r.name: r for r in records}
    found: set[str] = set()
    for name, source in _movement_outputs(index, by_name):
        record = by_name.get(name)
        if (record is not None and not record.is_float and record.encoding is not None
                and record.encoding.same_as(source.encoding)):
            found.add(name)
    return found
