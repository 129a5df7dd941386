"""Streaming activation statistics: one onnxruntime session, batches reduced as they arrive.

The calibration graph is the float model with weight quantizers applied. For min-max every observed
tensor gets ``ReduceMin``/``ReduceMax`` nodes whose scalar outputs are the only extra graph outputs, so
the reduction runs inside onnxruntime and nothing but two floats per tensor crosses into Python. The
histogram schemes (TF-enhanced, percentile) expose the tensors themselves and fold each batch into a
`HistogramObserver` before the next batch runs (exact min/max, bin counts from an even subsample of at
most `HISTOGRAM_SAMPLE` values per batch). Memory is O(observed tensors x bins), never O(dataset);
batches may differ in shape.

Feeds with NaN/Inf in a float input are skipped with a warning (documented policy); a tensor whose
batch statistics are non-finite ignores that batch. A calibration that ends with no usable batch raises.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from tqdm.auto import tqdm

from .observers import HistogramObserver

__all__ = ["TensorStats", "CalibrationSession", "add_statistics_outputs", "check_feed", "run_calibration"]

_ORT_TO_NUMPY = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
    "tensor(int16)": np.int16, "tensor(uint16)": np.uint16, "tensor(bool)": np.bool_,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64,
}


@dataclass
class TensorStats:
    """Running statistics of one quantizer (all tensors tied to it)."""

    min: float = np.inf
    max: float = -np.inf
    histogram: HistogramObserver | None = None

    def update_range(self, lo: float, hi: float) -> None:
        self.min, self.max = min(self.min, lo), max(self.max, hi)


@dataclass
class _Outputs:
    model_outputs: list[str]
    minmax: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # tensor -> (min or None, max)
    full: dict[str, str] = field(default_factory=dict)  # tensor -> exposed output name


def add_statistics_outputs(
    model: onnx.ModelProto,
    minmax_tensors: Iterable[str],
    full_tensors: Iterable[str],
    *,
    nonnegative: frozenset[str] = frozenset(),
    ranks: Mapping[str, int] | None = None,
) -> tuple[onnx.ModelProto, _Outputs]:
    """Extend ``model`` (modified in place) with statistics outputs; returns the output map.

    Min-max tensors get ``ReduceMax`` (``GlobalMaxPool`` first for 4-D tensors: onnxruntime keeps that in
    its blocked NCHWc layout, so the convolutions around it stay in their fast path) and ``ReduceMin``,
    except ``nonnegative`` ones, whose minimum is known to be >= 0 and therefore irrelevant.
    """
    graph = model.graph
    outputs = _Outputs([o.name for o in graph.output])
    existing = {o.name for o in graph.output}
    used = {n for node in graph.node for n in list(node.input) + list(node.output)} | existing
    used |= {i.name for i in graph.input} | {t.name for t in graph.initializer}

    def fresh(base: str) -> str:
        while base in used:
            base += "_"
        used.add(base)
        return base

    for name in minmax_tensors:
        source = name
        if (ranks or {}).get(name) == 4:
            source = fresh(f"{name}/calibration_channel_max")
            graph.node.append(helper.make_node("GlobalMaxPool", [name], [source], name=source))
        hi = fresh(f"{name}/calibration_max")
        graph.node.append(helper.make_node("ReduceMax", [source], [hi], name=hi, keepdims=0))
        graph.output.append(helper.make_tensor_value_info(hi, TensorProto.FLOAT, []))
        lo = None
        if name not in nonnegative:
            lo = fresh(f"{name}/calibration_min")
            graph.node.append(helper.make_node("ReduceMin", [name], [lo], name=lo, keepdims=0))
            graph.output.append(helper.make_tensor_value_info(lo, TensorProto.FLOAT, []))
        outputs.minmax[name] = (lo, hi)
    for name in full_tensors:
        if name not in existing:
            graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
            existing.add(name)
        outputs.full[name] = name
    return model, outputs


HISTOGRAM_SAMPLE = 1 << 16


def _histogram_sample(data: np.ndarray) -> np.ndarray:
    """At most about `HISTOGRAM_SAMPLE` values of a batch, evenly strided through it, for binning.

    The exact batch min/max are taken from all values (they set the histogram's range and AIMET's
    search bounds); the bin counts only estimate the value distribution, and 65k evenly spread values
    per batch and tensor estimate a 512-bin distribution to well under 1% per bin while binning costs
    a fixed amount however large the activation is.
    """
    flat = data.reshape(-1)
    step = flat.size // HISTOGRAM_SAMPLE
    return flat[::step] if step > 1 else flat


def check_feed(feed: Mapping, inputs: list, where: str) -> dict[str, np.ndarray]:
    """Validate one feed dict against the session inputs: names, dtypes and ranks (clear errors)."""
    if not isinstance(feed, Mapping):
        raise TypeError(f"{where}: expected a dict of input name -> array, got {type(feed).__name__}")
    expected = {i.name: i for i in inputs}
    unknown = sorted(set(feed) - set(expected))
    missing = sorted(set(expected) - set(feed))
    if unknown or missing:
        raise ValueError(
            f"{where}: feed does not match the model inputs {sorted(expected)}"
            + (f"; unknown: {unknown}" if unknown else "")
            + (f"; missing: {missing}" if missing else "")
        )
    checked = {}
    for name, value in feed.items():
        array = np.asarray(value)
        want = _ORT_TO_NUMPY.get(expected[name].type)
        if want is not None and array.dtype != want:
            raise TypeError(f"{where}: input {name!r} has dtype {array.dtype}, the model expects {np.dtype(want)}")
        rank = len(expected[name].shape) if expected[name].shape is not None else None
        if rank is not None and array.ndim != rank:
            raise ValueError(
                f"{where}: input {name!r} has rank {array.ndim} (shape {array.shape}), the model expects rank "
                f"{rank} {tuple(expected[name].shape)}"
            )
        checked[name] = array
    return checked


def _finite_feed(feed: dict[str, np.ndarray]) -> bool:
    return all(np.isfinite(v).all() for v in feed.values() if np.issubdtype(v.dtype, np.floating))


class CalibrationSession:
    """What a calibration callback receives as ``session``: runs the model and records statistics.

    ``run`` returns only the outputs asked for (all model outputs for ``None``), like onnxruntime.
    """

    def __init__(self, session: ort.InferenceSession, outputs: _Outputs, groups: dict[str, str], histogram: bool):
        self._session = session
        self._outputs = outputs
        self._groups = groups  # tensor -> quantizer name
        self._histogram = histogram
        self._fetch = list(outputs.model_outputs)
        extra = [n for pair in outputs.minmax.values() for n in pair if n] + list(outputs.full.values())
        self._fetch += [n for n in extra if n not in self._fetch]
        self.stats: dict[str, TensorStats] = {}
        self.batches_used = 0
        self.batches_skipped = 0
        self._nonfinite_tensors: set[str] = set()

    def get_inputs(self):
        return self._session.get_inputs()

    def get_outputs(self):
        return [o for o in self._session.get_outputs() if o.name in self._outputs.model_outputs]

    def run(self, output_names, input_feed, run_options=None):
        feed = check_feed(input_feed, self._session.get_inputs(), f"calibration batch {self.batches_used + self.batches_skipped}")
        names = output_names or self._outputs.model_outputs
        unknown = [n for n in names if n not in self._outputs.model_outputs and n not in self._outputs.full]
        if unknown:
            raise ValueError(f"calibration session: {unknown} are not outputs of the model "
                             f"(outputs: {self._outputs.model_outputs})")
        if not _finite_feed(feed):
            self.batches_skipped += 1
            warnings.warn(
                f"calibration batch {self.batches_used + self.batches_skipped - 1} has NaN/Inf in its inputs: skipped",
                RuntimeWarning, stacklevel=2,
            )
            return self._session.run(list(names), feed, run_options)
        values = dict(zip(self._fetch, self._session.run(self._fetch, feed, run_options)))
        self._record(values)
        self.batches_used += 1
        return [values[n] for n in names]

    def _record(self, values: dict[str, np.ndarray]) -> None:
        for tensor, (lo_name, hi_name) in self._outputs.minmax.items():
            hi = float(values[hi_name])
            lo = 0.0 if lo_name is None else float(values[lo_name])
            if not (np.isfinite(lo) and np.isfinite(hi)):
                self._nonfinite_tensors.add(tensor)
                continue
            self.stats.setdefault(self._groups[tensor], TensorStats()).update_range(lo, hi)
        for tensor, out in self._outputs.full.items():
            data = values[out]
            if data.size == 0:
                continue
            lo, hi = float(data.min()), float(data.max())  # NaN/inf anywhere shows up here
            if not (np.isfinite(lo) and np.isfinite(hi)):  # same policy as min-max: ignore this batch
                self._nonfinite_tensors.add(tensor)
                continue
            stats = self.stats.setdefault(self._groups[tensor], TensorStats())
            if stats.histogram is None:
                stats.histogram = HistogramObserver()
            stats.histogram.update(_histogram_sample(data), value_range=(lo, hi))
            stats.update_range(lo, hi)

    def finish(self) -> dict[str, TensorStats]:
        if self._nonfinite_tensors:
            names = sorted(self._nonfinite_tensors)
            warnings.warn(
                f"non-finite values in {len(names)} tensor(s) (e.g. {names[:3]}); those batches were ignored for them",
                RuntimeWarning, stacklevel=2,
            )
        if self.batches_used == 0:
            raise ValueError(
                "calibration saw no usable batch"
                + (f" ({self.batches_skipped} skipped for NaN/Inf)" if self.batches_skipped else " (empty calibration data)")
                + "; encodings are unchanged"
            )
        return self.stats


def run_calibration(session: CalibrationSession, data, *, progress: bool = True) -> dict[str, TensorStats]:
    """Drive ``session`` with an iterable of feeds, or with a callback ``data(session)``."""
    if callable(data):
        data(session)
        return session.finish()
    if isinstance(data, Mapping) or not isinstance(data, Iterable):
        raise TypeError(
            "compute_encodings expects an iterable of feed dicts or a callback(session[, args]); "
            f"got {type(data).__name__}"
        )
    total = len(data) if hasattr(data, "__len__") else None
    for feed in tqdm(data, total=total, desc="calibration", unit="batch", disable=not progress, leave=False):
        session.run(None, feed)
    return session.finish()
