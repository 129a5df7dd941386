"""AIMET's ``QuantAnalyzer`` (aimet_onnx.quant_analyzer, 2.42) on quantsim: where a model loses accuracy to
quantization, as data files plus one self-contained HTML page.

``QuantAnalyzer(model, dummy_input, forward_pass_callback, eval_callback).analyze(...)`` builds and calibrates a
sim, then writes into ``results_dir`` (AIMET's names; AIMET writes a bokeh HTML page beside each JSON, here the
JSON files carry the same data and `QUANT_ANALYZER_PAGE` shows all of it):

* the model's score in float, with only the weights quantized and with only the activations quantized (logged,
  and on the page);
* ``per_layer_quant_enabled.json`` / ``per_layer_quant_disabled.json``: ``{node: score}`` with only that node's
  quantizers enabled / with only them disabled (a node's quantizers: its enabled parameter and output
  quantizers and those of the model inputs it reads, as AIMET's ``get_op_quantizers``), from
  `mixed_precision.group_sensitivity`;
* ``min_max_ranges/weights.json`` and ``activations.json``: each quantizer's encoding ``[min, max]``, named
  ``<node>_input_<i>`` / ``<node>_output_<i>`` / ``<node>_<weight|bias>`` (non-word characters become ``_``),
  per-channel parameters as ``{<name>_<channel>: [min, max]}``;
* with TF-enhanced (as AIMET), ``activations_pdf/<node>_{input,output}_q<i>_0.json`` and
  ``weights_pdf/<node>/<node>_<param>_<channel>.json``: ``{"histogram": [[left edge, share of values], ...],
  "encoding": {"min", "max"}}`` over the values' own range (`HISTOGRAM_BINS` bins): activations are the float
  model's values on the calibration data (AIMET's come from its calibration pass: weights quantized, earlier
  activations not), recorded while the forward-pass callback calibrates;
* after `QuantAnalyzer.enable_per_layer_mse_loss`, ``per_layer_mse_loss.json``: per node whose output has a
  quantizer, AIMET's figure: the sum over batches of the batch's mean squared difference between the float
  model's output and the sim's (after that quantizer), divided by the number of samples.

The sim is the caller's to keep: every method that changes quantizers restores them (`temporary_state`).
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from mixed_precision.analysis import group_sensitivity
from mixed_precision.files import write_text_atomic
from mixed_precision.quant_analyzer_page import QUANT_ANALYZER_PAGE, write_quant_analyzer_html
from quantsim import (
    InvalidArgumentError,
    InvalidTypeError,
    QcQuantizeOp,
    QuantizationSimModel,
    QuantizerGroup,
    QuantScheme,
    TensorCache,
    qtype,
)

__all__ = ["QuantAnalyzer", "HISTOGRAM_BINS", "QUANT_ANALYZER_PAGE"]

_log = logging.getLogger(__name__)
HISTOGRAM_BINS = 512  # buckets of each exported histogram, as AIMET's TF-enhanced statistics


def _clean(name: str) -> str:
    return re.sub(r"\W+", "_", name)


def _save_json(data: Any, folder: str | os.PathLike, name: str) -> Path:
    Path(folder).mkdir(parents=True, exist_ok=True)
    return write_text_atomic(Path(folder) / name, json.dumps(data, indent=4))


class _RecordingSession:
    """The calibration session handed to the forward-pass callback, keeping a copy of every feed it runs."""

    def __init__(self, session: Any, store: TensorCache):
        self._session, self._store = session, store

    def run(self, output_names, input_feed=None, *args, **kwargs):
        if input_feed is not None:
            self._store.append(dict(input_feed))
        return self._session.run(output_names, input_feed, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


AIMET_ANALYZER_SIM = {"fold_batchnorm": True, "range_health": False, "depthwise_supergroups": False,
                      "int32_bias": False}
"""How aimet-onnx 2.42's QuantAnalyzer builds its sims (it folds BatchNormalization first), as constructor options."""


