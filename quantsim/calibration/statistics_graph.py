"""The calibration graph's statistics outputs: per-tensor min/max and histogram samples, computed in-graph.

Every observed tensor gets reduction nodes whose results become extra graph outputs, so the passes over
the tensor run inside onnxruntime (multi-threaded, next to the producer) and only a few floats per row or
channel cross into Python, where `in_graph_statistics` finishes them. Tensors observed for a histogram
scheme (TF-enhanced, percentile) additionally get an in-graph sample of about `HISTOGRAM_SAMPLE` values:
the full activations never become graph outputs, which would keep every one of them alive until the end of
the run.

The sample of a tensor of rank >= 2 is every ``step``-th row of its ``[rows, last axis]`` view, ``step =
max(1, size // HISTOGRAM_SAMPLE)``: whole rows are contiguous, so onnxruntime copies them with memcpy
(5-10x faster than an element-strided slice, which cost as much as the convolutions on PP-OCR det). It
holds fewer than ``2 * HISTOGRAM_SAMPLE`` values plus at most one row; when the last axis is known to be
longer than `HISTOGRAM_SAMPLE` (one row would be too many values), and for rank 0/1 or unknown rank, the
sample is the element-strided ``flat[::step]`` instead. Where the caller knows the tensor's element count
for the batches to come (``counts``: from shape inference with the first batch's shapes), ``step`` is a
constant, and the tensor's ``Size`` becomes an output the caller compares with that count (a batch where they
differ is run again with steps computed in-graph, so a wrong inferred shape never changes a sample);
otherwise the graph computes the step from ``Size`` (2 more nodes per tensor).

How a tensor is reduced (chosen by measurement on onnxruntime's CPU provider):

* rank >= 2: over the trailing axes (``[2, ...]`` for rank >= 3, ``[1]`` for rank 2), one value per row;
  the small remainder (``N x C`` values) is reduced in numpy (`in_graph_statistics`). onnxruntime runs the
  row reduction in parallel, about twice as fast as a single reduction over all axes, and the second stage
  in numpy spares a node per statistic (each node costs session creation about as much as a node of the
  model; the second stage cost a kernel launch per tensor and batch);
* the maximum of a 4-D tensor produced by a convolution-like op uses ``GlobalMaxPool``, which
  onnxruntime runs on its blocked NCHWc layout, so no layout conversion is inserted for it;
* no minimum for tensors proven non-negative (``nonnegative``): it is known to be >= 0, and encodings
  always include zero. Their histograms start from 0 as the lower bound of the batch range (a minimum
  would cost a full pass, plus a layout conversion on onnxruntime's NCHWc path, for nothing the
  encodings use: TF-enhanced and percentile both include zero).

Non-finite values: an infinite value yields an infinite statistic, which the caller treats as an unusable
batch for that tensor. onnxruntime's ReduceMin/ReduceMax do not handle NaN consistently: a NaN that comes
first in a row wins, one later in the row is passed over, so a row holding a NaN can report a finite value
that is not its minimum (a wrong range, not an error). Every observed tensor therefore also gets a NaN
probe: its sum (per-channel ``GlobalAveragePool`` on the NCHWc path, per-row sums otherwise, added up in
numpy), which is NaN exactly when the tensor holds a NaN (or both infinities), because addition propagates
NaN whatever the order. A batch whose probe is NaN is unusable for that tensor (the caller warns and names
it), never a wrong finite range.

Whole tensors: a tensor named in ``whole`` gets no nodes at all; it becomes a graph output itself and its
statistics are computed in numpy from the fetched values (`whole_statistics`): the same minimum, maximum
and sample, a NaN found by numpy's NaN-propagating min/max. Each statistics node costs onnxruntime's
session creation about as much as a node of the model (every graph transformer visits it), so on a small
model the ~12 nodes per observed tensor made the calibration session 3-7x as slow to create as the float
model's; fetching a small tensor whole costs one numpy pass per batch instead (`quantsim.calibration.whole_tensors`
chooses which).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["StatisticsOutputs", "WholeTensor", "add_statistics_outputs", "whole_statistics", "in_graph_statistics",
           "samples_by_rows", "HISTOGRAM_SAMPLE", "NCHWC_PRODUCERS"]

HISTOGRAM_SAMPLE = 1 << 16
"""Histogram tensors are sampled with stride ``max(1, size // HISTOGRAM_SAMPLE)`` (rows, or elements; module
docstring): about ``HISTOGRAM_SAMPLE`` to ``2 * HISTOGRAM_SAMPLE`` evenly spread values per batch. The exact
batch min/max come from all values (they set the histogram range and AIMET's search bounds); 65k values
estimate a 512-bin distribution to well under 1% per bin, and binning then costs a fixed amount however
large the activation is. (16k values made TF-enhanced encodings move by up to 50% and cost PP-OCR rec's
sim 2.4 dB of output SQNR.)"""

NCHWC_PRODUCERS = frozenset({"Conv", "MaxPool", "AveragePool", "Relu", "Clip", "BatchNormalization"})
"""Producers whose 4-D outputs onnxruntime keeps in its NCHWc layout (their max goes through GlobalMaxPool)."""

_REDUCE_AXES_AS_INPUT = 18  # ReduceMin/ReduceMax take ``axes`` as an input from opset 18 on


@dataclass(frozen=True)
class WholeTensor:
    """How a tensor fetched whole is reduced in numpy: no minimum when ``nonnegative`` (as in-graph), and a
    sample of about ``sample`` values (None: not sampled) taken by rows or element-wise (``by_rows``)."""

    nonnegative: bool
    sample: int | None = None
    by_rows: bool = False


@dataclass
class StatisticsOutputs:
    """Names of the outputs `add_statistics_outputs` added, per observed tensor."""

    model_outputs: list[str]
    minmax: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # tensor -> (min or None, max), per row
    nan_probes: dict[str, str] = field(default_factory=dict)  # tensor -> its sums per row (NaN iff it holds a NaN)
    samples: dict[str, str] = field(default_factory=dict)  # tensor -> strided-sample output
    whole: dict[str, WholeTensor] = field(default_factory=dict)  # tensor (fetched as itself) -> its reduction
    order: list[str] = field(default_factory=list)  # every observed tensor, in the order they were given
    counts: dict[str, int] = field(default_factory=dict)  # sampled tensor -> element count its constant step assumes
    sizes: dict[str, str] = field(default_factory=dict)  # sampled tensor with a constant step -> its Size output

    @property
    def statistics(self) -> list[str]:
        """Every added output, in a fixed order."""
        names = [n for lo, hi in self.minmax.values() for n in (lo, hi) if n]
        return (names + list(self.nan_probes.values()) + list(self.samples.values()) + list(self.sizes.values())
                + list(self.whole))

    def steps_hold(self, values: Mapping[str, np.ndarray]) -> bool:
        """Whether every constant sampling step was the one ``Size`` gives in this batch (``values``: the
        fetched outputs); False means the batch must be run again with steps computed in-graph."""
        return all(int(values[name]) == self.counts[tensor] for tensor, name in self.sizes.items())

    @property
    def tensors(self) -> list[str]:
        """The observed tensors in the order they were given (statistics are folded in this order)."""
        return self.order or list(self.minmax) + [t for t in self.whole if t not in self.minmax]


class _Builder:
    """Appends nodes, constants and outputs to a graph under fresh names."""

    def __init__(self, model: onnx.ModelProto):
        self.graph = model.graph
        g = self.graph
        self.used = {n for node in g.node for n in list(node.input) + list(node.output)}
        self.used |= {o.name for o in g.output} | {i.name for i in g.input} | {t.name for t in g.initializer}
        self.opset = next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), 13)
        self._constants: dict[tuple, str] = {}

    def fresh(self, base: str) -> str:
        while base in self.used:
            base += "_"
        self.used.add(base)
        return base

    def constant(self, values, dtype=np.int64) -> str:
        array = np.asarray(values, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            name = self.fresh(f"calibration_constant_{len(self._constants)}")
            self.graph.initializer.append(numpy_helper.from_array(array, name))
            self._constants[key] = name
        return self._constants[key]

    def node(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        self.graph.node.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def reduce(self, op: str, x: str, output: str, axes: list[int] | None = None) -> str:
        if axes is None:
            return self.node(op, [x], output, keepdims=0)
        if self.opset >= _REDUCE_AXES_AS_INPUT:
            return self.node(op, [x, self.constant(axes)], output, keepdims=0)
        return self.node(op, [x], output, keepdims=0, axes=axes)

    def output(self, name: str, elem_type: int = TensorProto.FLOAT, shape=None) -> None:
        self.graph.output.append(helper.make_tensor_value_info(name, elem_type, shape))


def _leading_reduction_axes(rank: int | None) -> list[int] | None:
    """Axes of the parallel first stage (trailing axes, keeping rows), or None for a single stage."""
    if rank is None or rank < 2:
        return None
    return [1] if rank == 2 else list(range(2, rank))


def _rows_rank(rank: int | None) -> int:
    """Rank of a first-stage reduction's result (``keepdims=0``): the rows kept, none for a single stage."""
    axes = _leading_reduction_axes(rank)
    return 0 if axes is None or rank is None else rank - len(axes)


def _add_extreme(b: _Builder, tensor: str, op: str, rank: int | None, producer: str | None) -> str:
    """The extreme of each row (channel) of ``tensor``, or of all of it for rank 0/1 or unknown rank; the
    rest is reduced in numpy (`in_graph_statistics`)."""
    kind = "max" if op == "ReduceMax" else "min"
    if op == "ReduceMax" and rank == 4 and producer in NCHWC_PRODUCERS:
        return b.node("GlobalMaxPool", [tensor], b.fresh(f"{tensor}/calibration_channel_max"))
    axes = _leading_reduction_axes(rank)
    if axes is None:
        return b.reduce(op, tensor, b.fresh(f"{tensor}/calibration_{kind}"))
    return b.reduce(op, tensor, b.fresh(f"{tensor}/calibration_row_{kind}"), axes)


def _add_nan_probe(b: _Builder, tensor: str, rank: int | None, producer: str | None) -> str:
    """Sums of ``tensor`` per row (module docstring: their sum is NaN exactly when it holds a NaN); 4-D
    NCHWc outputs are averaged per channel instead (no layout conversion)."""
    if rank == 4 and producer in NCHWC_PRODUCERS:
        return b.node("GlobalAveragePool", [tensor], b.fresh(f"{tensor}/calibration_channel_mean"))
    axes = _leading_reduction_axes(rank)
    if axes is None:
        return _reduce_sum(b, tensor, b.fresh(f"{tensor}/calibration_nan_probe"))
    return _reduce_sum(b, tensor, b.fresh(f"{tensor}/calibration_row_sum"), axes)


def _reduce_sum(b: _Builder, x: str, output: str, axes: list[int] | None = None) -> str:
    """ReduceSum, whose ``axes`` moved to an input at opset 13 (the other reductions at 18)."""
    if axes is None:
        return b.node("ReduceSum", [x], output, keepdims=0)
    if b.opset >= 13:
        return b.node("ReduceSum", [x, b.constant(axes)], output, keepdims=0)
    return b.node("ReduceSum", [x], output, keepdims=0, axes=axes)


def _stride(b: _Builder, tensor: str, target: int, count: int | None = None) -> str:
    """``[max(1, size // target)]`` (1-D, as Slice wants it): a constant for a known element ``count`` (the
    caller checks it against the tensor's ``Size``, an output), else a scalar ``Size`` divided by a 1-D constant."""
    if count is not None:
        return b.constant([max(1, count // target)])
    size = b.node("Size", [tensor], b.fresh(f"{tensor}/calibration_size"))
    ratio = b.node("Div", [size, b.constant([target])], b.fresh(f"{tensor}/calibration_stride_raw"))
    return b.node("Max", [ratio, b.constant([1])], b.fresh(f"{tensor}/calibration_stride"))


def samples_by_rows(shape: tuple | None, target: int) -> bool:
    """Whether a tensor of (static) ``shape`` is sampled by whole rows (module docstring), else element-wise."""
    last = shape[-1] if shape else None
    return shape is not None and len(shape) >= 2 and not (isinstance(last, int) and last > target)


def in_graph_statistics(values: Mapping[str, np.ndarray], outputs: StatisticsOutputs,
                        tensor: str) -> tuple[float, float, bool, np.ndarray | None] | None:
    """``(min, max, holds NaN, sample)`` of a tensor reduced in-graph, from its fetched per-row (per-channel)
    extremes and sums: the second stage, in numpy (module docstring). None for an empty tensor."""
    lo_name, hi_name = outputs.minmax[tensor]
    rows_hi = values[hi_name]
    if rows_hi.size == 0:
        return None
    hi = float(rows_hi.max())
    lo = 0.0 if lo_name is None else float(values[lo_name].min())
    probe = outputs.nan_probes.get(tensor)
    # NaN in the rows' sums, or +inf and -inf among them (added in float64: no new overflow of finite sums)
    nan = probe is not None and bool(np.isnan(values[probe].sum(dtype=np.float64)))  # min/max cannot be trusted
    sample_name = outputs.samples.get(tensor)
    return lo, hi, nan, (values[sample_name] if sample_name is not None else None)


def whole_statistics(values: np.ndarray, whole: WholeTensor) -> tuple[float, float, bool, np.ndarray | None] | None:
    """``(min, max, holds NaN, sample)`` of a tensor fetched whole, as its in-graph statistics would give them;
    None for an empty tensor (nothing to learn, as in-graph). numpy's min/max return NaN when a NaN is
    present, which replaces the in-graph NaN probe; the sample takes the same rows or elements as `_add_sample`."""
    if values.size == 0:
        return None
    hi = float(values.max())
    lo = 0.0 if whole.nonnegative else float(values.min())
    sample = None
    if whole.sample is not None:
        step = max(1, values.size // whole.sample)
        view = values.reshape(-1, values.shape[-1]) if whole.by_rows else values.reshape(-1)
        sample = np.ascontiguousarray(view[::step])
    return lo, hi, bool(np.isnan(hi) or np.isnan(lo)), sample


def _add_sample(b: _Builder, tensor: str, shape: tuple | None, target: int,
                count: int | None = None) -> tuple[str, list]:
    """The tensor's sample of about ``target`` values (module docstring): every ``step``-th row of
    ``Flatten(x, rank - 1)``, or ``Reshape(x, [-1])[::step]`` (``step`` a constant when the element ``count``
    is given); returns its name and declared shape."""
    rank = None if shape is None else len(shape)
    last = shape[-1] if shape else None
    by_rows = samples_by_rows(shape, target)
    if by_rows and rank == 2:
        view = tensor  # already its own [rows, last axis] view
    elif by_rows and rank is not None:
        view = b.node("Flatten", [tensor], b.fresh(f"{tensor}/calibration_rows"), axis=rank - 1)
    else:
        view = b.node("Reshape", [tensor, b.constant([-1])], b.fresh(f"{tensor}/calibration_flat"))
    steps = _stride(b, tensor, target, count)
    sample = b.node("Slice", [view, b.constant([0]), b.constant([np.iinfo(np.int64).max]), b.constant([0]), steps],
                    b.fresh(f"{tensor}/calibration_sample"))
    return sample, ([None, last if isinstance(last, int) else None] if by_rows else [None])


def add_statistics_outputs(
    model: onnx.ModelProto,
    minmax_tensors: Iterable[str],
    sampled_tensors: Iterable[str] = (),
    *,
    nonnegative: frozenset[str] = frozenset(),
    shapes: Mapping[str, tuple | None] | None = None,
    elem_types: Mapping[str, int] | None = None,
    sample_sizes: Mapping[str, int] | None = None,
    whole: Iterable[str] = (),
    counts: Mapping[str, int] | None = None,
) -> tuple[onnx.ModelProto, StatisticsOutputs]:
    """Extend ``model`` (modified in place) with statistics outputs; returns it and the output map.

    ``minmax_tensors`` get min/max outputs (no minimum for ``nonnegative`` ones); ``sampled_tensors`` get
    them too, plus a histogram sample. ``shapes`` (tensor -> dims as int, name or None, where the rank is
    known) picks the reductions and the sampling; ``sample_sizes`` (tensor -> values) gives a sampled tensor
    a smaller sample than `HISTOGRAM_SAMPLE` (a range-health sample needs no histogram's worth).
    ``elem_types`` (tensor -> ONNX element type; float32 where absent) types the outputs: a float16 or
    float64 tensor's statistics keep its type. Tensors in ``whole`` (never a graph input) get no nodes: they
    become outputs themselves, reduced in numpy by `whole_statistics` (module docstring). ``counts`` (tensor ->
    element count) gives sampled tensors a constant sampling step, valid only for batches where each holds
    that many elements (``outputs.counts``; the caller checks with `StatisticsOutputs.steps_hold`). The other
    statistics outputs hold one value per row or channel, finished by `in_graph_statistics`.
    """
    b = _Builder(model)
    outputs = StatisticsOutputs([o.name for o in model.graph.output])
    producer = {out: node.op_type for node in model.graph.node for out in node.output}
    shapes = shapes or {}
    sampled = list(dict.fromkeys(sampled_tensors))
    outputs.order = list(dict.fromkeys(list(minmax_tensors) + sampled))
    graph_inputs = {i.name for i in model.graph.input}
    fetched = {t for t in whole if t not in graph_inputs}
    for tensor in outputs.order:
        if tensor in fetched:
            target = (sample_sizes or {}).get(tensor, HISTOGRAM_SAMPLE) if tensor in sampled else None
            outputs.whole[tensor] = WholeTensor(tensor in nonnegative, target,
                                                target is not None and samples_by_rows(shapes.get(tensor), target))
            continue
        shape, made_by = shapes.get(tensor), producer.get(tensor)
        rank = None if shape is None else len(shape)
        hi = _add_extreme(b, tensor, "ReduceMax", rank, made_by)
        lo = None
        if tensor not in nonnegative:
            lo = _add_extreme(b, tensor, "ReduceMin", rank, made_by)
        outputs.minmax[tensor] = (lo, hi)
        outputs.nan_probes[tensor] = _add_nan_probe(b, tensor, rank, made_by)
    sample_shapes = []
    for tensor in [t for t in sampled if t not in outputs.whole]:
        target = (sample_sizes or {}).get(tensor, HISTOGRAM_SAMPLE)
        count = (counts or {}).get(tensor)
        if count is not None:
            outputs.counts[tensor] = count
            outputs.sizes[tensor] = b.node("Size", [tensor], b.fresh(f"{tensor}/calibration_size"))
        outputs.samples[tensor], sample_shape = _add_sample(b, tensor, shapes.get(tensor), target, count)
        sample_shapes.append(sample_shape)
    types = elem_types or {}
    for tensor, (lo, hi) in outputs.minmax.items():
        shape = shapes.get(tensor)
        rank = None if shape is None else len(shape)
        nchwc = rank == 4 and producer.get(tensor) in NCHWC_PRODUCERS
        for name in (lo, hi, outputs.nan_probes[tensor]):
            if name:
                pooled = nchwc and name != lo  # GlobalMaxPool / GlobalAveragePool keep [N, C, 1, 1]
                b.output(name, types.get(tensor, TensorProto.FLOAT), shape=[None] * (4 if pooled else _rows_rank(rank)))
    for (tensor, name), sample_shape in zip(outputs.samples.items(), sample_shapes):
        b.output(name, types.get(tensor, TensorProto.FLOAT), shape=sample_shape)
    for name in outputs.sizes.values():
        b.output(name, TensorProto.INT64, shape=[])
    model_outputs = set(outputs.model_outputs)
    for tensor in outputs.whole:
        if tensor not in model_outputs:
            b.output(tensor, types.get(tensor, TensorProto.FLOAT))
    return model, outputs
