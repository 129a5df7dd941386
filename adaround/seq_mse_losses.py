"""Sequential MSE's loss table: the output error of every candidate weight, per output channel.

PURE numpy. For a layer in column form (`adaround.linear_form`) with sim-side columns ``c_q`` and
float-side columns ``c_f`` (the same ones for "symqt"/"symfp"), candidate ``W_c`` and float weight ``W``,
the error of output channel ``m`` at column ``p`` is ``e = (W_c c_q - W c_f)[m, p]``. The loss functions
are AIMET's (``SeqMseParams.loss_fn``), each reduced to one number per channel:

* ``"mse"``: mean over all columns of ``e^2``. Quadratic in ``W_c``: one pass builds the second moments
  and every candidate is scored exactly from them (`adaround.layer_data.SecondMoments`). Where that costs
  more than multiplying each candidate's error out (one input for both sides, few positions and long
  columns: deep layers; `_direct_is_cheaper` compares the operation counts), the errors are multiplied out
  in float32 products summed in float64: the same quantity to about 1e-6, not bit for bit (the chosen
  encodings on the suite's real models: see benchmarks/README.md, issue 31 whole-model table).
* ``"l1"``: mean over all columns of ``|e|``; no moment form, each batch's columns are multiplied out
  for every candidate (what AIMET does, one candidate pass at a time).
* ``"sqnr"``: AIMET's negative SQNR in dB, **per batch** and summed over batches:
  ``sum_b -10 log10(mean_p (W c_f)^2 / (mean_p e^2 + 1e-10))`` with ``p`` over batch ``b``'s columns
  (the signal is the product without the bias, which does not move the argmin: it is the same for every
  candidate). With one batch it picks what ``"mse"`` picks; over several, batches with little signal
  weigh more.

AIMET's losses sum over columns where these take means; the argmin over candidates is the same.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from adaround.layer_data import SecondMoments, second_moments
from adaround.linear_form import LinearForm
from quantsim import InvalidArgumentError

__all__ = ["LOSS_FUNCTIONS", "SQNR_EPS", "row_errors", "candidate_losses"]

LOSS_FUNCTIONS = ("mse", "l1", "sqnr")
SQNR_EPS = 1e-10  # AIMET's, added to the mean squared error of each channel before the ratio


_FORM = "gmk,gkl,gml->gm"
_FIRST, _SECOND = "gmk,gkl->gml", "gml,gml->gm"  # the two contractions of `_FORM`'s path
_PAIR = ["einsum_path", (0, 1)]  # a two-operand einsum's only path (`optimize=True` would search for it each time)


def _first(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``einsum(_FIRST, a, s, optimize=_PAIR)`` exactly as numpy (2.x) computes it, without its per-call path
    finding and parsing (about half of Sequential MSE's scoring time on small layers): ``(s^T a^T)^T`` by one
    ``matmul`` of the same views, with a single group or row squeezed as numpy squeezes it. Tested equal to
    ``np.einsum`` bit for bit."""
    groups, rows, k = a.shape
    if groups == 1:
        if rows == 1:
            return np.matmul(s[0].T, a.reshape(k, 1)).reshape(1, 1, s.shape[2])
        return np.matmul(s[0].T, a[0].T).reshape(1, s.shape[2], rows).transpose(0, 2, 1)
    if rows == 1:
        return np.matmul(np.swapaxes(s, 1, 2), a.reshape(groups, k, 1)).reshape(1, groups, s.shape[2]
                                                                                  ).transpose(1, 0, 2)
    return np.matmul(np.swapaxes(s, 1, 2), np.swapaxes(a, 1, 2)).transpose(0, 2, 1)


