"""The two standard kernels the integer reference executor cannot take from ``onnx.reference``.

A kernel takes ``(inputs, attrs, opset)`` (missing optional inputs are ``None``) and returns its outputs.

* `pad`: negative pads crop, as onnxruntime applies them; onnx.reference's Pad refuses them.
* `nearest_resize`: nearest-neighbour Resize on codes with float32 coordinate maths like onnxruntime,
  including ``tf_half_pixel_for_nn`` and Resize-10's ``simple`` rounding, which onnx.reference lacks.
"""
from __future__ import annotations

import numpy as np

__all__ = ["pad", "nearest_resize"]


def _ints(t) -> list[int]:
    return [int(v) for v in np.asarray(t).reshape(-1)]


def pad(ins, attrs, opset):
    x = ins[0]
    if opset >= 11:
        pads = _ints(ins[1])
        value = ins[2] if len(ins) > 2 and ins[2] is not None and np.asarray(ins[2]).size else 0
        axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(x.ndim))
    else:
        pads, value, axes = list(attrs["pads"]), attrs.get("value", 0.0), list(range(x.ndim))
    widths = [[0, 0] for _ in range(x.ndim)]
    for i, a in enumerate(axes):
        widths[a % x.ndim] = [pads[i], pads[i + len(axes)]]
    crop = tuple(slice(-b if b < 0 else None, e if e < 0 else None) for b, e in widths)
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        return [np.pad(x, widths, constant_values=np.asarray(value).astype(x.dtype))]
    return [np.pad(x, widths, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])]


def _nearest_index(out_len, in_len, scale, ctm, mode):
    """Input index of every output position along one axis (float32 coordinate maths, like onnxruntime)."""
    o = np.arange(out_len, dtype=np.float32)
    s = np.float32(scale)
    half = np.float32(0.5)
    if ctm == "asymmetric":
        c = o / s
    elif ctm == "half_pixel":
        c = (o + half) / s - half
    elif ctm == "pytorch_half_pixel":
        c = (o + half) / s - half if out_len > 1 else np.zeros_like(o)
    elif ctm == "tf_half_pixel_for_nn":
        c = (o + half) / s
    elif ctm == "align_corners":
        c = o * np.float32(in_len - 1) / np.float32(out_len - 1) if out_len > 1 else np.zeros_like(o)
    elif ctm == "half_pixel_symmetric":
        adjust = np.float32(out_len) / (s * np.float32(in_len))
        c = np.float32(in_len) / 2 * (1 - adjust) + (o + half) / s - half
    else:
        raise NotImplementedError(f"Resize coordinate_transformation_mode={ctm!r}")
    fl = np.floor(c)
    tie = c == fl + half
    if mode == "round_prefer_floor":
        idx = np.where(tie, fl, np.floor(c + half))
    elif mode == "round_prefer_ceil":
        idx = np.where(tie, fl + 1, np.floor(c + half))
    elif mode == "floor":
        idx = fl
    elif mode == "ceil":
        idx = np.ceil(c)
    elif mode == "simple":  # Resize-10 / Upsample
        idx = np.ceil(c) if scale < 1 else fl
    else:
        raise NotImplementedError(f"Resize nearest_mode={mode!r}")
    return np.clip(idx, 0, in_len - 1).astype(np.int64)


def nearest_resize(ins, attrs, opset):
    x = ins[0]
    if attrs.get("mode", "nearest") != "nearest":
        raise NotImplementedError(f"Resize mode={attrs.get('mode')!r} (only 'nearest' runs on integer codes)")
    if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise NotImplementedError("Resize keep_aspect_ratio_policy other than 'stretch'")
    if opset < 11:
        scales, sizes, ctm, mode = ins[1], None, "asymmetric", "simple"
    else:
        scales = ins[2] if len(ins) > 2 else None
        sizes = ins[3] if len(ins) > 3 else None
        ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
        mode = attrs.get("nearest_mode", "round_prefer_floor")
    axes = [a % x.ndim for a in attrs.get("axes", range(x.ndim))]
    for i, a in enumerate(axes):
        n = x.shape[a]
        if sizes is not None and np.asarray(sizes).size:
            out = int(np.asarray(sizes).reshape(-1)[i])
            scale = np.float32(out) / np.float32(n)
        else:
            scale = np.float32(np.asarray(scales).reshape(-1)[i])
            out = int(np.floor(np.float32(n) * scale))
        x = np.take(x, _nearest_index(out, n, scale, ctm, mode), axis=a)
    return [x]
