"""`apply_adaround`: AdaRound every eligible weighted layer of a sim, in place, in topological order.

For each layer: the sim's input to it (earlier layers already rounded; activation quantizers as
calibrated, or pass-through while uncalibrated, as in AIMET) and the float model's target are streamed
through once (`adaround.layer_data`), the rounding is optimised (`adaround.layer_rounding`), and the
rounded weight replaces the sim's weight with its encoding frozen. The whole run is one
`sim.transaction()`: an exception or KeyboardInterrupt leaves the sim exactly as it was.

Skipped, each with the reason in the returned report: layers whose weight quantizer is missing,
disabled or float (FP16), frozen weights already on their grid (e.g. loaded with
`set_and_freeze_param_encodings` after an earlier AdaRound), shared weights, and layer shapes the linear
form does not cover (3-D convolutions, ConvTranspose with ``output_shape``). A frozen encoding whose
weight is not on its grid yet (e.g. chosen by Sequential MSE) is kept and the weight rounded against it.
A layer followed by an unfolded BatchNormalization (`quantsim.FollowingBatchNorm`) is rounded as if the BN were
folded into it: for the error after the BN and after the activation reading it (`adaround.layer_rounding`).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from adaround.activations import Activation, activation_for
from adaround.feeds import as_feeds, float_values, model_inputs
from adaround.layer_job import ActivationSpec, LayerProblem, solve
from adaround.layer_rounding import OutputAffine, RoundingResult, WeightGrid
from adaround.levels import independent_levels
from adaround.linear_form import LinearForm, UnsupportedLayer, linear_form
from adaround.params import AdaroundSettings
from quantsim import (
    FollowingActivation,
    InvalidArgumentError,
    InvalidTypeError,
    QuantizationSimModel,
    StagedCapturer,
    WeightedLayer,
    broadcast_param,
    fake_quantize,
)
from quantsim.errors import warn_at_caller, warn_if_forking_pool

__all__ = ["apply_adaround", "LayerReport", "select_layers"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerReport:
    """What happened to one weighted layer."""

    node: str
    op_type: str
    status: str  # "rounded" (AdaRound), "optimized" (Sequential MSE) or "skipped"
    reason: str = ""
    mode: str = ""  # "moments" (exact, all the data), "moments+sampled" (exact at anchors), "sampled"; Seq MSE
    # "columns" (loss_fn "l1": every column multiplied out)
    loss_before: float | None = None  # output error of nearest rounding (AdaRound) / the full range (Seq MSE)
    loss_after: float | None = None
    flipped: float | None = None  # share of weights rounded away from nearest
    seconds: float = 0.0
    iterations: int | None = None  # AdaRound's Adam steps (fewer than asked once the rounding is settled)


def _skip_reason(sim: QuantizationSimModel, layer: WeightedLayer) -> str | None:
    q = layer.weight_quantizer
    if q is None or not q.enabled:
        return "weight quantizer disabled"
    if q.spec.is_float or q.spec.is_fp8:
        return f"weight simulated as {q.spec.dtype} (no integer grid to round to)"
    if q.is_encoding_frozen() and q.encoding is not None:
        weight = sim.get_weight(layer.weight)
        if np.array_equal(fake_quantize(weight, q.encoding), weight):
            return "weight encoding frozen and the weight already on its grid (left as it is)"
    if q.encoding is None:
        return "weight has no encoding"
    if layer.shared_weight:
        return "weight shared with other nodes"
    return None


def select_layers(sim: QuantizationSimModel, nodes_to_include: Iterable[str] | None) -> tuple[list, list[LayerReport]]:
    """``(layers to optimise, reports of the skipped ones)``; unknown or weightless names are an error."""
    layers = sim.weighted_layers()
    by_name = {layer.node: layer for layer in layers}
    if nodes_to_include is not None:
        wanted = list(nodes_to_include)
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            known = {node.name for node in sim.model.graph.node}
            detail = ", ".join(f"{n!r} ({'has no constant weight' if n in known else 'no such node'})" for n in unknown)
            raise InvalidArgumentError(f"nodes_to_include: {detail}; weighted layers: {sorted(by_name)[:10]}")
        layers = [layer for layer in layers if layer.node in set(wanted)]
    chosen, skipped = [], []
    for layer in layers:
        reason = _skip_reason(sim, layer)
        if reason is None:
            try:
                linear_form(layer.op_type, layer.attributes, sim.get_weight(layer.weight).shape)
            except UnsupportedLayer as error:
                reason = str(error)
        if reason is None:
            chosen.append(layer)
        else:
            skipped.append(LayerReport(layer.node, layer.op_type, "skipped", reason))
    return chosen, skipped


def _grid(layer: WeightedLayer, weight: np.ndarray) -> WeightGrid:
    assert layer.weight_quantizer is not None  # select_layers keeps quantized layers only
    enc = layer.weight_quantizer.require_encoding()
    scale = broadcast_param(enc, enc.scale.astype(np.float32), weight.shape)
    zero_point = broadcast_param(enc, enc.zero_point.astype(np.float32), weight.shape)
    return WeightGrid(np.asarray(scale, np.float32), np.asarray(zero_point, np.float32), enc.qmin, enc.qmax)


def _following_activation(layer: WeightedLayer) -> FollowingActivation | None:
    """The activation after the layer, or after the unfolded BatchNormalization that follows it."""
    if layer.batchnorm is not None:
        return layer.batchnorm.activation
    return layer.activation


def _activation(layer: WeightedLayer, form: LinearForm) -> Activation | None:
    """The following activation in column form, or None (none follows, or it cannot be applied)."""
    follow = _following_activation(layer)
    if follow is None:
        return None
    axis = follow.attributes.get("axis", -1)
    on_channels = axis == 1 if form.op_type in ("Conv", "ConvTranspose") else axis == -1
    return activation_for(follow.op_type, follow.attributes, form.rows, on_channels)


def _output_affine(layer: WeightedLayer, form: LinearForm) -> OutputAffine | None:
    """The map of the unfolded BatchNormalization after the layer (`quantsim.FollowingBatchNorm`), or None."""
    bn = layer.batchnorm
    if bn is None or bn.scale.size != form.rows:
        return None
    return OutputAffine(form, bn.scale, bn.shift)


def _plan(layer: WeightedLayer, form: LinearForm, settings: AdaroundSettings) -> tuple[str, str]:
    """``(mode, float tensor read)``: ``"sampled"`` (an activation follows: its float output is the
    target), ``"moments"`` (none follows: exact second moments of the float layer input) or
    ``"moments+sampled"`` (the same moments, plus sampled sim-side columns for cheaper steps, where
    `AdaroundSettings.sampled_quadratic` picks it)."""
    follow = _following_activation(layer)
    if follow is not None and _activation(layer, form) is not None:
        return "sampled", follow.output
    inputs_per_column = int(np.prod(form.weight_shape)) // form.rows
    return ("moments+sampled" if settings.sampled_quadratic(inputs_per_column) else "moments"), layer.input


def _problem(sim, layer, feeds, staged, float_side, settings) -> LayerProblem:
    """One layer's `LayerProblem`, its sim-side input captured now (earlier layers as rounded so far)."""
    weight = sim.get_weight(layer.weight).astype(np.float32)
    form = linear_form(layer.op_type, layer.attributes, weight.shape)
    bias = form.bias_matrix(sim.get_weight(layer.bias) if layer.bias else None, form.rows)
    mode, target = _plan(layer, form, settings)
    spec = None
    if _activation(layer, form) is not None:
        follow = _following_activation(layer)
        assert follow is not None
        axis = follow.attributes.get("axis", -1)
        on_channels = axis == 1 if form.op_type in ("Conv", "ConvTranspose") else axis == -1
        spec = ActivationSpec(follow.op_type, dict(follow.attributes), form.rows, on_channels)
    affine = _output_affine(layer, form)
    bn = layer.batchnorm
    return LayerProblem(layer.node, mode, form, weight, _grid(layer, weight), bias, spec,
                        None if affine is None or bn is None else (bn.scale, bn.shift), layer.input, target,
                        staged([layer.input]), float_side, len(feeds), settings)


