"""From a standard QDQ model back to a float model plus encodings (``QuantizationSimModel.from_onnx_qdq``).

Patterns recognised (everything else is left as it is, with a warning or, when strict, an error):

* ``[Clip(lo, hi)] -> QuantizeLinear -> DequantizeLinear`` on a tensor: an activation (or constant)
  encoding from the pair's scale / zero point / storage type; a Clip with constant bounds narrows the
  grid to ``[round(lo/s) + z, round(hi/s) + z]`` when that is a strict symmetric or 2..15-bit grid
  inside the container (any other Clip, e.g. a model's Relu6, is the model's own and stays).
* ``DequantizeLinear(integer initializer)``: a weight; the float weight is the dequantized value and the
  encoding comes from the DQ (per-axis, or blocked: one channel axis, replicas along the others). int32
  biases become float biases.
* ``DequantizeLinear(integer constant, float constant) -> scale of a blocked DequantizeLinear``: an LPBQ
  weight (integer block scales times a per-channel float scale, as `quantsim.sim.lpbq_build` writes it).
* Q/DQ with a float8 zero point (float8e4m3fn / float8e5m2, which must be 0): a float8 encoding, per tensor
  or per axis.
* ``Cast(float16) -> Cast(float)`` on a float32 tensor: a float16 quantizer.
* ``Cast(float) -> QuantizeLinear -> DequantizeLinear -> Cast(float16)`` on a float16 tensor (a model computing in
  float16): one quantizer on that tensor; the Casts are the quantizer's and go with it. Likewise a weight's
  ``DequantizeLinear -> Cast(float16)`` (codes, or float values behind a Q): a float16 weight (the Cast's output)
  with that encoding.
* A Q/DQ pair right after a data-movement op that repeats the parameters of the DQ feeding that op
  (the derived pairs `quantsim.export.qdq` adds) is dropped without an encoding: it is an identity.

Naming: the float tensor keeps the name read by the Q, except for graph outputs and when that name
is ``<name>/...`` of the DQ's output (this SDK's own export convention): then it keeps the DQ output's.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim.core.fp8 import FP8_FORMATS
from quantsim.core.fp8_encodings import fp8_encoding_from_scale
from quantsim.core.numerics import Encoding
from quantsim.encodings import TensorEncoding
from quantsim.errors import InvalidArgumentError, warn_at_caller
from quantsim.export.qdq_float8_relu import restore_relus_before_float8
from quantsim.export.qdq_float_reads import restore_float_reads
from quantsim.graph.edit import drop_unused_initializers
from quantsim.graph.index import GraphIndex, node_attributes
from quantsim.prepare.naming import name_nodes

__all__ = ["strip_qdq", "sim_from_qdq", "weight_grid_storage"]

_SIGNED: dict[int, tuple[int, bool]] = {TensorProto.INT4: (4, True), TensorProto.INT8: (8, True), TensorProto.INT16: (16, True),
           TensorProto.UINT4: (4, False), TensorProto.UINT8: (8, False), TensorProto.UINT16: (16, False),
           TensorProto.INT32: (32, True)}
_FP8 = {TensorProto.FLOAT8E4M3FN: "float8e4m3fn", TensorProto.FLOAT8E5M2: "float8e5m2"}
assert set(_FP8.values()) == set(FP8_FORMATS)


def _constant(index: GraphIndex, name: str) -> np.ndarray | None:
    return index.constant_value(name) if name and index.is_constant(name) else None


_NARROW: dict[int, int] = {TensorProto.INT16: TensorProto.INT8, TensorProto.UINT16: TensorProto.UINT8}


def weight_grid_storage(index: GraphIndex, node: onnx.NodeProto, codes: np.ndarray) -> int:
    """The storage type whose grid a constant's codes are on. The QDQ export keeps an 8-bit MatMul/Gemm weight
    behind 16-bit activations in a 16-bit container (`quantsim.export.qdq.wide_weights_for_wide_activations`):
    codes that all fit the 8-bit range of the same signedness are that 8-bit grid (a calibrated 16-bit grid
    reaches far past it: its largest code is 2^15 - 1 or 2^16 - 1)."""
    storage = index.elem_type[node.input[0]]
    narrow = _NARROW.get(storage)
    if narrow is None or codes.size == 0 or "block_size" in node_attributes(node):
        return storage
    zp = _constant(index, node.input[2]) if len(node.input) > 2 else None
    bits, signed = _SIGNED[narrow]
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    values = codes.astype(np.int64)
    if zp is not None and (np.any(zp.astype(np.int64) < lo) or np.any(zp.astype(np.int64) > hi)):
        return storage
    return narrow if values.min() >= lo and values.max() <= hi else storage


def _storage(index: GraphIndex, node: onnx.NodeProto) -> int:
    if len(node.input) > 2 and node.input[2]:
        return index.elem_type[node.input[2]]
    attrs = node_attributes(node)
    return attrs.get("output_dtype", TensorProto.UINT8) or TensorProto.UINT8


def _is_grid_clip(index: GraphIndex, node: onnx.NodeProto, bounds) -> bool:
    """True when the Clip bounds are the float range of an n-bit or strict grid narrower than the
    Q's container (what the sim writes); a model's own Clip (Relu6, ...) is not one and stays."""
    if _storage(index, node) not in _SIGNED:  # float8: the sim writes no Clip
        return False
    bits, signed = _SIGNED[_storage(index, node)]
    scale = _constant(index, node.input[1])
    zp = _constant(index, node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if scale is None or scale.ndim != 0 or (zp is not None and zp.ndim != 0):
        return False
    s, z = np.float32(scale), int(zp) if zp is not None else 0
    ratios = [np.float32(b.reshape(())) / s for b in bounds]
    if any(abs(r - np.rint(r)) > 1e-3 for r in ratios):
        return False
    codes = tuple(int(np.rint(r)) + z for r in ratios)
    for n in range(2, bits + 1):
        lo, hi = (-(1 << (n - 1)), (1 << (n - 1)) - 1) if signed else (0, (1 << n) - 1)
        if (n < bits and codes == (lo, hi)) or (signed and codes == (lo + 1, hi)):
            return True
    return False


def _fp8_encoding(index, node, storage, shape=None) -> Encoding:
    """The float8 encoding of a Q/DQ with a float8 zero point (module docstring)."""
    scale = _constant(index, node.input[1])
    if scale is None:
        raise InvalidArgumentError(f"node {node.name!r}: the scale {node.input[1]!r} is not a constant")
    zp = _constant(index, node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if zp is not None and np.any(zp.astype(np.float32) != 0):
        raise InvalidArgumentError(f"node {node.name!r}: a {_FP8[storage]} zero point other than 0 has no AIMET "
                                   "encoding (float8 grids are symmetric about zero)")
    if scale.ndim > 1 or "block_size" in node_attributes(node):
        raise InvalidArgumentError(f"node {node.name!r}: blocked {_FP8[storage]} Q/DQ is not supported")
    axis = node_attributes(node).get("axis", 1) % (len(shape) if shape else 1) if scale.ndim == 1 else None
    return fp8_encoding_from_scale(scale.astype(np.float64), _FP8[storage], axis=axis)


def _lpbq_scale(index: GraphIndex, name: str) -> tuple[np.ndarray, int] | None:
    """``(block scales, scale bits)`` when ``name`` is ``DequantizeLinear(integer constant, float constant, 0)``:
    the integer block scales of an LPBQ weight times its per-channel float scale (`quantsim.sim.lpbq_build`).
    The scale bits are those of the largest integer scale (LPBQ gives every channel's largest block
    ``2^scale_bits``)."""
    producer = index.producer_of(name)
    if producer is None or producer.op_type != "DequantizeLinear":
        return None
    ints, channel = _constant(index, producer.input[0]), _constant(index, producer.input[1])
    zero_point = _constant(index, producer.input[2]) if len(producer.input) > 2 else None
    if ints is None or channel is None or ints.dtype.kind not in "iu" or ints.ndim < 2 or np.any(ints < 1) or (
            zero_point is not None and np.any(zero_point)):
        return None
    view = [1] * ints.ndim
    if channel.ndim == 1:
        view[node_attributes(producer).get("axis", 1) % ints.ndim] = channel.size
    scale = ints.astype(np.float64) * channel.astype(np.float64).reshape(view if channel.ndim == 1 else channel.shape)
    return scale, max(1, (int(ints.max()) - 1).bit_length())


def _is_lpbq_scale(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """``node`` computes the scale of a blocked DequantizeLinear (and nothing else)."""
    reader = index.single_consumer(node.output[0])
    return (reader is not None and reader.op_type == "DequantizeLinear" and len(reader.input) > 1
            and reader.input[1] == node.output[0] and "block_size" in node_attributes(reader)
            and _lpbq_scale(index, node.output[0]) is not None)


def _collapse_blocks(node, scale: np.ndarray, zero_point: np.ndarray, block_axis: int):
    """Blocked-layout scale / zero point -> (channel axis, (C, n_blocks) scale, zero point): the channel axis is
    the one other axis they vary along; every other axis must hold replicas."""
    others = [k for k in range(scale.ndim) if k != block_axis]
    varying = [k for k in others if not (np.all(scale == np.take(scale, [0], axis=k))
                                         and np.all(zero_point == np.take(zero_point, [0], axis=k)))]
    if len(varying) > 1:
        raise NotImplementedError(f"{node.name}: a blocked DequantizeLinear whose scale varies along axes {varying} "
                                  "(one channel axis is supported)")
    axis = varying[0] if varying else others[0]

    def pick(values: np.ndarray) -> np.ndarray:
        moved = np.moveaxis(values, (axis, block_axis), (0, 1))
        return moved.reshape(moved.shape[0], moved.shape[1], -1)[:, :, 0]

    return axis, pick(scale), pick(zero_point)


def _encoding(index, node, storage, clip_bounds=None, shape=None, scale_values=None) -> Encoding:
    if storage in _FP8:
        return _fp8_encoding(index, node, storage, shape)
    bits, signed = _SIGNED[storage]
    if scale_values is None:
        scale_values = _constant(index, node.input[1])
    if scale_values is None:
        raise InvalidArgumentError(f"node {node.name!r}: the scale {node.input[1]!r} is not a constant")
    scale = scale_values.astype(np.float64)
    zp_values = _constant(index, node.input[2]) if len(node.input) > 2 else None
    zero_point = np.zeros(scale.shape, np.int64) if zp_values is None else zp_values.astype(np.int64)
    qmin, qmax = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    grid_bits = bits
    if clip_bounds is not None and scale.ndim == 0:
        s = np.float32(scale)
        lo = int(np.rint(np.float32(clip_bounds[0]) / s)) + int(zero_point)
        hi = int(np.rint(np.float32(clip_bounds[1]) / s)) + int(zero_point)
        qmin, qmax = max(qmin, lo), min(qmax, hi)
        levels = qmax - qmin + 1
        strict = signed and qmin == -qmax
        grid_bits = int(np.log2(levels + 1)) if strict else int(np.ceil(np.log2(levels)))
        if not strict:
            qmin, qmax = (-(1 << (grid_bits - 1)), (1 << (grid_bits - 1)) - 1) if signed else (0, (1 << grid_bits) - 1)
    attrs = node_attributes(node)
    symmetric = signed and not np.any(zero_point)
    axis = block_axis = block_size = None
    if scale.ndim >= 1 and "block_size" in attrs:
        if scale.ndim < 2:
            raise NotImplementedError(f"{node.name}: a blocked DequantizeLinear needs a weight of rank >= 2")
        block_axis = attrs.get("axis", 1) % scale.ndim
        block_size = attrs["block_size"]
        axis, scale, zero_point = _collapse_blocks(node, scale, np.broadcast_to(zero_point, scale.shape), block_axis)
    elif scale.ndim == 1:
        axis = attrs.get("axis", 1) % (len(shape) if shape else 1)
    return Encoding(scale, zero_point, grid_bits, signed, qmin, qmax, symmetric, axis, block_axis, block_size)


def strip_qdq(model: onnx.ModelProto, strict: bool = False) -> tuple[onnx.ModelProto, list[TensorEncoding]]:
    """The float model hidden in a QDQ model and the encodings its Q/DQ (and Cast pairs) describe."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    restore_relus_before_float8(work)  # the export's Max/Min spelling of a Relu/Clip before float8 Q
    restore_float_reads(work)  # the export's Cast/Sub/Mul spelling of a DequantizeLinear before a float weight
    work, _ = name_nodes(work)  # nodes are removed by name below: unnamed ones need names first
    _type_if_float16(work)
    graph = work.graph
    index = GraphIndex(work)
    remove, renames, records = set(), {}, []
    new_initializers = []
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and index.is_constant(node.input[0]):
            remove.add(node.name)
            if _is_lpbq_scale(index, node):  # read with the weight's DQ below
                continue
            codes = index.constant_value(node.input[0])
            storage = weight_grid_storage(index, node, codes)
            lpbq = _lpbq_scale(index, node.input[1]) if "block_size" in node_attributes(node) else None
            enc = _encoding(index, node, storage, shape=codes.shape, scale_values=lpbq[0] if lpbq else None)
            values = _dequantize_constant(codes, enc, node)
            name = node.output[0]
            narrowed = _float16_weight(index, name)
            if narrowed is not None:
                remove.add(narrowed.name)
                name, values = narrowed.output[0], values.astype(np.float16)
            new_initializers.append(numpy_helper.from_array(values, name))
            if enc.bits <= 16:
                records.append(TensorEncoding.from_encoding(name, enc, "param", codes.shape, lpbq[1] if lpbq else None))
            continue
        if node.op_type == "QuantizeLinear":
            dq = index.single_consumer(node.output[0])
            if dq is None or dq.op_type != "DequantizeLinear":
                _unmatched(node, strict)
                continue
            source, target = node.input[0], dq.output[0]
            widened = _float16_widening(index, node, dq)
            if widened is not None:  # Cast(float) -> Q -> DQ -> Cast(float16): a quantizer on a float16 tensor
                remove.update({widened[0].name, widened[1].name})
                source, target = widened[0].input[0], widened[1].output[0]
            producer = index.producer_of(source)
            clip = None
            reader = index.single_consumer(source)
            if producer is not None and producer.op_type == "Clip" and reader is not None and reader is node:
                bounds = [b for b in (_constant(index, n) for n in producer.input[1:3]) if b is not None and b.size == 1]
                if len(bounds) == 2 and _is_grid_clip(index, node, bounds):
                    clip = (float(bounds[0].reshape(())), float(bounds[1].reshape(())))
                    remove.add(producer.name)
                    source = producer.input[0]
            shape = tuple(index.initializers[source].dims) if index.is_constant(source) else index.shape.get(source)
            enc = _encoding(index, node, _storage(index, node), clip, shape=shape)  # a constant's axis needs its rank
            name = _float_name(index, source, target)
            if clip is None and _is_derived(index, node, source):
                renames[target if name == source else source] = name
                remove.update({node.name, dq.name})
                continue
            kind = "param" if index.is_constant(source) else "activation"
            narrowed = _float16_weight(index, target) if kind == "param" else None
            if narrowed is not None:  # AIMET's form (float weight -> Q -> DQ) of a float16 weight
                remove.add(narrowed.name)
                name = narrowed.output[0]
                new_initializers.append(numpy_helper.from_array(index.constant_value(source).astype(np.float16), name))
            elif kind == "param" and name != source:  # the constant takes the name its readers know
                new_initializers.append(numpy_helper.from_array(index.constant_value(source), name))
            records.append(TensorEncoding.from_encoding(name, enc, kind))
            renames[target if name == source else source] = name
            remove.update({node.name, dq.name})
        elif node.op_type == "DequantizeLinear" and index.producer_of(node.input[0]) is None:
            _unmatched(node, strict)
        elif node.op_type == "Cast" and node.name not in remove and _is_fp16_pair(index, node):
            back = index.single_consumer(node.output[0])
            assert back is not None  # _is_fp16_pair checked it
            source, target = node.input[0], back.output[0]
            name = _float_name(index, source, target)
            records.append(TensorEncoding.float16(name, "param" if index.is_constant(source) else "activation"))
            renames[target if name == source else source] = name
            remove.update({node.name, back.name})
    kept = [n for n in graph.node if n.name not in remove]
    _apply_renames(kept, graph, renames)
    replaced = {t.name for t in new_initializers}
    initializers = [t for t in graph.initializer if t.name not in replaced] + new_initializers
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    drop_unused_initializers(graph, {t.name for t in initializers})
    del graph.value_info[:]
    return work, records


