"""Low-power blockwise quantization (LPBQ) scale maths. PURE: numpy only.

An LPBQ grid is a symmetric per-block grid (one scale per output channel and block of input channels)
whose block scales are themselves quantized: within a channel, ``block_scale = int_scale * channel_scale``
with ``int_scale`` an integer in ``[1, 2^scale_bits]`` and one float ``channel_scale``. AIMET 2.42
(``lpbq_utils.grouped_dynamic_quantize``) derives them from the min-max block scales ``s`` as

* ``channel_scale = max_blocks(s) / 2^scale_bits`` (float64; the division by a power of two is exact),
* ``int_scale = clip(round(s / channel_scale), 1, 2^scale_bits)`` (numpy's ``round``: ties to even),

so the largest block of a channel always gets ``int_scale = 2^scale_bits`` (16 for 4 scale bits, one
more than a 4-bit unsigned code holds; AIMET writes it as is). The grid the weights are quantized on is
the effective block scale ``int_scale * channel_scale`` (float64, applied in float32). Compressing an
already compressed grid gives it back unchanged (``max = 2^scale_bits * channel_scale`` exactly), so
re-deriving is safe wherever an encoding is (re)installed.
"""
from __future__ import annotations

import numpy as np

from quantsim.errors import InvalidArgumentError

__all__ = ["compress_block_scales", "lpbq_block_scales", "decompose_block_scales"]


def _check(scale: np.ndarray, scale_bits: int) -> np.ndarray:
    scale = np.asarray(scale, dtype=np.float64)
    if scale.ndim != 2:
        raise InvalidArgumentError(f"LPBQ block scales must have shape (channels, blocks), got {scale.shape}")
    if not np.isfinite(scale).all() or (scale <= 0).any():
        raise InvalidArgumentError("LPBQ block scales must be finite and positive")
    if not 1 <= int(scale_bits) <= 16:
        raise InvalidArgumentError(f"LPBQ scale_bits must be in 1..16, got {scale_bits}")
    return scale


def decompose_block_scales(scale: np.ndarray, scale_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``(int_scale, channel_scale)`` of block scales ``scale`` (C, n_blocks): int64 (C, n_blocks) in
    ``[1, 2^scale_bits]`` and float64 (C,), as AIMET computes them (module docstring)."""
    scale = _check(scale, scale_bits)
    top = float(1 << int(scale_bits))
    channel_scale = scale.max(axis=1) / top
    int_scale = np.clip(np.round(scale / channel_scale[:, None]), 1, top).astype(np.int64)
    return int_scale, channel_scale


def lpbq_block_scales(int_scale: np.ndarray, channel_scale: np.ndarray) -> np.ndarray:
    """The effective block scales ``int_scale * channel_scale`` (float64, shape of ``int_scale``)."""
    int_scale = np.asarray(int_scale)
    channel_scale = np.asarray(channel_scale, dtype=np.float64).reshape(-1)
    if int_scale.ndim != 2 or int_scale.shape[0] != channel_scale.size:
        raise InvalidArgumentError(f"LPBQ integer scales of shape {int_scale.shape} do not fit "
                                   f"{channel_scale.size} channel scales")
    return int_scale.astype(np.float64) * channel_scale[:, None]


def compress_block_scales(scale: np.ndarray, scale_bits: int) -> np.ndarray:
    """Block scales (C, n_blocks) moved onto the LPBQ grid: ``int_scale * channel_scale``."""
    return lpbq_block_scales(*decompose_block_scales(scale, scale_bits))
