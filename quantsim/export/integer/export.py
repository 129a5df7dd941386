"""Fully integer export: the sim as onnxruntime integer kernels between one Q and one DQ.

``export_integer(sim)`` walks the prepared float model in topological order and lowers each node by the
rule registered for its op type (`LOWERINGS`: one function per op type, in `lowering_linear`,
`lowering_elementwise`, `lowering_movement`, `lowering_lut`, `lowering_batchnorm`, ...), keeping for every
tensor its uint8 codes on the sim's 8-bit grid (`lowering_context`):

    model input -> QuantizeLinear (uint8) -> QLinearConv / QGemm / QLinearAdd / uint8 MaxPool / ...
                -> DequantizeLinear -> model output

With ``integer_io=True`` the boundary Q/DQ are dropped: graph inputs and outputs are the uint8 codes
themselves, and their ``(scale, zero_point)`` are returned in ``io`` and in the model's metadata_props
(``quantsim.io``): ``real = scale * (code - zero_point)``, codes within ``code_range`` (``[0, 255]``, or
the narrower range of a 2..7-bit grid).

Accuracy contract (tests/test_export_integer.py): data movement, clamps, lookup tables and float islands
are exact. Kernels with an int32 accumulator add the bias as ``round(b / (s_in s_w))`` where the sim (like
AIMET) adds the float bias: up to ``0.5 * s_in s_w / s_out`` output steps, so values that close to a
rounding midpoint move by one step (0.05-0.5% of conv outputs with int8 weights, more with int4 weights,
whose larger ``s_w`` makes that bound larger). With zero biases the integer model equals the sim bit
for bit; QLinearSoftmax alone adds about 1% one-step differences. One-step differences can grow by a
step or two through deep stacks of layers.

Activations on grids of 2..7 bits (or strict symmetric) ride in uint8 codes with the same scale and zero
point, clamped to their code range after each kernel (`context.Grid`), so W4A4 or int2 models run on the
same integer kernels and match the sim like 8-bit ones. Before returning, the model is loaded once in
onnxruntime (no graph optimizations): a model onnxruntime refuses raises `IntegerExportError`, so nothing
unloadable is ever written.

Models of any size: the graph is built over placeholders (`quantsim.graph.deferred`, as the QDQ export):
each weight's codes, a constant's codes and each float constant of an op left in float are computed only
when `IntegerExport.save` writes them, one at a time (external data past 2 GiB), or when ``.model`` is
first read. The float model is read without ``sim.model`` (a large model's mapped weights stay mapped), and
onnx.checker and the load check read the graph with the placeholders as typed graph inputs (types and
shapes are all they check), so no step holds the float or the integer weights all at once.

With ``input_shapes`` (or when every graph input is declared with static dims) the model is exported for
those shapes: its shape arithmetic (a detector's anchors and strides, computed from ``Shape``) is folded
into constants first (`shapes`), the graph inputs declare the static dims, and onnxruntime refuses other
sizes. Without static shapes such values stay float and their report entries say ``input_shapes`` folds them.

Nodes no rule can lower (unsupported op types, 16-bit / float16 quantizers, float weights, a
quantizer disabled in the middle of the graph) run in float exactly as in the sim (`fallback`) and are
listed in ``report`` as ``(node, op_type, reason)``. The export never silently changes numerics: an
uncalibrated quantizer or a scale that is zero or not finite in float32 raises `IntegerExportError`
naming the tensor. ``requant`` holds, per lowered node, the real requantization multipliers and their
fixed-point form (int32 mantissa in [2^30, 2^31) and shift, `fixed_point`), zero points and scales.

Float16-compute models (float32 I/O, Casts, float16 ops) lower the same way: `float_types`. Float64 and
bfloat16 models raise `IntegerExportError`, and so do sims with float8 quantizers (float8 values have no
integer kernels; running them float would drop the float8 rounding the sim applies): their deployable form
is the QDQ model.

The model keeps the prepared model's ai.onnx opset (``opset`` asks for a higher one, converted with
onnx.version_converter) and IR version; contrib kernels come from the ``com.microsoft`` domain, which
onnxruntime's default CPU provider runs. Below opset 12 onnxruntime has no uint8 Clip / MaxPool, so
those rules refuse and the nodes run in float.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from quantsim.errors import IntegerExportError, InvalidArgumentError, InvalidStateError, SessionError
from quantsim.export.integer import batchnorm as lowering_batchnorm
from quantsim.export.integer import elementwise as lowering_elementwise
from quantsim.export.integer import layernorm as lowering_layernorm
from quantsim.export.integer import linear as lowering_linear
from quantsim.export.integer import lut as lowering_lut
from quantsim.export.integer import movement as lowering_movement
from quantsim.export.integer.context import MS_DOMAIN, LoweringContext, Unsupported
from quantsim.export.integer.fallback import apply_quantizer, emit_as_is, lower_in_float
from quantsim.export.integer.prefetch import prefetch
from quantsim.export.integer.shapes import fold_shape_arithmetic, shape_derived, static_input_shapes
from quantsim.export.readiness import check_activations_calibrated
from quantsim.export.weight_codes import resolve_weight_codes, shift_weight_codes
from quantsim.graph.deferred import DeferredWeights, WeightSource
from quantsim.graph.file_set import FileSet
from quantsim.graph.index import GraphIndex, rename_outer_references, subgraph_references
from quantsim.graph.large_models import converted_skeleton, copy_without_initializers
from quantsim.graph.session import make_session
from quantsim.sim.build import IR_FOR_OPSET

__all__ = ["export_integer", "IntegerExport", "IntegerReport", "ReportEntry", "LOWERINGS", "IntegerExportError", "REQUANT_FORMAT"]

REQUANT_FORMAT = "quantsim.requant/1"
MIN_OPSET = 10  # QuantizeLinear / QLinearConv; uint8 Clip and MaxPool need 12 (rules refuse below)

def _lower_mul(ctx, node: onnx.NodeProto) -> None:
    """``x * HardSigmoid(x)`` is HardSwish (one table); any other Mul is QLinearMul or a scalar table."""
    if not lowering_lut.lower_hard_swish_product(ctx, node):
        lowering_elementwise.RULES["Mul"](ctx, node)


def _lower_reduce_mean(ctx, node: onnx.NodeProto) -> None:
    """A ReduceMean opening a decomposed layer norm is one LayerNormalization; one over the spatial axes is a
    global average pool; any other stays float."""
    if lowering_layernorm.match_decomposed_layer_norm(ctx.index, node) is not None:
        lowering_layernorm.RULES["ReduceMean"](ctx, node)
    else:
        lowering_elementwise.RULES["ReduceMean"](ctx, node)


LOWERINGS = {
    **lowering_lut.RULES,
    **{op: lowering_lut.lower_scalar_binary for op in ("Sub", "Div", "Pow", "Max", "Min", "PRelu")},
    **lowering_movement.RULES,
    **lowering_elementwise.RULES,
    **lowering_linear.RULES,
    **lowering_layernorm.RULES,
    **lowering_batchnorm.RULES,
    "Mul": _lower_mul,
    "ReduceMean": _lower_reduce_mean,
}


class ReportEntry(NamedTuple):
    """A node left in float: its name, op type and why."""

    node: str
    op_type: str
    reason: str


class IntegerReport(list):
    """The `ReportEntry` list of an `IntegerExport` (a plain ``list``); ``str()`` is a readable table."""

    def __str__(self) -> str:
        if not self:
            return "integer export: every node lowered to integer kernels (nothing left in float)"
        rows = [("node", "op type", "why it stayed float")] + [(e.node, e.op_type, e.reason) for e in self]
        widths = [max(len(row[i]) for row in rows) for i in range(2)]
        lines = [f"integer export: {len(self)} node(s) left in float"]
        lines += [f"  {a.ljust(widths[0])}  {b.ljust(widths[1])}  {c}".rstrip() for a, b, c in rows]
        return "\n".join(lines)


class IntegerExport:
    """The integer model, what stayed float, the fixed-point requant table and the I/O grids.

    The model's big constants (weight codes, float constants of ops left in float) are placeholders
    (`quantsim.graph.deferred`) until they are needed: ``save`` computes and writes them one at a time, and
    ``model`` fills them in when first read. Both compute them from the sim, which must not have changed
    since the export (quantizers, weights): else `InvalidStateError` (export again)."""

    def __init__(self, model: onnx.ModelProto, report: list[ReportEntry] | None = None, requant: dict | None = None,
                 io: dict | None = None, *, weights: DeferredWeights | None = None,
                 current: Callable[[], bool] | None = None):
        self._model, self._weights, self._current = model, weights, current
        self.report: list[ReportEntry] = report if isinstance(report, IntegerReport) else IntegerReport(report or [])
        self.requant: dict = {} if requant is None else requant
        self.io: dict = {} if io is None else io

    @property
    def model(self) -> onnx.ModelProto:
        """The integer ModelProto, its placeholders filled in (on first read, in place, one at a time)."""
        if self._weights is not None:
            self._check_current()
            self._weights.materialize(self._model)
            self._weights = self._current = None
        return self._model

    def __getstate__(self) -> dict:
        """Pickling (copying, shipping to a worker process) fills the placeholders in first: what computes them
        stays with the original."""
        self.model  # noqa: B018 - materializes
        return dict(self.__dict__)

    def _check_current(self) -> None:
        if self._current is not None and not self._current():
            raise InvalidStateError("the sim changed (quantizers or weights) since export_integer() built this export, "
                                    "whose weights are computed when saved or read: call export_integer() again")

    def requant_document(self) -> dict:
        """The JSON document ``save`` writes next to the model."""
        return {"format": REQUANT_FORMAT,
                "convention": "real = scale * (code - zero_point); multiplier ~= mantissa * 2^(shift - 31)",
                "io": self.io, "report": [list(r) for r in self.report], "requant": self.requant}

    def save(self, path_prefix) -> tuple[Path, Path]:
        """Write ``<prefix>.onnx`` (external data past 2 GiB) and ``<prefix>.requant.json`` as one set: both
        are staged before either replaces an old file (`quantsim.graph.file_set`). Each big weight is computed
        and written in turn (class docstring): the model is never whole in memory."""
        prefix = Path(path_prefix)
        model_name, table_name = prefix.name + ".onnx", prefix.name + ".requant.json"
        if self._weights is not None:
            self._check_current()
        with FileSet(prefix.parent, prefix.name) as files:
            files.add_model(self._model, model_name, weights=self._weights)  # placeholders computed as written
            files.add_json(table_name, self.requant_document())
            files.commit()
        return prefix.parent / model_name, prefix.parent / table_name


def _float_model(sim) -> tuple[onnx.ModelProto, WeightSource | None]:
    """The sim's prepared model and the reader of its initializers held outside it (memory-mapped weights of a
    large model), without copying them in as ``sim.model`` would."""
    index = getattr(sim, "_index", None)
    if index is None:
        return sim.model.model, None
    return sim.prepared_model, index.weights


def _check_sim(sim) -> None:
    model, _ = _float_model(sim)
    other = (TensorProto.DOUBLE, TensorProto.BFLOAT16)
    wide = sorted({TensorProto.DataType.Name(t.data_type) for t in model.graph.initializer if t.data_type in other}
                  | {TensorProto.DataType.Name(i.type.tensor_type.elem_type) for i in model.graph.input
                     if i.type.tensor_type.elem_type in other})
    if wide:
        raise IntegerExportError(f"export_integer lowers float32 and float16 models; this one computes in "
                                 f"{', '.join(wide)}. Its QDQ export (sim.to_onnx_qdq / export(..., qdq=True)) "
                                 "runs on onnxruntime")
    ensure = getattr(sim, "_ensure_param_encodings", None)
    if ensure is not None:
        ensure()
    check_activations_calibrated(sim, "export_integer", IntegerExportError)
    fp8 = [t for q in sim.quantizers if q.enabled and q.spec.is_fp8 for t in q.tensors]
    if fp8:
        raise IntegerExportError(
            f"export_integer lowers integer grids to integer kernels; {len(fp8)} tensor(s) use a float8 type "
            f"(e.g. {', '.join(repr(t) for t in fp8[:3])}), which has none. Export float8 as a QDQ model "
            "(sim.to_onnx_qdq: float8 QuantizeLinear/DequantizeLinear, opset 19) or switch those quantizers "
            "to an integer type or off")
    for q in sim.quantizers:
        if not q.enabled or q.spec.is_float or q.encoding is None:  # without one: float, as in the sim
            continue
        names = ", ".join(repr(t) for t in q.tensors)
        scale = np.asarray(q.encoding.scale, dtype=np.float32)
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise IntegerExportError(f"quantizer of {names} has a zero, negative or non-finite float32 scale "
                                     f"{q.encoding.scale!r}")


def _prepared_model(sim, opset: int | None) -> tuple[onnx.ModelProto, WeightSource | None, int]:
    """The sim's float model at the requested ai.onnx opset, the reader of its weights held outside it, and the
    opset. A higher opset converts the model's skeleton (`converted_skeleton`): its weights stay where they
    are and are read by name, never copied in."""
    model, weights = _float_model(sim)
    current = GraphIndex(model).opset()
    target = current if opset is None else int(opset)
    if target < current:
        raise InvalidArgumentError(f"opset {target} is below the model's opset {current}")
    if target > current:
        try:
            converted = converted_skeleton(model, target)
        except Exception as error:  # noqa: BLE001 - re-raised with context
            raise InvalidArgumentError(f"cannot convert the model from opset {current} to {target} "
                             f"({str(error).splitlines()[-1]}); export at the model's opset") from None
        model, weights = converted, _ByName(GraphIndex(model, weights=weights).constant_value)
    if target < MIN_OPSET:
        raise InvalidArgumentError(f"integer export needs ai.onnx opset >= {MIN_OPSET} (QuantizeLinear); the model has "
                         f"{target}: pass opset={MIN_OPSET} or convert the model")
    return model, weights, target


class _ByName:
    """Reads a converted skeleton's external initializers: each is the original model's tensor of its name."""

    def __init__(self, values: Callable[[str], np.ndarray]):
        self._values = values

    def array(self, tensor: TensorProto) -> np.ndarray:
        return self._values(tensor.name)


def _lower_node(ctx: LoweringContext, node: onnx.NodeProto, report: list[ReportEntry], from_shapes: set[str]) -> None:
    index = ctx.index
    reads = [n for n in node.input if n] + sorted(subgraph_references(node))
    if not any(index.is_float(n) for n in reads) and not any(index.is_float(n) for n in node.output if n):
        emit_as_is(ctx, node, [ctx.float_input(n) for n in node.input], list(node.output))  # shape / index arithmetic
        return
    rule = LOWERINGS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    reason = f"no integer lowering for {node.op_type}"
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        reason = f"{node.op_type} body runs in float, as in the sim"
    if rule is not None:
        state = ctx.snapshot()
        try:
            rule(ctx, node)
            report.extend(ReportEntry(*island) for island in ctx.islands)  # a rule's one-op float island
            ctx.islands.clear()
            return
        except Unsupported as error:
            ctx.restore(state)
            reason = str(error)
    lower_in_float(ctx, node)
    inputs = [n for n in node.input if n]
    if any(f"'{n}'" in reason for n in inputs if n in from_shapes) or (  # why: an input computed from shapes
            inputs and all(n in from_shapes or ctx.index.is_constant(n) for n in inputs)):  # shape arithmetic itself
        reason += " (computed from the input shape: export_integer(input_shapes=...) folds it into constants)"
    report.append(ReportEntry(node.name, node.op_type, reason))


def _io_record(grid, shape) -> dict:
    return {"dtype": "uint8", "scale": grid.scale, "zero_point": grid.zero_point, "code_range": [grid.low, grid.high],
            "shape": list(shape or [])}


def _value_info(name: str, elem_type: int, shape) -> onnx.ValueInfoProto:
    dims = [d if isinstance(d, (int, str)) else None for d in shape] if shape is not None else None
    return helper.make_tensor_value_info(name, elem_type, dims)


def export_integer(sim, *, integer_io: bool = False, opset: int | None = None,
                   input_shapes: dict[str, list[int]] | None = None, weight_codes: str = "int8",
                   exact: bool = True) -> IntegerExport:
    """Lower a calibrated sim to an integer ONNX model (see the module docstring). ``input_shapes``
    (``{input: dims}``) fixes dynamic input dims: the model is exported for those shapes only, with its
    shape arithmetic folded into constants (`shapes`); models whose inputs are all static get that fold
    without it. ``weight_codes`` ("int8", "uint8" or "auto") is the storage type of the 8-bit weight codes
    of the integer kernels (`quantsim.export.weight_codes`); the requant table does not depend on it.
    ``exact=True`` (default) lowers elementwise functions only to exact forms: a kernel chain is used where
    the 256-code probe finds it equal to the function's table, the table otherwise, so the integer model
    computes what the sim computes on them. ``exact=False`` accepts HardSwish / HardSigmoid kernel chains
    within one output step of the table (`piecewise.TOLERANCE`): 1.1-1.3x faster on models full of
    HardSwish, but their one-step errors grow through the following layers (benchmarks/README.md, "Sim
    vs deployed models")."""
    code_type = resolve_weight_codes(weight_codes, getattr(sim, "providers", None))
    _check_sim(sim)
    model, weights, opset = _prepared_model(sim, opset)
    shapes = static_input_shapes(model, input_shapes)
    kept_out: list[TensorProto] = []
    if shapes is not None:
        model, kept_out, _ = fold_shape_arithmetic(model, shapes, weights)
    index = GraphIndex(model, [*model.graph.initializer, *kept_out], weights=weights)
    from_shapes = shape_derived(index)
    deferred = DeferredWeights()
    exact_grids: dict = {}  # shared with the dry run: a scan of a big constant's values, done once
    # every lookup table and kernel probe the rules will ask for, computed up front in one session per kind
    code_graphs = prefetch(sim, index, opset, LOWERINGS, exact_grids)
    ctx = LoweringContext(sim, index, opset, deferred, code_graphs, exact_grids)
    ctx.exact = bool(exact)
    report: list[ReportEntry] = []
    io: dict = {}
    inputs = []
    for info in model.graph.input:
        name = info.name
        if name in index.initializers:
            continue
        grid = ctx.grid_of(name) if index.is_float(name) else None
        if integer_io and grid is not None:
            inputs.append(_value_info(name, TensorProto.UINT8, index.shape.get(name)))
            ctx.set_int(name, name, grid)
            io[name] = {"role": "input", **_io_record(grid, index.shape.get(name))}
            continue
        inputs.append(info)
        if index.is_float(name):
            apply_quantizer(ctx, name, name)
            if integer_io:
                report.append(ReportEntry(name, "graph input", f"kept float: {ctx.why_not_8bit(name)}"))
    for node in index.nodes:
        if node.name not in ctx.absorbed:
            _lower_node(ctx, node, report, from_shapes)
    outputs, renames = [], {}
    graph_inputs = {i.name for i in inputs}
    for info in model.graph.output:
        name = info.name
        source, info_out = None, info
        if integer_io and index.is_float(name):
            try:
                codes = ctx.int_input(name)
                source = codes.name
                info_out = _value_info(name, TensorProto.UINT8, index.shape.get(name))
                io[name] = {"role": "output", **_io_record(codes.grid, index.shape.get(name))}
            except Unsupported as error:
                report.append(ReportEntry(name, "graph output", f"kept float: {error}"))
        if source is None:
            if name in ctx.ints and name not in ctx.floats:
                source = ctx.dequantize_output(name)
            else:
                source = ctx.float_input(name) if index.is_float(name) else name
        outputs.append(info_out)
        if source == name:
            continue
        if source in renames or source in graph_inputs or source in {t.name for t in ctx.initializers}:
            ctx.emit("Identity", [source], [name], name=f"{name}/output")
        else:
            renames[source] = name
    for node in ctx.nodes:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
        rename_outer_references(node, renames)
    graph = helper.make_graph(ctx.nodes, model.graph.name or "integer", inputs, outputs, ctx.initializers)
    opsets = [helper.make_opsetid("", opset)]
    opsets += [o for o in model.opset_import if o.domain not in ("", "ai.onnx", MS_DOMAIN)]
    if MS_DOMAIN in ctx.domains:
        opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    result = helper.make_model(graph, opset_imports=opsets, producer_name="quantsim.export_integer")
    result.ir_version = max(model.ir_version, next(ir for first, ir in IR_FOR_OPSET if opset >= first))
    helper.set_model_props(result, {"quantsim.io": json.dumps(io, sort_keys=True),
                                     "quantsim.float_nodes": str(len(report))})
    if code_type == "uint8":
        result, _ = shift_weight_codes(result, deferred)
    checked = _without_placeholders(result, deferred)
    onnx.checker.check_model(checked)
    _check_loads(checked)
    version = getattr(sim, "_version", None)
    return IntegerExport(result, report, ctx.requant, io, weights=deferred,
                         current=None if version is None else lambda: sim.version == version)


def _without_placeholders(model: onnx.ModelProto, weights: DeferredWeights) -> onnx.ModelProto:
    """``model`` for onnx.checker and the load check, which need no weight values: each deferred initializer
    is a graph input of its type and shape instead (nothing computed); ``model`` itself when it has none."""
    if not any(weights.holds(t) for t in model.graph.initializer):
        return model
    checked = copy_without_initializers(model)
    for tensor in model.graph.initializer:
        if weights.holds(tensor):
            checked.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
        else:
            checked.graph.initializer.append(tensor)
    return checked


def _check_loads(model: onnx.ModelProto) -> None:
    """onnxruntime must accept the model (types of every kernel included), or nothing is returned or written:
    onnx.checker passes graphs that onnxruntime refuses (e.g. a Cast of 4-bit codes)."""
    try:
        make_session(model, session_options_kwargs={"graph_optimization_level": ort.GraphOptimizationLevel.ORT_DISABLE_ALL})
    except SessionError as error:
        raise IntegerExportError(f"the integer model does not load in onnxruntime: {error.__cause__ or error}") from error