def _is_derived(index: GraphIndex, q: onnx.NodeProto, source: str) -> bool:
    """True for a Q/DQ pair after a data-movement op (or a Pad) that repeats its input's Q/DQ parameters."""
    from quantsim.graph.op_facts import GRID_MOVEMENT_OPS

    producer = index.producer_of(source)
    if producer is None or (producer.op_type not in GRID_MOVEMENT_OPS and producer.op_type != "Pad") or not producer.input:
        return False
    upstream = index.producer_of(producer.input[0])
    if upstream is None or upstream.op_type != "DequantizeLinear" or len(upstream.input) != len(q.input):
        return False
    return all(
        a == b or (index.is_constant(a) and index.is_constant(b)
                   and np.array_equal(index.constant_value(a), index.constant_value(b)))
        for a, b in zip(upstream.input[1:], q.input[1:])
    )


def _resolve(name: str, renames: dict[str, str]) -> str:
    seen = set()
    while name in renames and name not in seen:
        seen.add(name)
        name = renames[name]
    return name


def _apply_renames(nodes, graph, renames) -> None:
    for node in nodes:
        for i, name in enumerate(node.input):
            node.input[i] = _resolve(name, renames)
        for i, name in enumerate(node.output):
            node.output[i] = _resolve(name, renames)


