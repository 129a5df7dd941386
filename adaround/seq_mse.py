"""Sequential MSE (aimet-onnx 2.x ``apply_seq_mse``): per layer, in topological order, the weight range
that minimises the layer's output error given its already-quantized input, then frozen.

For each weighted layer, candidate ranges scale the weight's per-channel (or per-tensor) min and max by
``(i + 1) / num_candidates``; each channel keeps the candidate with the least output error. The output
error of a weight ``W_c`` is quadratic in it, so one pass over the data gives second moments of the
layer input (`adaround.layer_data.SecondMoments`) and every candidate of every channel is scored
exactly on all the data: ``(W_c - W) S (W_c - W)^T`` per output channel. ``inp_symmetry`` picks which
input each side sees, as in AIMET's ``SeqMseParams``: "symqt" (both the sim's quantized input: the
default), "asym" (the float model's input for the float weight), "symfp" (both the float input).
("symqt" is the only one AIMET 2.42 runs). ``loss_fn``: "mse" (default), "l1" or "sqnr", as AIMET's
(`adaround.seq_mse_losses`). Per-block (and LPBQ) weights choose a factor per (channel, block) by the
block's own output error (`adaround.seq_mse_blocks`, "mse" only). Frozen, float or disabled weight quantizers
are skipped (reason in the report).

Call forms (AIMET's, told apart by argument types): ``apply_seq_mse(sim, inputs, num_candidates=20,
nodes_to_exclude=None)`` (aimet-onnx 2.42); ``apply_seq_mse(sim, inputs, SeqMseParams(...))`` or
``params=SeqMseParams(...)`` (every field of the object used: ``num_batches`` caps the batches read);
``apply_seq_mse(model, sim, params, data_loader)`` (aimet-onnx's older ``SequentialMse.apply_seq_mse``,
deprecated there too: it warns, and ``model`` is not read, the sim holds its float model); and the
`SequentialMse` object itself.
A layer followed by an unfolded BatchNormalization (`quantsim.FollowingBatchNorm`) scores each channel's
error in the network's units (times its factor squared for "mse", its absolute factor for "l1"; "sqnr" is
per channel and unchanged): the per-channel choice is unchanged, a per-tensor one weighs channels as the
network does.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
from tqdm.auto import tqdm

from adaround.apply import LayerReport, select_layers
from adaround.feeds import as_feeds, float_values, model_inputs
from adaround.layer_data import second_moments
from adaround.levels import independent_levels
from adaround.linear_form import LinearForm, linear_form
from adaround.seq_mse_blocks import best_block_encoding
from adaround.seq_mse_losses import LOSS_FUNCTIONS, candidate_losses
from quantsim import (
    InvalidArgumentError,
    InvalidTypeError,
    QuantizationSimModel,
    StagedCapturer,
    encoding_from_range,
    fake_quantize,
)
from quantsim.errors import warn_at_caller, warn_if_forking_pool

__all__ = ["apply_seq_mse", "SeqMseParams", "SequentialMse", "INPUT_SYMMETRIES", "LOSS_FUNCTIONS"]

_log = logging.getLogger(__name__)

INPUT_SYMMETRIES = ("symqt", "asym", "symfp")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class SeqMseParams:
    """AIMET's parameter object, every field used: ``num_batches`` (the first that many batches of the
    inputs; None: all; AIMET requires it), ``num_candidates`` ranges per channel, ``inp_symmetry``
    ("symqt", "asym", "symfp") and ``loss_fn`` ("mse", "l1", "sqnr"; see `adaround.seq_mse_losses`)."""

    num_batches: int | None = None
    num_candidates: int = 20
    inp_symmetry: str = "symqt"
    loss_fn: str = "mse"

    def __post_init__(self) -> None:
        if self.num_batches is not None:
            _positive_int("SeqMseParams.num_batches", self.num_batches)
        _positive_int("num_candidates", self.num_candidates)
        if self.inp_symmetry not in INPUT_SYMMETRIES:
            raise InvalidArgumentError(f"inp_symmetry must be one of {INPUT_SYMMETRIES}, got {self.inp_symmetry!r}")
        if self.loss_fn not in LOSS_FUNCTIONS:
            raise InvalidArgumentError(f"loss_fn must be one of {LOSS_FUNCTIONS}, got {self.loss_fn!r}")


def _moment_sources(staged: StagedCapturer, layer, float_side, symmetry: str):
    """``(sim-side batches, float-side batches or None)`` of the layer input for ``symmetry``."""
    if symmetry == "symfp":
        return iter(float_side), None
    quantized = staged([layer.input])
    return quantized, (iter(float_side) if symmetry == "asym" else None)


def _best_encoding(form: LinearForm, weight: np.ndarray, enc, spec, sources, tensor: str, params: SeqMseParams,
                   output_scale: np.ndarray | None = None):
    """``(encoding, loss, full-range loss)`` of one layer: plain data in and out, so that an executor's
    worker (another process or machine) computes exactly what the caller's process would."""
    axis = enc.axis if not enc.is_per_tensor else None
    reduce = tuple(i for i in range(weight.ndim) if i != axis) if axis is not None else None
    lo, hi = np.minimum(weight.min(axis=reduce), 0.0), np.maximum(weight.max(axis=reduce), 0.0)
    flags = {"symmetric": spec.symmetric, "strict": spec.strict_symmetric, "unsigned_symmetric": spec.unsigned_symmetric}
    num = params.num_candidates
    factors = np.asarray([(i + 1) / num for i in range(num)])
    candidates = [form.to_matrix(fake_quantize(weight, encoding_from_range(lo * f, hi * f, enc.bits, axis=axis,
                                                                           **flags))) for f in factors]
    table = candidate_losses(form, tensor, sources[0], sources[1], candidates, form.to_matrix(weight), params.loss_fn)
    if output_scale is not None and output_scale.size == table.shape[1] and params.loss_fn != "sqnr":
        factor = np.square(output_scale) if params.loss_fn == "mse" else np.abs(output_scale)
        table = table * factor[None, :]  # the error after a following BatchNormalization
    if axis is None:  # one range for the tensor: the candidate with the least total over the channels
        best = factors[int(np.argmin(table.sum(axis=1)))]
        return (encoding_from_range(lo * best, hi * best, enc.bits, **flags), float(table.sum(axis=1).min()),
                float(table[-1].sum()))
    choice = factors[np.argmin(table, axis=0)]  # rows of W_mat are the weight's output channels: the channel axis
    return (encoding_from_range(lo * choice, hi * choice, enc.bits, axis=axis, **flags),
            float(table.min(axis=0).sum()), float(table[-1].sum()))


