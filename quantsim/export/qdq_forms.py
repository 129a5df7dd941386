"""The two spellings of a QDQ model that AIMET's ``to_onnx_qdq`` lets its caller choose (same values either way).

* **Activation signedness** (``force_activation_as``): an activation's Q/DQ pair may store its codes signed or
  unsigned. The grids are the same: shifting the zero point and the code range by ``2^(b-1)`` (int8 zero point
  ``z`` -> uint8 ``z + 128``) gives the same ``clamp(round(x / s) + z)`` values after DequantizeLinear, for 4, 8
  and 16 bits. ``"unsigned"`` (AIMET's default) stores every activation unsigned, ``"signed"`` every one
  signed, ``None`` keeps each grid's own (signed for symmetric, unsigned otherwise). Constants and weights keep
  theirs. A Clip in front of a Q (an n-bit grid in a wider container) works on float values and is unchanged.
* **Constants as codes or as floats** (``prequantize_constants``): a weight is stored either as integer codes
  behind a DequantizeLinear (True: what runtimes load directly) or, as AIMET writes by default, as its
  fake-quantized float values behind a QuantizeLinear -> DequantizeLinear pair (False). The float values are
  exactly ``(code - zero_point) * scale``, which QuantizeLinear maps back to the same code (``|error| << 0.5``
  step), so both graphs compute the same. int32 bias codes stay codes (QuantizeLinear has no int32 output,
  AIMET does the same), and so do an LPBQ weight's integer block scales and its codes (the weight's scale is
  computed by a DequantizeLinear: the pair `from_onnx_qdq` reads as one LPBQ encoding).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim.errors import InvalidArgumentError
from quantsim.graph.deferred import DeferredWeights
from quantsim.graph.index import GraphIndex, node_attributes

__all__ = ["ACTIVATION_SIGNEDNESS", "check_activation_signedness", "set_activation_signedness", "float_constants"]

ACTIVATION_SIGNEDNESS = ("unsigned", "signed", None)

# storage type -> (the same width with the other signedness, shift of the zero point to get there)
_OTHER_SIGNEDNESS: dict[int, tuple[int, int]] = {
    TensorProto.INT8: (TensorProto.UINT8, 1 << 7), TensorProto.UINT8: (TensorProto.INT8, -(1 << 7)),
    TensorProto.INT16: (TensorProto.UINT16, 1 << 15), TensorProto.UINT16: (TensorProto.INT16, -(1 << 15)),
    TensorProto.INT4: (TensorProto.UINT4, 1 << 3), TensorProto.UINT4: (TensorProto.INT4, -(1 << 3)),
}
_SIGNED = frozenset({TensorProto.INT8, TensorProto.INT16, TensorProto.INT4})
_FLOAT8 = frozenset({TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2})


def check_activation_signedness(value) -> str | None:
    """``force_activation_as`` checked: "unsigned", "signed" or None."""
    if value not in ACTIVATION_SIGNEDNESS:
        raise InvalidArgumentError(f"force_activation_as must be 'unsigned', 'signed' or None, got {value!r}")
    return value


def _zero_point_tensor(name: str, values: np.ndarray, elem_type: int) -> onnx.TensorProto:
    return helper.make_tensor(name, elem_type, list(values.shape), values.reshape(-1).astype(np.int64).tolist())


def set_activation_signedness(model: onnx.ModelProto, signedness: str | None) -> onnx.ModelProto:
    """Store every activation Q/DQ pair's codes as ``signedness`` says (module docstring), in place. Needs the
    zero points explicit (before `qdq.drop_zero_zero_points`). A zero point that anything other than
    activation Q/DQ pairs also reads is left as it is."""
    if signedness is None:
        return model
    index = GraphIndex(model)
    want_signed = signedness == "signed"
    activation_q = [n for n in index.nodes if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2]
                    and not index.is_constant(n.input[0])]
    q_outputs = {n.output[0] for n in activation_q}
    changed: dict[str, onnx.TensorProto] = {}
    for q in activation_q:
        zp_name = q.input[2]
        if zp_name in changed or zp_name not in index.initializers:
            continue
        elem_type = index.initializers[zp_name].data_type
        if elem_type not in _OTHER_SIGNEDNESS or (elem_type in _SIGNED) == want_signed:
            continue
        readers = index.uses(zp_name)
        if not all((u.node.op_type == "QuantizeLinear" and not index.is_constant(u.node.input[0]))
                   or (u.node.op_type == "DequantizeLinear" and u.node.input[0] in q_outputs) for u in readers):
            continue
        other, shift = _OTHER_SIGNEDNESS[elem_type]
        values = index.constant_value(zp_name).astype(np.int64) + shift
        changed[zp_name] = _zero_point_tensor(zp_name, values, other)
    if changed:
        for tensor in model.graph.initializer:
            if tensor.name in changed:
                tensor.CopyFrom(changed[tensor.name])
        for node in model.graph.node:  # an explicit output_dtype must follow its zero point's type
            if node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in changed:
                for attribute in node.attribute:
                    if attribute.name == "output_dtype":
                        attribute.i = changed[node.input[2]].data_type
    return model


def _dequantizer(index: GraphIndex, dq: onnx.NodeProto):
    """``codes -> float32 values`` of constant DequantizeLinear ``dq`` (per tensor, per axis or per block)."""
    attrs = node_attributes(dq)
    rank = len(index.initializers[dq.input[0]].dims)
    scale = index.constant_value(dq.input[1]).astype(np.float32)
    zp = index.constant_value(dq.input[2]).astype(np.int64) if len(dq.input) > 2 and dq.input[2] else np.zeros((), np.int64)
    axis = int(attrs.get("axis", 1)) % max(rank, 1)
    block_size = int(attrs.get("block_size", 0))
    if block_size:
        scale = np.repeat(scale, block_size, axis=axis)
        zp = np.repeat(zp, block_size, axis=axis) if zp.ndim else zp
    elif scale.ndim:
        view = [1] * rank
        view[axis] = scale.size
        scale, zp = scale.reshape(view), (zp.reshape(view) if zp.ndim else zp)

    float8 = index.initializers[dq.input[0]].data_type in _FLOAT8  # codes that are float values, not integers
    zero = index.constant_value(dq.input[2]).astype(np.float32) if float8 and len(dq.input) > 2 and dq.input[2] else zp
    if float8 and scale.ndim and np.ndim(zero):
        zero = zero.reshape(scale.shape)

    def dequantized(codes: np.ndarray) -> np.ndarray:
        if float8:  # int64 would truncate them (4.5 -> 4): the weights were wrong by up to a float8 step
            return ((codes.astype(np.float32) - zero) * scale).astype(np.float32)
        return ((codes.astype(np.int64) - zp).astype(np.float32) * scale).astype(np.float32)

    return dequantized


def float_constants(model: onnx.ModelProto, weights: DeferredWeights | None = None) -> onnx.ModelProto:
    """Store each constant's codes behind a DequantizeLinear as float values behind QuantizeLinear ->
    DequantizeLinear (module docstring; AIMET's ``prequantize_constants=False``), in place. int32 codes stay."""
    index = GraphIndex(model, weights=weights)
    replaced: set[str] = set()
    before: dict[int, list[onnx.NodeProto]] = {}
    for position, node in enumerate(index.nodes):
        codes_name = node.input[0] if node.op_type == "DequantizeLinear" and node.input else ""
        if not codes_name or codes_name not in index.initializers or codes_name in replaced:
            continue
        codes = index.initializers[codes_name]
        if codes.data_type in (TensorProto.INT32, TensorProto.UINT32) or not all(
                index.is_constant(n) for n in node.input[1:] if n):
            continue
        if any(u.index == 1 and u.node.op_type in ("QuantizeLinear", "DequantizeLinear")
               for u in index.uses(node.output[0])):
            continue  # an LPBQ weight's integer block scales: codes that define a grid, like the weight's own
        dequantized = _dequantizer(index, node)
        float_name = index.fresh_name(f"{node.output[0]}/float")
        if weights is not None and weights.holds(codes):
            tensor = weights.derive(codes, float_name, TensorProto.FLOAT, dequantized)
        else:
            tensor = numpy_helper.from_array(dequantized(index.constant_value(codes_name)), float_name)
        model.graph.initializer.append(tensor)
        attrs = {k: v for k, v in node_attributes(node).items() if k in ("axis", "block_size")}
        if len(node.input) < 3 or not node.input[2]:
            attrs["output_dtype"] = codes.data_type  # zero point left out (opset >= 21): the type says it
        before.setdefault(position, []).append(helper.make_node(
            "QuantizeLinear", [float_name, *node.input[1:]], [codes_name],
            name=index.fresh_name(f"{node.output[0]}/quantize"), **attrs))
        replaced.add(codes_name)
    if replaced:
        from quantsim.export.qdq import _insert_before  # one home for inserting nodes by position (qdq imports us lazily)

        _insert_before(model, before)
        kept = [t for t in model.graph.initializer if t.name not in replaced]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
    return model
