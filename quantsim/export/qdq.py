"""Standard QDQ export: what ``sim.to_onnx_qdq()`` returns.

Starting from the sim graph built with prequantized weights (integer initializers + DequantizeLinear,
activation Q/DQ pairs; see `quantsim.sim.build`), two rewrites make it the form onnxruntime fuses into
integer kernels and other toolchains expect:

* **int32 bias**: a float bias of Conv / ConvTranspose / Gemm (or the per-column bias Add after a MatMul
  with a constant 2-D weight) whose input and weight both come from
  DequantizeLinear (input per tensor) becomes ``DequantizeLinear(int32 codes, s_in * s_w)`` with zero
  point 0 (per output channel when the weight is per channel); see `quantsim.core.bias`. A norm layer's
  bias gets AIMET's statistical int32 grid instead (`quantsim.export.qdq_norm_bias`).
* **derived Q/DQ after data movement**: the output of a Reshape, Flatten, Transpose, MaxPool, ... whose
  input is quantized holds values of the same grid; a Q/DQ pair with the input's parameters is added
  after it (exact: an identity on those values) so onnxruntime sees a complete node unit and keeps the
  tensor in 8 bits (AIMET's export adds the same derived encodings). A Pad gets one too when every value
  it writes is on that grid (reflect/edge modes, or a constant that survives the round trip, 0 always
  does): without it the Conv after a Pad read a float input and ran in FP32 (Silero's STFT Conv: 70%
  of its QDQ model's time). Rows gathered from a table's codes (an embedding) get one too. A chain of
  them (attention's Transpose -> Reshape head merge) gets a pair after every op, so the MatMul after it
  still fuses.
* **bool inputs as codes**: a Conv / Gemm / MatMul whose activation input is ``Cast(bool, to=float)``
  (a one-hot encoding, a mask) and whose weight is 8-bit reads ``DequantizeLinear(Cast(bool, to=uint8),
  scale 1)`` instead: 0 and 1 are the codes 0 and 1 of that grid, so the input values are unchanged, and
  the op becomes a node unit onnxruntime runs on integer kernels (MatMulIntegerToFloat; magika's one-hot
  embedding MatMul and its float Cast were 13% of the QDQ model's kernel time). With one 1 per row (a
  one-hot) the fused result is the sim's bit for bit (one product, code * scale); with several the
  integer sum is exact where the sim's float sum rounds. The float Cast stays only for other readers.
* **float weights for ops with a float input**: a Conv / ConvTranspose / Gemm / MatMul whose activation
  input does not come from a DequantizeLinear (the sim keeps that input float: normalization statistics,
  index or mask arithmetic, a disabled quantizer) runs in float in every QDQ runtime; no integer kernel
  can take it. Its weight is stored as the fake-quantized float values, the exact numbers
  ``DequantizeLinear`` would produce, instead of codes + a DequantizeLinear that onnxruntime would run
  at every inference (it does not constant-fold a DequantizeLinear, and a Conv whose weight is not an
  initializer loses the blocked NCHWc kernels: magika's Conv ran 2.2x slower than in FP32). With no DQ
  on the input, onnxruntime's WeightBiasQuantization does not touch it. A weight shared with an op whose
  input *is* quantized keeps its DequantizeLinear for that op and gets a float copy for this one.
  The rule is per node, from the graph: input behind a DequantizeLinear -> integer weight + DQ (onnxruntime
  fuses 8-bit Conv/MatMul/Gemm into integer kernels; where it cannot, e.g. ConvTranspose or 16-bit
  activations, the weight's DQ costs less than the alternative, reading the large input through
  Cast/Sub/Mul to keep WeightBiasQuantization away, and other QDQ runtimes take the codes); input float
  -> float weight. The same holds for the weights and biases of recurrent ops (LSTM/GRU/RNN), which no
  QDQ runtime fuses: they are stored dequantized (ddddocr's LSTM ran its two weight DequantizeLinear at
  every inference, and a weight that is not an initializer also loses the LSTM's pre-packing: the QDQ
  model ran 1.10x slower than quantize_static's, which leaves the LSTM float). ``from_onnx_qdq`` cannot
  read an encoding back from such a float weight. Normalisation scales and PRelu slopes keep their
  DequantizeLinear (vectors: a negligible cost, and the import reads their encodings back).
* **16-bit weight containers where no integer kernel applies**: a MatMul/Gemm whose activation input is
  a 16-bit (not 8-bit) Q/DQ tensor runs in float in onnxruntime, but ``DequantizeLinear(int8 weight) ->
  MatMul`` would be rewritten into MatMulNBits, which computes the activation in 8 bits (hundreds of
  16-bit steps off); a float weight instead would be requantized by onnxruntime's WeightBiasQuantization.
  Such weights keep their codes in an int16/uint16 container: the same values, no rewrite (other QDQ
  runtimes run these ops on 16-bit integer kernels, so the weight stays a DequantizeLinear).
* **float weights stay float**: onnxruntime's WeightBiasQuantization re-quantizes a float weight (to
  int8 per tensor) of a Conv/ConvTranspose/Gemm/MatMul that reads a DequantizeLinear output. Where the
  sim keeps a weight in float (its quantizer disabled or float16), that op reads its input through
  ``Cast -> Sub(zero point) -> Mul(scale)`` instead: bit-identical to the DequantizeLinear, invisible
  to the rewrite.
* **no dead pairs**: a quantizer on an output nothing reads (an LSTM's unused final states) is an
  identity in the sim; its Q/DQ pair would be run for nothing (and asks onnxruntime for the output), so
  it is left out.
* **zero points by type**: at opset >= 21 a zero point that is all zero is dropped; QuantizeLinear then
  names its storage type with the ``output_dtype`` attribute and DequantizeLinear takes the type from its
  input. Below opset 21 (no ``output_dtype``) the zero-point tensors stay.

AIMET's spellings of the same values (``prequantize_constants=False``: weights as floats behind Q -> DQ;
``force_activation_as``: signed or unsigned activation codes) are `quantsim.export.qdq_forms`.

IR and opset are set explicitly: the opset is the model's, raised only as far as the quantizers need
(13 for per-channel, 21 for int4/int16/blocked grids), never above what onnxruntime loads.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim.core.bias import fits_int32, quantize_bias
from quantsim.errors import warn_at_caller
from quantsim.export.readiness import check_activations_calibrated
from quantsim.graph.deferred import DeferredWeights
from quantsim.graph.edit import drop_unused_initializers, referenced_names
from quantsim.graph.index import GraphIndex, node_attributes
from quantsim.graph.op_facts import BIAS_SLOT, GATHER_OPS, GRID_MOVEMENT_OPS, PARAM_SLOTS, RECURRENT_OPS, WEIGHTED_OPS, facts_of
from quantsim.graph.pad_fill import on_integer_grid, pad_fill_value

__all__ = [
    "to_qdq_model",
    "quantize_biases",
    "wide_weights_for_wide_activations",
    "float_weights_for_float_inputs",
    "protect_float_weights",
    "drop_zero_zero_points",
    "add_derived_qdq",
    "drop_dead_qdq",
    "codes_for_boolean_inputs",
]

def _dq_params(index: GraphIndex, name: str):
    """``(scale array, axis attr)`` of the DequantizeLinear producing ``name``, or None."""
    node = index.producer_of(name)
    if node is None or node.op_type != "DequantizeLinear" or not index.is_constant(node.input[1]):
        return None
    if index.code_type(node) in (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2):
        return None  # float8 values have no integer accumulator for an int32 bias (AIMET keeps the bias float)
    attrs = node_attributes(node)
    if "block_size" in attrs:
        return None
    return index.constant_value(node.input[1]), attrs.get("axis", 1)


def quantize_biases(model: onnx.ModelProto, weights: DeferredWeights | None = None) -> onnx.ModelProto:
    """Replace eligible float biases with int32 codes + DequantizeLinear (module docstring)."""
    index = GraphIndex(model, weights=weights)
    replaced: dict[str, onnx.NodeProto] = {}
    overflowing: list[str] = []
    for node in index.nodes:
        slot = BIAS_SLOT.get(node.op_type)
        if slot is None or len(node.input) <= slot or not index.is_constant(node.input[slot]):
            continue
        bias_name = node.input[slot]
        if bias_name in replaced or len(index.uses(bias_name)) != 1:
            continue
        x_params, w_params = _dq_params(index, node.input[0]), _dq_params(index, node.input[1])
        if x_params is None or w_params is None or x_params[0].ndim != 0:
            continue
        w_scale, w_axis = w_params
        attrs = node_attributes(node)
        if node.op_type == "Gemm":
            if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0):
                continue
            output_axis = 0 if attrs.get("transB", 0) else 1
        else:
            axis_of_output = facts_of(node.op_type).weight_output_axis
            assert axis_of_output is not None  # Conv and ConvTranspose have one
            output_axis = axis_of_output
            if node.op_type == "ConvTranspose" and attrs.get("group", 1) != 1 and w_scale.ndim:
                continue
        if w_scale.ndim and w_axis % len(index.shape.get(node.input[1]) or (0, 0)) != output_axis:
            continue
        if fits_int32(index.constant_value(bias_name), x_params[0], w_scale):  # else it stays float, as in the sim
            replaced[bias_name] = _int32_bias_node(model, index, bias_name, x_params[0], w_scale)
        elif node.op_type in ("Conv", "Gemm"):
            overflowing.append(node.name or node.output[0])
    for node in index.nodes:
        bias_name = _matmul_bias(index, node)
        if bias_name is not None and bias_name not in replaced:
            scales = _matmul_bias_scales(index, node)
            if fits_int32(index.constant_value(bias_name), *scales):
                replaced[bias_name] = _int32_bias_node(model, index, bias_name, *scales)
    initializers_to_nodes(model, replaced)
    if overflowing:
        warn_at_caller(
            f"to_onnx_qdq: the float bias of {', '.join(overflowing[:5])}{' ...' if len(overflowing) > 5 else ''} "
            "overflows int32 on s_in * s_w (a weight encoding frozen narrower than calibration widens it): "
            "onnxruntime's BiasQuantization casts round(b / (s_in s_w)) to int32 without a range check in every "
            "session with QDQ optimizations (the default), so the deployed model adds another bias; unfreeze the "
            "weight encoding and calibrate again (quantsim widens it to fit), or run the model with "
            "session.disable_quant_qdq")
    return model


def _int32_bias_node(model: onnx.ModelProto, index: GraphIndex, bias_name: str, x_scale, w_scale) -> onnx.NodeProto:
    """``DequantizeLinear(int32 codes, s_in * s_w)`` writing ``bias_name`` (per channel along its last axis)."""
    bias = index.constant_value(bias_name)
    codes, scale = quantize_bias(bias, x_scale, w_scale)
    codes_name = index.fresh_name(f"{bias_name}/int32")
    scale_name = index.fresh_name(f"{bias_name}/int32_scale")
    model.graph.initializer.extend([numpy_helper.from_array(codes, codes_name),
                                    numpy_helper.from_array(scale, scale_name)])
    dq_attrs: dict = {"axis": codes.ndim - 1} if scale.ndim else {}
    return helper.make_node("DequantizeLinear", [codes_name, scale_name], [bias_name],
                            name=index.fresh_name(f"{bias_name}/dequantize"), **dq_attrs)


def _matmul_bias(index: GraphIndex, node: onnx.NodeProto) -> str | None:
    """The float32 per-column bias a dequantized MatMul's only consumer adds (`quantsim.sim.int32_bias`), when its
    input is per tensor and its weight per tensor or per column (axis 1); else None."""
    if node.op_type != "MatMul" or len(node.input) != 2:
        return None
    add = index.single_consumer(node.output[0])
    weight_dq = index.producer_of(node.input[1])
    if add is None or add.op_type != "Add" or len(add.input) != 2 or weight_dq is None:
        return None
    others = [n for n in add.input if n != node.output[0]]
    codes = index.initializers.get(weight_dq.input[0]) if weight_dq.input else None
    bias = index.initializers.get(others[0]) if len(others) == 1 else None
    if (codes is None or bias is None or len(codes.dims) != 2 or bias.data_type != TensorProto.FLOAT
            or len(index.uses(others[0])) != 1 or not bias.dims or bias.dims[-1] != codes.dims[1]
            or int(np.prod(bias.dims[:-1], dtype=np.int64)) != 1):
        return None
    x_params, w_params = _dq_params(index, node.input[0]), _dq_params(index, node.input[1])
    if x_params is None or w_params is None or x_params[0].ndim != 0 or (w_params[0].ndim and w_params[1] % 2 != 1):
        return None
    return others[0]


def _matmul_bias_scales(index: GraphIndex, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray]:
    x_params, w_params = _dq_params(index, node.input[0]), _dq_params(index, node.input[1])
    assert x_params is not None and w_params is not None  # checked by `_matmul_bias`
    return x_params[0], w_params[0]


def _pad_value_on_grid(index: GraphIndex, pad: onnx.NodeProto, params: list[str]) -> bool:
    """True when every value ``pad`` writes is on the grid of ``params`` (scale, zero point): reflect /
    edge / wrap modes copy input values; constant mode adds its constant value (0 by default, always on
    a grid whose range includes zero), on the grid when a Q/DQ round trip keeps it."""
    value = pad_fill_value(pad, lambda name: index.constant_value(name) if index.is_constant(name) else None)
    if value is None:
        return False
    if value == 0.0:
        return True
    if not all(n and index.is_constant(n) for n in params):
        return False
    scale = np.float32(index.constant_value(params[0]))
    zp_array = index.constant_value(params[1]) if len(params) > 1 else np.zeros((), np.uint8)
    info = np.iinfo(zp_array.dtype) if zp_array.dtype.kind in "iu" else None
    if scale.ndim or zp_array.ndim or info is None:
        return False
    return on_integer_grid(value, float(scale), int(zp_array), int(info.min), int(info.max))


def add_derived_qdq(model: onnx.ModelProto, weights: DeferredWeights | None = None) -> onnx.ModelProto:
    """Q/DQ pairs after grid-preserving data movement whose input is dequantized (module docstring)."""
    index = GraphIndex(model, weights=weights)
    inserted: dict[str, list[onnx.NodeProto]] = {}
    derived: dict[str, list[str]] = {}  # outputs given a derived pair in this pass -> its Q/DQ parameters
    for node in index.nodes:  # graph order: a chain (Transpose -> Reshape) gets a pair after every op
        if (node.op_type not in GRID_MOVEMENT_OPS and node.op_type != "Pad") or not node.input:
            continue
        params = derived.get(node.input[0])
        if params is None:
            source = index.producer_of(node.input[0])
            table = node.op_type in GATHER_OPS  # rows of a constant table's codes (an embedding)
            if source is None or source.op_type != "DequantizeLinear" or (index.is_constant(source.input[0]) and not table):
                continue
            if any(a.name in ("axis", "block_size") for a in source.attribute):
                continue
            params = list(source.input[1:])
        if node.op_type == "Pad" and not _pad_value_on_grid(index, node, params):
            continue
        for position, out in enumerate(node.output):
            uses = index.uses(out)
            if not out or not index.is_float(out) or (uses and all(u.node.op_type == "QuantizeLinear" for u in uses)):
                continue
            raw, codes = index.fresh_name(f"{out}/float"), index.fresh_name(f"{out}/codes")
            node.output[position] = raw
            derived[out] = params
            inserted.setdefault(node.name, []).extend([
                helper.make_node("QuantizeLinear", [raw, *params], [codes], name=index.fresh_name(f"{out}/quantize")),
                helper.make_node("DequantizeLinear", [codes, *params], [out], name=index.fresh_name(f"{out}/dequantize")),
            ])
    if inserted:
        ordered = []
        for node in model.graph.node:
            ordered.append(node)
            ordered.extend(inserted.get(node.name, ()))
        del model.graph.node[:]
        model.graph.node.extend(ordered)
    return model


_WIDER: dict[int, int] = {TensorProto.INT8: TensorProto.INT16, TensorProto.UINT8: TensorProto.UINT16,
          TensorProto.INT4: TensorProto.INT16, TensorProto.UINT4: TensorProto.UINT16}


def _dequantization(index: GraphIndex, dq: onnx.NodeProto) -> Callable[[np.ndarray], np.ndarray] | None:
    """What constant DequantizeLinear ``dq`` does to its codes (float32 values), or None if not foldable."""
    attrs = node_attributes(dq)
    if "block_size" in attrs or not all(index.is_constant(n) for n in dq.input if n):
        return None
    scale = index.constant_value(dq.input[1]).astype(np.float32)
    zp = index.constant_value(dq.input[2]).astype(np.int64) if len(dq.input) > 2 and dq.input[2] else 0
    rank = len(index.initializers[dq.input[0]].dims)
    if scale.ndim:
        view = [1] * rank
        view[attrs.get("axis", 1) % rank] = scale.size
        scale = scale.reshape(view)
        zp = np.reshape(zp, view) if np.ndim(zp) else zp

    def dequantized(codes: np.ndarray) -> np.ndarray:
        return ((codes.astype(np.int64) - zp).astype(np.float32) * scale).astype(np.float32)

    return dequantized


def _dequantized_constant(index: GraphIndex, dq: onnx.NodeProto, name: str, weights: DeferredWeights | None,
                          dequantized: Callable[[np.ndarray], np.ndarray]) -> onnx.TensorProto:
    """Float initializer ``name`` holding ``dequantized`` codes of ``dq``: a placeholder computed when read where
    the codes are deferred (`quantsim.graph.deferred`), else the values now."""
    codes = index.initializers[dq.input[0]]
    if weights is not None and weights.holds(codes):
        return weights.derive(codes, name, TensorProto.FLOAT, dequantized)
    return numpy_helper.from_array(dequantized(index.constant_value(dq.input[0])), name)


def _widened(tensor: onnx.TensorProto, weights: DeferredWeights | None) -> onnx.TensorProto:
    wide_type = _WIDER[tensor.data_type]
    wide = helper.tensor_dtype_to_np_dtype(wide_type)
    if weights is not None and weights.holds(tensor):
        return weights.derive(tensor, tensor.name, wide_type, lambda codes: codes.astype(np.int64).astype(wide))
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.int64).astype(wide), tensor.name)


def wide_weights_for_wide_activations(model: onnx.ModelProto, weights: DeferredWeights | None = None) -> onnx.ModelProto:
    """Store MatMul/Gemm weight codes in 16-bit containers when the activation input is not 8-bit
    (module docstring); the codes and hence the values are unchanged."""
    index = GraphIndex(model, weights=weights)
    widen: set[str] = set()
    for node in index.nodes:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        activation = index.producer_of(node.input[0])
        eight_bit = (activation is not None and activation.op_type == "DequantizeLinear"
                     and len(activation.input) > 2  # zero points are still explicit at this stage
                     and index.elem_type.get(activation.input[2]) in (TensorProto.UINT8, TensorProto.INT8))
        weight = index.producer_of(node.input[1])
        if eight_bit or weight is None or weight.op_type != "DequantizeLinear":
            continue
        if activation is None or activation.op_type != "DequantizeLinear" or index.opset() < 21:
            continue  # float input: `float_weights_for_float_inputs`; below opset 21 no 16-bit DQ
        names = [n for i, n in enumerate(weight.input) if n and i != 1 and index.is_constant(n)]
        if all(index.elem_type.get(n) in _WIDER for n in names) and index.is_constant(weight.input[0]):
            widen.update(names)
    if widen:
        initializers = [_widened(t, weights) if t.name in widen else t for t in model.graph.initializer]
        del model.graph.initializer[:]
        model.graph.initializer.extend(initializers)
    return model


def _boolean_cast_source(index: GraphIndex, name: str) -> str | None:
    """The bool tensor that ``name`` is a ``Cast(to=float)`` of, or None."""
    cast = index.producer_of(name)
    if cast is None or cast.op_type != "Cast" or node_attributes(cast).get("to") != TensorProto.FLOAT:
        return None
    return cast.input[0] if index.elem_type.get(cast.input[0]) == TensorProto.BOOL else None


def initializers_to_nodes(model: onnx.ModelProto, replaced: dict[str, onnx.NodeProto]) -> None:
    """Drop the initializers named in ``replaced`` and put the node computing each in front of the graph, in
    place (a bias becoming ``DequantizeLinear`` of its int32 codes)."""
    if not replaced:
        return
    kept = [t for t in model.graph.initializer if t.name not in replaced]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    nodes = list(replaced.values()) + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _insert_before(model: onnx.ModelProto, before: dict[int, list[onnx.NodeProto]]) -> None:
    """Insert ``before[i]`` ahead of the graph's node at position ``i`` (positions, not names: names may be
    empty or repeat), in place."""
    if not before:
        return
    ordered: list[onnx.NodeProto] = []
    for position, node in enumerate(model.graph.node):
        ordered.extend(before.get(position, ()))
        ordered.append(node)
    del model.graph.node[:]
    model.graph.node.extend(ordered)


def codes_for_boolean_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give a weighted op whose activation input is a bool tensor cast to float (a one-hot encoding, a
    mask) that input as uint8 codes behind ``DequantizeLinear(scale 1)`` (module docstring): the values 0
    and 1 are codes 0 and 1 on that grid, so the input is the same, and with its 8-bit weight behind a
    DequantizeLinear the op becomes a node unit onnxruntime runs on integer kernels."""
    index = GraphIndex(model)
    converted: dict[str, str] = {}  # bool tensor -> its dequantized uint8 codes
    before: dict[int, list[onnx.NodeProto]] = {}  # position of a node -> nodes to insert before it (names may repeat)
    for position, node in enumerate(index.nodes):
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2 or not node.input[0]:
            continue
        source = _boolean_cast_source(index, node.input[0])
        weight = index.producer_of(node.input[1])
        if (source is None or weight is None or weight.op_type != "DequantizeLinear"
                or not index.is_constant(weight.input[0]) or "block_size" in node_attributes(weight)
                or index.elem_type.get(weight.input[0]) not in (TensorProto.INT8, TensorProto.UINT8)):
            continue
        if source not in converted:
            base = index.fresh_name(f"{node.input[0]}/codes")
            scale, zero_point = index.fresh_name(f"{base}/scale"), index.fresh_name(f"{base}/zero_point")
            model.graph.initializer.extend([numpy_helper.from_array(np.array(1.0, np.float32), scale),
                                            numpy_helper.from_array(np.array(0, np.uint8), zero_point)])
            converted[source] = index.fresh_name(f"{node.input[0]}/dequantized")
            before.setdefault(position, []).extend([
                helper.make_node("Cast", [source], [base], name=base, to=TensorProto.UINT8),
                helper.make_node("DequantizeLinear", [base, scale, zero_point], [converted[source]],
                                 name=index.fresh_name(f"{base}/dequantize")),
            ])
        node.input[0] = converted[source]
    if before:
        _insert_before(model, before)
        read = referenced_names(model.graph)
        kept = [n for n in model.graph.node if not (n.op_type == "Cast" and _boolean_cast_source(index, n.output[0])
                                                    and n.output[0] not in read)]
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return model


