"""Sequential MSE (aimet-onnx 2.x ``apply_seq_mse``): per layer, in topological order, the weight range
that minimises the layer's output error given its already-quantized input, then frozen.

For each weighted layer, candidate ranges scale the weight's per-channel (or per-tensor) min and max by
``(i + 1) / num_candidates``; each channel keeps the candidate with the least output error. The output
error of a weight ``W_c`` is quadratic in it, so one pass over the data gives second moments of the
layer input (`adaround.layer_data.SecondMoments`) and every candidate of every channel is scored
exactly on all the data: ``(W_c - W) S (W_c - W)^T`` per output channel. ``inp_symmetry`` picks which
input each side sees, as in AIMET's ``SeqMseParams``: "symqt" (both the sim's quantized input: the
default), "asym" (the float model's input for the float weight), "symfp" (both the float input).
Per-block weights and frozen, float or disabled weight quantizers are skipped (reason in the report).
A layer followed by an unfolded BatchNormalization (`quantsim.FollowingBatchNorm`) scores each channel's
error times the square of its factor: the per-channel choice is unchanged, a per-tensor one weighs channels as
the network does.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from adaround.apply import LayerReport, select_layers
from adaround.layer_data import SecondMoments, second_moments
from adaround.linear_form import LinearForm, linear_form
from quantsim import InvalidArgumentError, QuantizationSimModel, encoding_from_range, fake_quantize

__all__ = ["apply_seq_mse", "SeqMseParams", "INPUT_SYMMETRIES"]

_log = logging.getLogger(__name__)

INPUT_SYMMETRIES = ("symqt", "asym", "symfp")


@dataclass(frozen=True)
class SeqMseParams:
    """AIMET's parameter object: ``num_batches`` of the inputs, ``num_candidates`` ranges per channel,
    ``inp_symmetry`` ("symqt", "asym", "symfp") and ``loss_fn`` ("mse": the only one with an exact
    second-moment form; AIMET's "l1" and "sqnr" are not offered)."""

    num_batches: int | None = None
    num_candidates: int = 20
    inp_symmetry: str = "symqt"
    loss_fn: str = "mse"


def _row_losses(data: SecondMoments, candidate: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Output error per output channel (rows of ``W_mat``) of ``candidate`` against ``reference``."""
    candidate, reference = candidate.astype(np.float64), reference.astype(np.float64)
    quad = np.einsum("gmk,gkl,gml->gm", candidate, data.s_qq, candidate, optimize=True)
    cross = np.einsum("gmk,gkl,gml->gm", candidate, data.s_qf, reference, optimize=True)
    const = np.einsum("gmk,gkl,gml->gm", reference, data.s_ff, reference, optimize=True)
    return ((quad - 2 * cross + const) / data.columns).reshape(-1)


def _moments(form: LinearForm, sim, layer, inputs, float_capturer, symmetry: str) -> SecondMoments:
    quantized = sim.capturer([layer.input], quantized=True)
    if symmetry == "symqt":
        return second_moments(form, quantized(inputs), None, layer.input)
    if symmetry == "symfp":
        return second_moments(form, float_capturer(inputs), None, layer.input)
    return second_moments(form, quantized(inputs), float_capturer(inputs), layer.input)


def _best_encoding(form: LinearForm, weight: np.ndarray, q, data: SecondMoments, num_candidates: int,
                   output_scale: np.ndarray | None = None):
    enc = q.encoding
    spec = q.spec
    axis = enc.axis if not enc.is_per_tensor else None
    reduce = tuple(i for i in range(weight.ndim) if i != axis) if axis is not None else None
    lo, hi = np.minimum(weight.min(axis=reduce), 0.0), np.maximum(weight.max(axis=reduce), 0.0)
    flags = {"symmetric": spec.symmetric, "strict": spec.strict_symmetric, "unsigned_symmetric": spec.unsigned_symmetric}
    reference = form.to_matrix(weight)
    factors = [(i + 1) / num_candidates for i in range(num_candidates)]
    losses = []
    for factor in factors:
        candidate = encoding_from_range(lo * factor, hi * factor, enc.bits, axis=axis, **flags)
        losses.append(_row_losses(data, form.to_matrix(fake_quantize(weight, candidate)), reference))
    table = np.stack(losses)  # [candidates, rows]
    if output_scale is not None and output_scale.size == table.shape[1]:  # the error after a following BN
        table = table * np.square(output_scale)[None, :]
    if axis is None:
        best = factors[int(np.argmin(table.sum(axis=1)))]
        return encoding_from_range(lo * best, hi * best, enc.bits, **flags), float(table.sum(axis=1).min()), float(
            table[-1].sum())
    choice = np.asarray(factors)[np.argmin(table, axis=0)]
    # rows of W_mat are the weight's output channels, which is the per-channel axis
    return (encoding_from_range(lo * choice, hi * choice, enc.bits, axis=axis, **flags),
            float(table.min(axis=0).sum()), float(table[-1].sum()))


def apply_seq_mse(sim: QuantizationSimModel, inputs: Iterable[Mapping[str, np.ndarray]], num_candidates: int = 20,
                  nodes_to_exclude: Iterable[str] | None = None, *, inp_symmetry: str = "symqt",
                  progress: bool | None = None) -> list[LayerReport]:
    """Choose and freeze every eligible weight encoding by Sequential MSE (see the module docstring).

    Returns one `LayerReport` per weighted layer (``loss_before``: the output error with the full
    min-max range; ``loss_after``: with the chosen ranges). Usable alone or before `apply_adaround`,
    which then rounds against the frozen encodings. Any failure leaves the sim exactly as it was.
    """
    if int(num_candidates) != num_candidates or num_candidates < 1:
        raise InvalidArgumentError(f"num_candidates must be a positive integer, got {num_candidates!r}")
    if inp_symmetry not in INPUT_SYMMETRIES:
        raise InvalidArgumentError(f"inp_symmetry must be one of {INPUT_SYMMETRIES}, got {inp_symmetry!r}")
    feeds = list(inputs)
    if not feeds:
        raise InvalidArgumentError("apply_seq_mse needs at least one calibration batch (inputs is empty)")
    progress = sim.progress if progress is None else progress
    sim.compute_param_encodings()
    excluded = set(nodes_to_exclude or ())
    known = {layer.node for layer in sim.weighted_layers()}
    if excluded - known:
        raise InvalidArgumentError(f"nodes_to_exclude: {sorted(excluded - known)} are not weighted nodes")
    layers, reports = select_layers(sim, [n for n in known if n not in excluded])
    with sim.transaction():
        float_capturer = sim.capturer(sorted({layer.input for layer in layers}), quantized=False) if layers else None
        for layer in tqdm(layers, desc="Sequential MSE", unit="layer", leave=False, disable=None if progress else True):
            q = layer.weight_quantizer
            if q.is_encoding_frozen() or q.encoding.block_size is not None:
                why = "weight encoding frozen" if q.is_encoding_frozen() else "per-block weight encoding"
                reports.append(LayerReport(layer.node, layer.op_type, "skipped", why))
                continue
            weight = sim.get_weight(layer.weight).astype(np.float32)
            form = linear_form(layer.op_type, layer.attributes, weight.shape)
            data = _moments(form, sim, layer, feeds, float_capturer, inp_symmetry)
            encoding, loss, full_range_loss = _best_encoding(form, weight, q, data, int(num_candidates),
                                                             layer.batchnorm.scale if layer.batchnorm else None)
            q.set_encoding(encoding)
            q.freeze_encodings()
            _log.info("Sequential MSE %s: output error %.4g (full range %.4g)", layer.node, loss, full_range_loss)
            reports.append(LayerReport(layer.node, layer.op_type, "optimized", "", "moments", full_range_loss, loss))
    order = {layer.node: i for i, layer in enumerate(sim.weighted_layers())}
    return sorted(reports, key=lambda r: order.get(r.node, len(order)))
