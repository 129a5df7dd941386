"""Integer reference executor: runs a "fully integer" ONNX model in numpy and proves what it computes.

``run_integer_model(model, feeds)`` executes the graph the way integer hardware does (Jacob et al. 2018;
gemmlowp / TFLite; reference/onnxruntime_integer.md §5): int32 accumulation, requantization by a
per-channel fixed-point (mantissa, shift) computed once from the op's float scales (saturating rounding
doubling high multiply + rounding right shift), clamping to the output grid; sigmoid and softmax's exp
through lookup tables built once from the scales. Float appears only at the boundary (Q/DQ,
DynamicQuantizeLinear, float-output QGemm, MatMulIntegerToFloat) and in float chains after ConvInteger /
MatMulInteger (Cast -> Mul).

The graph runs on ``onnx.reference.ReferenceEvaluator``: standard ops (data movement and selection on
codes, Cast, Clip, Add/Mul/... with numpy semantics of the operand type) on onnx's own kernels, and only
what onnx lacks or computes differently from integer deployment as custom ops (``new_ops``): the QLinear*,
ConvInteger/MatMulInteger, QGemm and com.microsoft kernels of `quantsim.export.reference.qlinear_linear`
and `quantsim.export.reference.qlinear_elementwise`, QuantizeLinear/DequantizeLinear (onnxruntime's NaN
saturation and float32 arithmetic), integer Div (C truncation toward zero, where onnx's kernel returns
floats), GatherElements (onnx's kernel handles at most 64 rows) and com.microsoft NhwcMaxPool.

onnxruntime's QLinearConv / QLinearMatMul / QGemm requantize with an fp32 multiplier, so ORT agreeing with
the sim says nothing about a fixed-point deployment; this executor is one. ``rounding`` picks its
requantization: ``"double"`` (default; gemmlowp's SRDHM + rounding shift, TFLite's reference kernels) rounds
twice, so results within ``2^-(e+1)`` of a midpoint move by one step (``e`` the right shift: 0.2-0.3% of
MiniLM's Gemm outputs, 5.4% of a PP-OCR det depthwise layer's); ``"single"`` (TFLite's
``TFLITE_SINGLE_ROUNDING``, CMSIS-NN, TOSA ``double_round=false``) rounds the 64-bit product once and gives
onnxruntime's (and the sim's) codes except within about ``2^-31`` of a midpoint. `compare_with_onnxruntime`
states per output the largest difference in output steps (LSB) and the fraction within one LSB.

`SUPPORTED_OPS` lists the (domain, op) pairs it runs: the custom kernels plus the standard data-movement
and integer ops on codes (`STANDARD_OPS`). Anything else raises NotImplementedError naming the node (or,
with ``float_fallback=True``, runs as a float island on onnx's kernels, which may not read codes).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from quantsim.core.fixed_point import ROUNDINGS
from quantsim.errors import InvalidArgumentError
from quantsim.export.reference.movement import nearest_resize, pad
from quantsim.export.reference.numerics import rounding_mode
from quantsim.export.reference.qlinear_linear import BOUNDARY_OPS, QUANT_KERNELS

__all__ = ["IntegerReferenceExecutor", "run_integer_model", "compare_with_onnxruntime", "SUPPORTED_OPS",
           "STANDARD_OPS"]

#: standard ops the executor runs on integer codes with onnx's own kernels
STANDARD_OPS = frozenset(
    """Reshape Flatten Transpose Squeeze Unsqueeze Slice Pad Resize MaxPool Gather GatherElements Clip Div
    Constant Shape Concat Cast Identity Relu Max Min Expand Tile Add Sub Mul DepthToSpace SpaceToDepth
    ReduceMax ReduceMin Size Dropout Split GatherND GlobalMaxPool""".split()
)

#: (domain, op_type) pairs the executor runs
SUPPORTED_OPS = frozenset(set(QUANT_KERNELS) | {("", op) for op in STANDARD_OPS} | {("com.microsoft", "NhwcMaxPool")})


def _integer_div(ins, attrs, opset):
    a, b = ins
    if np.issubdtype(np.asarray(a).dtype, np.integer):  # C integer division truncates toward zero
        q = np.abs(a).astype(np.int64) // np.abs(b).astype(np.int64)
        return [(np.sign(a).astype(np.int64) * np.sign(b) * q).astype(np.result_type(a, b))]
    return [np.divide(a, b)]


def _gather_elements(ins, attrs, opset):
    """GatherElements with numpy's take_along_axis (onnx's kernel uses np.choose: at most 64 rows)."""
    data, indices = ins
    axis = int(attrs.get("axis", 0)) % data.ndim
    indices = np.where(indices < 0, indices + data.shape[axis], indices).astype(np.int64)
    return [np.take_along_axis(data, indices, axis=axis)]


def _global_max_pool(ins, attrs, opset):
    """GlobalMaxPool over every axis after the channels (onnx 1.x's kernel reduces the wrong axes of inputs that
    are not 4-D: magika's ``[N, C, L]`` pooling came out ``[N, 1]``)."""
    x = np.asarray(ins[0])
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]


