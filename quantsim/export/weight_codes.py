"""Storage type of 8-bit weight codes in the ONNX exports: ``weight_codes="int8" | "uint8" | "auto"``.

The sim's 8-bit weights are int8 codes (symmetric: zero point 0). ``real = scale * (code - zero_point)``
holds the same numbers with ``code + 128`` in uint8 and ``zero_point + 128``: the shift is exact for every
int8 code and zero point (``[-128, 127] + 128 = [0, 255]``), per tensor and per channel alike, so the
dequantized weights, and every integer sum built from them, are unchanged.

Why offer it: on x86-64 CPUs with AVX2 but without VNNI, onnxruntime's uint8 x int8 kernels saturate
(`quantsim.graph.int8_kernels`), while its uint8 x uint8 kernels compute exactly on every CPU. With
uint8 weight codes the integer export, the QDQ export in onnxruntime's default session and
`QuantizationSimModel.fused_session` run exactly there (onnxruntime's own ``quantize_static`` offers the
same choice as ``weight_type=QuantType.QUInt8``). On VNNI CPUs the U8S8 kernels are the fast path, so
``int8`` stays the default of the exported files (a file is deployed on other machines than the one that
wrote it); ``auto`` asks the probe of this machine and is the default of in-process sessions.

What is shifted (the weight slots of ops onnxruntime runs on integer kernels; nothing else):

* the weight input of ``QLinearConv``, ``QLinearMatMul``, ``QGemm`` (with its zero point) and of
  ``ConvInteger`` / ``MatMulInteger`` (its zero point added when absent);
* the codes of a constant ``DequantizeLinear`` whose every consumer is a Conv / MatMul / Gemm (the QDQ
  node units onnxruntime fuses into those kernels).

A weight or zero-point initializer that other nodes read too is copied, the copy shifted. The AIMET
encodings files are not touched: they keep int8 symmetric semantics.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from quantsim.errors import InvalidArgumentError
from quantsim.graph.deferred import DeferredWeights
from quantsim.graph.edit import drop_unused_initializers, drop_value_info
from quantsim.graph.index import GraphIndex
from quantsim.graph.int8_kernels import uint8_int8_kernels_saturate, warn_if_int8_kernels_saturate

__all__ = ["WEIGHT_CODES", "check_weight_codes", "resolve_weight_codes", "shift_weight_codes"]

WEIGHT_CODES = ("int8", "uint8", "auto")

# op type -> (weight slot, scale slot or None, zero-point slot)
_KERNEL_SLOTS = {"QLinearConv": (3, 4, 5), "QLinearMatMul": (3, 4, 5), "QGemm": (3, 4, 5),
                 "ConvInteger": (1, None, 3), "MatMulInteger": (1, None, 3)}
_DQ_SLOTS = (0, 1, 2)
_FUSED_CONSUMERS = frozenset({"Conv", "MatMul", "Gemm"})


def check_weight_codes(value: object) -> str:
    """``value`` if it is one of `WEIGHT_CODES`, else an `InvalidArgumentError` naming the option."""
    if not isinstance(value, str) or value not in WEIGHT_CODES:
        raise InvalidArgumentError(f"weight_codes must be one of {', '.join(map(repr, WEIGHT_CODES))}, "
                                   f"got {value!r}")
    return value


def resolve_weight_codes(value: object, providers=None, *, warn_as: str | None = None) -> str:
    """``"int8"`` or ``"uint8"``: ``"auto"`` is ``"uint8"`` exactly when the first of ``providers``
    (default: the CPU provider) saturates uint8 x int8 sums on this machine. With ``warn_as`` (the caller's
    name), an ``"int8"`` answer also logs the once-per-process saturation warning where it applies."""
    value = check_weight_codes(value)
    if value == "auto":
        first = providers[0] if providers else "CPUExecutionProvider"
        provider = first[0] if isinstance(first, tuple) else first
        value = "uint8" if uint8_int8_kernels_saturate(provider) else "int8"
    if warn_as is not None and value == "int8":
        warn_if_int8_kernels_saturate(warn_as, providers)
    return value


def _candidates(index: GraphIndex) -> list[tuple[onnx.NodeProto, tuple[int, int | None, int]]]:
    """Nodes whose weight slot holds int8 codes that can move to uint8, with their slots."""
    found = []
    for node in index.nodes:
        if node.domain not in ("", "ai.onnx", "com.microsoft"):
            continue
        slots = _KERNEL_SLOTS.get(node.op_type)
        if slots is None and node.op_type == "DequantizeLinear":
            uses = index.uses(node.output[0])
            if uses and node.output[0] not in index.graph_outputs and all(
                    u.node.op_type in _FUSED_CONSUMERS and u.index >= 0 for u in uses):
                slots = _DQ_SLOTS
        if slots is None or len(node.input) <= slots[0]:
            continue
        weight = node.input[slots[0]]
        if not index.is_constant(weight) or index.elem_type.get(weight) != TensorProto.INT8:
            continue
        zp = node.input[slots[2]] if len(node.input) > slots[2] else ""
        if zp and (not index.is_constant(zp) or index.elem_type.get(zp) != TensorProto.INT8):
            continue
        found.append((node, slots))
    return found


def _shifted(values: np.ndarray) -> np.ndarray:
    return (np.asarray(values).astype(np.int16) + 128).astype(np.uint8)


def shift_weight_codes(model: onnx.ModelProto, weights=None) -> tuple[onnx.ModelProto, int]:
    """Store the int8 weight codes of integer-kernel weight slots as uint8 (code + 128, zero point + 128;
    module docstring), in place; returns ``(model, number of weight slots changed)``. ``weights``: the reader
    of initializers held outside the model, if any (`quantsim.graph.mapped`, or the export's
    `quantsim.graph.deferred.DeferredWeights`, whose placeholders stay deferred: their shift is computed when
    the writer reads them)."""
    index = GraphIndex(model, weights=weights)
    candidates = _candidates(index)
    if not candidates:
        return model, 0
    slot_of = {id(node): slots for node, slots in candidates}
    initializers = {t.name: t for t in model.graph.initializer}

    def only_candidate_slots(name: str, which: int) -> bool:
        return name not in index.graph_outputs and all(
            id(u.node) in slot_of and u.index == slot_of[id(u.node)][which] for u in index.uses(name))

    renamed: dict[str, str] = {}  # int8 initializer -> its uint8 version
    new_tensors: list[TensorProto] = []
    replaced: set[str] = set()

    def shifted_name(name: str, which: int) -> str:
        if name not in renamed:
            in_place = only_candidate_slots(name, which)
            target = name if in_place else index.fresh_name(f"{name}_u8")
            tensor = initializers.get(name)
            if isinstance(weights, DeferredWeights) and tensor is not None and weights.holds(tensor):
                new_tensors.append(weights.derive(tensor, target, TensorProto.UINT8, _shifted))  # stays deferred
            else:
                new_tensors.append(numpy_helper.from_array(_shifted(index.constant_value(name)), target))
            if in_place:
                replaced.add(name)
            renamed[name] = target
        return renamed[name]

    for node, (w_slot, s_slot, zp_slot) in candidates:
        node.input[w_slot] = shifted_name(node.input[w_slot], 0)
        zp = node.input[zp_slot] if len(node.input) > zp_slot else ""
        if zp:
            node.input[zp_slot] = shifted_name(zp, 2)
            continue
        scale = node.input[s_slot] if s_slot is not None else ""
        shape = tuple(index.shape.get(scale) or ()) if scale and index.is_constant(scale) else ()
        name = index.fresh_name(f"{node.input[w_slot]}_zero_point")
        new_tensors.append(numpy_helper.from_array(np.full(shape, 128, np.uint8), name))
        while len(node.input) < zp_slot:
            node.input.append("")
        node.input.append(name)
    kept = [t for t in model.graph.initializer if t.name not in replaced]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept + new_tensors)
    drop_value_info(model.graph, replaced)  # their recorded type was int8
    drop_unused_initializers(model.graph, set(renamed))
    return model, len(candidates)
