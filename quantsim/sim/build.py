"""Build the sim graph: the float model with each enabled quantizer as standard ONNX ops.

* int activations: ``QuantizeLinear -> DequantizeLinear`` (ties to even, saturating) in 8-bit (grids up to
  8 bits, see `activation_container`) or 16-bit types; grids narrower than their container (strict
  symmetric, 2..7-bit, 9..15-bit) get a ``Clip`` to the grid's float range first,
  which makes the n-bit grid exact: ``clip(x, s(qmin - z), s(qmax - z))`` then quantize equals quantize
  then clamp to ``[qmin, qmax]``.
* float8 (float8e4m3fn, float8e5m2): ``QuantizeLinear -> DequantizeLinear`` with a float8 zero point of 0
  (opset 19; saturating, ties to even), per tensor or per channel, no Clip.
* float16: ``Cast(float16) -> Cast(float)``.
* tensors of a float16 or float64 model: the same pairs between ``Cast(float)`` and a ``Cast`` back to the
  tensor's type (the encodings are float32 grids, and QuantizeLinear takes no float64), so the model
  keeps its own types everywhere else; a float16 precision on a float16 tensor is a no-op.
* parameters and other constants: ``weights="fake"`` bakes the fake-quantized float values into the
  initializer (the fastest exact sim: no runtime weight QDQ); ``weights="qdq"`` stores the integer codes
  as an initializer of the storage type followed by ``DequantizeLinear`` (the standard QDQ form).
  A constant activation read only as a Gather's table (an embedding) takes the ``qdq`` form too.
  ``integer_weights=True`` (sessions of large models) keeps the fake form's values but holds big float32
  weights of grids up to 8 bits as int8/uint8 codes, computed back as ``Mul(Cast(codes) - zero_point,
  scale)`` just before their layer: a quarter of the memory, and exactly the fake-quantized floats
  (`numerics.fake_quantize` is ``(code - zero_point) * scale`` in float32). Not a DequantizeLinear:
  onnxruntime's per-channel DequantizeLinear over the last axis runs element by element (10x slower
  than Cast and a broadcast Mul on a 4096x4096 weight).

A quantized tensor keeps its name: its producer writes a fresh ``<name>/float`` tensor and the last
quantizer node writes ``<name>``, so consumers and graph outputs need no rewiring. Model inputs keep their
name too; their consumers are rewired to ``<name>/quantized``.

Redundant activation quantizers are left out of the ``weights="fake"`` graph (the exact sim): those whose
tensor a value-selecting op produces from inputs already on exactly the same grid (`quantsim.sim.redundant`).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim.core.dtypes import int8, int16, qtype
from quantsim.core.numerics import Encoding, broadcast_param, grid_bounds, quantize
from quantsim.core.spec import LPBQ
from quantsim.errors import InvalidArgumentError, InvalidStateError
from quantsim.graph.deferred import DeferredWeights
from quantsim.graph.edit import default_opset
from quantsim.graph.index import GraphIndex
from quantsim.graph.large_models import converted_skeleton, copy_without_initializers, is_external_candidate, is_large
from quantsim.graph.mapped import is_mapped
from quantsim.graph.model_io import IN_MEMORY_ELEM_TYPES
from quantsim.graph.op_facts import GATHER_OPS
from quantsim.graph.wrapped import as_model_proto
from quantsim.sim.deferral import WeightDeferral
from quantsim.sim.fake_values import FakeValues
from quantsim.sim.lpbq_build import lpbq_scale_nodes
from quantsim.sim.quantizer import QcQuantizeOp
from quantsim.sim.redundant import redundant_activation_quantizers

__all__ = ["build_sim_model", "required_opset", "activation_container", "IR_FOR_OPSET"]

IR_FOR_OPSET = ((21, 10), (19, 9), (15, 8), (1, 7))


def _ir_version_for(opset: int) -> int:
    return next(ir for first, ir in IR_FOR_OPSET if opset >= first)


def required_opset(quantizers: list[QcQuantizeOp], weights: str) -> int:
    """Lowest ai.onnx opset whose Q/DQ ops carry every enabled quantizer of the graph."""
    needed = 1
    for q in quantizers:
        if not q.enabled or q.spec.is_float:
            continue
        enc = q.require_encoding()
        if enc.fp8 is not None and (q.role == "activation" or weights == "qdq"):
            needed = max(needed, q.spec.dtype.min_opset())
        elif q.role == "activation" and enc is not None and enc.is_per_tensor:
            container = activation_container(q.spec.dtype)
            needed = max(needed, container.min_opset(), 13 if _needs_clip(enc, container) else 10)
        elif weights == "qdq" and enc is not None:
            needed = max(needed, q.spec.dtype.min_opset(), 13 if enc.axis is not None else 10)
            if enc.block_size is not None:
                needed = max(needed, 21)
    return needed


def activation_container(dtype: qtype) -> qtype:
    """The Q/DQ type carrying an activation grid: 8 bits for grids up to 8 bits, else 16; a float8 format
    carries itself.

    4-bit activation grids ride in 8-bit Q/DQ behind a Clip rather than in int4/uint4: onnxruntime
    1.32 drops a non-redundant Relu before a 4-bit QuantizeLinear and fuses 4-bit Q/DQ around Conv into
    QLinearConv, which has no 4-bit kernel. The values are the same grid either way.
    """
    if dtype.is_fp8:
        return dtype
    return int8 if dtype.bits <= 8 else int16


def _needs_clip(enc: Encoding, container: qtype) -> bool:
    if enc.fp8 is not None:
        return False
    return (enc.qmin, enc.qmax) != grid_bounds(container.bits, enc.signed)


def _with_opset(model: onnx.ModelProto, opset: int) -> tuple[onnx.ModelProto, list[TensorProto] | None]:
    """``model`` at ``opset`` or later, and the initializers to build from (None: the returned model's own).
    A large model's skeleton is converted (the converter serialises its input, which protobuf refuses over
    2 GiB): its weights are then ``model``'s own tensors, neither copied nor serialised."""
    current = default_opset(model) or 0
    if current >= opset:
        return model, None
    large = is_large(model)
    try:
        converted = converted_skeleton(model, opset) if large else onnx.version_converter.convert_version(model, opset)
    except Exception as error:  # noqa: BLE001 - re-raised with context
        raise InvalidStateError(
            f"the sim needs opset {opset} for its quantizers but converting the model from opset {current} "
            f"failed: {error}"
        ) from error
    converted.ir_version = max(converted.ir_version, _ir_version_for(opset))
    if not large:
        return converted, None
    weights = {t.name: t for t in model.graph.initializer if is_external_candidate(t)}
    return converted, [weights[t.name] if t.name in weights and is_mapped(t) else t
                       for t in converted.graph.initializer]


