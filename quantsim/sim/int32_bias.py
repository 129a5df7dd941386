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

The same holds for a MatMul with a constant 2-D weight ``[K, N]`` whose unquantized output feeds only an Add of
a constant per-column bias (shape ``[N]`` or ``[1, ..., 1, N]``, `GraphIndex.bias_add`): the integer export
folds it into ``QGemm``'s int32 bias and the QDQ export dequantizes it from int32 codes on ``s_in * s_w``
(MiniLM: the float bias was most of the sim's one-step differences from the integer model on its first
layers, 0.05-0.07% of outputs, 0.002% with it).

Eligibility follows `quantize_biases`, read from the sim's quantizer table over the prepared graph (names
are the same in the sim graph and the exports): the bias is a constant read by this node only, without an
enabled quantizer of its own (the exports dequantize such a bias from its codes); the op's data
input has an enabled, calibrated per-tensor integer quantizer (not float8), or comes from one through
grid-preserving data movement (`op_facts.GRID_MOVEMENT_OPS`, and a Pad writing only values on the grid: the
outputs the QDQ export gives a derived Q/DQ pair); the weight has an enabled integer quantizer (not float8,
not block-wise) whose per-channel axis, if any, is the op's output-channel axis; Gemm only with
``alpha = beta = 1`` and no ``transA``; grouped ConvTranspose only per tensor. The integer export's float
islands use the same values (`LoweringContext.sim_constant`), so a Conv it leaves in float (16-bit
activations) computes what the sim does.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from quantsim.core.bias import fits_int32, quantize_bias
from quantsim.graph.op_facts import BIAS_SLOT, GRID_MOVEMENT_OPS, facts_of
from quantsim.graph.pad_fill import on_integer_grid, pad_fill_value
from quantsim.sim.quantizer import QcQuantizeOp

__all__ = ["int32_bias_values", "sim_bias_values", "eligible_biases", "on_int32_grid", "matmul_bias", "biased_ops",
           "input_grid_quantizer"]

def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _integer_encoding(q: QcQuantizeOp | None):
    if q is None or not q.enabled or q.spec.is_float or q.encoding is None or q.encoding.fp8 is not None:
        return None
    return q.encoding


def input_grid_quantizer(name: str, producer_of: Callable[[str], onnx.NodeProto | None],
                         table: dict[str, QcQuantizeOp],
                         constant_of: Callable[[str], np.ndarray | None] | None = None) -> QcQuantizeOp | None:
    """The enabled quantizer whose grid the activation ``name`` is on: its own, or through data movement
    (`GRID_MOVEMENT_OPS`: Split, Reshape, Transpose, ...) its source's; None when no quantizer sets it.
    A Pad is followed too when every value it writes lies on that grid, as the QDQ export's derived Q/DQ
    pair after it requires (`quantsim.export.qdq.add_derived_qdq`): reflect / edge / wrap modes, a constant
    0 (the default), or another constant that a round trip through the grid keeps (read with
    ``constant_of``: name -> value, None when not a constant; without it only 0 qualifies). Keras'
    ``ZeroPadding2D`` before a strided convolution (ResNet, MobileNet through tf2onnx) is such a Pad.
    ``producer_of``: tensor name -> the node writing it; ``table``: tensor name -> quantizer."""
    pad_values: list[float] = []
    for _ in range(64):
        q = table.get(name)
        if q is not None and q.enabled:
            return q if all(_on_grid(value, q) for value in pad_values) else None
        node = producer_of(name)
        if node is None or not node.input:
            return None
        if node.op_type == "Pad":
            value = pad_fill_value(node, constant_of or _no_constants)
            if value is None:
                return None
            if value != 0.0:
                pad_values.append(value)
        elif node.op_type not in GRID_MOVEMENT_OPS:
            return None
        name = node.input[0]
    return None


def _no_constants(name: str) -> None:
    return None


def _on_grid(value: float, q: QcQuantizeOp) -> bool:
    """True when ``value`` survives a round trip through ``q``'s per-tensor integer grid."""
    enc = _integer_encoding(q)
    if enc is None or not enc.is_per_tensor:
        return False
    return on_integer_grid(value, float(np.float32(enc.scale)), int(np.asarray(enc.zero_point)), enc.qmin, enc.qmax)


def _initializer_values(graph: onnx.GraphProto) -> Callable[[str], np.ndarray | None]:
    """name -> value of a small initializer of ``graph`` (a Pad's constant), None for others."""
    small = {t.name: t for t in graph.initializer if not t.external_data and np.prod(t.dims) <= 1}
    return lambda name: numpy_helper.to_array(small[name]) if name in small else None


def _input_scale(name: str, producer: dict[str, onnx.NodeProto], table: dict[str, QcQuantizeOp],
                 constant_of: Callable[[str], np.ndarray | None] | None = None) -> np.ndarray | None:
    """The per-tensor scale of the activation grid ``name`` is on (`input_grid_quantizer`), or None when it is
    not on an integer grid."""
    enc = _integer_encoding(input_grid_quantizer(name, producer.get, table, constant_of))
    return None if enc is None or not enc.is_per_tensor else np.asarray(enc.scale, np.float32)


def _output_axis(node: onnx.NodeProto) -> int | None:
    attrs = _attrs(node)
    if node.op_type == "Gemm":
        if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0):
            return None
        return 0 if attrs.get("transB", 0) else 1
    return facts_of(node.op_type).weight_output_axis