def _float_name(index: GraphIndex, source: str, target: str) -> str:
    """Name the de-quantized tensor keeps (module docstring): graph outputs and this SDK's
    ``<name>/float`` tensors keep the DQ output's name; everything else keeps the Q input's."""
    if index.is_constant(source) or source in index.graph_inputs:  # (a constant `<name>/float`: AIMET's form of ours)
        return target if index.is_constant(source) and source.startswith(target + "/") else source
    if target in index.graph_outputs or source.startswith(target + "/"):
        return target
    return source


def _dequantize_constant(codes: np.ndarray, enc: Encoding, node) -> np.ndarray:
    from quantsim.core.numerics import dequantize

    if enc.fp8 is not None:
        return dequantize(codes.astype(np.float32), enc)
    if enc.bits > 16:  # int32 bias
        scale = enc.scale.astype(np.float32)
        view = scale.reshape(-1) if scale.ndim else scale
        return ((codes.astype(np.int64) - enc.zero_point.reshape(view.shape)).astype(np.float32) * view).astype(np.float32)
    return dequantize(codes.astype(np.int64), enc)


def _type_if_float16(model: onnx.ModelProto) -> None:
    """Add inferred value types to ``model`` (in place) when it casts to float16 (the Cast patterns below are told
    apart by the type of the tensor cast); nothing when it does not, or when inference fails (types stay unknown).
    Inference runs on the graph without the payloads of big constants (declared as inputs: only types matter)."""
    graph = model.graph
    if not any(n.op_type == "Cast" and node_attributes(n).get("to") == TensorProto.FLOAT16 for n in graph.node):
        return
    small = [t for t in graph.initializer if np.prod(t.dims, dtype=np.int64) <= 4096]
    declared = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                for t in graph.initializer if np.prod(t.dims, dtype=np.int64) > 4096]
    light = helper.make_model(helper.make_graph(graph.node, graph.name, [*graph.input, *declared], graph.output, small),
                              opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(light)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError):  # types stay unknown
        return
    graph.value_info.extend(inferred.graph.value_info)