def _report(sim, layer, problem: LayerProblem, result: RoundingResult, seconds: float) -> LayerReport:
    """Put the rounded weight into the sim (encoding frozen) and say what happened."""
    sim.replace_weight(layer.weight, result.weight, freeze=not layer.weight_quantizer.is_encoding_frozen())
    _log.info("AdaRound %s (%s, %s): loss %.4g -> %.4g, %.1f%% flipped, %.2f s", layer.node, layer.op_type,
              problem.mode, result.loss_before, result.loss_after, 100 * result.flipped, seconds)
    reason = "optimised rounding was worse than nearest on the data: nearest kept" if result.kept_nearest else ""
    return LayerReport(layer.node, layer.op_type, "rounded", reason, problem.mode, result.loss_before,
                       result.loss_after, result.flipped, seconds, result.iterations)


def _solve_here(problem: LayerProblem, progress: bool) -> tuple[RoundingResult, float]:
    settings = problem.settings
    bar = tqdm(total=settings.num_iterations, desc=f"AdaRound {problem.node}", unit="it", leave=False,
               disable=None if progress else True)
    step = max(1, settings.num_iterations // 100)
    try:
        return solve(problem, on_step=lambda i: bar.update(step) if (i + 1) % step == 0 else None)
    finally:
        bar.close()


def _round_levels(sim, layers, feeds, staged, float_side, settings, progress, executor) -> list[LayerReport]:
    """Round ``layers``: one by one here, or each level of independent problems at once on ``executor``
    (every input of a level is captured before any of its layers changes; results put in topological order)."""
    reports = []
    if executor is None:
        for layer in layers:
            problem = _problem(sim, layer, feeds, staged, float_side, settings)
            reports.append(_report(sim, layer, problem, *_solve_here(problem, progress)))
        return reports
    bar = tqdm(total=len(layers), desc="AdaRound", unit="layer", leave=False, disable=None if progress else True)
    try:
        for level in independent_levels(sim, layers):
            problems = [_problem(sim, layer, feeds, staged, float_side, settings).materialized() for layer in level]
            futures = [executor.submit(solve, problem) for problem in problems]
            try:
                for layer, problem, future in zip(level, problems, futures):
                    reports.append(_report(sim, layer, problem, *future.result()))
                    bar.update(1)
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    finally:
        bar.close()
    return reports


def apply_adaround(sim: QuantizationSimModel, inputs: Iterable[Mapping[str, np.ndarray] | np.ndarray | Sequence[np.ndarray]],
                   num_iterations: int = 10000,
                   nodes_to_include: Iterable[str] | None = None, *, node_names_to_optimize: Iterable[str] | None = None,
                   reg_param: float = 0.01, beta_range: tuple[float, float] = (20.0, 2.0), warm_start: float = 0.2,
                   learning_rate: float = 1e-3, columns_per_iteration: int = 4096, quadratic_form: str = "auto",
                   quadratic_columns_per_iteration: int = 64, anchor_interval: int = 10,
                   memory_budget_bytes: int = 1 << 30, seed: int = 0, progress: bool | None = None,
                   executor: Executor | None = None) -> list[LayerReport]:
    """AdaRound the sim's weights in place (aimet-onnx 2.x signature plus documented hyper-parameters).

    ``inputs``: batches, each a feed dict (``{input name: array}``), an array (one-input model) or a
    list/tuple of arrays in model-input order, as AIMET takes them (`adaround.feeds`). ``num_iterations``: Adam
    steps per layer (AIMET recommends 10,000 for 8-bit weights, 15,000 below). ``nodes_to_include``
    (alias ``node_names_to_optimize``, deprecated in AIMET): only these nodes. The other arguments are
    `AdaroundSettings`'. Weight encodings missing so far are computed first; activation quantizers that
    are uncalibrated pass data through (call ``compute_encodings`` first to round against quantized
    inputs). Returns one `LayerReport` per weighted layer considered (AIMET returns None).
    ``executor``: a `concurrent.futures.Executor` (threads, processes, or a Dask ``Client``'s
    ``get_executor()``) that optimises the layers of each level of independent problems (`adaround.levels`:
    no layer's input depends on another of its level) at once. Each layer draws from its own generator
    (``seed`` and its name, `adaround.layer_job`), so the rounded weights equal the local run's bit for bit;
    the workers receive the layer's captured inputs (`adaround.layer_job.LayerProblem`, which pickles).
    ``Adaround.apply_adaround(sim, inputs, ...)`` is the same call; its older form
    ``Adaround.apply_adaround(model, params, path, filename_prefix, ...)`` is `adaround.legacy`'s.
    """
    if not isinstance(sim, QuantizationSimModel):
        raise InvalidTypeError(f"apply_adaround(sim, inputs, ...): sim must be a QuantizationSimModel, got "
                               f"{type(sim).__name__} (for AIMET's older form on a model use "
                               "Adaround.apply_adaround(model, params, path, filename_prefix, ...))")
    warn_if_forking_pool(executor, "apply_adaround")
    if node_names_to_optimize is not None:
        warn_at_caller("node_names_to_optimize is deprecated (as in AIMET): use nodes_to_include", DeprecationWarning)
        if nodes_to_include is not None:
            raise InvalidArgumentError("pass nodes_to_include or node_names_to_optimize, not both")
        nodes_to_include = node_names_to_optimize
    settings = AdaroundSettings(num_iterations, reg_param, (beta_range[0], beta_range[1]), warm_start, learning_rate,
                                columns_per_iteration, quadratic_form, quadratic_columns_per_iteration,
                                anchor_interval, memory_budget_bytes, seed)
    feeds = as_feeds(inputs, model_inputs(sim), "apply_adaround inputs")
    progress = sim.progress if progress is None else progress
    sim.compute_param_encodings()
    layers, reports = select_layers(sim, nodes_to_include)
    for report in reports:
        _log.info("AdaRound skips %s (%s): %s", report.node, report.op_type, report.reason)
    uncalibrated = [q.name for q in sim.quantizers if q.role == "activation" and q.enabled and not q.is_initialized()]
    if uncalibrated and layers:
        warn_at_caller(f"{len(uncalibrated)} activation quantizer(s) are uncalibrated (e.g. {uncalibrated[:3]}): "
                       "AdaRound sees their float values; call sim.compute_encodings first to round against "
                       "quantized inputs")
    targets = {_plan(layer, linear_form(layer.op_type, layer.attributes, sim.get_weight(layer.weight).shape),
                     settings)[1] for layer in layers}
    with sim.transaction(), float_values(sim, targets, feeds) as float_side, \
            StagedCapturer(sim, feeds) as staged:  # one float pass for every target; sim inputs kept layer to layer
        reports += _round_levels(sim, layers, feeds, staged, float_side, settings, progress, executor)
    order = {layer.node: i for i, layer in enumerate(sim.weighted_layers())}
    return sorted(reports, key=lambda r: order.get(r.node, len(order)))

