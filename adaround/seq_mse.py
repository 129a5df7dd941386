"""Sequential MSE (aimet-onnx 2.x ``apply_seq_mse``): per layer, in topological order, the weight range
that minimises the layer's output error given its already-quantized input, then frozen.

For each weighted layer, candidate ranges scale the weight's per-channel (or per-tensor) min and max by
``(i + 1) / num_candidates``; each channel keeps the candidate with the least output error. The output
error of a weight ``W_c`` is quadratic in it, so one pass over the data gives second moments of the
layer input (`adaround.layer_data.SecondMoments`) and every candidate of every channel is scored
exactly on all the data: ``(W_c - W) S (W_c - W)^T`` per output channel. ``inp_symmetry`` picks which
input each side sees, as in AIMET's ``SeqMseParams``: "symqt" (both the sim's quantized input: the
default), "asym" (the float model's input for the float weight), "symfp" (both the float input).
Per-block (and LPBQ) weights choose a factor per (channel, block) by the block's own output error, as
AIMET's blockwise Sequential MSE does; an LPBQ quantizer re-derives its integer block scales and per-channel
scale from the chosen ranges, so the result stays on the two-level grid, and the chosen encoding is kept
only if its full output error is below that of the starting (min-max) encoding. Frozen, float or disabled
weight quantizers are skipped (reason in the report).
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


def _best_encoding(form: LinearForm, weight: np.ndarray, q, data: SecondMoments, num_candidates: int):
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
    if axis is None:
        best = factors[int(np.argmin(table.sum(axis=1)))]
        return encoding_from_range(lo * best, hi * best, enc.bits, **flags), float(table.sum(axis=1).min()), float(
            table[-1].sum())
    choice = np.asarray(factors)[np.argmin(table, axis=0)]
    # rows of W_mat are the weight's output channels, which is the per-channel axis
    return (encoding_from_range(lo * choice, hi * choice, enc.bits, axis=axis, **flags),
            float(table.min(axis=0).sum()), float(table[-1].sum()))


def _block_ranges(weight: np.ndarray, enc) -> tuple[np.ndarray, np.ndarray]:
    """Per (channel, block) min and max of ``weight`` (zero included), shape ``(C, n_blocks)``."""
    axis, block_axis = enc.axis % weight.ndim, enc.block_axis % weight.ndim
    moved = np.moveaxis(weight, (axis, block_axis), (0, 1))
    blocks = moved.reshape(moved.shape[0], moved.shape[1] // enc.block_size, -1)
    return np.minimum(blocks.min(axis=2), 0.0).astype(np.float64), np.maximum(blocks.max(axis=2), 0.0).astype(np.float64)


def _block_columns(form: LinearForm, weight: np.ndarray, enc) -> list[list[np.ndarray]]:
    """Per group of ``W_mat``, the columns of each block (a block of input channels is a set of columns, the
    same for every output row of the group)."""
    block_axis = enc.block_axis % weight.ndim
    ids = np.arange(weight.shape[block_axis]) // enc.block_size
    view = [1] * weight.ndim
    view[block_axis] = ids.size
    matrix = form.to_matrix(np.broadcast_to(ids.reshape(view), weight.shape).astype(np.float32))
    if np.any(matrix != matrix[:, :1, :]):
        raise InvalidArgumentError("per-block Sequential MSE: a block does not map to whole columns of the layer")
    return [[np.flatnonzero(row == b) for b in range(int(ids.max()) + 1)] for row in matrix[:, 0, :]]


def _block_losses(data: SecondMoments, candidate: np.ndarray, reference: np.ndarray,
                  columns: list[list[np.ndarray]]) -> np.ndarray:
    """Output error of each block's own partial sums, ``[rows, n_blocks]``: `_row_losses` restricted to the
    block's columns (the diagonal blocks of the second moments)."""
    candidate, reference = candidate.astype(np.float64), reference.astype(np.float64)
    out = np.zeros((candidate.shape[0], candidate.shape[1], len(columns[0])))
    for g, blocks in enumerate(columns):
        for b, cols in enumerate(blocks):
            if cols.size == 0:
                continue
            c, r, square = candidate[g][:, cols], reference[g][:, cols], np.ix_(cols, cols)
            out[g, :, b] = (np.einsum("mk,kl,ml->m", c, data.s_qq[g][square], c, optimize=True)
                            - 2 * np.einsum("mk,kl,ml->m", c, data.s_qf[g][square], r, optimize=True)
                            + np.einsum("mk,kl,ml->m", r, data.s_ff[g][square], r, optimize=True))
    return (out / data.columns).reshape(-1, out.shape[2])


def _best_block_encoding(form: LinearForm, weight: np.ndarray, q, data: SecondMoments, num_candidates: int):
    """Per-block candidates (AIMET's blockwise Sequential MSE): each (channel, block) keeps the factor whose
    block-diagonal output error ``dW_b S_bb dW_b^T`` (the block's own partial sums, as AIMET's grouped
    layers compute it) is least; the quantizer then re-derives LPBQ scales from the chosen ranges. Returns
    the encoding installed on ``q`` (after `QcQuantizeOp.set_encoding`), its full output error, and that of
    the encoding ``q`` had before; the better of the two is kept."""
    enc, spec = q.encoding, q.spec
    flags = {"symmetric": spec.symmetric, "strict": spec.strict_symmetric, "unsigned_symmetric": spec.unsigned_symmetric,
             "axis": enc.axis, "block_axis": enc.block_axis, "block_size": enc.block_size}
    lo, hi = _block_ranges(weight, enc)
    reference = form.to_matrix(weight)
    columns = _block_columns(form, weight, enc)
    factors = np.array([(i + 1) / num_candidates for i in range(num_candidates)])
    table = np.empty((num_candidates, lo.shape[0], lo.shape[1]))
    for c, factor in enumerate(factors):
        uniform = encoding_from_range(lo * factor, hi * factor, enc.bits, **flags)
        table[c] = _block_losses(data, form.to_matrix(fake_quantize(weight, uniform)), reference, columns)
    choice = factors[np.argmin(table, axis=0)]
    before = enc
    loss_before = float(_row_losses(data, form.to_matrix(fake_quantize(weight, before)), reference).sum())
    q.set_encoding(encoding_from_range(lo * choice, hi * choice, enc.bits, **flags))
    loss_after = float(_row_losses(data, form.to_matrix(fake_quantize(weight, q.encoding)), reference).sum())
    if loss_after > loss_before:
        q.set_encoding(before)
        loss_after = loss_before
    return loss_after, loss_before


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
            if q.is_encoding_frozen():
                reports.append(LayerReport(layer.node, layer.op_type, "skipped", "weight encoding frozen"))
                continue
            weight = sim.get_weight(layer.weight).astype(np.float32)
            form = linear_form(layer.op_type, layer.attributes, weight.shape)
            data = _moments(form, sim, layer, feeds, float_capturer, inp_symmetry)
            if q.encoding.block_size is not None:
                loss, full_range_loss = _best_block_encoding(form, weight, q, data, int(num_candidates))
            else:
                encoding, loss, full_range_loss = _best_encoding(form, weight, q, data, int(num_candidates))
                q.set_encoding(encoding)
            q.freeze_encodings()
            _log.info("Sequential MSE %s: output error %.4g (full range %.4g)", layer.node, loss, full_range_loss)
            reports.append(LayerReport(layer.node, layer.op_type, "optimized", "", "moments", full_range_loss, loss))
    order = {layer.node: i for i, layer in enumerate(sim.weighted_layers())}
    return sorted(reports, key=lambda r: order.get(r.node, len(order)))