class QuantAnalyzer:
    """AIMET's QuantAnalyzer: ``eval_callback(session) -> float`` (higher is better) scores a session;
    ``forward_pass_callback`` calibrates (AIMET's ``CallbackFunc``, called as ``func(session, args)``, or a plain
    ``callback(session)``). ``dummy_input`` is part of AIMET's signature and is kept, not used: the sims are built
    without it, since an ONNX model carries its own shapes (`QuantizationSimModel` would warn that it has no
    effect). The sims it builds place quantizers as aimet-onnx's QuantAnalyzer does (`AIMET_ANALYZER_SIM`:
    BatchNormalization folded, a depthwise convolution's output quantized, no calibrated decisions, float
    biases); ``sim_options`` (ours) override any of them for every `QuantizationSimModel` it builds."""

    def __init__(self, model: onnx.ModelProto, dummy_input: Mapping[str, np.ndarray] | None,
                 forward_pass_callback: Callable[..., Any], eval_callback: Callable[[Any], float], *,
                 sim_options: Mapping[str, Any] | None = None):
        if not callable(forward_pass_callback):
            raise InvalidTypeError(f"forward_pass_callback must be callable, got {type(forward_pass_callback).__name__}")
        if not callable(eval_callback):
            raise InvalidTypeError(f"eval_callback must be callable, got {type(eval_callback).__name__}")
        inner = getattr(model, "model", None)  # onnxruntime's ONNXModel wrapper, as AIMET accepts
        self._model = inner if not isinstance(model, onnx.ModelProto) and isinstance(inner, onnx.ModelProto) else model
        if not isinstance(self._model, onnx.ModelProto):
            raise InvalidTypeError(f"QuantAnalyzer takes an onnx.ModelProto, got {type(model).__name__}")
        self._dummy_input = dummy_input
        self._sim_options = {**AIMET_ANALYZER_SIM, **(sim_options or {})}
        self._forward_pass_callback = forward_pass_callback
        self._eval_callback = eval_callback
        self._mse_data: Iterable | None = None
        self._num_batches = 0
        self._calibration = TensorCache()  # the feeds the forward pass ran, for the activation histograms

    # ---- the whole analysis ------------------------------------------------------------------------------
    def analyze(self, quant_scheme: QuantScheme | str = QuantScheme.post_training_tf_enhanced, default_param_bw: int = 8,
                default_activation_bw: int = 8, config_file: str | None = None,
                results_dir: str | os.PathLike = "./tmp/") -> dict[str, Any]:
        """Run every analysis and write its files into ``results_dir`` (see the module docstring); returns the
        data written (AIMET returns None)."""
        sim = self.create_quantsim_and_encodings(quant_scheme, default_param_bw, default_activation_bw, config_file)
        folder = Path(results_dir).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        float_score, weights_only, activations_only = self.check_model_sensitivity_to_quantization(sim)
        groups = _op_groups(sim)
        _, quantized, scores = group_sensitivity(sim, self._eval_callback, groups)
        enabled = {g.nodes[0]: s.alone for g, s in zip(groups, scores)}
        disabled = {g.nodes[0]: s.without for g, s in zip(groups, scores)}
        _save_json(enabled, folder, "per_layer_quant_enabled.json")
        _save_json(disabled, folder, "per_layer_quant_disabled.json")
        weights, activations = self.export_per_layer_encoding_min_max_range(sim, folder)
        histograms = None
        if QuantScheme.from_str(quant_scheme) == QuantScheme.post_training_tf_enhanced:  # as AIMET
            histograms = self.export_per_layer_stats_histogram(sim, folder)
        mse = self.export_per_layer_mse_loss(sim, folder) if self._mse_data is not None else None
        report = {"float_score": float_score, "weight_quantized_score": weights_only,
                  "activation_quantized_score": activations_only, "quantized_score": quantized,
                  "per_layer_quant_enabled": enabled, "per_layer_quant_disabled": disabled,
                  "weights_min_max": weights, "activations_min_max": activations, "per_layer_mse_loss": mse,
                  "activation_histograms": histograms}
        write_quant_analyzer_html(report, folder / QUANT_ANALYZER_PAGE)
        return report

    def create_quantsim_and_encodings(self, quant_scheme: QuantScheme | str, default_param_bw: int,
                                      default_activation_bw: int, config_file: str | None) -> QuantizationSimModel:
        """A sim of the model at these bitwidths, calibrated with the forward-pass callback."""
        sim = QuantizationSimModel(self._model, quant_scheme=quant_scheme, param_type=qtype.int(default_param_bw),
                                   activation_type=qtype.int(default_activation_bw), config_file=config_file,
                                   **self._sim_options)
        self._calibration.close()
        callback = self._forward_pass_callback
        func, args = getattr(callback, "func", None), getattr(callback, "args", None)

        def recorded(session: Any) -> Any:
            session = _RecordingSession(session, self._calibration)
            return func(session, args) if callable(func) else callback(session)

        sim.compute_encodings(recorded)
        return sim

    def check_model_sensitivity_to_quantization(self, sim: QuantizationSimModel) -> tuple[float, float, float]:
        """``(float score, score with only the weights quantized, score with only the activations quantized)``."""
        scores = []
        for keep in ((), ("param",), ("activation",)):
            with sim.temporary_state():
                for q in sim.quantizers:
                    q.enabled = q.enabled and q.role in keep
                scores.append(float(self._eval_callback(sim.session)))
        _log.info("QuantAnalyzer: float %g, weights quantized %g, activations quantized %g", *scores)
        return scores[0], scores[1], scores[2]

    # ---- per layer --------------------------------------------------------------------------------------
    def perform_per_layer_analysis_by_enabling_quantizers(self, sim: QuantizationSimModel,
                                                          results_dir: str | os.PathLike | None = None,
                                                          filename: str | None = None) -> dict[str, float]:
        """``{node: score with only that node's quantizers enabled}``; written to ``results_dir`` as
        ``<filename or per_layer_quant_enabled>.json``."""
        return self._per_layer(sim, "alone", results_dir, filename or "per_layer_quant_enabled")

    def perform_per_layer_analysis_by_disabling_quantizers(self, sim: QuantizationSimModel,
                                                           results_dir: str | os.PathLike | None = None,
                                                           filename: str | None = None) -> dict[str, float]:
        """``{node: score with only that node's quantizers disabled}``; written like the enabled analysis."""
        return self._per_layer(sim, "without", results_dir, filename or "per_layer_quant_disabled")

    def _per_layer(self, sim: QuantizationSimModel, which: str, results_dir, filename: str) -> dict[str, float]:
        groups = _op_groups(sim)
        _, _, scores = group_sensitivity(sim, self._eval_callback, groups, compute=(which,))
        result = {g.nodes[0]: getattr(s, which) for g, s in zip(groups, scores)}
        if results_dir is not None:
            name = filename[:-5] if filename.endswith(".html") else filename
            _save_json(result, results_dir, f"{name}.json")
        return result

    def export_per_layer_encoding_min_max_range(self, sim: QuantizationSimModel, results_dir: str | os.PathLike
                                                ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(weights, activations)`` encoding ranges (see the module docstring), written to
        ``results_dir/min_max_ranges/{weights,activations}.json``."""
        weights: dict[str, Any] = {}
        activations: dict[str, Any] = {}
        for node, inputs, outputs, params in _op_quantizers(sim):
            op = _clean(node)
            for kind, quantizers in (("input", inputs), ("output", outputs)):
                for i, q in enumerate(quantizers):
                    enc = q.get_encodings()
                    if enc:
                        activations[f"{op}_{kind}_{i}"] = [enc[0].min, enc[0].max]
            for param_type, q in params.items():
                enc = q.get_encodings()
                if not enc:
                    continue
                name = _clean(f"{op}_{param_type}")
                weights[name] = ({f"{name}_{k}": [e.min, e.max] for k, e in enumerate(enc)} if len(enc) > 1
                                 else [enc[0].min, enc[0].max])
        folder = Path(results_dir) / "min_max_ranges"
        _save_json(weights, folder, "weights.json")
        _save_json(activations, folder, "activations.json")
        return weights, activations

    def export_per_layer_stats_histogram(self, sim: QuantizationSimModel, results_dir: str | os.PathLike
                                         ) -> dict[str, Any]:
        """Histograms of each quantizer's values (see the module docstring); returns the activations'
        ``{file stem: {"histogram", "encoding"}}``. Activations need the calibration feeds: call after
        `create_quantsim_and_encodings` (or `analyze`)."""
        folder = Path(results_dir)
        activation_files: dict[str, QcQuantizeOp] = {}
        weights = []
        for node, inputs, outputs, params in _op_quantizers(sim):
            op = _clean(node)
            for kind, quantizers in (("input", inputs), ("output", outputs)):
                for i, q in enumerate(quantizers):
                    activation_files[f"{op}_{kind}_q{i}_0"] = q
            weights += [(q, folder / "weights_pdf" / op, f"{op}_{_clean(param_type)}") for param_type, q in params.items()]
        if activation_files and not len(self._calibration):  # refused before any file is written
            raise InvalidArgumentError("no calibration feeds recorded: activation histograms need the sim from "
                                       "create_quantsim_and_encodings (or analyze)")
        for q, where, stem in weights:
            self._weight_histograms(sim, q, where, stem)
        tensors = {stem: q.tensors[0] for stem, q in activation_files.items() if q.encoding is not None}
        values = _stream_histograms(sim, sorted(set(tensors.values())), self._calibration)
        out = {}
        for stem, tensor in tensors.items():
            enc = activation_files[stem].get_encodings() or []
            data = {"histogram": values[tensor], "encoding": {"min": enc[0].min, "max": enc[0].max}}
            _save_json(data, folder / "activations_pdf", f"{stem}.json")
            out[stem] = data
        return out

    @staticmethod
    def _weight_histograms(sim: QuantizationSimModel, q: QcQuantizeOp, folder: Path, stem: str) -> None:
        enc = q.get_encodings()
        if not enc:
            return
        w = np.asarray(sim.get_weight(q.tensors[0]), dtype=np.float64)
        axis = q.channel_axis if len(enc) > 1 and q.channel_axis is not None else None
        rows = [w.reshape(-1)] if axis is None else list(np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1))
        for k, (row, e) in enumerate(zip(rows, enc)):
            _save_json({"histogram": _pdf(*_counts([row], float(row.min()), float(row.max()))),
                        "encoding": {"min": e.min, "max": e.max}}, folder, f"{stem}_{k}.json")

    # ---- per-layer MSE -------------------------------------------------------------------------------------
    def enable_per_layer_mse_loss(self, unlabeled_dataset_iterable: Iterable, num_batches: int) -> None:
        """Make `analyze` also write the per-layer MSE over the first ``num_batches`` batches of the data (each
        a feed dict, an array for a single-input model, or a list of arrays in input order)."""
        if not hasattr(unlabeled_dataset_iterable, "__len__"):
            raise InvalidArgumentError("unlabeled_dataset_iterable must have a length (a list, a data loader)")
        if len(unlabeled_dataset_iterable) < num_batches:  # type: ignore[arg-type]
            raise InvalidArgumentError(f"can not fetch {num_batches} batches from a data set of "
                                       f"{len(unlabeled_dataset_iterable)}")  # type: ignore[arg-type]
        if num_batches < 1:
            raise InvalidArgumentError(f"num_batches must be >= 1, got {num_batches}")
        self._mse_data, self._num_batches = unlabeled_dataset_iterable, int(num_batches)

    def export_per_layer_mse_loss(self, sim: QuantizationSimModel, results_dir: str | os.PathLike) -> dict[str, float]:
        """``{node: AIMET's MSE figure}`` (module docstring), written to ``results_dir/per_layer_mse_loss.json``."""
        if self._mse_data is None:
            raise InvalidArgumentError("call enable_per_layer_mse_loss first")
        names = [i.name for i in sim.model.graph.input]
        feeds: list[dict[str, np.ndarray]] = []
        for batch in self._mse_data:
            if len(feeds) == self._num_batches:
                break
            feeds.append(_feed_dict(batch, names))
        nodes = {n.name: n.output[0] for n in sim.model.graph.node
                 if n.op_type != "Constant" and n.output and n.output[0] in sim.qc_quantize_op_dict}
        tensors = sorted(set(nodes.values()))
        sums = dict.fromkeys(tensors, 0.0)
        samples = 0
        if tensors:
            for ref, got in zip(sim.capture(tensors, feeds, quantized=False), sim.capture(tensors, feeds)):
                for t in tensors:
                    diff = np.asarray(ref[t], np.float64) - np.asarray(got[t], np.float64)
                    sums[t] += float(np.mean(diff * diff)) if diff.size else 0.0
                samples += int(np.asarray(ref[tensors[0]]).shape[0]) if np.ndim(ref[tensors[0]]) else 1
        result = {node: sums[t] / max(samples, 1) for node, t in nodes.items()}
        _save_json(result, results_dir, "per_layer_mse_loss.json")
        return result


def _feed_dict(batch: Any, names: list[str]) -> dict[str, np.ndarray]:
    if isinstance(batch, Mapping):
        return {k: np.asarray(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        if len(batch) != len(names):
            raise InvalidArgumentError(f"a batch of {len(batch)} arrays for a model with inputs {names}")
        return {n: np.asarray(v) for n, v in zip(names, batch)}
    return {names[0]: np.asarray(batch)}


def _op_quantizers(sim: QuantizationSimModel):
    """Per node, in graph order: its enabled model-input quantizers, output quantizers and ``{param type:
    quantizer}`` (AIMET's ``get_op_quantizers``), for nodes that have any."""
    model = sim.model
    graph_inputs = {i.name for i in model.graph.input}
    table = sim.qc_quantize_op_dict
    for node in model.graph.node:
        inputs = [table[n] for n in node.input if n in graph_inputs and n in table and table[n].enabled]
        outputs = [table[n] for n in node.output if n in table and table[n].enabled]
        params = {}
        for slot, name in enumerate(node.input):
            q = table.get(name)
            if q is not None and q.enabled and q.role == "param":
                params[q.param_type or f"param_{slot}"] = q
        if inputs or outputs or params:
            yield node.name, inputs, outputs, params


def _op_groups(sim: QuantizationSimModel) -> list[QuantizerGroup]:
    groups = []
    for node, inputs, outputs, params in _op_quantizers(sim):
        acts = tuple(dict.fromkeys(q.name for q in [*inputs, *outputs]))
        groups.append(QuantizerGroup(tuple(q.name for q in params.values()), acts, (node,)))
    return groups


def _counts(chunks: Iterable[np.ndarray], lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, HISTOGRAM_BINS + 1)
    counts = np.zeros(HISTOGRAM_BINS, np.int64)
    for chunk in chunks:
        counts += np.histogram(chunk, bins=edges)[0]
    return counts, edges


def _pdf(counts: np.ndarray, edges: np.ndarray) -> list[list[float]]:
    total = max(int(counts.sum()), 1)
    return [[float(left), float(c) / total] for left, c in zip(edges[:-1], counts)]


def _stream_histograms(sim: QuantizationSimModel, tensors: list[str], feeds: TensorCache
                       ) -> dict[str, list[list[float]]]:
    """Each tensor's histogram over its own range on the float model: one pass for the ranges, one to count."""
    if not tensors:
        return {}
    lo = dict.fromkeys(tensors, math.inf)
    hi = dict.fromkeys(tensors, -math.inf)
    for batch in sim.capture(tensors, feeds, quantized=False):
        for t in tensors:
            values = np.asarray(batch[t])
            finite = values[np.isfinite(values)]
            if finite.size:
                lo[t], hi[t] = min(lo[t], float(finite.min())), max(hi[t], float(finite.max()))
    edges = {t: np.linspace(lo[t], hi[t] if hi[t] > lo[t] else lo[t] + 1.0, HISTOGRAM_BINS + 1)
             for t in tensors if math.isfinite(lo[t])}
    counts = {t: np.zeros(HISTOGRAM_BINS, np.int64) for t in edges}
    for batch in sim.capture(tensors, feeds, quantized=False):
        for t in edges:
            counts[t] += np.histogram(np.asarray(batch[t]), bins=edges[t])[0]
    return {t: _pdf(counts[t], edges[t]) if t in edges else [] for t in tensors}