def _float16_weight(index: GraphIndex, dequantized: str) -> onnx.NodeProto | None:
    """The ``Cast(float16)`` that alone reads a weight's dequantized values: the weight of a float16 model
    (its encoding goes to the Cast's output, the float16 weight the model's layers read), else None."""
    cast = index.single_consumer(dequantized)
    if cast is None or cast.op_type != "Cast" or node_attributes(cast).get("to") != TensorProto.FLOAT16:
        return None
    return cast


def _elem_type(index: GraphIndex, name: str) -> int | None:
    """The element type of ``name``: declared, or read off a Cast / DequantizeLinear producer (exports carry
    no value_info)."""
    if name in index.elem_type:
        return index.elem_type[name]
    producer = index.producer_of(name)
    if producer is None:
        return None
    if producer.op_type == "Cast":
        return node_attributes(producer).get("to")
    if producer.op_type == "DequantizeLinear" and len(producer.input) > 1:
        return index.elem_type.get(producer.input[1])  # a DequantizeLinear computes in its scale's type
    return None


def _float16_widening(index: GraphIndex, q: onnx.NodeProto, dq: onnx.NodeProto):
    """``(Cast to float, Cast to float16)`` around a Q/DQ pair when they spell a quantizer on a float16 tensor
    (how `quantsim.export.qdq` writes one for a model computing in float16: the Q/DQ work in float32), else None.
    The Casts belong to the quantizer, not to the model, and the back Cast is no float16 quantizer."""
    widen = index.producer_of(q.input[0])
    back = index.single_consumer(dq.output[0])
    if widen is None or back is None or widen.op_type != "Cast" or back.op_type != "Cast" \
            or index.single_consumer(q.input[0]) is not q:
        return None
    if node_attributes(widen).get("to") != TensorProto.FLOAT or node_attributes(back).get("to") != TensorProto.FLOAT16:
        return None
    return (widen, back) if _elem_type(index, widen.input[0]) == TensorProto.FLOAT16 else None


