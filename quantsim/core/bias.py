"""int32 bias quantization for Conv/ConvTranspose/Gemm/MatMul+Add: scale ``s_in * s_w``, zero point 0.

PURE numpy. The accumulator of an integer convolution is ``sum(q_x - z_x) * (q_w - z_w)`` in units of
``s_in * s_w``; a bias added to it must live on the same grid, so ``b_q = round(b / (s_in * s_w))``
(ties to even, as ONNX QuantizeLinear), saturated to int32. The scale is computed in float32 exactly
as onnxruntime multiplies the two float32 scales.

A bias too large for int32 on that grid (a tiny input scale, e.g. a stem Conv on normalised pixels, times
a small weight scale) would saturate. `int32_fitting_weight_scale` enlarges the weight scale of just the
channels concerned so the bias fits, as onnxruntime's ``quantize_static`` does
(``QDQQuantizer._adjust_weight_scale_for_int32_bias``: required bias scale ``1.0001 * 2 max|b| / (2^32 - 2)``,
the weight scale multiplied by the missing ratio); the zero point is kept, so the weight grid only widens.
"""
from __future__ import annotations

import numpy as np

from quantsim.errors import InvalidArgumentError

__all__ = ["bias_scale", "quantize_bias", "fits_int32", "int32_fitting_weight_scale"]

_INT32 = np.iinfo(np.int32)


def bias_scale(input_scale, weight_scale) -> np.ndarray:
    """float32 ``s_in * s_w`` (per output channel when the weight scale is)."""
    return (np.float32(input_scale) * np.asarray(weight_scale, dtype=np.float32)).astype(np.float32)


def quantize_bias(bias: np.ndarray, input_scale, weight_scale) -> tuple[np.ndarray, np.ndarray]:
    """``(int32 codes, float32 scale)`` of ``bias`` on the accumulator grid."""
    scale = bias_scale(input_scale, weight_scale)
    codes = np.rint(np.asarray(bias, dtype=np.float32) / scale).astype(np.float64)  # float32 cannot hold 2^31 - 1
    return np.clip(codes, _INT32.min, _INT32.max).astype(np.int32), scale


def fits_int32(bias: np.ndarray, input_scale, weight_scale) -> bool:
    """Whether every value of ``bias`` is an int32 code on the accumulator grid ``s_in * s_w`` (no saturation).
    A bias that is not (an additive mask of -1e9 after a MatMul, a weight encoding frozen too narrow) stays a
    float in the sim and every export: saturating it would silently add another value."""
    scale = bias_scale(input_scale, weight_scale)
    if np.any(scale <= 0) or not np.all(np.isfinite(scale)):
        return False
    ratio = np.abs(np.asarray(bias, np.float64) / np.asarray(scale, np.float64))
    return bool(np.all(np.isfinite(ratio)) and np.all(ratio <= _INT32.max))


_MARGIN = 1.0001  # onnxruntime's multiplicative epsilon


def int32_fitting_weight_scale(bias: np.ndarray, input_scale, weight_scale) -> np.ndarray | None:
    """The weight scale (same shape as ``weight_scale``: per tensor, or one per bias element) with which
    ``round(bias / (s_in s_w))`` fits int32, or None when it already does.

    Only the channels whose bias overflows change (per tensor: the one scale, by the largest ``|b|``);
    the result is checked in float32 as `quantize_bias` computes it.
    """
    bias = np.abs(np.asarray(bias, np.float64)).reshape(-1)
    scale = np.asarray(weight_scale, np.float64)
    needed = bias.max(initial=0.0) if scale.ndim == 0 else bias
    if scale.ndim and scale.size != needed.size:
        raise InvalidArgumentError(f"{scale.size} weight scales for {needed.size} bias values")
    limit = float(_INT32.max)
    accumulator = np.float64(np.float32(input_scale)) * scale
    smallest = _MARGIN * needed / limit
    if np.all(accumulator >= smallest):
        return None
    fitted = np.where(accumulator < smallest, scale * (smallest / accumulator), scale)
    codes = np.asarray(needed, np.float32) / bias_scale(input_scale, fitted.astype(np.float32))
    while np.any(codes > limit):  # float32 rounding of the new scales: widen by one more ulp
        fitted = np.where(codes > limit, np.nextafter(fitted.astype(np.float32), np.float32(np.inf)), fitted)
        codes = np.asarray(needed, np.float32) / bias_scale(input_scale, fitted.astype(np.float32))
    return fitted.reshape(scale.shape)
