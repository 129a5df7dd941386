"""Which observed tensors a calibration fetches whole, and the session that goes with that choice.

In-graph statistics (`statistics_graph`) cost about 12 nodes per observed tensor, and onnxruntime's session
creation costs per node: on a small model that creation, not the data, was most of the calibration
(PP-OCR's 150-node classifier became a 1,400-node graph, 3-7x as slow to create as the float model).
A small tensor is cheaper fetched whole and reduced in numpy (`statistics_graph.whole_statistics`: the same
minimum, maximum and sample). The choice needs the tensors' sizes, which depend on the feed's shapes, so
the session is made when the first batch arrives (`CalibrationSessions.session_for`):

* the sizes come from ONNX shape inference on the calibration graph with the feed's shapes (weights left
  out, only their shapes given); a tensor whose size it cannot tell keeps in-graph statistics;
* tensors of at most `WHOLE_TENSOR_BYTES` are fetched whole, smallest first, while their sum stays within
  `WHOLE_BATCH_BYTES` (every fetched tensor of a batch is alive at once, as a graph output);
* a later batch of other shapes is sized again; if its fetched tensors would exceed
  ``4 * WHOLE_BATCH_BYTES`` the calibration continues on a session with in-graph statistics only;
* the same sizes give the in-graph samples a constant sampling step (`statistics_graph`: 2 nodes fewer per
  sampled tensor), checked against each tensor's ``Size`` in every batch; a batch in which such a tensor has
  another element count (another shape, or a shape inference got wrong) moves the calibration to a session
  whose steps the graph computes, for the rest of it (a batch caught by its ``Size`` alone is run again).

Both paths give the same statistics, so the choice never changes an encoding.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, shape_inference

from quantsim.calibration.statistics_graph import StatisticsOutputs

__all__ = ["WHOLE_TENSOR_BYTES", "WHOLE_BATCH_BYTES", "InputInfo", "model_inputs", "model_outputs",
           "inference_graph", "tensor_bytes", "tensor_sizes", "choose_whole", "CalibrationSessions"]

_log = logging.getLogger(__name__)

WHOLE_TENSOR_BYTES = 4 << 20
"""Largest tensor (bytes, one batch) fetched whole instead of reduced in-graph."""
WHOLE_BATCH_BYTES = 64 << 20
"""Most bytes of whole tensors per batch; a batch whose whole tensors would take 4x this moves the
calibration to in-graph statistics only."""

_SMALL_INITIALIZER = 4096  # elements: initializers kept for shape inference (shape constants), others as inputs


@dataclass(frozen=True)
class InputInfo:
    """What onnxruntime's ``NodeArg`` tells of a graph input or output: name, type string, dims."""

    name: str
    type: str
    shape: list | None


def _info(value: onnx.ValueInfoProto) -> InputInfo:
    tensor = value.type.tensor_type
    kind = f"tensor({TensorProto.DataType.Name(tensor.elem_type).lower()})" if tensor.elem_type else "unknown"
    if not tensor.HasField("shape"):
        return InputInfo(value.name, kind, None)
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
    return InputInfo(value.name, kind, dims)


def model_inputs(model: onnx.ModelProto) -> list[InputInfo]:
    """The inputs a session of ``model`` asks for (graph inputs that are not initializers)."""
    constants = {t.name for t in model.graph.initializer}
    return [_info(i) for i in model.graph.input if i.name not in constants]


def model_outputs(model: onnx.ModelProto) -> list[InputInfo]:
    return [_info(o) for o in model.graph.output]


def inference_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """What shape inference needs of ``model``: its nodes and small initializers (shape constants), the other
    initializers declared as inputs of their shape (no weight is copied)."""
    graph = model.graph
    small: list[onnx.TensorProto] = []
    big: list[onnx.TensorProto] = []
    for t in graph.initializer:
        external = t.data_location == TensorProto.EXTERNAL
        (big if external or int(np.prod(t.dims)) > _SMALL_INITIALIZER else small).append(t)
    constants = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in constants]
    inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in big]
    light = helper.make_model(helper.make_graph(graph.node, graph.name, inputs, graph.output, small),
                              opset_imports=model.opset_import, ir_version=model.ir_version)
    light.functions.extend(model.functions)
    return light


def tensor_bytes(light: onnx.ModelProto, feed: Mapping[str, np.ndarray], tensors: Sequence[str]) -> dict[str, int]:
    """Bytes of each of ``tensors`` for this feed, where shape inference on ``light`` (`inference_graph`) with
    the feed's shapes tells (module docstring)."""
    return {name: count * itemsize for name, (count, itemsize) in tensor_sizes(light, feed, tensors).items()}


def tensor_sizes(light: onnx.ModelProto, feed: Mapping[str, np.ndarray],
                 tensors: Sequence[str]) -> dict[str, tuple[int, int]]:
    """``(elements, bytes per element)`` of each of ``tensors`` for this feed, where shape inference on
    ``light`` with the feed's shapes tells; a graph input among ``tensors`` is sized from the feed itself."""
    model = onnx.ModelProto()
    model.CopyFrom(light)
    for value in model.graph.input:
        if value.name in feed:
            shape = value.type.tensor_type.shape
            del shape.dim[:]
            for size in np.shape(feed[value.name]):
                shape.dim.add().dim_value = int(size)
    wanted, sizes = set(tensors), {}
    for name in wanted & set(feed):
        array = np.asarray(feed[name])
        sizes[name] = (int(array.size), array.dtype.itemsize)
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - onnx raises several error types; in-graph statistics need none
        _log.debug("calibration: no tensor sizes (shape inference failed: %s)", exc)
        return sizes
    for value in list(inferred.graph.value_info) + list(inferred.graph.output):
        tensor = value.type.tensor_type
        if value.name not in wanted or not tensor.HasField("shape") or not tensor.elem_type:
            continue
        dims = tensor.shape.dim
        if all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
            itemsize = helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
            sizes[value.name] = (int(np.prod([d.dim_value for d in dims], dtype=np.int64)), itemsize)
    return sizes