def _float_slots(index: GraphIndex, node: onnx.NodeProto) -> list[int]:
    """Input slots of ``node`` whose constant DequantizeLinear no runtime fuses (module docstring): the
    weight of a Conv/ConvTranspose/Gemm/MatMul whose activation input is not dequantized, and every
    parameter of a recurrent op (LSTM/GRU/RNN: no QDQ runtime fuses them)."""
    if node.op_type in WEIGHTED_OPS:
        if len(node.input) < 2 or not node.input[0]:
            return []
        activation = index.producer_of(node.input[0])
        return [] if activation is not None and activation.op_type == "DequantizeLinear" else [1]
    if node.op_type in RECURRENT_OPS:
        return [slot for slot in PARAM_SLOTS[node.op_type] if slot < len(node.input) and node.input[slot]]
    return []


def float_weights_for_float_inputs(model: onnx.ModelProto, weights: DeferredWeights | None = None) -> onnx.ModelProto:
    """Store the dequantized float weight of every weighted op whose activation input is not the output
    of a DequantizeLinear, and the float parameters of ops without integer kernels (module docstring):
    no DequantizeLinear runs on them at inference."""
    index = GraphIndex(model, weights=weights)
    float_users: dict[str, list[tuple[onnx.NodeProto, int]]] = {}  # weight tensor -> (op, slot) reading it in float
    for node in index.nodes:
        for slot in _float_slots(index, node):
            weight = index.producer_of(node.input[slot])
            if weight is not None and weight.op_type == "DequantizeLinear" and index.is_constant(weight.input[0]):
                float_users.setdefault(node.input[slot], []).append((node, slot))
    folded: set[str] = set()
    for name, users in float_users.items():
        dq = index.producer_of(name)
        assert dq is not None  # found above
        dequantized = _dequantization(index, dq)
        if dequantized is None:
            continue
        if len(index.uses(name)) == len(users) and name not in index.graph_outputs:
            model.graph.initializer.append(_dequantized_constant(index, dq, name, weights, dequantized))  # DQ gone
            folded.add(dq.name)
            continue
        copy = index.fresh_name(f"{name}/float")
        model.graph.initializer.append(_dequantized_constant(index, dq, copy, weights, dequantized))
        for node, slot in users:
            node.input[slot] = copy
    if folded:
        dead = [n for n in model.graph.node if n.name in folded]
        kept = [n for n in model.graph.node if n.name not in folded]
        del model.graph.node[:]
        model.graph.node.extend(kept)
        drop_unused_initializers(model.graph, {i for n in dead for i in n.input if i})
    return model