def matmul_bias(node: onnx.NodeProto, consumers: dict[str, list[onnx.NodeProto]], dims: dict[str, list[int]],
                is_constant: Callable[[str], bool]) -> str | None:
    """The constant per-column bias added to the output of ``node``, a MatMul with a constant 2-D weight, by
    its only consumer (an Add of ``[N]`` or ``[1, ..., 1, N]``); ``dims``: initializer shapes. Else None."""
    if node.op_type != "MatMul" or len(node.input) != 2 or not is_constant(node.input[1]):
        return None
    weight = dims.get(node.input[1])
    users = consumers.get(node.output[0], [])
    if weight is None or len(weight) != 2 or len(users) != 1 or users[0].op_type != "Add" or len(users[0].input) != 2:
        return None
    others = [n for n in users[0].input if n != node.output[0]]
    shape = dims.get(others[0]) if len(others) == 1 and is_constant(others[0]) else None
    if not shape or shape[-1] != weight[1] or int(np.prod(shape[:-1], dtype=np.int64)) != 1:
        return None
    return others[0]


def biased_ops(graph: onnx.GraphProto, is_constant: Callable[[str], bool]):
    """``(node, bias name, output axis of the weight)`` of each Conv / ConvTranspose / Gemm with a bias input and
    each MatMul with a bias Add (`matmul_bias`)."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    dims = {t.name: list(t.dims) for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    for output in graph.output:
        consumers.setdefault(output.name, []).append(onnx.NodeProto())  # a graph output: not only the Add's
    for node in graph.node:
        slot = BIAS_SLOT.get(node.op_type)
        if slot is not None and len(node.input) > slot and node.input[slot] and len(node.input) >= 2:
            yield node, node.input[slot], _output_axis(node)
        elif (bias := matmul_bias(node, consumers, dims, is_constant)) is not None:
            yield node, bias, 1


def eligible_biases(graph: onnx.GraphProto, quantizers: list[QcQuantizeOp], is_constant: Callable[[str], bool],
                    ops: Iterable[tuple[onnx.NodeProto, str, int | None]] | None = None
                    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{bias name: (input scale, weight scale)}`` of the biases of ``graph`` (the sim's prepared graph) that
    the exports put on an int32 grid (module docstring); ``ops``: only these of `biased_ops`'s answers
    (None: all of them)."""
    producer = {out: node for node in graph.node for out in node.output}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    table = {t: q for q in quantizers for t in q.tensors}
    constant_of = _initializer_values(graph)
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for node, bias, axis in biased_ops(graph, is_constant) if ops is None else ops:
        if node.op_type == "MatMul" and (out := table.get(node.output[0])) is not None and out.enabled:
            continue  # quantized before the Add: an ordinary QLinearAdd in the integer model
        own = table.get(bias)
        if uses.get(bias, 0) != 1 or not is_constant(bias) or (own is not None and own.enabled):
            continue  # a bias with its own quantizer is on that grid in the sim and the exports
        q = table.get(node.input[1])
        enc = _integer_encoding(q)
        if q is None or enc is None or enc.block_size is not None:
            continue
        x_scale = _input_scale(node.input[0], producer, table, constant_of)
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


def on_int32_grid(value: np.ndarray, x_scale: np.ndarray, w_scale: np.ndarray) -> np.ndarray:
    """``value`` as DequantizeLinear computes it from its int32 codes: ``float32(codes) * (s_in * s_w)``."""
    codes, scale = quantize_bias(value, x_scale, w_scale)
    return (codes.astype(np.float32) * scale).astype(np.float32).reshape(np.shape(value))


def sim_bias_values(graph: onnx.GraphProto, quantizers: list[QcQuantizeOp], value_of: Callable[[str], np.ndarray],
                    is_constant: Callable[[str], bool],
                    ops: Iterable[tuple[onnx.NodeProto, str, int | None]] | None = None) -> dict[str, np.ndarray]:
    """``{bias name: its value on the int32 grid}`` for the float32 biases of ``graph`` that the exports add as
    int32 codes (float16/float64 models keep theirs: the sim's Cast pairs keep the model's own types);
    ``ops``: only the biases of these of `biased_ops`'s answers (None: all)."""
    values = {}
    for name, (x_scale, w_scale) in eligible_biases(graph, quantizers, is_constant, ops).items():
        value = np.asarray(value_of(name))
        if value.dtype == np.float32 and fits_int32(value, x_scale, w_scale):  # else float, as in the exports
            values[name] = on_int32_grid(value, x_scale, w_scale)
    return values


def int32_bias_values(built: onnx.ModelProto, source: onnx.ModelProto, quantizers: list[QcQuantizeOp],
                      value_of: Callable[[str], np.ndarray], external: dict[str, np.ndarray] | None = None) -> int:
    """Put, in place, the int32-grid value of each eligible bias of ``source`` (the prepared model) into
    ``built`` (its sim graph in the fake-weight form; big constants possibly in ``external``); returns how
    many biases were replaced."""
    initializers = {t.name: t for t in built.graph.initializer}
    constants = {t.name for t in source.graph.initializer}
    values = sim_bias_values(source.graph, quantizers, value_of, constants.__contains__)
    for name, value in values.items():
        if external is not None and name in external:
            external[name] = value
        elif name in initializers:
            initializers[name].CopyFrom(numpy_helper.from_array(value, name))
    return len(values)
