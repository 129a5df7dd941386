"""The QDQ form of an LPBQ weight's scales: a DequantizeLinear of the integer block scales.

``scale = DequantizeLinear(int_scale, channel_scale, 0, axis=channel axis)`` feeds the weight's blocked
DequantizeLinear as its scale, as aimet-onnx 2.42's ``to_onnx_qdq`` writes it (``<w>_scale_q`` uint8,
``<w>_meta_scale`` float32 per channel, ``<w>_meta_zero_point`` zeros). onnxruntime computes
``float32(int_scale) * float32(channel_scale)``; the sim applies ``float32(int_scale * channel_scale)``
(float64 product, as AIMET's simulation does), so a block scale can differ by one float32 rounding between
the two (values by at most one float32 ulp; the integer codes are the sim's).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim.core.lpbq import decompose_block_scales
from quantsim.core.numerics import Encoding
from quantsim.core.spec import LPBQ

__all__ = ["lpbq_scale_nodes", "int_scale_type"]


def int_scale_type(scale_bits: int) -> int:
    """The narrowest unsigned (or int32) ONNX type holding codes ``1 .. 2^scale_bits``."""
    top = 1 << scale_bits
    return TensorProto.UINT8 if top <= 0xFF else TensorProto.UINT16 if top <= 0xFFFF else TensorProto.INT32


def lpbq_scale_nodes(scale_name: str, enc: Encoding, granularity: LPBQ, onnx_layout) -> tuple[list[TensorProto], onnx.NodeProto]:
    """Initializers and the DequantizeLinear node computing the blocked scale tensor ``scale_name``.

    ``onnx_layout(enc)`` turns an encoding's (C, n_blocks) scales into the blocked DQ layout (the builder's
    own layout function, so the integer scales sit exactly where the float ones would)."""
    int_scale, channel_scale = decompose_block_scales(enc.scale, granularity.scale_bits)
    blocked = onnx_layout(replace(enc, scale=int_scale.astype(np.float64)))
    elem_type = int_scale_type(granularity.scale_bits)
    codes = np.rint(blocked).astype(helper.tensor_dtype_to_np_dtype(elem_type))
    zeros = np.zeros(channel_scale.shape, dtype=codes.dtype)
    names = [f"{scale_name}/int_scale", f"{scale_name}/channel_scale", f"{scale_name}/channel_zero_point"]
    tensors = [numpy_helper.from_array(codes, names[0]),
               numpy_helper.from_array(channel_scale.astype(np.float32), names[1]),
               numpy_helper.from_array(zeros, names[2])]
    assert enc.axis is not None  # a blockwise encoding has its channel axis
    node = helper.make_node("DequantizeLinear", names, [scale_name], name=f"{scale_name}/dequantize",
                            axis=enc.axis % blocked.ndim)
    return tensors, node