def _second(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``einsum(_SECOND, a, b, optimize=_PAIR)`` (one dot product per group and row) exactly as numpy computes
    it: a batched ``matmul`` of ``[G*M, 1, L]`` by ``[G*M, L, 1]`` made from the same views. Tested equal to
    ``np.einsum`` bit for bit."""
    groups, rows, length = a.shape
    if groups == 1 and rows == 1:
        return np.matmul(a[0, 0].reshape(1, length), b[0, 0].reshape(length, 1)).reshape(1, 1)
    if groups == 1:
        a, b = a[0], b[0]
    elif rows == 1:
        a, b = a[:, 0], b[:, 0]
    n = groups * rows
    return np.matmul(a.reshape(n, 1, length), b.reshape(n, length, 1)).reshape(groups, rows)


def _matmul_is_einsum() -> bool:
    """Whether `_first` / `_second` compute exactly what this numpy's pairwise ``np.einsum`` does (numpy 2.4
    does; 2.0's einsum sums in another order): probed once, on small operands of every branch; where they do
    not, the losses go through ``np.einsum`` itself, so they never depend on which form ran."""
    rng = np.random.default_rng(0)
    for groups, rows, k in ((1, 1, 5), (1, 3, 7), (3, 1, 6), (2, 4, 9)):
        a = rng.standard_normal((groups, rows, k))
        s = rng.standard_normal((groups, k, k))
        want = np.einsum(_FIRST, a, s, optimize=_PAIR)
        got = _first(a, s)
        if got.shape != want.shape or not np.array_equal(got, want):
            return False
        if not np.array_equal(_second(got, a), np.einsum(_SECOND, want, a, optimize=_PAIR)):
            return False
    return True


_MATMUL_IS_EINSUM = _matmul_is_einsum()


def _product(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    return _first(a, s) if _MATMUL_IS_EINSUM else np.einsum(_FIRST, a, s, optimize=_PAIR)


def _dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _second(a, b) if _MATMUL_IS_EINSUM else np.einsum(_SECOND, a, b, optimize=_PAIR)


def row_errors(data: SecondMoments, candidate: np.ndarray, reference: np.ndarray, *,
               path: list | None = None, const: np.ndarray | None = None) -> np.ndarray:
    """Mean over columns of the squared output error per output channel (rows of ``W_mat``, all groups).

    ``path``: ``np.einsum_path``'s answer for these shapes (the one ``optimize=True`` finds; finding it again
    for every candidate cost more than the products); ``const``: the reference's own term, the same for every
    candidate. Either only saves work: the numbers are the same."""
    candidate, reference = candidate.astype(np.float64), np.asarray(reference, dtype=np.float64)
    if path is None:
        path = np.einsum_path(_FORM, candidate, data.s_qq, candidate, optimize=True)[0]
    if data.s_qf is data.s_qq and path[1:] == [(0, 1), (0, 1)]:
        # one moment for both terms (both sides read the same input): the product ``candidate S`` that both
        # einsums would form first is formed once, by the same contraction (bmm_einsum), so the terms are
        # the same numbers (tested) for half the work
        product = _product(candidate, data.s_qq)
        quad = _dots(product, candidate)
        cross = _dots(product, reference)
    else:
        quad = np.einsum(_FORM, candidate, data.s_qq, candidate, optimize=path)
        cross = np.einsum(_FORM, candidate, data.s_qf, reference, optimize=path)
    if const is None:
        const = np.einsum(_FORM, reference, data.s_ff, reference, optimize=path)
    return np.maximum((quad - 2 * cross + const) / data.columns, 0.0).reshape(-1)


def _scored(data: SecondMoments, candidates: list[np.ndarray], reference: np.ndarray) -> list[np.ndarray]:
    """`row_errors` of every candidate, the einsum path and the reference's term found once."""
    ref64 = reference.astype(np.float64)
    path = np.einsum_path(_FORM, ref64, data.s_qq, ref64, optimize=True)[0]
    const = np.einsum(_FORM, ref64, data.s_ff, ref64, optimize=path)
    return [row_errors(data, c, ref64, path=path, const=const) for c in candidates]


def _direct_is_cheaper(k: int, rows: int, columns: int, num_candidates: int) -> bool:
    """Whether multiplying each candidate's error out over the ``P = columns`` (``2 M K P`` operations per
    candidate and group of ``M = rows`` rows and ``K`` inputs) costs less than the second moments (``K^2 P``,
    a symmetric product) plus each candidate's product with them (``2 M K^2``): layers deep in a network, with
    few positions and long columns."""
    direct = num_candidates * 2 * rows * k * columns
    return direct < k * k * columns + num_candidates * 2 * rows * k * k


