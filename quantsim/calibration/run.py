"""Streaming activation statistics: one onnxruntime session, batches reduced as they arrive.

The calibration graph is the float model with weight quantizers applied, extended by
`statistics_graph.add_statistics_outputs`: in-graph min/max reductions for every observed tensor and, for
the histogram schemes (TF-enhanced, percentile), an in-graph strided sample that is folded into a
`HistogramObserver` before the next batch runs. Only scalars and samples cross into Python, so memory
is O(observed tensors x bins), never O(dataset) or O(activations); batches may differ in shape.

The session runs with onnxruntime's priority-based execution order: its default order computes the
statistics outputs after the whole forward pass, which keeps every observed activation alive to the
end (on PP-OCR's recogniser, 8 GB instead of 0.4 GB, and runs dominated by page faults).

Feeds with NaN/Inf in a float input are skipped with a warning (documented policy); a tensor whose
batch statistics are non-finite, or that holds a NaN computed inside the model (its in-graph NaN probe,
see `statistics_graph`), ignores that batch, with one warning naming the tensors. A calibration that
ends with no usable batch raises.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sized
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
from tqdm.auto import tqdm

from quantsim.calibration.histograms import HistogramObserver
from quantsim.calibration.statistics_graph import StatisticsOutputs, in_graph_statistics, whole_statistics
from quantsim.calibration.whole_tensors import CalibrationSessions
from quantsim.errors import CalibrationError, InvalidArgumentError, InvalidTypeError, warn_at_caller

_log = logging.getLogger(__name__)

__all__ = ["TensorStats", "RANGE_SAMPLE", "CalibrationSession", "check_feed", "run_calibration", "drive_calibration",
           "CALIBRATION_EXECUTION_ORDER", "CALIBRATION_SESSION_OPTIONS"]

CALIBRATION_EXECUTION_ORDER = ort.ExecutionOrder.PRIORITY_BASED

CALIBRATION_SESSION_OPTIONS: dict = {"execution_order": CALIBRATION_EXECUTION_ORDER, "enable_mem_pattern": False}
"""``SessionOptions`` of calibration sessions (a user's ``session_options_kwargs`` override them). A
calibration runs a few batches once: onnxruntime's memory pattern, planned on the first run and allocated
as one block on the next, only adds work there (first pass 0.19 s instead of 0.29 s of CPU on PP-LCNet
orientation's 2 batches, 0.42-0.54 instead of 0.54-0.59 on PP-OCRv4 det's; on a quiet machine, wall time
0.16 instead of 0.22 s for orientation's whole calibration, 0.32 instead of 0.34 s for det's). Worker
threads keep spinning, onnxruntime's default: without it the CPU time fell on a loaded machine, but on a
quiet one the wall time rose (Silero VAD 0.043-0.046 -> 0.053-0.054 s, det 0.31 -> 0.32-0.33 s)."""

RANGE_SAMPLE = 1 << 12
"""Values kept per tensor for the range-health check: enough to see every code holding more than ~0.05% of
a tensor's values, a few MB for a thousand tensors."""

_ORT_TO_NUMPY = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
    "tensor(int16)": np.int16, "tensor(uint16)": np.uint16, "tensor(bool)": np.bool_,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64,
}