def _scalar(name: str, value, elem_type: int) -> TensorProto:
    if elem_type in (TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2):
        return helper.make_tensor(name, elem_type, [], [int(value)])
    return numpy_helper.from_array(np.array(value, dtype=helper.tensor_dtype_to_np_dtype(elem_type)), name)


def _integer_tensor(name: str, codes: np.ndarray, elem_type: int) -> TensorProto:
    if elem_type in (TensorProto.INT4, TensorProto.UINT4):
        return helper.make_tensor(name, elem_type, list(codes.shape), codes.reshape(-1).tolist())
    return numpy_helper.from_array(codes.astype(helper.tensor_dtype_to_np_dtype(elem_type)), name)


def _qdq_parameters(enc: Encoding, q: QcQuantizeOp, shape: tuple) -> tuple[np.ndarray, np.ndarray, dict]:
    """Scale, zero point and Q/DQ attributes in ONNX layout (per-axis 1-D, blocked same rank as x)."""
    scale = enc.scale.astype(np.float32)
    zero_point = enc.zero_point
    attrs: dict = {}
    if enc.block_size is not None:
        rank = len(shape)
        assert enc.axis is not None and enc.block_axis is not None
        axis, block_axis = enc.axis % rank, enc.block_axis % rank
        full = [1] * rank
        full[axis] = scale.shape[0]
        full[block_axis] = scale.shape[1]
        order = sorted([axis, block_axis])
        if order != [axis, block_axis]:
            scale, zero_point = scale.T, zero_point.T
        reps = [1 if i in (axis, block_axis) else shape[i] for i in range(rank)]
        scale = np.tile(scale.reshape(full), reps)
        zero_point = np.tile(zero_point.reshape(full), reps)
        attrs = {"axis": block_axis, "block_size": enc.block_size}
    elif enc.axis is not None:
        attrs = {"axis": enc.axis % len(shape)}
    return scale, zero_point, attrs


