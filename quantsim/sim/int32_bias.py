"""The sim's biases on their int32 accumulator grid, as the deployed models add them.

Every export adds the bias of a Conv / ConvTranspose / Gemm whose input and weight are quantized as int32
codes on the accumulator grid ``s_in * s_w`` (zero point 0, per output channel with a per-channel weight):
the QDQ model as ``DequantizeLinear(int32 codes, s_in * s_w)`` (`quantsim.export.qdq.quantize_biases`), the
integer model inside ``QLinearConv`` / ``QGemm`` (`quantsim.export.integer.linear`). A float bias differs from
that by up to half an accumulator unit, which moves values near a rounding midpoint of the output grid by
one step; on a deep net such one-step flips grow layer by layer (PP-OCR's direction classifier: 4 dB of
output SQNR to FP32 between the float-bias sim and its own QDQ model run without fusion, see
benchmarks/README.md "Sim vs deployed models"). `int32_bias_values` gives the sim's graph the same biases:
each eligible bias initializer is replaced by ``float32(codes) * scale``, the value DequantizeLinear computes
from the codes, so the sim and the unfused QDQ export compute the same floats.

Eligibility follows `quantize_biases`: the bias is a constant read by this node only; the op's data input
comes (through grid-preserving data movement, `op_facts.GRID_MOVEMENT_OPS`, whose outputs the QDQ export
gives a derived Q/DQ pair) from a per-tensor integer DequantizeLinear; the weight has an enabled integer
quantizer (not float8, not block-wise) whose per-channel axis, if any, is the op's output-channel axis; Gemm
only with ``alpha = beta = 1`` and no ``transA``; grouped ConvTranspose only per tensor.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from quantsim.core.bias import quantize_bias
from quantsim.graph.op_facts import BIAS_SLOT, GRID_MOVEMENT_OPS, facts_of
from quantsim.sim.quantizer import QcQuantizeOp

__all__ = ["int32_bias_values", "eligible_biases"]

_FLOAT8 = (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _input_scale(name: str, producer: dict[str, onnx.NodeProto], constants: dict[str, np.ndarray],
                 elem_type: dict[str, int]) -> np.ndarray | None:
    """The per-tensor scale of the integer DequantizeLinear that ``name`` comes from, or None."""
    seen = 0
    node = producer.get(name)
    while node is not None and node.op_type in GRID_MOVEMENT_OPS and node.input and seen < 64:
        node, seen = producer.get(node.input[0]), seen + 1
    if node is None or node.op_type != "DequantizeLinear" or node.input[1] not in constants:
        return None
    if "block_size" in _attrs(node):
        return None
    scale = np.asarray(constants[node.input[1]])
    if scale.ndim != 0:
        return None
    zero_point = node.input[2] if len(node.input) > 2 else ""
    if zero_point and (zero_point not in constants or elem_type.get(zero_point) in _FLOAT8):
        return None
    return scale


def _output_axis(node: onnx.NodeProto) -> int | None:
    attrs = _attrs(node)
    if node.op_type == "Gemm":
        if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0):
            return None
        return 0 if attrs.get("transB", 0) else 1
    return facts_of(node.op_type).weight_output_axis


def eligible_biases(model: onnx.ModelProto, quantizers: list[QcQuantizeOp], constants: dict[str, np.ndarray]
                    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{bias name: (input scale, weight scale)}`` of the biases that ``model`` (a sim graph in the fake-weight
    form, with activation Q/DQ pairs) would get on an int32 grid in the exports (module docstring).
    ``constants`` holds the values of the graph's small constants (scales, zero points, biases)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    elem_type = {t.name: t.data_type for t in model.graph.initializer}
    by_tensor = {t: q for q in quantizers for t in q.tensors}
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for node in model.graph.node:
        slot = BIAS_SLOT.get(node.op_type)
        if slot is None or len(node.input) <= slot or node.input[slot] not in constants:
            continue
        bias = node.input[slot]
        if uses.get(bias, 0) != 1 or bias in found:
            continue
        q = by_tensor.get(node.input[1])
        enc = q.encoding if q is not None and q.enabled and not q.spec.is_float else None
        if enc is None or enc.fp8 is not None or enc.block_size is not None:
            continue
        x_scale = _input_scale(node.input[0], producer, constants, elem_type)
        axis = _output_axis(node)
        if x_scale is None or axis is None:
            continue
        w_scale = np.asarray(enc.scale, np.float32)
        if w_scale.ndim:
            if node.op_type == "ConvTranspose" and _attrs(node).get("group", 1) != 1:
                continue
            rank = len(q.shape) if q.shape else 2
            if enc.axis is None or enc.axis % rank != axis:
                continue
            w_scale = w_scale.reshape(-1)
        found[bias] = (x_scale, w_scale)
    return found


def int32_bias_values(model: onnx.ModelProto, quantizers: list[QcQuantizeOp],
                      external: dict[str, np.ndarray] | None = None) -> int:
    """Replace, in place, each eligible bias of ``model`` (a fake-weight sim graph; its big constants possibly
    in ``external``) by its value on the int32 accumulator grid; returns how many were replaced."""
    initializers = {t.name: t for t in model.graph.initializer}
    wanted = {node.input[slot] for node in model.graph.node
              if (slot := BIAS_SLOT.get(node.op_type)) is not None and len(node.input) > slot}
    constants: dict[str, np.ndarray] = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear":
            wanted.update(node.input[1:])
    for name in wanted:
        if external is not None and name in external:
            constants[name] = external[name]
        elif name in initializers and initializers[name].data_location != TensorProto.EXTERNAL:
            constants[name] = numpy_helper.to_array(initializers[name])
    grids = eligible_biases(model, quantizers, constants)
    for name, (x_scale, w_scale) in grids.items():
        value = np.asarray(constants[name])
        if value.dtype != np.float32:
            continue  # float16/float64 models: the sim's Cast pairs keep the bias in the model's own type
        codes, scale = quantize_bias(value, x_scale, w_scale)
        on_grid = (codes.astype(np.float32) * scale).astype(np.float32).reshape(value.shape)
        if external is not None and name in external:
            external[name] = on_grid
        else:
            initializers[name].CopyFrom(numpy_helper.from_array(on_grid, name))
    return len(grids)