def _positions(form: LinearForm, x: np.ndarray) -> int:
    """The input's positions (``N * spatial`` for convolutions, the rows of a MatMul/Gemm input): the number of
    columns for stride 1 with "same" padding, an estimate otherwise (cost estimates only)."""
    x = np.asarray(x)
    if form.op_type in ("Conv", "ConvTranspose"):
        return x.size // max(1, x.shape[1])
    return x.size // max(1, x.shape[-1])


def _direct_errors(form: LinearForm, tensor: str, batches: list[Mapping[str, np.ndarray]],
                   candidates: list[np.ndarray], reference: np.ndarray) -> np.ndarray:
    """`row_errors` of every candidate multiplied out over the columns: the mean over columns of the squared
    output error ``((W_c - W) c)^2`` per row. The products run in float32 (as the layer does; the weight
    difference is small and the squared errors are summed in float64, so no terms cancel as in the moment
    form); the same quantity as the moment form's to about 1e-6, not bit for bit."""
    reference32 = np.asarray(reference, dtype=np.float32)
    differences = [np.subtract(c, reference32, dtype=np.float32) for c in candidates]
    table = np.zeros((len(candidates), form.rows), dtype=np.float64)
    columns = 0
    for batch in batches:
        cols = form.columns(batch[tensor])[0]
        for i, difference in enumerate(differences):
            error = np.matmul(difference, cols)
            np.square(error, out=error)
            table[i] += error.sum(axis=2, dtype=np.float64).reshape(-1)
        columns += cols.shape[2]
    return table / columns


def _pairs(quantized, floating):
    return zip(quantized, floating) if floating is not None else ((batch, None) for batch in quantized)


def candidate_losses(form: LinearForm, tensor: str, quantized: Iterator[Mapping[str, np.ndarray]],
                     floating: Iterator[Mapping[str, np.ndarray]] | None, candidates: list[np.ndarray],
                     reference: np.ndarray, loss_fn: str) -> np.ndarray:
    """``[len(candidates), rows]`` losses of each candidate ``W_mat`` against ``reference`` (``W_mat`` of the
    float weight), the layer input ``tensor`` read batch by batch from ``quantized`` (sim side) and
    ``floating`` (float side; None: both sides read ``quantized``)."""
    if loss_fn not in LOSS_FUNCTIONS:
        raise InvalidArgumentError(f"loss_fn must be one of {LOSS_FUNCTIONS}, got {loss_fn!r}")
    if loss_fn == "mse":
        if floating is None and candidates:
            batches = list(quantized)
            if batches and _direct_is_cheaper(candidates[0].shape[2], candidates[0].shape[1],
                                              sum(_positions(form, b[tensor]) for b in batches), len(candidates)):
                return _direct_errors(form, tensor, batches, candidates, reference)
            quantized = iter(batches)
        data = second_moments(form, quantized, floating, tensor)
        return np.stack(_scored(data, candidates, reference))
    table = np.zeros((len(candidates), form.rows), dtype=np.float64)
    columns = 0
    reference32 = reference.astype(np.float32)
    for q_batch, f_batch in _pairs(quantized, floating):
        if loss_fn == "sqnr":
            data = second_moments(form, iter([q_batch]), None if f_batch is None else iter([f_batch]), tensor)
            ref64 = reference.astype(np.float64)
            signal = np.einsum("gmk,gkl,gml->gm", ref64, data.s_ff, ref64, optimize=True).reshape(-1) / data.columns
            with np.errstate(divide="ignore"):
                for i, errors in enumerate(_scored(data, candidates, reference)):
                    table[i] -= 10 * np.log10(signal / (errors + SQNR_EPS))
            columns += data.columns
            continue
        cq = form.columns(q_batch[tensor])[0]
        cf = cq if f_batch is None else form.columns(f_batch[tensor])[0]
        target = np.matmul(reference32, cf)  # [groups, M/g, P]
        for i, candidate in enumerate(candidates):
            table[i] += np.abs(np.matmul(candidate.astype(np.float32), cq) - target).sum(axis=2, dtype=np.float64
                                                                                          ).reshape(-1)
        columns += cq.shape[2]
    if columns == 0:
        raise InvalidArgumentError("the calibration data is empty: no batch reached the layer")
    return table if loss_fn == "sqnr" else table / columns