def _constant_key(q: QcQuantizeOp) -> tuple:
    """Everything a constant's fake-quantized values depend on besides the float values themselves."""
    enc = q.encoding
    if enc is None:
        return (q.spec,)
    return (q.spec, enc.scale.tobytes(), enc.zero_point.tobytes(), enc.qmin, enc.qmax, enc.axis, enc.block_axis,
            enc.block_size)


def _grid_key(q: QcQuantizeOp) -> tuple | None:
    """What the sim's Q/DQ (or Cast pair) of activation quantizer ``q`` computes: equal keys, equal maps."""
    if q.spec.is_float:
        return ("float16",)
    enc = q.require_encoding()
    if not enc.is_per_tensor:
        return None
    storage = activation_container(q.spec.dtype).storage_type(enc.signed)
    return (float(np.float32(enc.scale)), int(enc.zero_point), storage, enc.qmin, enc.qmax, enc.fp8)




class _SimBuilder:
    """Collects the sim's changes to ``model`` (a copy without initializers) and assembles it in `finish`.

    ``initializers`` are the source model's, left untouched: `finish` copies each into ``model`` (or the
    tensor that replaces it). ``values`` converts one of them to an array. Big weights go where ``deferral``
    (`quantsim.sim.deferral`) puts them: deferred, held beside the model, or in it.
    """

    def __init__(self, model: onnx.ModelProto, initializers, weights: str,
                 values: Callable[[str], np.ndarray] | None, external: dict | None,
                 memo: dict[str, tuple] | None = None, integer_weights: bool = False,
                 deferred: DeferredWeights | None = None):
        self.model = model
        self.graph = model.graph
        self.source_initializers = list(initializers)
        self.index = GraphIndex(model, initializers=self.source_initializers)
        self.weights = weights
        self.initializers = self.index.initializers
        self.values = values or (lambda name: numpy_helper.to_array(self.initializers[name]))
        self.integer_weights = integer_weights
        self.declared_inputs = {i.name for i in model.graph.input}
        self.deferral = WeightDeferral(external, memo, deferred, self.declared_inputs)
        self.replaced: dict[str, TensorProto | None] = {}  # initializer name -> new tensor (None: removed)
        self.new_initializers: list[TensorProto] = []
        self.after: dict[str, list[onnx.NodeProto]] = {}
        self.before: dict[str, list[onnx.NodeProto]] = {}  # node name -> nodes to run just before it
        self.front: list[onnx.NodeProto] = []
        self.rewire: dict[str, str] = {}

    def add_constant_quantizer(self, name: str, q: QcQuantizeOp) -> None:
        """Quantize constant ``name``: its fake-quantized values in its place, or (``weights="qdq"``, parameters)
        its integer codes and a DequantizeLinear writing it; big ones deferred where ``deferral`` defers them."""
        enc = None if q.spec.is_float else q.require_encoding()
        if enc is not None and self._integer_weight(name, q, enc):
            return
        tensor, read = self.initializers[name], self.values
        if enc is None or self.weights == "fake" or (q.role != "param" and not self._lookup_table(name)):
            compute = FakeValues(read(name), enc)  # whole, or in blocks of rows for a session's weight file
            placeholder = self.deferral.defer(name, tensor.data_type, tensor, ("quantized", *_constant_key(q)), compute)
            if placeholder is None:
                new = self.deferral.remembered(name, _constant_key(q), compute)
                placeholder = self.deferral.hold(name, new) or numpy_helper.from_array(new, name)
            self.replaced[name] = placeholder
            return
        storage = q.spec.dtype.storage_type(enc.signed)
        codes_name = self.index.fresh_name(f"{name}/quantized")
        scale, zero_point, attrs = _qdq_parameters(enc, q, tuple(tensor.dims))
        codes = self.deferral.defer(codes_name, storage, tensor, ("codes", *_constant_key(q)),
                                 lambda: quantize(read(name), enc))
        if isinstance(q.spec.granularity, LPBQ):  # the scale is the DQ of the integer block scales
            tensors, scale_node = lpbq_scale_nodes(f"{codes_name}/scale", enc, q.spec.granularity,
                                                   lambda e: _qdq_parameters(e, q, tuple(tensor.dims))[0])
            self.new_initializers += tensors
            self.front.append(scale_node)
        else:
            self.new_initializers.append(numpy_helper.from_array(scale, f"{codes_name}/scale"))
        self.new_initializers += [
            codes or _integer_tensor(codes_name, quantize(self.values(name), enc), storage),
            _integer_tensor(f"{codes_name}/zero_point", zero_point, storage),
        ]
        self.replaced[name] = None
        self._dequantize_weight(name, codes_name, tensor.data_type, attrs)

    def _lookup_table(self, name: str) -> bool:
        """A constant every reader gathers rows from (an embedding): the QDQ form stores its codes, so the rows
        stay on the grid through the Gather (the export adds derived Q/DQ pairs after it) and a MatMul reading
        them gets an int32 bias, as the sim adds it, and an integer kernel."""
        uses = self.index.uses(name)
        return bool(uses) and all(use.node.op_type in GATHER_OPS and use.index == 0 for use in uses)

    def _dequantize_weight(self, name: str, codes_name: str, elem_type: int, attrs: dict) -> None:
        """``DequantizeLinear`` of ``codes_name`` (with its scale and zero point) writing weight ``name`` of
        ``elem_type`` (through a Cast for a float16/float64 model)."""
        dq_out = name if elem_type == TensorProto.FLOAT else self.index.fresh_name(f"{name}/dequantized")
        dq = helper.make_node(
            "DequantizeLinear", [codes_name, f"{codes_name}/scale", f"{codes_name}/zero_point"], [dq_out],
            name=f"{name}/dequantize", **attrs,
        )
        self.front.append(dq)
        if dq_out != name:  # a float16/float64 model: back to the weight's own type
            self.front.append(helper.make_node("Cast", [dq_out], [name], name=f"{name}/cast", to=elem_type))

    def _integer_weight(self, name: str, q: QcQuantizeOp, enc: Encoding) -> bool:
        """With ``integer_weights``: put a big float32 weight of a grid up to 8 bits into the graph as int8/uint8
        codes (an ``external`` placeholder) and compute ``name`` as ``(float(codes) - zero_point) * scale``
        (module docstring); False if it does not qualify."""
        tensor = self.initializers[name]
        if (not self.integer_weights or self.weights != "fake" or q.role != "param" or self.deferral.external is None
                or q.spec.dtype.bits > 8 or enc.fp8 is not None or enc.block_size is not None
                or tensor.data_type != TensorProto.FLOAT
                or name in self.declared_inputs or not is_external_candidate(tensor)):
            return False
        dtype = helper.tensor_dtype_to_np_dtype(int8.storage_type(enc.signed))
        codes = self.deferral.remembered(name, ("codes", *_constant_key(q)),
                                      lambda: quantize(self.values(name), enc, dtype))
        codes_name = self.index.fresh_name(f"{name}/codes")
        placeholder = self.deferral.hold(codes_name, codes)
        if placeholder is None:
            return False
        shape = tuple(tensor.dims)
        scale_name, zero_point_name = f"{codes_name}/scale", f"{codes_name}/zero_point"
        scale = broadcast_param(enc, enc.scale.astype(np.float32), shape)
        if scale.size == 1:  # a scalar Mul would be folded into a MatMul's alpha (another rounding)
            scale = np.full(shape[-1:], scale.reshape(()), dtype=np.float32)
        self.new_initializers += [placeholder, numpy_helper.from_array(scale, scale_name)]
        self.replaced[name] = None
        readers = [use.node for use in self.index.uses(name)]
        nodes = self._after_reader_input(readers[0], codes_name, shape) if readers else []
        as_float = self.index.fresh_name(f"{codes_name}/as_float")
        nodes.append(helper.make_node("Cast", [nodes[-1].output[0] if nodes else codes_name], [as_float],
                                      name=as_float, to=TensorProto.FLOAT))
        if np.any(enc.zero_point != 0):
            self.new_initializers.append(numpy_helper.from_array(
                broadcast_param(enc, enc.zero_point.astype(np.float32), shape), zero_point_name))
            centered = self.index.fresh_name(f"{codes_name}/centered")
            nodes.append(helper.make_node("Sub", [as_float, zero_point_name], [centered], name=centered))
            as_float = centered
        nodes.append(helper.make_node("Mul", [as_float, scale_name], [name], name=f"{name}/dequantize"))
        self.before.setdefault(readers[0].name if readers else "", []).extend(nodes)
        return True

    def _after_reader_input(self, reader: onnx.NodeProto, codes: str, shape: tuple) -> list[onnx.NodeProto]:
        """Nodes reshaping ``codes`` to their own ``shape`` computed as ``shape + 0 * (a dimension of reader's
        first computed input)``, so that the weight's dequantization waits for its layer (a copy of the
        codes, a quarter of the float weight). onnxruntime would otherwise dequantize every weight first
        (they read only initializers; its fusions renumber the layers after them) and hold them all at once."""
        anchor = next((i for i in reader.input if i and i not in self.initializers), None)
        if anchor is None:
            return []
        names = [self.index.fresh_name(f"{codes}/{part}") for part in ("shape", "dim", "zero", "dims", "after")]
        first, nothing, dims = (self.index.fresh_name(f"{codes}/{part}") for part in ("first", "nothing", "own_dims"))
        self.new_initializers += [numpy_helper.from_array(np.array(0, dtype=np.int64), first),
                                  numpy_helper.from_array(np.array(0, dtype=np.int64), nothing),
                                  numpy_helper.from_array(np.array(shape, dtype=np.int64), dims)]
        return [helper.make_node("Shape", [anchor], [names[0]], name=names[0]),
                helper.make_node("Gather", [names[0], first], [names[1]], name=names[1], axis=0),
                helper.make_node("Mul", [names[1], nothing], [names[2]], name=names[2]),
                helper.make_node("Add", [dims, names[2]], [names[3]], name=names[3]),
                helper.make_node("Reshape", [codes, names[3]], [names[4]], name=names[4])]

    def _unchanged(self, tensor: TensorProto) -> TensorProto:
        """An initializer no quantizer changes: itself, or with ``external`` a placeholder for a big float one.
        One whose values are in a mapped file (`quantsim.graph.mapped`) is always replaced: by a placeholder
        (deferred, a copy computed when written), or by its values."""
        name, read = tensor.name, self.values
        if is_mapped(tensor):
            placeholder = self.deferral.defer(name, tensor.data_type, tensor, ("float",), lambda: read(name))
            if placeholder is None:
                values = self.values(name)
                placeholder = self.deferral.hold(name, values) or numpy_helper.from_array(np.array(values), name)
            return placeholder
        if (self.deferral.external is None or tensor.data_type not in IN_MEMORY_ELEM_TYPES
                or not is_external_candidate(tensor)):
            return tensor
        return self.deferral.hold(name, self.deferral.remembered(name, ("float",), lambda: self.values(name))) or tensor

    def add_activation_quantizer(self, name: str, q: QcQuantizeOp) -> None:
        if name in self.index.graph_inputs:
            if name in self.index.graph_outputs:
                return  # a pass-through input/output: nothing inside reads it
            source, target = name, self.index.fresh_name(f"{name}/quantized")
            self.rewire[name] = target
            self.front.extend(self._fake_quant_nodes(source, target, q))
            return
        producer, position = self.index.producer[name]
        source = self.index.fresh_name(f"{name}/float")
        producer.output[position] = source
        self.after.setdefault(producer.name, []).extend(self._fake_quant_nodes(source, name, q))

    def _fake_quant_nodes(self, source: str, target: str, q: QcQuantizeOp) -> list[onnx.NodeProto]:
        """The quantizer's nodes from ``source`` to ``target``; around them, for a tensor that is not float32,
        a Cast to float32 and one back to its type (module docstring)."""
        elem_type = self.index.elem_type.get(target if target in self.index.elem_type else source, TensorProto.FLOAT)
        if elem_type == TensorProto.FLOAT:
            return self._float32_quantizer_nodes(source, target, q)
        if q.spec.is_float and elem_type == TensorProto.FLOAT16:
            return [helper.make_node("Identity", [source], [target], name=f"{target}/fp16")]
        as_float = self.index.fresh_name(f"{target}/as_float")
        quantized = self.index.fresh_name(f"{target}/quantized_float")
        return [helper.make_node("Cast", [source], [as_float], name=f"{target}/cast_in", to=TensorProto.FLOAT),
                *self._float32_quantizer_nodes(as_float, quantized, q),
                helper.make_node("Cast", [quantized], [target], name=f"{target}/cast_out", to=elem_type)]

    def _float32_quantizer_nodes(self, source: str, target: str, q: QcQuantizeOp) -> list[onnx.NodeProto]:
        base = target
        if q.spec.is_float:
            mid = self.index.fresh_name(f"{base}/fp16")
            return [
                helper.make_node("Cast", [source], [mid], name=f"{base}/cast_fp16", to=TensorProto.FLOAT16),
                helper.make_node("Cast", [mid], [target], name=f"{base}/cast_fp32", to=TensorProto.FLOAT),
            ]
        enc = q.require_encoding()
        container = activation_container(q.spec.dtype)
        storage = container.storage_type(enc.signed)
        scale_name, zp_name = self.index.fresh_name(f"{base}/scale"), self.index.fresh_name(f"{base}/zero_point")
        self.new_initializers += [
            _scalar(scale_name, np.float32(enc.scale), TensorProto.FLOAT),
            _scalar(zp_name, int(enc.zero_point), storage),
        ]
        nodes = []
        if _needs_clip(enc, container):
            scale = np.float32(enc.scale)
            lo = np.float32(scale * np.float32(enc.qmin - int(enc.zero_point)))
            hi = np.float32(scale * np.float32(enc.qmax - int(enc.zero_point)))
            clipped = self.index.fresh_name(f"{base}/clipped")
            lo_name, hi_name = self.index.fresh_name(f"{base}/clip_min"), self.index.fresh_name(f"{base}/clip_max")
            self.new_initializers += [_scalar(lo_name, lo, TensorProto.FLOAT), _scalar(hi_name, hi, TensorProto.FLOAT)]
            nodes.append(helper.make_node("Clip", [source, lo_name, hi_name], [clipped], name=f"{base}/clip"))
            source = clipped
        codes = self.index.fresh_name(f"{base}/codes")
        nodes += [
            helper.make_node("QuantizeLinear", [source, scale_name, zp_name], [codes], name=f"{base}/quantize"),
            helper.make_node("DequantizeLinear", [codes, scale_name, zp_name], [target], name=f"{base}/dequantize"),
        ]
        return nodes

    def finish(self) -> onnx.ModelProto:
        ordered = [*self.front, *self.before.pop("", ())]
        for node in self.graph.node:
            for before_or_node in (*self.before.get(node.name, ()), node):
                for position, name in enumerate(before_or_node.input):
                    if name in self.rewire:
                        before_or_node.input[position] = self.rewire[name]
                ordered.append(before_or_node)
            ordered.extend(self.after.get(node.name, ()))
        del self.graph.node[:]
        self.graph.node.extend(ordered)
        initializers = []
        for tensor in self.source_initializers:
            name = tensor.name
            if name in self.replaced and self.initializers[name] is tensor:
                if self.replaced[name] is not None:
                    initializers.append(self.replaced[name])
            else:
                initializers.append(self._unchanged(tensor))
        self.graph.initializer.extend(initializers + self.new_initializers)
        return self.model


