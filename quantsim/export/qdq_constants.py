"""QDQ export: float constants of elementwise ops given as exact 8-bit codes, so the op fuses.

An ``Add`` / ``Mul`` that adds or multiplies a dequantized 8-bit activation by a float constant and whose
output is quantized (PP-LCNetV3's learnable affine blocks ``y = a * x + b`` after every activation; the
scalar factors and offsets of detection heads) is, in the sim, ``Q(DQ(x) op c)`` with ``c`` in float: the
sim leaves such constants unquantized. onnxruntime fuses ``DQ -> Add/Mul -> Q`` into ``QLinearAdd`` /
``QLinearMul`` only when *both* inputs come from a DequantizeLinear; with a float constant it runs the op
in float between a DequantizeLinear and a QuantizeLinear over the whole tensor (PP-OCRv4 det: 48 such
ops, each three passes over a full feature map where the fused op makes one).

Where ``c`` lies exactly on an 8-bit grid of the activation's code type (a scalar always does: code 1
with scale ``|c|``; a vector when its values are integer multiples of one step within the code range,
e.g. a per-channel factor the sim fake-quantized on an 8-bit grid: `exact_codes`), the constant is stored
as those codes behind ``DequantizeLinear``, whose output is ``c`` bit for bit (``(code - zero_point) *
scale`` in float32, checked here for every element). A ``Div`` by a power of two becomes the ``Mul`` by
its reciprocal (bit for bit the same; attention's division by sqrt(64) = 8). The model computes the same
numbers as before wherever Q/DQ run as written (``to_onnx_qdq(int32_bias=False)`` with fusion off is
still the sim exactly). A runtime that fuses the node unit computes the same real value in another float
order; the rewrite is made only where, for every one of the 256 input codes, the sim's result lies clear of
a rounding tie (`TIE_MARGIN`), so the fused op gives the sim's codes too (`_clear_of_ties`).
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from quantsim.graph.deferred import WeightSource
from quantsim.graph.edit import drop_unused_initializers
from quantsim.graph.index import GraphIndex, node_attributes

__all__ = ["TIE_MARGIN", "codes_for_elementwise_constants", "exact_codes"]

_BINARY_OPS = ("Add", "Mul")  # the elementwise ops onnxruntime fuses with Q/DQ on both inputs and the output
_EIGHT_BIT: dict[int, type] = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}


def exact_codes(values: np.ndarray, code_type: int) -> tuple[np.ndarray, np.float32, int] | None:
    """``(codes, scale, zero_point)`` of ``code_type`` (uint8 / int8) whose DequantizeLinear,
    ``float32(code - zero_point) * scale``, gives exactly ``values`` (float32, every element), or None.

    Candidate scales: the smallest nonzero magnitude (a scalar: code +-1), the step of the 8-bit grid
    spanning ``[min, max]`` (a constant the sim fake-quantized on such a grid) and the step of the
    symmetric grid ``max|v| / 127``; the values over the scale must be integers that fit the code range with
    one zero point (0 when it fits, else the one that puts the smallest value at the lowest code)."""
    values = np.asarray(values)
    if values.dtype != np.float32 or values.size == 0 or not np.all(np.isfinite(values)):
        return None
    nonzero = np.abs(values[values != 0])
    if not nonzero.size:
        return np.zeros(values.shape, _EIGHT_BIT[code_type]), np.float32(1.0), 0
    info = np.iinfo(_EIGHT_BIT[code_type])
    span = float(max(values.max(), 0)) - float(min(values.min(), 0))
    for scale in dict.fromkeys((np.float32(nonzero.min()), np.float32(span / (info.max - info.min)),
                                np.float32(nonzero.max() / info.max))):
        if not scale > 0:
            continue
        steps = np.rint(values.astype(np.float64) / np.float64(scale)).astype(np.int64)
        zero_point = 0 if steps.min() >= info.min and steps.max() <= info.max else info.min - int(steps.min())
        codes = steps + zero_point
        if not info.min <= zero_point <= info.max or codes.min() < info.min or codes.max() > info.max:
            continue
        dequantized = (codes - zero_point).astype(np.float32) * scale  # DequantizeLinear's arithmetic
        # bit for bit (a -0.0 may become +0.0: it adds and scales alike up to the sign of a zero)
        if np.all((dequantized.view(np.uint32) == values.view(np.uint32)) | ((values == 0) & (dequantized == 0))):
            return codes.astype(_EIGHT_BIT[code_type]), scale, zero_point
    return None


def _activation_code_type(index: GraphIndex, name: str) -> int | None:
    """The 8-bit code type of the per-tensor DequantizeLinear of an activation producing ``name``, or None."""
    dq = index.producer_of(name)
    if dq is None or dq.op_type != "DequantizeLinear" or index.is_constant(dq.input[0]):
        return None
    if any(a in node_attributes(dq) for a in ("axis", "block_size")) or not index.is_constant(dq.input[1]):
        return None
    if np.asarray(index.constant_value(dq.input[1])).ndim:
        return None
    code_type = index.elem_type.get(dq.input[0])
    if code_type is None and len(dq.input) > 2 and dq.input[2]:
        code_type = index.elem_type.get(dq.input[2])
    return code_type if code_type in _EIGHT_BIT else None


def _quantized_output(index: GraphIndex, name: str, code_type: int) -> bool:
    """True when every reader of ``name`` is a per-tensor QuantizeLinear to ``code_type`` (a node unit)."""
    uses = index.uses(name)
    if not uses or name in index.graph_outputs:
        return False
    for use in uses:
        q = use.node
        if q.op_type != "QuantizeLinear" or use.index != 0 or "axis" in node_attributes(q):
            return False
        out_type = index.elem_type.get(q.input[2]) if len(q.input) > 2 and q.input[2] else \
            node_attributes(q).get("output_dtype", TensorProto.UINT8)
        if out_type != code_type:
            return False
    return True


def _power_of_two_reciprocal(values: np.ndarray) -> np.ndarray | None:
    """``1 / values`` when every element is +-2^k with a normal reciprocal, so that ``x / c == x * (1 / c)``
    holds bit for bit for every float32 ``x`` (both are the correctly rounded ``x * 2^-k``), else None."""
    values = np.asarray(values)
    if values.dtype != np.float32 or values.size == 0 or not np.all(np.isfinite(values)) or np.any(values == 0):
        return None
    mantissa, _ = np.frexp(values)
    reciprocal = (np.float32(1) / values).astype(np.float32)
    if not np.all(np.abs(mantissa) == 0.5) or not np.all(np.abs(reciprocal) >= np.finfo(np.float32).tiny):
        return None
    return reciprocal


def _fusable_operand(index: GraphIndex, node: onnx.NodeProto) -> tuple[int, int] | None:
    """``(constant slot, code type)`` when ``node`` is an Add/Mul (or a Div by a constant) of an 8-bit dequantized
    activation and a float constant whose output only per-tensor QuantizeLinear nodes of that type read."""
    if node.op_type not in (*_BINARY_OPS, "Div") or len(node.input) != 2:
        return None
    for slot in ((1,) if node.op_type == "Div" else (0, 1)):
        constant, activation = node.input[slot], node.input[1 - slot]
        if not index.is_constant(constant) or index.elem_type.get(constant) != TensorProto.FLOAT:
            continue
        code_type = _activation_code_type(index, activation)
        if code_type is not None and _quantized_output(index, node.output[0], code_type):
            return slot, code_type
    return None


TIE_MARGIN = 1e-3
"""How far (in output steps) from a rounding tie every result of a fused op must lie. A fused kernel
(QLinearAdd / QLinearMul) computes the same real value as the sim in another float32 order, off by about
1e-5 steps at 8 bits; outside this margin both round to the same code."""

_MAX_TIE_CHECK = 1 << 14  # constant elements checked against every input code; a larger constant stays float


def _qdq_params(index: GraphIndex, node: onnx.NodeProto) -> tuple[np.float32, int] | None:
    """``(scale, zero point)`` of a per-tensor Q/DQ node with constant parameters, else None."""
    if not all(index.is_constant(n) for n in node.input[1:] if n):
        return None
    zero_point = int(index.constant_value(node.input[2])) if len(node.input) > 2 and node.input[2] else 0
    return np.float32(index.constant_value(node.input[1])), zero_point


def _clear_of_ties(index: GraphIndex, node: onnx.NodeProto, slot: int, code_type: int, values: np.ndarray) -> bool:
    """True when, for every input code and every element of the constant, the sim's result of ``node``
    (float32 ``DQ(code) op c``) lies at least `TIE_MARGIN` output steps from a rounding tie of each
    QuantizeLinear reading it: then a fused kernel gives the sim's code for every input. An Add of 1.0 to
    an erf output on the same grid (GELU) puts half the codes on ties, which a fused kernel rounds the
    other way: such an op stays float. ``values``: the constant operand's."""
    dq = index.producer_of(node.input[1 - slot])
    params = _qdq_params(index, dq) if dq is not None else None
    if params is None:
        return False
    constant = np.asarray(values, np.float32).reshape(1, -1)
    info = np.iinfo(_EIGHT_BIT[code_type])
    codes = np.arange(info.min, info.max + 1, dtype=np.int64).reshape(-1, 1)
    x = (codes - params[1]).astype(np.float32) * params[0]
    with np.errstate(all="ignore"):
        y = {"Add": np.add, "Mul": np.multiply, "Div": np.divide}[node.op_type](
            *((x, constant) if slot == 1 else (constant, x))).astype(np.float32)
    for use in index.uses(node.output[0]):
        out = _qdq_params(index, use.node)
        if out is None or not out[0] > 0:
            return False
        steps = y.astype(np.float64) / np.float64(out[0]) + out[1]
        inside = (steps > info.min - 1) & (steps < info.max + 1)
        if not np.all(np.isfinite(y)) or np.any(inside & (np.abs(steps - np.floor(steps) - 0.5) < TIE_MARGIN)):
            return False
    return True