def _materialized(args: tuple) -> tuple:
    """``_best_encoding``'s arguments with the captured batches as lists (iterators do not travel)."""
    sources = args[4]
    listed = (list(sources[0]), None if sources[1] is None else list(sources[1]))
    return (*args[:4], listed, *args[5:])


def _resolve_call(sim, inputs, num_candidates, nodes_to_exclude, params):
    """``(sim, inputs, params given positionally or None, num_candidates, nodes_to_exclude)`` for every
    call form (module docstring)."""
    if isinstance(inputs, QuantizationSimModel) and not isinstance(sim, QuantizationSimModel):
        third, fourth = num_candidates, nodes_to_exclude
        if isinstance(third, SeqMseParams) == isinstance(fourth, SeqMseParams):
            raise InvalidTypeError("apply_seq_mse(model, sim, params, data_loader): expected one SeqMseParams among "
                                   f"the last two arguments, got {type(third).__name__} and {type(fourth).__name__}")
        warn_at_caller("apply_seq_mse(model, sim, params, data_loader) is AIMET's deprecated form: use "
                       "apply_seq_mse(sim, inputs, params); the model argument is not read (the sim holds its "
                       "float model)", DeprecationWarning)
        given, data = (third, fourth) if isinstance(third, SeqMseParams) else (fourth, third)
        if params is not None:
            raise InvalidArgumentError("apply_seq_mse: params given twice (positionally and as params=)")
        return inputs, data, given, 20, None
    if isinstance(num_candidates, SeqMseParams):
        if params is not None:
            raise InvalidArgumentError("apply_seq_mse: params given twice (positionally and as params=)")
        return sim, inputs, num_candidates, 20, nodes_to_exclude
    return sim, inputs, None, num_candidates, nodes_to_exclude