def build_sim_model(
    model: onnx.ModelProto,
    quantizers: list[QcQuantizeOp],
    *,
    weights: str = "fake",
    min_opset: int = 1,
    skip_redundant: bool | None = None,
    source: GraphIndex | None = None,
    external: dict[str, np.ndarray] | None = None,
    memo: dict[str, tuple] | None = None,
    integer_weights: bool = False,
    deferred: DeferredWeights | None = None,
    int32_bias: bool = False,
) -> onnx.ModelProto:
    """A new model: ``model`` (left unchanged) with every enabled, initialised quantizer applied (see module
    docstring).

    Quantizers without an encoding (uncalibrated activations) are skipped: they pass data through.
    ``skip_redundant`` (default: ``weights == "fake"``, the exact sim) leaves out activation Q/DQ pairs
    that provably map every value to itself; the QDQ form (``weights="qdq"``) keeps every quantizer, since
    integer runtimes read the Q/DQ around each op.

    ``source``, a `GraphIndex` of ``model``, supplies the constants' values (converted once inside its
    `GraphIndex.cached_constants` block). With ``external`` (a dict), big float initializers, quantized or
    not, stay out of the model: it holds a `model_io.in_memory_placeholder` for each and ``external`` maps
    the name to the values. Such a model is complete only with them: `session.make_session` takes them as
    ``external_initializers``, which spares copying, serialising and parsing the weights. ``memo`` (a dict
    the caller keeps, cleared whenever a weight's values change) lets builds share those arrays.
    ``integer_weights`` (with ``external``) holds big 8-bit weights as integer codes dequantized just before
    their layer (module docstring): the same outputs in a quarter of the memory. Big weights computed from
    mapped ones (with ``external`` and no ``memo``), and with ``deferred`` (exports, without ``external``) big
    quantized constants and mapped weights, are deferred (`quantsim.sim.deferral`): computed only when written,
    one at a time, a session's keyed so that its weight files are reused while they are unchanged.
    ``int32_bias`` (fake weights only) puts the biases the exports add as int32 codes on that grid
    (`quantsim.sim.int32_bias`).
    """
    model = as_model_proto(model)  # sim.model (a view) too
    if weights not in ("fake", "qdq"):
        raise InvalidArgumentError(f"weights must be 'fake' or 'qdq', got {weights!r}")
    if skip_redundant is None:
        skip_redundant = weights == "fake"
    active = [q for q in quantizers if q.enabled and q.is_initialized()]
    source_model, converted_initializers = _with_opset(model, max(required_opset(active, weights), min_opset))
    initializers = source_model.graph.initializer if converted_initializers is None else converted_initializers
    values = None
    if source is not None and source_model is model is source.model:
        values = source.constant_value
    elif source is not None:  # a converted copy: its mapped initializers are still the source's
        converted = {t.name: t for t in initializers}
        values = lambda name: (source.constant_value(name) if is_mapped(converted[name])  # noqa: E731
                               else numpy_helper.to_array(converted[name]))
    builder = _SimBuilder(copy_without_initializers(source_model), initializers, weights, values,
                          external, memo, integer_weights, deferred)
    placed: list[tuple[str, QcQuantizeOp]] = []
    planned: dict[str, tuple | None] = {}
    for q in active:
        for name in q.tensors:
            if name in builder.initializers:
                placed.append((name, q))
            elif name in builder.index.producer or name in builder.index.graph_inputs:
                placed.append((name, q))
                planned[name] = _grid_key(q)
    redundant = redundant_activation_quantizers(builder.index, planned) if skip_redundant else set()
    for name, q in placed:
        if name in builder.initializers:
            builder.add_constant_quantizer(name, q)
        elif name not in redundant:
            builder.add_activation_quantizer(name, q)
    built = builder.finish()
    if int32_bias and weights == "fake":
        from quantsim.sim.int32_bias import int32_bias_values

        int32_bias_values(built, model, active, builder.values, external)
    return built
