"""Data-movement and float kernels of the integer reference executor (`quantsim.export.reference.executor`).

A kernel takes ``(inputs, attrs, opset)`` (missing optional inputs are ``None``) and returns its outputs.
These ops move, select or compare elements (Reshape, Transpose, Slice, Split, Pad, Resize nearest,
MaxPool, Gather, DepthToSpace, ...) or compute with numpy semantics of the operand type (Add/Sub/Mul/Div,
Cast, Clip, Max/Min): integer wrap-around on codes, float32 for dequantized chains. `MOVEMENT_KERNELS` maps
op type (default domain) -> kernel; `_split` and `_max_pool` also take the output count / layout.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantsim.export.reference.numerics import extract_windows, pool_geometry

__all__ = ["MOVEMENT_KERNELS"]  # the executor also uses _split and _max_pool (multi-output / channels-last)


def _np_dtype(onnx_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type))


def _ints(t) -> list[int]:
    return [int(v) for v in np.asarray(t).reshape(-1)]


def _axes(ins, attrs, opset, input_from: int, index: int = 1):
    """``axes`` from an input (opset >= input_from) or the attribute."""
    if opset >= input_from:
        return _ints(ins[index]) if len(ins) > index and ins[index] is not None else None
    return attrs.get("axes")


# ------------------------------------------------------------------------------------------------ data movement
def _reshape(ins, attrs, opset):
    x, shape = ins[0], _ints(ins[1])
    if not int(attrs.get("allowzero", 0)):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


def _flatten(ins, attrs, opset):
    x = ins[0]
    axis = int(attrs.get("axis", 1)) % (x.ndim + 1) if x.ndim else 0
    return [x.reshape(math.prod(x.shape[:axis]), -1)]


def _transpose(ins, attrs, opset):
    return [np.transpose(ins[0], attrs.get("perm"))]


def _squeeze(ins, attrs, opset):
    axes = _axes(ins, attrs, opset, 13)
    x = ins[0]
    return [np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(a % x.ndim for a in axes))]


def _unsqueeze(ins, attrs, opset):
    axes = _axes(ins, attrs, opset, 13)
    x = ins[0]
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(a % rank for a in axes)))]


def _slice(ins, attrs, opset):
    x = ins[0]
    if opset >= 10:
        starts, ends = _ints(ins[1]), _ints(ins[2])
        axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    else:
        starts, ends = attrs["starts"], attrs["ends"]
        axes, steps = attrs.get("axes", list(range(len(starts)))), [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a % x.ndim] = slice(s, e, st)  # Python slicing clamps exactly as ONNX Slice does
    return [x[tuple(index)]]


def _split(ins, attrs, opset, n_outputs: int):
    x = ins[0]
    axis = int(attrs.get("axis", 0)) % x.ndim
    split = (_ints(ins[1]) if len(ins) > 1 and ins[1] is not None else None) if opset >= 13 else attrs.get("split")
    if split is None:
        n = int(attrs.get("num_outputs", n_outputs))
        chunk = -(-x.shape[axis] // n)
        split = [min(chunk, x.shape[axis] - i * chunk) for i in range(n)]
    return np.split(x, np.cumsum(split)[:-1], axis=axis)


def _pad(ins, attrs, opset):
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


def _resize(ins, attrs, opset):
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


def _max_pool(ins, attrs, opset, channels_last: bool = False):
    x = np.moveaxis(ins[0], -1, 1) if channels_last else ins[0]
    if int(attrs.get("storage_order", 0)):
        raise NotImplementedError("MaxPool storage_order=1")
    kernel = list(attrs["kernel_shape"])
    begin, end, out, strides, dil = pool_geometry(x.shape[2:], kernel, attrs, bool(attrs.get("ceil_mode", 0)))
    fill = np.iinfo(x.dtype).min if np.issubdtype(x.dtype, np.integer) else -np.inf
    win = extract_windows(x, begin, end, out, kernel, strides, dil, fill)
    y = win.max(axis=tuple(range(-len(kernel), 0)))
    return [np.moveaxis(y, 1, -1) if channels_last else y]


def _gather(ins, attrs, opset):
    data, idx = ins[0], np.asarray(ins[1]).astype(np.int64)
    axis = int(attrs.get("axis", 0)) % data.ndim
    return [np.take(data, np.where(idx < 0, idx + data.shape[axis], idx), axis=axis)]


def _gather_elements(ins, attrs, opset):
    data, idx = ins[0], np.asarray(ins[1]).astype(np.int64)
    axis = int(attrs.get("axis", 0)) % data.ndim
    return [np.take_along_axis(data, np.where(idx < 0, idx + data.shape[axis], idx), axis=axis)]


def _clip(ins, attrs, opset):
    x = ins[0]
    if opset >= 11:
        lo = ins[1] if len(ins) > 1 and ins[1] is not None else None
        hi = ins[2] if len(ins) > 2 and ins[2] is not None else None
    else:
        lo, hi = attrs.get("min"), attrs.get("max")
    if lo is not None:
        x = np.maximum(x, np.asarray(lo).astype(x.dtype))
    if hi is not None:
        x = np.minimum(x, np.asarray(hi).astype(x.dtype))
    return [x]


def _div(ins, attrs, opset):
    a, b = ins
    if np.issubdtype(np.asarray(a).dtype, np.integer):  # C integer division truncates toward zero
        q = np.abs(a).astype(np.int64) // np.abs(b).astype(np.int64)
        return [(np.sign(a).astype(np.int64) * np.sign(b) * q).astype(np.result_type(a, b))]
    return [np.divide(a, b)]


def _constant(ins, attrs, opset):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attrs:
            v = attrs[key]
            if isinstance(v, onnx.TensorProto):
                return [numpy_helper.to_array(v)]
            return [np.asarray(v, np.float32 if "float" in key else np.int64)]
    raise NotImplementedError("Constant without value / value_float(s) / value_int(s)")


def _shape(ins, attrs, opset):
    dims = np.asarray(ins[0].shape, np.int64)
    return [dims[attrs.get("start", 0): attrs.get("end", None)]]


def _depth_to_space(ins, attrs, opset):
    x, bs = ins[0], int(attrs["blocksize"])
    b, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        y = x.reshape(b, bs, bs, c // bs**2, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:  # CRD
        y = x.reshape(b, c // bs**2, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [y.reshape(b, c // bs**2, h * bs, w * bs)]


def _space_to_depth(ins, attrs, opset):
    x, bs = ins[0], int(attrs["blocksize"])
    b, c, h, w = x.shape
    y = x.reshape(b, c, h // bs, bs, w // bs, bs).transpose(0, 3, 5, 1, 2, 4)
    return [y.reshape(b, c * bs * bs, h // bs, w // bs)]


def _reduce(fn):
    def run(ins, attrs, opset):
        axes = _axes(ins, attrs, opset, 18)
        if not axes and int(attrs.get("noop_with_empty_axes", 0)):
            return [ins[0]]
        axes = tuple(axes) if axes else None
        return [fn(ins[0], axis=axes, keepdims=bool(int(attrs.get("keepdims", 1))))]
    return run


def _binary(fn):
    return lambda ins, attrs, opset: [fn(ins[0], ins[1])]


MOVEMENT_KERNELS = {
    "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Slice": _slice, "Pad": _pad, "Resize": _resize, "MaxPool": _max_pool,
    "Gather": _gather, "GatherElements": _gather_elements, "Clip": _clip, "Div": _div,
    "Constant": _constant, "Shape": _shape,
    "Concat": lambda ins, attrs, opset: [np.concatenate(ins, axis=int(attrs["axis"]))],
    "Cast": lambda ins, attrs, opset: [np.asarray(ins[0]).astype(_np_dtype(attrs["to"]))],
    "Identity": lambda ins, attrs, opset: [ins[0]],
    "Relu": lambda ins, attrs, opset: [np.maximum(ins[0], np.zeros((), ins[0].dtype))],
    "Max": lambda ins, attrs, opset: [np.maximum.reduce(np.broadcast_arrays(*ins))],
    "Min": lambda ins, attrs, opset: [np.minimum.reduce(np.broadcast_arrays(*ins))],
    "Expand": lambda ins, attrs, opset: [ins[0] * np.ones(_ints(ins[1]), ins[0].dtype)],
    "Tile": lambda ins, attrs, opset: [np.tile(ins[0], _ints(ins[1]))],
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply),
    "DepthToSpace": _depth_to_space, "SpaceToDepth": _space_to_depth,
    "ReduceMax": _reduce(np.max), "ReduceMin": _reduce(np.min),
    "Size": lambda ins, attrs, opset: [np.asarray(np.asarray(ins[0]).size, np.int64)],
    "Dropout": lambda ins, attrs, opset: [ins[0]],
}
