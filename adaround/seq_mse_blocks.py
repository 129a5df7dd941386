"""Sequential MSE on per-block (and LPBQ) weights: a factor per (channel, block), chosen by the block's own
output error, as aimet-onnx's blockwise Sequential MSE does (`adaround.seq_mse`).

An LPBQ quantizer re-derives its integer block scales and per-channel scale from the chosen ranges
(`quantsim.QcQuantizeOp.set_encoding`), so the result stays on the two-level grid; the chosen encoding is kept
only if its full output error is below that of the starting (min-max) encoding.
"""
from __future__ import annotations

import numpy as np

from adaround.layer_data import SecondMoments
from adaround.linear_form import LinearForm
from adaround.seq_mse_losses import row_errors
from quantsim import InvalidArgumentError, encoding_from_range, fake_quantize

__all__ = ["best_block_encoding"]


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


def best_block_encoding(form: LinearForm, weight: np.ndarray, q, data: SecondMoments, num_candidates: int):
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
    loss_before = float(row_errors(data, form.to_matrix(fake_quantize(weight, before)), reference).sum())
    q.set_encoding(encoding_from_range(lo * choice, hi * choice, enc.bits, **flags))
    loss_after = float(row_errors(data, form.to_matrix(fake_quantize(weight, q.encoding)), reference).sum())
    if loss_after > loss_before:
        q.set_encoding(before)
        loss_after = loss_before
    return loss_after, loss_before