_Batches = Iterable[Mapping[str, np.ndarray] | np.ndarray | Sequence[Any]]


@overload
def apply_seq_mse(sim: QuantizationSimModel, inputs: _Batches, num_candidates: int | SeqMseParams = 20,
                  nodes_to_exclude: Iterable[str] | None = None, *, params: SeqMseParams | None = None,
                  num_batches: int | None = None, inp_symmetry: str = "symqt", loss_fn: str = "mse",
                  progress: bool | None = None, executor: Executor | None = None) -> list[LayerReport]: ...


@overload
def apply_seq_mse(sim: Any, inputs: QuantizationSimModel, num_candidates: SeqMseParams | _Batches,
                  nodes_to_exclude: _Batches | SeqMseParams) -> list[LayerReport]: ...


def apply_seq_mse(sim: Any, inputs: Any, num_candidates: Any = 20, nodes_to_exclude: Any = None, *,
                  params: SeqMseParams | None = None, num_batches: int | None = None, inp_symmetry: str = "symqt",
                  loss_fn: str = "mse", progress: bool | None = None,
                  executor: Executor | None = None) -> list[LayerReport]:
    """Choose and freeze every eligible weight encoding by Sequential MSE (see the module docstring).

    ``inputs``: batches as `adaround.feeds` takes them. ``params`` (or a `SeqMseParams` in place of
    ``num_candidates``) sets ``num_batches``, ``num_candidates``, ``inp_symmetry`` and ``loss_fn`` at once;
    giving any of those as keywords as well is an error. Returns one `LayerReport` per weighted layer
    (``loss_before``: the loss, in ``loss_fn``'s units, of the full min-max range; ``loss_after``: of
    the chosen ranges; AIMET returns None). Usable alone or before `apply_adaround`, which then rounds
    against the frozen encodings. Any failure leaves the sim exactly as it was. ``executor``: a
    `concurrent.futures.Executor` (or anything with its ``submit``, Dask's ``Client`` included) that scores
    the layers of each level of independent problems (`adaround.levels`) at once; the results are bit for
    bit those of the local run (the workers get the captured inputs and compute what this process would).
    """
    sim, inputs, positional, num_candidates, nodes_to_exclude = _resolve_call(sim, inputs, num_candidates,
                                                                             nodes_to_exclude, params)
    params = positional if positional is not None else params
    warn_if_forking_pool(executor, "apply_seq_mse")
    if not isinstance(sim, QuantizationSimModel):
        raise InvalidTypeError(f"apply_seq_mse(sim, inputs, ...): sim must be a QuantizationSimModel, got "
                               f"{type(sim).__name__}")
    if params is not None:
        if not isinstance(params, SeqMseParams):
            raise InvalidTypeError(f"apply_seq_mse: params must be SeqMseParams, got {type(params).__name__}")
        clashing = [name for name, value, default in (("num_candidates", num_candidates, 20), ("num_batches",
                    num_batches, None), ("inp_symmetry", inp_symmetry, "symqt"), ("loss_fn", loss_fn, "mse"))
                    if value != default]
        if clashing:
            raise InvalidArgumentError(f"apply_seq_mse: {clashing} given both as keywords and in SeqMseParams")
    else:
        params = SeqMseParams(num_batches, num_candidates, inp_symmetry, loss_fn)  # validates them
    feeds = as_feeds(inputs, model_inputs(sim), "apply_seq_mse inputs", params.num_batches)
    progress = sim.progress if progress is None else progress
    sim.compute_param_encodings()
    excluded = set(nodes_to_exclude or ())
    known = {layer.node for layer in sim.weighted_layers()}
    if excluded - known:
        raise InvalidArgumentError(f"nodes_to_exclude: {sorted(excluded - known)} are not weighted nodes")
    layers, reports = select_layers(sim, [n for n in known if n not in excluded])
    float_inputs = {layer.input for layer in layers} if params.inp_symmetry != "symqt" else set()
    with sim.transaction(), float_values(sim, float_inputs, feeds) as float_side, \
            StagedCapturer(sim, feeds) as staged:  # one float pass, if needed; sim inputs kept layer to layer
        bar = tqdm(total=len(layers), desc="Sequential MSE", unit="layer", leave=False,
                   disable=None if progress else True)
        try:
            for level in (independent_levels(sim, layers) if executor is not None else [[layer] for layer in layers]):
                jobs = []
                for layer in level:  # every input of a level is captured before any of its layers changes
                    q = layer.weight_quantizer
                    assert q is not None and q.encoding is not None  # select_layers keeps encoded weights only
                    if q.is_encoding_frozen():
                        reports.append(LayerReport(layer.node, layer.op_type, "skipped", "weight encoding frozen"))
                        continue
                    weight = sim.get_weight(layer.weight).astype(np.float32)
                    form = linear_form(layer.op_type, layer.attributes, weight.shape)
                    sources = _moment_sources(staged, layer, float_side, params.inp_symmetry)
                    if q.encoding.block_size is not None:
                        if params.loss_fn != "mse":
                            raise InvalidArgumentError(f"apply_seq_mse: per-block weights ({layer.weight}) take "
                                                       f"loss_fn='mse' only, got {params.loss_fn!r}")
                        data = second_moments(form, sources[0], sources[1], layer.input)
                        jobs.append((layer, best_block_encoding(form, weight, q, data, params.num_candidates)))
                        continue
                    scale = layer.batchnorm.scale if layer.batchnorm else None
                    args = (form, weight, q.encoding, q.spec, sources, layer.input, params, scale)
                    if executor is None:
                        jobs.append((layer, _best_encoding(*args)))
                    else:
                        jobs.append((layer, executor.submit(_best_encoding, *_materialized(args))))
                for layer, job in jobs:  # in topological order, whichever worker finished first
                    result = job.result() if hasattr(job, "result") else job
                    q = layer.weight_quantizer
                    assert q is not None
                    if len(result) == 3:
                        encoding, loss, full_range_loss = result
                        q.set_encoding(encoding)
                    else:
                        loss, full_range_loss = result
                    q.freeze_encodings()
                    _log.info("Sequential MSE %s: %s %.4g (full range %.4g)", layer.node, params.loss_fn, loss,
                              full_range_loss)
                    mode = "columns" if params.loss_fn == "l1" else "moments"
                    reports.append(LayerReport(layer.node, layer.op_type, "optimized", "", mode, full_range_loss, loss))
                bar.update(len(level))
        finally:
            bar.close()
    order = {layer.node: i for i, layer in enumerate(sim.weighted_layers())}
    return sorted(reports, key=lambda r: order.get(r.node, len(order)))


