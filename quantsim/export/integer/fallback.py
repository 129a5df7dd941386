"""Float islands: a node the integer lowering cannot handle runs exactly as in the sim.

Each integer input is turned back into its sim value by ``Cast -> Sub -> Mul`` (bit-identical to
DequantizeLinear, but invisible to onnxruntime's Q/DQ fusions, which would otherwise re-quantize a float
Conv's weights per tensor or fuse the island into kernels the sim does not use), the node runs in float
with the sim's constants (fake-quantized weights, fp16-rounded values), and its outputs get the sim's
quantizers:

* a grid of at most 8 bits (`Grid`, sub-8-bit grids included): ``[Clip] -> QuantizeLinear`` to uint8
  codes, so integer ops can follow;
* a wider integer grid (9..16-bit): ``[Clip] -> QuantizeLinear`` in its 16-bit storage type, as the sim
  builds it (com.microsoft QuantizeLinear below opset 21, where ai.onnx has none), then the codes back to
  float. (4-bit storage types are never used: onnxruntime cannot Cast them, so a 4-bit graph would not load.)
* float16: ``Cast(float16) -> Cast(float)`` (nothing on a float16 tensor);
* no quantizer: the float value is kept.

A float16 tensor's value is cast to float32 before its quantizer and back after it, as the sim does
(`float_types`). The result equals the sim on that node; the export's report lists it with the reason.
"""
from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto

from quantsim.errors import IntegerExportError
from quantsim.export.integer.context import MS_DOMAIN, Grid, LoweringContext, Unsupported
from quantsim.export.integer.float_types import as_float32, as_own_type, is_half
from quantsim.graph.index import rename_outer_references, subgraph_references

_log = logging.getLogger(__name__)

__all__ = ["lower_in_float", "apply_quantizer", "emit_as_is"]

_WIDE_TYPES = {TensorProto.INT16, TensorProto.UINT16}


def apply_quantizer(ctx: LoweringContext, tensor: str, source: str) -> None:
    """Give ``tensor`` its sim value from the float ``source`` (see the module docstring)."""
    q = ctx.quantizer(tensor)
    if q is None:
        ctx.floats[tensor] = source
        return
    if q.spec.is_float:
        if is_half(ctx, tensor):  # float16 precision on a float16 tensor changes nothing (as in the sim)
            ctx.floats[tensor] = source
            return
        half, back = ctx.fresh(f"{tensor}/fp16"), ctx.fresh(f"{tensor}/fp16_round_trip")
        ctx.emit("Cast", [source], [half], name=f"{tensor}/cast_fp16", to=TensorProto.FLOAT16)
        ctx.emit("Cast", [half], [back], name=f"{tensor}/cast_fp32", to=TensorProto.FLOAT)
        ctx.floats[tensor] = back
        return
    enc = q.encoding
    grid = Grid.from_encoding(enc)
    if grid is not None:
        ctx.floats[tensor] = source  # provisional: int_input quantizes it, then the DQ value replaces it
        ctx.int_input(tensor)
        del ctx.floats[tensor]
        return
    if not enc.is_per_tensor:
        raise IntegerExportError(f"activation {tensor!r} has a per-channel encoding: not exportable")
    storage = q.spec.dtype.storage_type(enc.signed)
    if storage not in _WIDE_TYPES:
        raise IntegerExportError(f"activation {tensor!r}: no onnxruntime-loadable container for its "
                                 f"{enc.bits}-bit grid ({onnx.TensorProto.DataType.Name(storage)})")
    domain = MS_DOMAIN if ctx.opset < 21 else ""
    source = as_float32(ctx, source, tensor)
    scale = ctx.scalar(np.float32(enc.scale), np.float32, f"{tensor}/scale")
    zp = ctx.scalar(int(enc.zero_point), onnx.helper.tensor_dtype_to_np_dtype(storage), f"{tensor}/zero_point")
    if not enc.full_storage_range:
        lo = np.float32(np.float32(enc.scale) * np.float32(enc.qmin - int(enc.zero_point)))
        hi = np.float32(np.float32(enc.scale) * np.float32(enc.qmax - int(enc.zero_point)))
        source = ctx.float_clip(source, float(lo), float(hi), tensor)
    codes = ctx.fresh(f"{tensor}/codes")
    ctx.emit("QuantizeLinear", [source, scale, zp], [codes], name=f"{tensor}/quantize", domain=domain)
    value = ctx.arithmetic_dequantize(codes, float(np.float32(enc.scale)), int(enc.zero_point), tensor)
    ctx.floats[tensor] = as_own_type(ctx, value, tensor)


def emit_as_is(ctx: LoweringContext, node: onnx.NodeProto, inputs: list[str], outputs: list[str]) -> None:
    """Append ``node`` reading ``inputs`` and writing ``outputs``; its subgraphs (If / Loop / Scan bodies, run
    in float as in the sim) read the new graph's float value of each enclosing-scope tensor."""
    attributes_of = node
    references = subgraph_references(node)
    if references:
        attributes_of = onnx.NodeProto()
        attributes_of.CopyFrom(node)
        rename_outer_references(attributes_of, {name: ctx.float_input(name) for name in sorted(references)})
    ctx.emit(node.op_type, inputs, outputs, name=node.name, domain=node.domain, attributes_of=attributes_of)


def lower_in_float(ctx: LoweringContext, node: onnx.NodeProto) -> None:
    """Run ``node`` in float between DequantizeLinear inputs and its outputs' sim quantizers."""
    try:
        inputs = [ctx.float_input(name) for name in node.input]
        outputs = [ctx.fresh(f"{name}/float") if name and ctx.index.is_float(name) else name for name in node.output]
        emit_as_is(ctx, node, inputs, outputs)
    except Unsupported as error:
        raise IntegerExportError(f"node {node.name!r}: {error}") from error
    _log.info("integer export: node %r (%s) runs in float", node.name, node.op_type)
    for name, out in zip(node.output, outputs):
        if name and ctx.index.is_float(name):
            apply_quantizer(ctx, name, out)