def protect_float_weights(model: onnx.ModelProto, weights: DeferredWeights | None = None) -> onnx.ModelProto:
    """Read DQ outputs through Cast/Sub/Mul for ops whose weight is float (module docstring)."""
    index = GraphIndex(model, weights=weights)
    before: dict[int, list[onnx.NodeProto]] = {}  # position of a node -> nodes to insert before it (names may repeat)
    for position, node in enumerate(index.nodes):
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2 or not index.is_constant(node.input[1]):
            continue
        dq = index.producer_of(node.input[0])
        if dq is None or dq.op_type != "DequantizeLinear" or any(a.name == "block_size" for a in dq.attribute):
            continue
        codes, scale = dq.input[0], dq.input[1]
        base = index.fresh_name(f"{node.input[0]}/float_read")
        chain = [helper.make_node("Cast", [codes], [f"{base}/cast"], name=f"{base}/cast", to=TensorProto.FLOAT)]
        shifted = f"{base}/cast"
        if len(dq.input) > 2 and dq.input[2]:
            zp_float = index.fresh_name(f"{base}/zero_point")
            model.graph.initializer.append(
                numpy_helper.from_array(index.constant_value(dq.input[2]).astype(np.float32), zp_float))
            chain.append(helper.make_node("Sub", [shifted, zp_float], [f"{base}/sub"], name=f"{base}/sub"))
            shifted = f"{base}/sub"
        chain.append(helper.make_node("Mul", [shifted, scale], [base], name=f"{base}/mul"))
        before.setdefault(position, []).extend(chain)
        node.input[0] = base
    _insert_before(model, before)
    return model