def choose_whole(sizes: Mapping[str, int], tensor_limit: int | None = None,
                 batch_limit: int | None = None) -> frozenset[str]:
    """The tensors fetched whole: at most ``tensor_limit`` bytes each, smallest first while their sum stays
    within ``batch_limit`` (defaults: `WHOLE_TENSOR_BYTES`, `WHOLE_BATCH_BYTES`, read at call time)."""
    tensor_limit = WHOLE_TENSOR_BYTES if tensor_limit is None else tensor_limit
    batch_limit = WHOLE_BATCH_BYTES if batch_limit is None else batch_limit
    chosen, total = [], 0
    for name, size in sorted(sizes.items(), key=lambda item: (item[1], item[0])):
        if size > tensor_limit or total + size > batch_limit:
            break
        chosen.append(name)
        total += size
    return frozenset(chosen)


def _signature(feed: Mapping[str, np.ndarray]) -> tuple:
    return tuple(sorted((name, np.shape(value)) for name, value in feed.items()))


class CalibrationSessions:
    """The calibration's onnxruntime session, made for the first feed's shapes (module docstring).

    ``graph`` is the calibration graph before statistics (only read here); ``build(whole, counts)`` returns a
    session and its `StatisticsOutputs` with the tensors of ``whole`` fetched whole and constant sampling steps
    for the element ``counts`` given (None: steps computed in-graph); ``observed`` are the tensors with
    statistics. The last session made is kept for reuse (a later calibration with the same choice)."""

    def __init__(self, graph: onnx.ModelProto, observed: Sequence[str],
                 build: Callable[[frozenset[str], Mapping[str, int] | None],
                                 tuple[ort.InferenceSession, StatisticsOutputs]]):
        self.inputs = model_inputs(graph)
        self.outputs = model_outputs(graph)
        self._graph = inference_graph(graph)
        self._observed = list(observed)
        self._build = build
        self._made: tuple[tuple, ort.InferenceSession, StatisticsOutputs] | None = None
        self._sizes: dict[tuple, dict[str, tuple[int, int]]] = {}
        self._whole: frozenset[str] | None = None  # this calibration's choice
        self._counts: dict[str, int] | None = None  # this calibration's element counts (None: steps in-graph)

    def start(self) -> None:
        """A new calibration: its first feed chooses again."""
        self._whole = None
        self._counts = None

    @property
    def current(self) -> ort.InferenceSession | None:
        """The last session made (None before the first batch)."""
        return None if self._made is None else self._made[1]

    @property
    def whole(self) -> frozenset[str]:
        """The tensors the last session fetches whole."""
        return frozenset() if self._made is None else self._made[0][0]

    @property
    def constant_steps(self) -> bool:
        """Whether the last session samples with constant steps (its ``counts``)."""
        return self._made is not None and self._made[0][1] is not None

    def session_for(self, feed: Mapping[str, np.ndarray] | None,
                    constant_steps: bool = True) -> tuple[ort.InferenceSession, StatisticsOutputs]:
        """The session for a batch of ``feed`` (None: one with in-graph statistics only); ``constant_steps=False``
        moves this calibration to sampling steps computed in-graph (a batch whose sizes shape inference got wrong)."""
        if not constant_steps and self._whole is not None:
            self._counts = None
        counts = self._counts
        if feed is None:
            whole: frozenset[str] = frozenset()
            counts = None
        elif self._whole is None:
            sizes = self._sizes_of(feed)
            whole = choose_whole({t: n * item for t, (n, item) in sizes.items() if t not in feed})  # inputs: never
            counts = {t: n for t, (n, _) in sizes.items()}
            _log.debug("calibration: %d of %d observed tensors fetched whole (%.1f MB per batch)", len(whole),
                       len(self._observed), sum(sizes[t][0] * sizes[t][1] for t in whole) / 1e6)
        else:
            whole = self._whole
            baked = self._made[2].counts if self._made is not None and counts is not None else {}
            if whole or baked:
                sizes = self._sizes_of(feed)
                if whole and sum(sizes[t][0] * sizes[t][1] if t in sizes else WHOLE_TENSOR_BYTES
                                 for t in whole) > 4 * WHOLE_BATCH_BYTES:
                    _log.info("calibration: a batch of shapes %s would fetch too much whole; in-graph statistics "
                              "from here on", _signature(feed))
                    whole = frozenset()
                if any(sizes.get(t, (None, 0))[0] != n for t, n in baked.items()):
                    _log.info("calibration: a batch of shapes %s changes the sampled tensors' sizes; sampling "
                              "steps computed in-graph from here on", _signature(feed))
                    counts = None
        self._whole, self._counts = whole, counts
        key = (whole, None if counts is None else tuple(sorted(counts.items())))
        if self._made is None or self._made[0] != key:
            self._made = None  # let the previous session go before the next is made
            session, outputs = self._build(whole, counts)
            self._made = (key, session, outputs)
        return self._made[1], self._made[2]

    def _sizes_of(self, feed: Mapping[str, np.ndarray]) -> dict[str, tuple[int, int]]:
        key = _signature(feed)
        if key not in self._sizes:
            self._sizes[key] = tensor_sizes(self._graph, feed, self._observed)
        return self._sizes[key]
