"""Build the sim graph: the float model with each enabled quantizer as standard ONNX ops.

* int activations: ``QuantizeLinear -> DequantizeLinear`` (ties to even, saturating) in 8-bit (grids up to
  8 bits, see `activation_container`) or 16-bit types; grids narrower than their container (strict
  symmetric, 2..7-bit, 9..15-bit) get a ``Clip`` to the grid's float range first,
  which makes the n-bit grid exact: ``clip(x, s(qmin - z), s(qmax - z))`` then quantize equals quantize
  then clamp to ``[qmin, qmax]``.
* float16: ``Cast(float16) -> Cast(float)``.
* parameters and other constants: ``weights="fake"`` bakes the fake-quantized float values into the
  initializer (the fastest exact sim: no runtime weight QDQ); ``weights="qdq"`` stores the integer codes
  as an initializer of the storage type followed by ``DequantizeLinear`` (the standard QDQ form).

A quantized tensor keeps its name: its producer writes a fresh ``<name>/float`` tensor and the last
quantizer node writes ``<name>``, so consumers and graph outputs need no rewiring. Model inputs keep their
name too; their consumers are rewired to ``<name>/quantized``.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph import GraphIndex
from .dtypes import int8, int16, qtype
from .numerics import Encoding, fake_quantize, fp16_round_trip, grid_bounds, quantize
from .prepare.common import default_opset
from .quantizer import QcQuantizeOp

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
        enc = q.encoding
        if q.role == "activation" and enc is not None and enc.is_per_tensor:
            container = activation_container(q.spec.dtype)
            needed = max(needed, container.min_opset(), 13 if _needs_clip(enc, container) else 10)
        elif weights == "qdq" and enc is not None:
            needed = max(needed, q.spec.dtype.min_opset(), 13 if enc.axis is not None else 10)
            if enc.block_size is not None:
                needed = max(needed, 21)
    return needed


def activation_container(dtype: qtype) -> qtype:
    """The Q/DQ type carrying an activation grid: 8 bits for grids up to 8 bits, else 16.

    4-bit activation grids ride in 8-bit Q/DQ behind a Clip rather than in int4/uint4: onnxruntime
    1.32 drops a non-redundant Relu before a 4-bit QuantizeLinear and fuses 4-bit Q/DQ around Conv into
    QLinearConv, which has no 4-bit kernel. The values are the same grid either way.
    """
    return int8 if dtype.bits <= 8 else int16


def _needs_clip(enc: Encoding, container: qtype) -> bool:
    return (enc.qmin, enc.qmax) != grid_bounds(container.bits, enc.signed)


def _with_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    current = default_opset(model) or 0
    if current >= opset:
        return model
    try:
        converted = onnx.version_converter.convert_version(model, opset)
    except Exception as error:  # noqa: BLE001 - re-raised with context
        raise RuntimeError(
            f"the sim needs opset {opset} for its quantizers but converting the model from opset {current} "
            f"failed: {error}"
        ) from error
    converted.ir_version = max(converted.ir_version, _ir_version_for(opset))
    return converted


def _scalar(name: str, value, elem_type: int) -> TensorProto:
    if elem_type in (TensorProto.INT4, TensorProto.UINT4):
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


class _SimBuilder:
    def __init__(self, model: onnx.ModelProto, weights: str):
        self.model = model
        self.graph = model.graph
        self.index = GraphIndex(model)
        self.weights = weights
        self.opset = self.index.opset()
        self.initializers = {t.name: t for t in self.graph.initializer}
        self.new_initializers: list[TensorProto] = []
        self.after: dict[str, list[onnx.NodeProto]] = {}
        self.front: list[onnx.NodeProto] = []
        self.rewire: dict[str, str] = {}

    def add_constant_quantizer(self, name: str, q: QcQuantizeOp) -> None:
        tensor = self.initializers[name]
        values = numpy_helper.to_array(tensor)
        if q.spec.is_float:
            tensor.CopyFrom(numpy_helper.from_array(fp16_round_trip(values).astype(values.dtype), name))
            return
        enc = q.encoding
        if self.weights == "fake" or q.role != "param":
            tensor.CopyFrom(numpy_helper.from_array(fake_quantize(values, enc).astype(values.dtype), name))
            return
        storage = q.spec.dtype.storage_type(enc.signed)
        codes_name = self.index.fresh_name(f"{name}/quantized")
        scale, zero_point, attrs = _qdq_parameters(enc, q, values.shape)
        self.new_initializers += [
            _integer_tensor(codes_name, quantize(values, enc), storage),
            numpy_helper.from_array(scale, f"{codes_name}/scale"),
            _integer_tensor(f"{codes_name}/zero_point", zero_point, storage),
        ]
        self.graph.initializer.remove(tensor)
        dq = helper.make_node(
            "DequantizeLinear", [codes_name, f"{codes_name}/scale", f"{codes_name}/zero_point"], [name],
            name=f"{name}/dequantize", **attrs,
        )
        self.front.append(dq)

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
        base = target
        if q.spec.is_float:
            mid = self.index.fresh_name(f"{base}/fp16")
            return [
                helper.make_node("Cast", [source], [mid], name=f"{base}/cast_fp16", to=TensorProto.FLOAT16),
                helper.make_node("Cast", [mid], [target], name=f"{base}/cast_fp32", to=TensorProto.FLOAT),
            ]
        enc = q.encoding
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
        ordered = list(self.front)
        for node in self.graph.node:
            for position, name in enumerate(node.input):
                if name in self.rewire:
                    node.input[position] = self.rewire[name]
            ordered.append(node)
            ordered.extend(self.after.get(node.name, ()))
        del self.graph.node[:]
        self.graph.node.extend(ordered)
        self.graph.initializer.extend(self.new_initializers)
        return self.model


def build_sim_model(
    model: onnx.ModelProto, quantizers: list[QcQuantizeOp], *, weights: str = "fake", min_opset: int = 1
) -> onnx.ModelProto:
    """A copy of ``model`` with every enabled, initialised quantizer applied (see module docstring).

    Quantizers without an encoding (uncalibrated activations) are skipped: they pass data through.
    """
    if weights not in ("fake", "qdq"):
        raise ValueError(f"weights must be 'fake' or 'qdq', got {weights!r}")
    active = [q for q in quantizers if q.enabled and q.is_initialized()]
    work = onnx.ModelProto()
    work.CopyFrom(model)
    work = _with_opset(work, max(required_opset(active, weights), min_opset))
    builder = _SimBuilder(work, weights)
    for q in active:
        for name in q.tensors:
            if name in builder.initializers:
                builder.add_constant_quantizer(name, q)
            elif name in builder.index.producer or name in builder.index.graph_inputs:
                builder.add_activation_quantizer(name, q)
    return builder.finish()