def _nhwc_max_pool(ins, attrs, opset):
    """com.microsoft NhwcMaxPool: onnx's MaxPool on the NCHW view."""
    node = helper.make_node("MaxPool", ["x"], ["y"], **{k: v for k, v in attrs.items() if v is not None})
    x = np.moveaxis(ins[0], -1, 1)
    (y,) = ReferenceEvaluator(node, opsets={"": 12}).run(None, {"x": x})
    return [np.moveaxis(y, 1, -1)]


def _kernel_class(domain: str, op_type: str, kernel, opset: int) -> type[OpRun]:
    """An ``OpRun`` running ``kernel(inputs, attributes, opset)`` for ``domain::op_type``."""

    def _run(self, *inputs, **attributes):
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attributes.items() if v is not None}
        return tuple(np.asarray(v) for v in kernel(list(inputs), attrs, opset))

    return type(op_type, (OpRun,), {"op_domain": domain, "_run": _run})


def _custom_ops(opsets: dict[str, int]) -> list[type[OpRun]]:
    kernels = dict(QUANT_KERNELS)
    kernels[("", "Div")] = _integer_div
    kernels[("com.microsoft", "NhwcMaxPool")] = _nhwc_max_pool
    kernels[("", "GatherElements")] = _gather_elements  # the integer export's lookup tables (256 rows)
    kernels[("", "GlobalMaxPool")] = _global_max_pool
    kernels[("", "Resize")] = nearest_resize  # onnx.reference lacks tf_half_pixel_for_nn (onnxruntime has it)
    kernels[("", "Pad")] = pad  # onnx.reference refuses negative pads (crops), which onnxruntime applies
    return [_kernel_class(domain, op, fn, opsets.get(domain, 1)) for (domain, op), fn in kernels.items()]


