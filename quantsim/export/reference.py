"""Integer reference executor: runs a "fully integer" ONNX model in numpy and proves what it computes.

``run_integer_model(model, feeds)`` executes the graph node by node the way integer hardware does (Jacob et
al. 2018; gemmlowp / TFLite; reference/onnxruntime_integer.md §5): int32 accumulation, requantization by a
per-channel fixed-point (mantissa, shift) computed once from the op's float scales (saturating rounding
doubling high multiply + rounding right shift), clamping to the output grid; sigmoid and softmax's exp
through lookup tables built once from the scales. Float appears only at the boundary (Q/DQ,
DynamicQuantizeLinear, float-output QGemm, MatMulIntegerToFloat) and in float chains after ConvInteger /
MatMulInteger (Cast -> Mul). Kernels and their numerics: `quantsim.export.reference_ops`.

onnxruntime's QLinearConv / QLinearMatMul / QGemm requantize with an fp32 multiplier, so ORT agreeing with
the sim says nothing about a fixed-point deployment; this executor is one. `compare_with_onnxruntime`
states per output the largest difference in output steps (LSB) and the fraction within one LSB.

`SUPPORTED_OPS` lists the (domain, op) pairs: the QLinear* / integer ops of `reference_ops` plus data
movement and integer ops on codes (MaxPool, NhwcMaxPool, Reshape, Flatten, Transpose, Squeeze, Unsqueeze,
Slice, Resize nearest, Split, Pad, Concat, Gather(Elements), DepthToSpace, SpaceToDepth, ReduceMax/Min,
Cast, Max, Min, Clip, Relu, Identity, Dropout, Expand, Tile, Shape, Size, Constant, and Add/Sub/Mul/Div
with numpy semantics of the operand type: integer wrap-around, float32 for dequantized chains). Anything
else raises NotImplementedError naming the node (or, with ``float_fallback=True``, float islands run
through ``onnx.reference``). Initializers are read as given.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .reference_ops import BOUNDARY_OPS, QUANT_KERNELS, extract_windows, pool_geometry

__all__ = ["IntegerReferenceExecutor", "run_integer_model", "compare_with_onnxruntime", "SUPPORTED_OPS"]


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


_MOVEMENT = {
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

#: (domain, op_type) pairs the executor runs
SUPPORTED_OPS = frozenset(
    set(QUANT_KERNELS) | {("", op) for op in _MOVEMENT} | {("", "Split"), ("com.microsoft", "NhwcMaxPool")}
)


# ------------------------------------------------------------------------------------------------ executor
class IntegerReferenceExecutor:
    """Numpy executor of an integer ONNX model; ``run(feeds)`` -> ``{output name: array}``.

    After a run, ``trace`` lists ``(node name, op type, kind)`` with kind ``"boundary"`` (float <-> int
    conversion), ``"integer"`` (integer outputs only) or ``"float"`` (a float op, e.g. a dequantized
    chain after MatMulInteger), so a test can assert where float arithmetic happens.
    """

    def __init__(self, model: onnx.ModelProto, *, float_fallback: bool = False):
        self.model = model
        self.float_fallback = float_fallback
        graph = model.graph
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
        self.initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in self.initializers]
        self.output_names = [o.name for o in graph.output]
        self.trace: list[tuple[str, str, str]] = []
        # fail fast: an unsupported op is reported before any computation
        self._kernels = [self._kernel(node) for node in graph.node]

    def _kernel(self, node: onnx.NodeProto):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
            raise NotImplementedError(f"node {node.name!r} ({node.op_type}): subgraphs are not supported")
        if domain == "" and node.op_type == "Split":
            return lambda ins, attrs, opset: _split(ins, attrs, opset, len(node.output))
        if domain == "com.microsoft" and node.op_type == "NhwcMaxPool":
            return lambda ins, attrs, opset: _max_pool(ins, attrs, opset, channels_last=True)
        if domain == "" and node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
            raise NotImplementedError(f"node {node.name!r} (MaxPool): the Indices output is not supported")
        fn = QUANT_KERNELS.get((domain, node.op_type)) or (_MOVEMENT.get(node.op_type) if domain == "" else None)
        if fn is None and self.float_fallback and domain == "":
            return self._float_kernel(node)
        if fn is None:
            where = f"{domain}::" if domain else ""
            raise NotImplementedError(
                f"integer reference executor: unsupported op {where}{node.op_type} in node {node.name!r} "
                f"(outputs {list(node.output)})"
            )
        return fn

    def _float_kernel(self, node: onnx.NodeProto):
        """A float op outside the quantized region, run by ``onnx.reference`` (only with float_fallback)."""
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(node, opsets={"": self.opsets.get("", 1)})

        def run(ins, attrs, opset):
            codes = [n for n, v in zip(node.input, ins) if v is not None and v.dtype.itemsize <= 2
                     and np.issubdtype(v.dtype, np.integer)]
            if codes:
                raise NotImplementedError(f"node {node.name!r} ({node.op_type}): float fallback on codes {codes}")
            return evaluator.run(None, {n: v for n, v in zip(node.input, ins) if n})

        return run

    def run_node(self, index: int, env: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Outputs of the graph's ``index``-th node, its inputs read from ``env``."""
        node = self.model.graph.node[index]
        domain = "" if node.domain == "ai.onnx" else node.domain
        attrs = {}
        for a in node.attribute:
            v = helper.get_attribute_value(a)
            attrs[a.name] = v.decode() if isinstance(v, bytes) else v
        try:
            ins = [env[n] if n else None for n in node.input]
        except KeyError as err:
            raise ValueError(f"node {node.name!r} ({node.op_type}) reads {err} before it is produced") from None
        return [np.asarray(v) for v in self._kernels[index](ins, attrs, self.opsets.get(domain, 1))]

    def run_all(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every tensor value of the graph (initializers, feeds, node outputs)."""
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ValueError(f"missing feeds for graph inputs {missing}")
        env = dict(self.initializers)
        env.update({k: np.asarray(v) for k, v in feeds.items()})
        self.trace = []
        for index, node in enumerate(self.model.graph.node):
            outs = self.run_node(index, env)
            env.update((name, value) for name, value in zip(node.output, outs) if name)
            self.trace.append((node.name, node.op_type, self._kind(node.op_type, outs)))
        return env

    @staticmethod
    def _kind(op_type: str, outs) -> str:
        is_float = any(np.issubdtype(np.asarray(o).dtype, np.floating) for o in outs)
        if op_type in BOUNDARY_OPS or (op_type == "QGemm" and is_float):
            return "boundary"
        return "float" if is_float else "integer"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        env = self.run_all(feeds)
        return {name: env[name] for name in self.output_names}

    @property
    def float_nodes(self) -> list[str]:
        """Names of the nodes of the last run that computed in float (boundary ops included)."""
        return [name for name, _, kind in self.trace if kind != "integer"]


def run_integer_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *,
                      float_fallback: bool = False) -> dict[str, np.ndarray]:
    """Run ``model`` in the integer reference executor; ``{graph output name: numpy array}``.

    ``float_fallback=True`` runs unsupported standard ops whose data inputs are float (islands between
    DequantizeLinear and QuantizeLinear) with ``onnx.reference``; they show as "float" in the trace.
    """
    return IntegerReferenceExecutor(model, float_fallback=float_fallback).run(feeds)


# ------------------------------------------------------------------------------------------------ comparison
def _output_lsb(producer, env, ref: np.ndarray):
    """Size of one step of a tensor (1 for integer codes) made by ``producer``, broadcast to ``ref``."""
    if np.issubdtype(ref.dtype, np.integer):
        return np.ones((), np.float64)
    if producer is None or producer.op_type != "DequantizeLinear":
        return None
    scale = np.asarray(env[producer.input[1]], np.float64)
    if scale.size == 1:
        return scale.reshape(())
    axis = next((a.i for a in producer.attribute if a.name == "axis"), 1) % ref.ndim
    block = next((a.i for a in producer.attribute if a.name == "block_size"), 0)
    if block:
        return np.take(np.repeat(scale, block, axis=axis), np.arange(ref.shape[axis]), axis=axis)
    shape = [1] * ref.ndim
    shape[axis] = -1
    return scale.reshape(shape)


def _onnxruntime_values(model: onnx.ModelProto, feeds, extra: dict[str, np.dtype]) -> dict[str, np.ndarray]:
    """Graph outputs (and the ``extra`` tensors, exposed as outputs) from a default onnxruntime session."""
    import onnxruntime as ort  # only this check touches onnxruntime

    if extra:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        known = {o.name for o in model.graph.output}
        model.graph.output.extend(
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(t), None)
            for n, t in extra.items() if n not in known
        )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def compare_with_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, layerwise: bool = False,
                             float_fallback: bool = False) -> dict[str, dict]:
    """Run ``model`` in onnxruntime (default CPU session) and in the reference executor.

    Returns ``{output name: {"max_lsb_diff", "frac_within_1_lsb", "frac_exact", "max_abs_diff",
    "num_elements", "lsb"}}``. The LSB is 1 for integer outputs and the DequantizeLinear scale for a
    dequantized float output (per element when per axis); for another float output (float QGemm,
    MatMulIntegerToFloat, a float chain) ``lsb`` is None and the LSB figures use the raw difference.

    ``layerwise=True`` reports every node output instead, each computed by the executor from
    onnxruntime's values of that node's inputs: per-op agreement, free of differences propagated from
    earlier layers (end to end, a one-LSB difference can grow through the following layers).
    """
    executor = IntegerReferenceExecutor(model, float_fallback=float_fallback)
    env = executor.run_all(feeds)
    names = list(executor.output_names)
    if layerwise:
        names += [o for n in model.graph.node for o in n.output if o and o not in names]
    theirs = _onnxruntime_values(model, feeds, {n: env[n].dtype for n in names} if layerwise else {})
    if layerwise:
        ort_env = {**executor.initializers, **{k: np.asarray(v) for k, v in feeds.items()}, **theirs}
        for index, node in enumerate(model.graph.node):
            env.update((o, v) for o, v in zip(node.output, executor.run_node(index, ort_env)) if o)
    producers = {o: node for node in model.graph.node for o in node.output}
    report = {}
    for name in names:
        ref, got = np.asarray(env[name]), np.asarray(theirs[name])
        if ref.shape != got.shape:
            raise AssertionError(f"output {name!r}: reference shape {ref.shape} != onnxruntime {got.shape}")
        diff = np.abs(ref.astype(np.float64) - got.astype(np.float64))
        lsb = _output_lsb(producers.get(name), env, ref)
        steps = diff if lsb is None else np.rint(diff / lsb)  # a dequantized difference is k * scale
        report[name] = {
            "max_lsb_diff": float(steps.max(initial=0.0)),
            "frac_within_1_lsb": float(np.mean(steps <= 1)) if steps.size else 1.0,
            "frac_exact": float(np.mean(steps == 0)) if steps.size else 1.0,
            "max_abs_diff": float(diff.max(initial=0.0)),
            "num_elements": int(ref.size),
            "lsb": None if lsb is None else float(np.min(lsb)),
        }
    return report