def codes_for_elementwise_constants(model: onnx.ModelProto, weights: WeightSource | None = None) -> onnx.ModelProto:
    """Give each float constant operand of a quantized ``Add`` / ``Mul`` between 8-bit Q/DQ its exact codes
    behind a DequantizeLinear (module docstring); values the constant cannot hold exactly stay float. A
    ``Div`` by a constant power of two becomes the ``Mul`` by its reciprocal first (the same result bit for
    bit; attention's division by sqrt(64) = 8), a Div by anything else stays float. ``weights`` reads the
    initializers held outside ``model`` (a streamed export's `DeferredWeights` placeholders)."""
    index = GraphIndex(model, weights=weights)
    replaced: dict[tuple[str, int, bool], str] = {}  # (constant, code type, reciprocal) -> its dequantized codes
    new_nodes: list[onnx.NodeProto] = []
    for node in index.nodes:
        found = _fusable_operand(index, node)
        if found is None:
            continue
        slot, code_type = found
        constant, reciprocal = node.input[slot], node.op_type == "Div"
        if math.prod(index.initializers[constant].dims) > _MAX_TIE_CHECK:
            continue  # before its values are read: a big constant may be an export's deferred weight
        values = index.constant_value(constant)  # read once: a deferred one is computed
        if not _clear_of_ties(index, node, slot, code_type, values):
            continue
        key = (constant, code_type, reciprocal)
        if key not in replaced:
            operand = _power_of_two_reciprocal(values) if reciprocal else values
            codes = exact_codes(operand, code_type) if operand is not None else None
            if codes is None:
                continue
            base = index.fresh_name(f"{constant}/{'reciprocal_' if reciprocal else ''}codes")
            names = [base, index.fresh_name(f"{base}/scale"), index.fresh_name(f"{base}/zero_point")]
            model.graph.initializer.extend([
                numpy_helper.from_array(codes[0], names[0]), numpy_helper.from_array(np.array(codes[1], np.float32), names[1]),
                numpy_helper.from_array(np.array(codes[2], _EIGHT_BIT[code_type]), names[2])])
            replaced[key] = index.fresh_name(f"{base}/dequantized")
            new_nodes.append(onnx.helper.make_node("DequantizeLinear", names, [replaced[key]],
                                                   name=index.fresh_name(f"{base}/dequantize")))
        if reciprocal:
            node.op_type = "Mul"
        node.input[slot] = replaced[key]
    if new_nodes:
        nodes = new_nodes + list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        drop_unused_initializers(model.graph, {constant for constant, _, _ in replaced})
    return model