class SequentialMse:
    """aimet-onnx's object form, kept there for older scripts: ``SequentialMse(model, sim, params, data_loader,
    nodes_to_exclude=None).apply_seq_mse_algo()`` and the static ``SequentialMse.apply_seq_mse(model, sim,
    params, data_loader)`` (deprecated in aimet-onnx 2.42 as here). ``model`` is not read: the sim holds its
    float model. Both run `apply_seq_mse` with every field of ``params``."""

    def __init__(self, model: Any, sim: QuantizationSimModel, params: SeqMseParams,
                 data_loader: _Batches, nodes_to_exclude: Iterable[str] | None = None):
        if not isinstance(params, SeqMseParams):
            raise InvalidTypeError(f"SequentialMse: params must be SeqMseParams, got {type(params).__name__}")
        self.sim, self.params, self.data_loader = sim, params, data_loader
        self.nodes_to_exclude = nodes_to_exclude

    def apply_seq_mse_algo(self) -> list[LayerReport]:
        """Run Sequential MSE on the sim (in place); the per-layer reports (AIMET returns None)."""
        return apply_seq_mse(self.sim, self.data_loader, self.params, self.nodes_to_exclude)

    @staticmethod
    def apply_seq_mse(model: Any, sim: QuantizationSimModel, params: SeqMseParams,
                      data_loader: _Batches) -> list[LayerReport]:
        """Deprecated (as in aimet-onnx): use ``apply_seq_mse(sim, inputs, params)``."""
        return apply_seq_mse(model, sim, params, data_loader)