@dataclass
class TensorStats:
    """Running statistics of one quantizer (all tensors tied to it) or of one tensor.

    ``sample`` holds at most `RANGE_SAMPLE` evenly spread values of the histogram samples (the range-health
    check counts the codes they fall on, `quantsim.calibration.range_health`)."""

    min: float = np.inf
    max: float = -np.inf
    histogram: HistogramObserver | None = None
    sample: np.ndarray | None = None

    def update_range(self, lo: float, hi: float) -> None:
        self.min, self.max = min(self.min, lo), max(self.max, hi)

    def keep_sample(self, values: np.ndarray) -> None:
        """Add a batch's values to ``sample``, thinned by halves whenever it outgrows `RANGE_SAMPLE`."""
        flat = np.asarray(values, dtype=np.float32).reshape(-1)
        flat = flat[:: max(1, flat.size // RANGE_SAMPLE)]
        self.sample = flat.copy() if self.sample is None else np.concatenate([self.sample, flat])
        while self.sample.size > RANGE_SAMPLE:
            self.sample = self.sample[::2]


def check_feed(feed: Mapping, inputs: list, where: str) -> dict[str, np.ndarray]:
    """Validate one feed dict against the session inputs: names, dtypes and ranks (clear errors)."""
    if not isinstance(feed, Mapping):
        raise InvalidTypeError(f"{where}: expected a dict of input name -> array, got {type(feed).__name__}")
    expected = {i.name: i for i in inputs}
    unknown = sorted(set(feed) - set(expected))
    missing = sorted(set(expected) - set(feed))
    if unknown or missing:
        raise InvalidArgumentError(
            f"{where}: feed does not match the model inputs {sorted(expected)}"
            + (f"; unknown: {unknown}" if unknown else "")
            + (f"; missing: {missing}" if missing else "")
        )
    checked = {}
    for name, value in feed.items():
        array = np.asarray(value)
        want = _ORT_TO_NUMPY.get(expected[name].type)
        if want is not None and array.dtype != want:
            raise InvalidTypeError(f"{where}: input {name!r} has dtype {array.dtype}, the model expects {np.dtype(want)}")
        rank = len(expected[name].shape) if expected[name].shape is not None else None
        if rank is not None and array.ndim != rank:
            raise InvalidArgumentError(
                f"{where}: input {name!r} has rank {array.ndim} (shape {array.shape}), the model expects rank "
                f"{rank} {tuple(expected[name].shape)}"
            )
        if rank is not None:
            wrong = [(axis, want_dim, got) for axis, (want_dim, got) in enumerate(zip(expected[name].shape, array.shape))
                     if isinstance(want_dim, int) and want_dim >= 0 and want_dim != got]
            if wrong:
                axis, want_dim, got = wrong[0]
                raise InvalidArgumentError(
                    f"{where}: input {name!r} has shape {array.shape}; the model expects {tuple(expected[name].shape)} "
                    f"(axis {axis}: {got} instead of {want_dim})"
                )
        checked[name] = array
    return checked


def _finite_feed(feed: dict[str, np.ndarray]) -> bool:
    """No NaN or Inf in a float input (numpy's min and max return NaN when one is present: no mask needed)."""
    return all(v.size == 0 or (math.isfinite(v.min()) and math.isfinite(v.max()))
               for v in feed.values() if np.issubdtype(v.dtype, np.floating))


class CalibrationSession:
    """What a calibration callback receives as ``session``: runs the model and records statistics.

    ``run`` returns only the outputs asked for (all model outputs for ``None``), like onnxruntime.
    Statistics are kept per quantizer (``stats``) and, for the tensors in ``per_tensor``, also per tensor
    (``tensor_stats``: what untying a tied grid needs, `quantsim.sim.decisions`). Sampled tensors
    fold their samples into a histogram when their quantizer is in ``histograms`` (None: all of them) and
    keep a `RANGE_SAMPLE`-value sample when it is in ``range_samples``.

    Given ``sessions`` (a `whole_tensors.CalibrationSessions`) instead of a session, the onnxruntime session
    is made when the first batch arrives, for its shapes (which tensors are fetched whole); ``get_inputs`` and
    ``get_outputs`` then describe the graph (name, type, shape) without a session.
    """

    def __init__(self, session: ort.InferenceSession | None, outputs: StatisticsOutputs | None, groups: dict[str, str],
                 histograms: frozenset[str] | None = None, range_samples: frozenset[str] = frozenset(),
                 per_tensor: frozenset[str] = frozenset(), *, sessions: CalibrationSessions | None = None):
        self._session = session
        self._sessions = sessions
        if sessions is not None:
            sessions.start()
        if outputs is None:
            if sessions is None:
                raise InvalidArgumentError("CalibrationSession needs its statistics outputs or a CalibrationSessions")
            outputs = StatisticsOutputs([o.name for o in sessions.outputs])
        self._outputs = outputs
        self._groups = groups  # tensor -> quantizer name
        self._histograms = histograms
        self._range_samples = range_samples
        self._set_fetch()
        self.stats: dict[str, TensorStats] = {}  # per quantizer
        self.tensor_stats: dict[str, TensorStats] = {}  # per tensor, for the tensors in per_tensor
        self._per_tensor = per_tensor
        self.batches_used = 0
        self.batches_skipped = 0
        self._nonfinite_tensors: set[str] = set()

    def _set_fetch(self) -> None:
        self._fetch = list(self._outputs.model_outputs)
        self._fetch += [n for n in self._outputs.statistics if n not in self._fetch]

    def get_inputs(self):
        if self._sessions is not None:
            return list(self._sessions.inputs)
        return self._session.get_inputs()

    def get_outputs(self):
        if self._sessions is not None:
            return list(self._sessions.outputs)
        return [o for o in self._session.get_outputs() if o.name in self._outputs.model_outputs]

    def run(self, output_names, input_feed, run_options=None):
        feed = check_feed(input_feed, self.get_inputs(), f"calibration batch {self.batches_used + self.batches_skipped}")
        names = output_names or self._outputs.model_outputs
        unknown = [n for n in names if n not in self._outputs.model_outputs]
        if unknown:
            raise InvalidArgumentError(f"calibration session: {unknown} are not outputs of the model "
                             f"(outputs: {self._outputs.model_outputs})")
        if not _finite_feed(feed):
            self.batches_skipped += 1
            _log.info("calibration: batch %d skipped (NaN/Inf in its inputs)", self.batches_used + self.batches_skipped - 1)
            warn_at_caller(
                f"calibration batch {self.batches_used + self.batches_skipped - 1} has NaN/Inf in its inputs: skipped",
                RuntimeWarning
            )
            if self._session is None and self._sessions is not None:
                self._session, _ = self._sessions.session_for(None)
            return self._session.run(list(names), feed, run_options)
        if self._sessions is not None:
            session, outputs = self._sessions.session_for(feed)
            if outputs is not self._outputs:
                self._session, self._outputs = session, outputs
                self._set_fetch()
        values = self._run_statistics(feed, run_options)
        if not self._outputs.steps_hold(values) and self._sessions is not None:
            _log.info("calibration: a tensor's size differs from its inferred shape; sampling steps computed "
                      "in-graph from here on (this batch run again)")
            self._session, self._outputs = self._sessions.session_for(feed, constant_steps=False)
            self._set_fetch()
            values = self._run_statistics(feed, run_options)
        self._record(values)
        self.batches_used += 1
        return [values[n] for n in names]

    def _run_statistics(self, feed: dict[str, np.ndarray], run_options) -> dict[str, np.ndarray]:
        session = self._session
        assert session is not None  # made for the batch by ``run``
        try:
            results = session.run(self._fetch, feed, run_options)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own (unexported) error types
            raise CalibrationError(f"calibration batch {self.batches_used + self.batches_skipped}: onnxruntime failed "
                                   f"to run the model on it: {exc}") from exc
        return dict(zip(self._fetch, results))

    def _batch_statistics(self, values: dict[str, np.ndarray]):
        """``(tensor, min, max, holds NaN, sample or None)`` per observed tensor of one batch, in the order
        the tensors were given; empty tensors are left out."""
        outputs = self._outputs
        for tensor in outputs.tensors:
            whole = outputs.whole.get(tensor)
            found = (whole_statistics(values[tensor], whole) if whole is not None
                     else in_graph_statistics(values, outputs, tensor))
            if found is None:  # an empty tensor in this batch: nothing to learn from it
                continue
            lo, hi, nan, sample = found
            if not nan and lo > hi:  # an empty tensor in this batch (in-graph): nothing to learn from it
                continue
            yield tensor, lo, hi, nan, sample

    def _record(self, values: dict[str, np.ndarray]) -> None:
        for tensor, lo, hi, nan, sample in self._batch_statistics(values):
            if nan:
                self._nonfinite_tensors.add(tensor)
                continue
            if not (math.isfinite(lo) and math.isfinite(hi)):  # documented policy: ignore this batch for it
                self._nonfinite_tensors.add(tensor)
                continue
            name = self._groups[tensor]
            targets = [self.stats.setdefault(name, TensorStats())]
            if tensor in self._per_tensor:
                targets.append(self.tensor_stats.setdefault(tensor, TensorStats()))
            # NaN that the in-graph reductions passed over is dropped here; min/max find it without a mask
            if sample is not None and sample.size and not (math.isfinite(sample.min()) and math.isfinite(sample.max())):
                sample = sample[np.isfinite(sample)]
            for stats in targets:
                stats.update_range(lo, hi)
                if sample is None:
                    continue
                if self._histograms is None or name in self._histograms:
                    if stats.histogram is None:
                        stats.histogram = HistogramObserver()
                    stats.histogram.update(sample, value_range=(lo, hi))
                if name in self._range_samples:
                    stats.keep_sample(sample)

    def finish(self) -> dict[str, TensorStats]:
        """Warnings for tensors that lost batches; the statistics per quantizer (raises without any batch)."""
        if self._nonfinite_tensors:
            names = sorted(self._nonfinite_tensors)
            unusable = sorted(t for t in names if self._groups[t] not in self.stats)
            warn_at_caller(
                f"non-finite values (NaN or Inf) in {len(names)} tensor(s) (e.g. {names[:3]}); those batches were "
                "ignored for them"
                + (f"; no batch was usable for {unusable[:3]}, which keep no encoding" if unusable else ""),
                RuntimeWarning
            )
        if self.batches_used == 0:
            raise CalibrationError(
                "calibration saw no usable batch"
                + (f" ({self.batches_skipped} skipped for NaN/Inf)" if self.batches_skipped else " (empty calibration data)")
                + "; encodings are unchanged"
            )
        return self.stats


def run_calibration(session: CalibrationSession, data, *, progress: bool = True) -> dict[str, TensorStats]:
    """Drive ``session`` with an iterable of feeds, or with a callback ``data(session)``; the statistics."""
    drive_calibration(session, data, progress=progress)
    return session.finish()


def drive_calibration(session: CalibrationSession, data, *, progress: bool = True) -> None:
    """Run every feed of ``data`` (an iterable of feed dicts) through ``session``, or call ``data(session)``."""
    if callable(data):
        data(session)
        return
    if isinstance(data, Mapping) or not isinstance(data, Iterable):
        raise InvalidTypeError(
            "compute_encodings expects an iterable of feed dicts or a callback(session[, args]); "
            f"got {type(data).__name__}"
        )
    total = len(data) if isinstance(data, Sized) else None
    for feed in tqdm(data, total=total, desc="calibration", unit="batch", disable=None if progress else True,
                     leave=False):  # None: shown on a terminal only, never as fragments in CI logs
        session.run(None, feed)
