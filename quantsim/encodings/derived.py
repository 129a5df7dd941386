"""Derived encodings: the entries AIMET's 2.0.0 export adds for outputs of data-movement ops.

aimet-onnx 2.42 writes, in a 2.0.0 file, an entry for the output of every data-movement op (Reshape,
Flatten, Transpose, MaxPool, Slice, ...) whose input is quantized, holding the input's encoding: the op
moves values of that grid without changing them, so the output is on the same grid (its example file
lists ``flat`` for a Flatten). The sim does not quantize these outputs (a Q/DQ pair there is an
identity) and the QDQ export adds the same derived Q/DQ pairs (`quantsim.export.qdq.add_derived_qdq`,
the same op set: `GRID_MOVEMENT_OPS`).

Rules (the module's one concept, used both ways):

* **writing**: in graph order, a float output of a `GRID_MOVEMENT_OPS` node whose first input has a
  per-tensor activation record (the sim's own, or derived itself), and which has no record of its own,
  gets a record with the input's encoding;
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

__all__ = ["derived_records", "derived_names"]


def _deriving_source(record: TensorEncoding | None) -> bool:
    return (record is not None and not record.is_float and record.kind != "param" and record.encoding is not None
            and record.encoding.scale.ndim == 0 and record.bits <= 16)


def _movement_outputs(index: GraphIndex, by_name: dict[str, TensorEncoding]):
    """``(output, source record)`` for the outputs of every `GRID_MOVEMENT_OPS` node whose first input has
    a deriving record in ``by_name``, in graph order; ``by_name`` is read node by node, so records the
    caller adds meanwhile (a chain of moves) count."""
    for node in index.nodes:
        if node.op_type not in GRID_MOVEMENT_OPS or not node.input:
            continue
        source = by_name.get(node.input[0])
        if not _deriving_source(source):
            continue
        assert source is not None and source.encoding is not None  # checked by _deriving_source
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
