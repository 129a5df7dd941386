"""Legality of an exported QDQ model on a target (what ``quantsim inspect --target`` shows for an export).

`QdqView` reads a standard QDQ model the way a backend compiler does: a tensor produced by DequantizeLinear
has that DequantizeLinear's integer (or float8) type, a tensor read by QuantizeLinear has that one's type, a
``Cast(float16) -> Cast(float)`` pair is float16, anything else is float32; a DequantizeLinear of an
initializer is a parameter. `quantsim.target.legality.analyze` then gives each op a verdict. The sim's own
exports are checked before they are written (`quantsim.sim.target_rules.check_export`); this view is for
models on disk, whoever wrote them.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from quantsim.core.dtypes import float8e4m3fn, float8e5m2, float16, qtype
from quantsim.errors import InvalidArgumentError
from quantsim.export.qdq_import import weight_grid_storage
from quantsim.graph.index import GraphIndex
from quantsim.graph.op_facts import facts_of
from quantsim.graph.tensor_roles import find_index_tensors
from quantsim.target.legality import FLOAT, LegalityReport, TensorPrecision, analyze
from quantsim.target.profile import load_target

__all__ = ["QdqView", "qdq_report", "legality_report"]

_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})
_INT_BITS: dict[int, tuple[int, bool]] = {
    TensorProto.INT8: (8, True), TensorProto.UINT8: (8, False), TensorProto.INT16: (16, True),
    TensorProto.UINT16: (16, False), TensorProto.INT4: (4, True), TensorProto.UINT4: (4, False)}
_FP8: dict[int, qtype] = {TensorProto.FLOAT8E4M3FN: float8e4m3fn, TensorProto.FLOAT8E5M2: float8e5m2}


class QdqView:
    """A QDQ ModelProto as `analyze` reads it (module docstring)."""

    def __init__(self, model: onnx.ModelProto):
        inferred = onnx.shape_inference.infer_shapes(model)
        self.index = GraphIndex(inferred)
        self.inits = self.index.initializers
        self.nodes = [n for n in self.index.nodes if n.op_type not in _QDQ and not self._half_cast(n)]
        self.graph_inputs = self.index.graph_inputs
        self.graph_outputs = self.index.graph_outputs
        self.index_tensors = find_index_tensors(self.index)

    def _half_cast(self, node: onnx.NodeProto) -> bool:
        """A Cast of a float16 round trip (the sim's float16 quantizer)."""
        if node.op_type != "Cast":
            return False
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if to == TensorProto.FLOAT16:
            return any(u.node.op_type == "Cast" for u in self.index.uses(node.output[0]))
        producer = self.index.producer_of(node.input[0])
        return producer is not None and producer.op_type == "Cast" and self._half_cast(producer)

    def _grid(self, node: onnx.NodeProto, data: str) -> TensorPrecision:
        """The precision of Q/DQ ``node`` whose integer side is ``data`` (or, for Q, its zero point)."""
        zp = node.input[2] if len(node.input) > 2 and node.input[2] else None
        elem = self.index.elem_type.get(data)
        if zp is not None and zp in self.inits:
            elem = self.inits[zp].data_type
        if data in self.inits and node.op_type == "DequantizeLinear":  # an 8-bit weight in a 16-bit container
            elem = weight_grid_storage(self.index, node, self.index.constant_value(data))
        elem = elem or TensorProto.UINT8
        scale = self.inits.get(node.input[1])
        block = next((a.i for a in node.attribute if a.name == "block_size"), 0)
        granularity = "per_block" if block else ("per_channel" if scale is not None and
                                                 int(np.prod(scale.dims)) > 1 else "per_tensor")
        if elem in _FP8:
            return TensorPrecision(_FP8[elem], True, granularity, data)
        bits, signed = _INT_BITS.get(elem, (8, False))
        zero = numpy_helper.to_array(self.inits[zp]).astype(np.int64) if zp is not None and zp in self.inits else 0
        symmetric = bool(np.all(zero == 0) or (not signed and np.all(zero == 2 ** (bits - 1))))
        return TensorPrecision(qtype.int(bits), symmetric, granularity, data)

    def is_float(self, tensor: str) -> bool:
        return self.index.is_float(tensor)

    def _dq_of(self, tensor: str) -> onnx.NodeProto | None:
        producer = self.index.producer_of(tensor)
        return producer if producer is not None and producer.op_type == "DequantizeLinear" else None

    def is_constant(self, tensor: str) -> bool:
        dq = self._dq_of(tensor)
        return tensor in self.inits or (dq is not None and dq.input[0] in self.inits)

    def is_plain_constant(self, tensor: str) -> bool:
        """An initializer, or the int32 bias ``DequantizeLinear(int32 codes)`` of a bias Add (the accumulator's
        grid, part of the kernel: never an activation input of another precision)."""
        if tensor in self.inits:
            return True
        dq = self._dq_of(tensor)
        return dq is not None and dq.input[0] in self.inits and self.inits[dq.input[0]].data_type == TensorProto.INT32

    def consumers(self, tensor: str) -> list[onnx.NodeProto]:
        return [u.node for u in self.index.uses(tensor) if u.index >= 0 and u.node.op_type not in _QDQ]

    def producer(self, tensor: str) -> onnx.NodeProto | None:
        producer = self.index.producer_of(tensor)
        return None if producer is None or producer.op_type in _QDQ else producer

    def precision(self, tensor: str) -> TensorPrecision:
        dq = self._dq_of(tensor)
        if dq is not None:
            return self._grid(dq, dq.input[0])
        producer = self.index.producer_of(tensor)
        if producer is not None and producer.op_type == "Cast" and self._half_cast(producer):
            return TensorPrecision(float16, source=tensor)
        for use in self.index.uses(tensor):
            if use.node.op_type == "QuantizeLinear":
                return self._grid(use.node, use.node.output[0])
            if use.node.op_type == "Cast" and self._half_cast(use.node):
                return TensorPrecision(float16, source=tensor)
        if producer is not None and facts_of(producer.op_type).grid_preserving and producer.input:
            return self.precision(producer.input[0])
        return FLOAT

    def weight(self, node: onnx.NodeProto) -> tuple[str, TensorPrecision] | None:
        for slot, kind in sorted(facts_of(node.op_type).param_slots.items()):
            if kind == "weight" and slot < len(node.input) and self.is_constant(node.input[slot]):
                return node.input[slot], self.precision(node.input[slot])
        return None

    def shape(self, tensor: str) -> tuple | None:
        dq = self._dq_of(tensor)
        return self.index.shape.get(dq.input[0] if dq is not None else tensor)


def qdq_report(model: onnx.ModelProto, target) -> LegalityReport:
    """Verdicts and findings of a QDQ model on ``target`` (a `TargetProfile`, shipped name or file)."""
    return analyze(QdqView(model), load_target(target))


def legality_report(sim_or_model, target=None) -> LegalityReport:
    """Where each node of a sim (default ``target``: the sim's own) or of a QDQ ModelProto would run on
    ``target``, and every rule it breaks (`quantsim.target.legality`)."""
    if isinstance(sim_or_model, onnx.ModelProto):
        if target is None:
            raise InvalidArgumentError("legality_report of a model needs a target (a TargetProfile, shipped name or file)")
        return qdq_report(sim_or_model, target)
    from quantsim.sim.target_rules import sim_report

    report = sim_report(sim_or_model, target)
    if report is None:
        raise InvalidArgumentError("the sim has no target: pass target= (a TargetProfile, shipped name or file)")
    return report