def _is_fp16_pair(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """``node`` and its one reader are ``Cast(float16) -> Cast(float)`` on a float32 tensor: the sim's float16
    quantizer. A Cast to float16 of a tensor that is float16 already (or not known to be float32) is the model's."""
    attrs = node_attributes(node)
    back = index.single_consumer(node.output[0])
    if attrs.get("to") != TensorProto.FLOAT16 or back is None or back.op_type != "Cast":
        return False
    if _elem_type(index, node.input[0]) not in (TensorProto.FLOAT, None):
        return False
    return node_attributes(back).get("to") == TensorProto.FLOAT


def _unmatched(node: onnx.NodeProto, strict: bool) -> None:
    message = f"{node.op_type} node {node.name!r} is not part of a recognised Q/DQ pattern; left in the model"
    if strict:
        raise NotImplementedError(message)
    warn_at_caller(message)


def _bias_form(model: onnx.ModelProto) -> bool | None:
    """Whether the file adds its quantized linear layers' biases as int32 codes (``DequantizeLinear`` of an
    int32 constant: the sim's ``int32_bias=True``) or as float constants (``int32_bias=False``); None when it
    has no such bias. Biases are those of Conv / ConvTranspose / Gemm and the Add after a MatMul. A file with
    both forms cannot be followed by one sim-wide switch: it warns, naming a layer of the minority form, and
    follows the majority."""
    from quantsim.graph.op_facts import BIAS_SLOT

    index = GraphIndex(model)
    int32_dq = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"
                and index.is_constant(n.input[0]) and index.elem_type.get(n.input[0]) == TensorProto.INT32}
    dq_outputs = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    forms: dict[bool, list[str]] = {True: [], False: []}
    for node in model.graph.node:
        if len(node.input) < 2 or node.input[0] not in dq_outputs or node.input[1] not in dq_outputs:
            continue  # not a quantized layer: its bias is float in every form
        slot = BIAS_SLOT.get(node.op_type)
        if slot is not None and len(node.input) > slot and node.input[slot]:
            bias = node.input[slot]
        elif node.op_type == "MatMul" and (add := index.single_consumer(node.output[0])) is not None \
                and add.op_type == "Add" and len(add.input) == 2:
            bias = add.input[1] if add.input[0] == node.output[0] else add.input[0]  # the per-column bias Add
        else:
            continue
        if bias in int32_dq:
            forms[True].append(node.name)
        elif index.is_constant(bias):
            forms[False].append(node.name)
    if not forms[True] and not forms[False]:
        return None
    chosen = len(forms[True]) >= len(forms[False])
    if forms[True] and forms[False]:
        other = forms[not chosen]
        warn_at_caller(f"QDQ model: {len(forms[True])} quantized layers add int32 biases and {len(forms[False])} "
                       f"float biases (e.g. {other[0]!r}); the sim adds every bias as "
                       f"{'int32 codes' if chosen else 'float'} (int32_bias={chosen}), so layers like "
                       f"{other[0]!r} may differ from the file by half an accumulator unit")
    return chosen


def sim_from_qdq(cls, model, *, strict: bool = False, **init_kwargs):
    """Build a ``cls`` sim from a QDQ model; quantizers without a Q/DQ in the model are disabled, so the
    sim computes what the QDQ model computes."""
    from quantsim.encodings.transfer import load_records

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    float_model, records = strip_qdq(model, strict)
    # The file's Q/DQ decide what is quantized: AIMET's placement has a quantizer wherever ours may (a depthwise
    # output too), and the ones the file lacks are disabled below.
    init_kwargs.setdefault("depthwise_supergroups", False)
    form = _bias_form(model)
    if "int32_bias" not in init_kwargs and form is not None:
        init_kwargs["int32_bias"] = form
    sim = cls(float_model, **init_kwargs)
    load_records(sim, "qdq", records, "QDQ model", strict=strict, allow_overwrite=True,
                 disable_missing_quantizers=True)
    matched = sum(1 for r in records if r.name in sim.qc_quantize_op_dict)
    if matched < len(records):
        warn_at_caller(f"loaded {matched} of {len(records)} encodings from the QDQ model")
    return sim