def drop_zero_zero_points(model: onnx.ModelProto, weights: DeferredWeights | None = None) -> onnx.ModelProto:
    """At opset >= 21, drop all-zero zero points (Q gets ``output_dtype``); below it, do nothing."""
    index = GraphIndex(model, weights=weights)
    if index.opset() < 21:
        return model
    dropped = set()
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 3:
            continue
        zp_name = node.input[2]
        if not zp_name or not index.is_constant(zp_name) or np.any(index.constant_value(zp_name).astype(np.int64)):
            continue
        if node.op_type == "QuantizeLinear":
            node.attribute.append(helper.make_attribute("output_dtype", index.elem_type[zp_name]))
        del node.input[2]
        dropped.add(zp_name)
    drop_unused_initializers(model.graph, dropped)
    return model


def drop_dead_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove QuantizeLinear/DequantizeLinear nodes whose outputs nothing reads (module docstring)."""
    while True:
        read = referenced_names(model.graph)  # an If / Loop body's read of an outer tensor counts
        dead = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                and not any(o in read for o in n.output)]
        if not dead:
            return model
        names = {n.name for n in dead}
        kept = [n for n in model.graph.node if n.name not in names]
        del model.graph.node[:]
        model.graph.node.extend(kept)
        drop_unused_initializers(model.graph, {i for n in dead for i in n.input if i})


def to_qdq_model(sim, *, int32_bias: bool = True, weights: DeferredWeights | None = None,
                 weight_codes: str = "int8", activations_as: str | None = None,
                 prequantize_constants: bool = True) -> onnx.ModelProto:
    """The sim as a standard QDQ ModelProto (module docstring).

    Its big weights (codes, float weights, mapped weights copied unchanged) are computed one at a time: with
    ``weights`` they are left as its placeholders (`quantsim.graph.deferred`) for a writer to stream to disk
    (`large_models.save_model(..., weights=weights)`), else filled into the returned model at the end, so that
    the rewrites never hold a second copy of them. ``weight_codes`` ("int8", "uint8" or "auto") is the storage
    type of the 8-bit weight codes of fused Conv/MatMul/Gemm (`quantsim.export.weight_codes`). ``activations_as``
    and ``prequantize_constants`` choose between equivalent spellings (`quantsim.export.qdq_forms`)."""
    from quantsim.export.qdq_constants import codes_for_elementwise_constants
    from quantsim.export.qdq_float8_relu import keep_relus_before_float8
    from quantsim.export.qdq_forms import float_constants, set_activation_signedness
    from quantsim.export.qdq_hardswish import hardswish_for_gated_products
    from quantsim.export.qdq_norm_bias import quantize_norm_biases
    from quantsim.export.weight_codes import resolve_weight_codes, shift_weight_codes
    from quantsim.sim.build import build_sim_model

    codes = resolve_weight_codes(weight_codes, sim.providers)
    deferred = weights if weights is not None else DeferredWeights()
    model = build_sim_model(sim.prepared_model, sim.quantizers, weights="qdq", source=sim.graph_index, deferred=deferred)
    model = add_derived_qdq(model, deferred)
    model = codes_for_boolean_inputs(model)
    model = codes_for_elementwise_constants(model, deferred)
    model = hardswish_for_gated_products(model)
    model = float_weights_for_float_inputs(model, deferred)
    model = wide_weights_for_wide_activations(model, deferred)
    model = set_activation_signedness(model, activations_as)  # before the float reads of codes below
    model = protect_float_weights(model, deferred)
    if int32_bias:
        model = quantize_biases(model, deferred)
        model = quantize_norm_biases(model, deferred)
    model = drop_zero_zero_points(model, deferred)
    model = drop_dead_qdq(model)
    model = keep_relus_before_float8(model)
    if codes == "uint8":
        model, _ = shift_weight_codes(model, deferred)
    if not prequantize_constants:
        model = float_constants(model, deferred)
    # the shapes preparation inferred are for the library's own passes: with them, onnxruntime 1.32's
    # ReshapeFusion turns a computed [N, 4] shape into [0, -1], which fails on an empty batch (a detector
    # finding nothing: torchvision's FCOS); onnxruntime infers what it needs when it loads the model
    del model.graph.value_info[:]
    onnx.helper.set_model_props(model, {"producer": "quantsim"})
    return model if weights is not None else deferred.materialize(model)


def qdq_skeleton(sim, int32_bias: bool = True, weight_codes: str = "int8", activations_as: str | None = None,
                 prequantize_constants: bool = True) -> tuple[onnx.ModelProto, DeferredWeights]:
    """The calibrated sim's QDQ model with its big weights as placeholders, and what computes them
    (`to_qdq_model`): what `QuantizationSimModel.to_onnx_qdq` fills in or streams to a file."""
    from quantsim.export.weight_codes import resolve_weight_codes

    codes = resolve_weight_codes(weight_codes, sim.providers, warn_as="to_onnx_qdq")
    sim.compute_param_encodings()
    check_activations_calibrated(sim, "to_onnx_qdq")
    weights = DeferredWeights()
    return to_qdq_model(sim, int32_bias=int32_bias, weights=weights, weight_codes=codes, activations_as=activations_as,
                        prequantize_constants=prequantize_constants), weights