# ------------------------------------------------------------------------------------------------ executor
class IntegerReferenceExecutor:
    """Executor of an integer ONNX model on onnx.reference; ``run(feeds)`` -> ``{output name: array}``.

    After a run, ``trace`` lists ``(node name, op type, kind)`` with kind ``"boundary"`` (float <-> int
    conversion), ``"integer"`` (integer outputs only) or ``"float"`` (a float op, e.g. a dequantized
    chain after MatMulInteger), so a test can assert where float arithmetic happens.
    """

    def __init__(self, model: onnx.ModelProto, *, float_fallback: bool = False, rounding: str = "double"):
        if rounding not in ROUNDINGS:
            raise InvalidArgumentError(f"IntegerReferenceExecutor: rounding must be one of {ROUNDINGS}, got {rounding!r}")
        self.model = model
        self.float_fallback = float_fallback
        self.rounding = rounding
        graph = model.graph
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
        self.initializers = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in self.initializers]
        self.output_names = [o.name for o in graph.output]
        self.trace: list[tuple[str, str, str]] = []
        for node in graph.node:  # fail fast: an unsupported op is reported before any computation
            self._check(node)
        self._new_ops = _custom_ops(self.opsets)
        self._evaluator = ReferenceEvaluator(model, new_ops=self._new_ops)
        self._node_evaluators: dict[int, ReferenceEvaluator] = {}

    def _check(self, node: onnx.NodeProto) -> None:
        domain = "" if node.domain == "ai.onnx" else node.domain
        if any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
            raise NotImplementedError(f"node {node.name!r} ({node.op_type}): subgraphs are not supported")
        if domain == "" and node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
            raise NotImplementedError(f"node {node.name!r} (MaxPool): the Indices output is not supported")
        if (domain, node.op_type) in SUPPORTED_OPS or (self.float_fallback and domain == ""):
            return
        where = f"{domain}::" if domain else ""
        raise NotImplementedError(
            f"integer reference executor: unsupported op {where}{node.op_type} in node {node.name!r} "
            f"(outputs {list(node.output)})"
        )

    def _is_float_island(self, node: onnx.NodeProto) -> bool:
        domain = "" if node.domain == "ai.onnx" else node.domain
        return (domain, node.op_type) not in SUPPORTED_OPS

    def run_node(self, index: int, env: dict[str, Any]) -> list[np.ndarray]:
        """Outputs of the graph's ``index``-th node, its inputs read from ``env``."""
        node = self.model.graph.node[index]
        missing = [n for n in node.input if n and n not in env]
        if missing:
            raise InvalidArgumentError(f"node {node.name!r} ({node.op_type}) reads {missing[0]!r} before it is produced")
        if self._is_float_island(node):
            self._check_float_inputs(node, env)
        evaluator = self._node_evaluators.get(index)
        if evaluator is None:
            evaluator = ReferenceEvaluator(node, opsets=dict(self.opsets), new_ops=self._new_ops)
            self._node_evaluators[index] = evaluator
        with rounding_mode(self.rounding):
            outputs = evaluator.run(None, {n: env[n] for n in node.input if n})
        return [np.asarray(v) for v in outputs]

    @staticmethod
    def _check_float_inputs(node: onnx.NodeProto, env: dict[str, Any]) -> None:
        codes = [n for n in node.input if n and np.asarray(env[n]).dtype.itemsize <= 2
                 and np.issubdtype(np.asarray(env[n]).dtype, np.integer)]
        if codes:
            raise NotImplementedError(f"node {node.name!r} ({node.op_type}): float fallback on codes {codes}")

    def run_all(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every tensor value of the graph (initializers, feeds, node outputs)."""
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InvalidArgumentError(f"missing feeds for graph inputs {missing}")
        inputs = {k: np.asarray(v) for k, v in feeds.items()}
        islands = [n for n in self.model.graph.node if self._is_float_island(n)]
        if islands:  # node by node, so that a float island reading codes is refused before it runs
            env: dict[str, Any] = {**self.initializers, **inputs}
            for index, node in enumerate(self.model.graph.node):
                env.update((o, v) for o, v in zip(node.output, self.run_node(index, env)) if o)
        else:
            with rounding_mode(self.rounding):
                results = self._evaluator.run(None, inputs, intermediate=True)
            assert isinstance(results, dict)  # intermediate=True: every named result
            env = {**self.initializers, **inputs, **results}
        self.trace = [(node.name, node.op_type, self._kind(node.op_type, [env[o] for o in node.output if o]))
                      for node in self.model.graph.node]
        return {k: np.asarray(v) for k, v in env.items()}

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
                      float_fallback: bool = False, rounding: str = "double") -> dict[str, np.ndarray]:
    """Run ``model`` in the integer reference executor; ``{graph output name: numpy array}``.

    ``float_fallback=True`` runs unsupported standard ops whose data inputs are float (islands between
    DequantizeLinear and QuantizeLinear) with ``onnx.reference``; they show as "float" in the trace.
    ``rounding``: ``"double"`` (gemmlowp) or ``"single"`` fixed-point requantization (module docstring).
    """
    return IntegerReferenceExecutor(model, float_fallback=float_fallback, rounding=rounding).run(feeds)


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
                             float_fallback: bool = False, rounding: str = "double") -> dict[str, dict]:
    """Run ``model`` in onnxruntime (default CPU session) and in the reference executor.

    Returns ``{output name: {"max_lsb_diff", "frac_within_1_lsb", "frac_exact", "max_abs_diff",
    "num_elements", "lsb"}}``. The LSB is 1 for integer outputs and the DequantizeLinear scale for a
    dequantized float output (per element when per axis); for another float output (float QGemm,
    MatMulIntegerToFloat, a float chain) ``lsb`` is None and the LSB figures use the raw difference.

    ``layerwise=True`` reports every node output instead, each computed by the executor from
    onnxruntime's values of that node's inputs: per-op agreement, free of differences propagated from
    earlier layers (end to end, a one-LSB difference can grow through the following layers). ``rounding``
    as in `run_integer_model`.
    """
    executor = IntegerReferenceExecutor(model, float_fallback=float_fallback, rounding=rounding)
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
