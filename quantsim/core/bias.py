"""int32 bias quantization for Conv/ConvTranspose/Gemm/MatMul+Add: scale ``s_in * s_w``, zero point 0.

PURE numpy. The accumulator of an integer convolution is ``sum(q_x - z_x) * (q_w - z_w)`` in units of
``s_in * s_w``; a bias added to it must live on the same grid, so ``b_q = round(b / (s_in * s_w))``
(ties to even, as ONNX QuantizeLinear), saturated to int32. The scale is computed in float32 exactly
as onnxruntime multiplies the two float32 scales.
"""
from __future__ import annotations

import numpy as np

__all__ = ["bias_scale", "quantize_bias"]

_INT32 = np.iinfo(np.int32)


def bias_scale(input_scale, weight_scale) -> np.ndarray:
    """float32 ``s_in * s_w`` (per output channel when the weight scale is)."""
    return (np.float32(input_scale) * np.asarray(weight_scale, dtype=np.float32)).astype(np.float32)


def quantize_bias(bias: np.ndarray, input_scale, weight_scale) -> tuple[np.ndarray, np.ndarray]:
    """``(int32 codes, float32 scale)`` of ``bias`` on the accumulator grid."""
    scale = bias_scale(input_scale, weight_scale)
    codes = np.rint(np.asarray(bias, dtype=np.float32) / scale)
    return np.clip(codes, _INT32.min, _INT32.max).astype(np.int32), scale
