"""TF-enhanced (SQNR) grid search over histograms: candidates, costs, best candidate. PURE numpy.

The rules (AIMET ``TfEnhancedEncodingAnalyzer``: candidate grids, cost, first lowest cost wins) are
given in `observers`' module docstring; this module evaluates them. Rows are histograms: ``pdf``
(C, B) bin probabilities, bin ``i`` covering ``[lo + i*w, lo + (i+1)*w)`` with midpoint ``c_i``.
A candidate ``(delta, offset)`` has the grid ``[delta*offset, delta*(offset + N)]``; ``a``/``b`` are
the bins holding its min/max. Its cost is ``3 * w^2 * sat + delta^2 * sum_{a <= i < b} p_i (t_i - q_i)^2``
with ``t_i = c_i/delta - offset`` and ``q_i = clip(floor(t_i + 0.5), 0, N)``; ``sat`` sums ``p_i`` times
the squared distance (in bins) to bin ``a`` of the bins below it and to bin ``b`` of the bins from ``b``
on, from prefix sums of ``p``, ``p*i``, ``p*i^2``.

`candidate_costs` is the definition: one dense candidates x non-empty-bins matrix per row, summed
per candidate. `best_grids` returns exactly its choice (the first lowest cost among the valid
candidates, rows evaluated in chunks of ``_CHUNK_ELEMENTS``) while computing far less:

1. per candidate, in O(1): the saturation term (same arithmetic as the dense form), a lower bound
   (saturation + bin ``a``'s term, every other term being >= 0) and an upper bound (each bin strictly
   inside ``(a, b)`` adds at most ``p_i / 4`` since ``|t_i - q_i| <= 1/2`` there), with rounding slack;
2. candidates whose lower bound exceeds the row's smallest upper bound cannot win and are dropped
   (typically more than 90% of them);
3. the survivors' sums run over the non-empty bins of their own window ``[a, b)`` only: the same
   terms as the dense form in another order, so within ``B * eps`` relative of it;
4. when survivors other than exact duplicates (same delta and offset) of the first lie within that
   rounding margin of the minimum (exact or rounding-level ties: constant or integer-valued data, grids
   that clip everything alike; rare on real data), those candidates are re-evaluated by the dense form
   with the padding width the chunked all-candidates evaluation uses, so that ties resolve bit for bit
   as it does. Rows with non-finite costs take the dense form entirely.

Only bins within the columns some row occupies are touched (a one-batch histogram fills the middle third).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .numerics import round_half_away

__all__ = ["SATURATION_WEIGHT", "asymmetric_candidates", "symmetric_candidates", "candidate_costs", "best_grids"]

SATURATION_WEIGHT = 3.0  # AIMET's GAMMA: saturation error weighs 3x the quantisation error
_CHUNK_ELEMENTS = 1 << 21  # rows x candidates x bins per step of the dense evaluation (sets its padding)
_EPS = float(np.finfo(np.float64).eps)


@functools.lru_cache(maxsize=None)
def _asymmetric_pattern(n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """AIMET's (delta factor, offset) pairs: ``f = 1/16 .. 17/16`` outer, 21 offsets inner (read-only)."""
    f = np.arange(1, 18, dtype=np.float64) / 16.0
    offs = np.trunc(-n_steps + n_steps / 20.0 * np.arange(21, dtype=np.float64))
    pattern = np.repeat(f, offs.size), np.tile(offs, f.size)
    for a in pattern:
        a.flags.writeable = False
    return pattern


def asymmetric_candidates(mn: np.ndarray, mx: np.ndarray, n_steps: int):
    """(delta, offset, valid), each (C, 17*21 + 1): the clamped AIMET grid plus the observed grid."""
    delta0 = (mx - mn) / n_steps
    offset0 = round_half_away(mn / delta0)
    gmin = (delta0 * offset0)[:, None]
    gmax = gmin + (delta0 * n_steps)[:, None]
    f, offs = _asymmetric_pattern(int(n_steps))
    delta = np.empty((mn.size, f.size + 1))
    offset = np.empty_like(delta)
    valid = np.ones(delta.shape, dtype=bool)
    tmin = f * delta0[:, None]
    tmax = tmin * n_steps
    tmin *= offs
    tmax += tmin  # delta * offset + delta * n_steps
    head = valid[:, :-1]
    np.logical_not((tmin < gmin) & (tmax > gmax), out=head)  # a grid covering the whole range is skipped
    np.maximum(tmin, gmin, out=tmin)  # clamped into the observed grid
    np.minimum(tmax, gmax, out=tmax)
    d = delta[:, :-1]
    np.subtract(tmax, tmin, out=d)
    d /= n_steps
    head &= d > 0
    d[~head] = 1.0
    offset[:, :-1] = round_half_away(tmin / d)
    offset[:, :-1][~head] = 0.0
    delta[:, -1], offset[:, -1] = delta0, offset0
    return delta, offset, valid


def symmetric_candidates(mn: np.ndarray, mx: np.ndarray, n_steps: int, unsigned: bool):
    """(delta, offset, valid), each (C, 101): fractions 0.01..1.01 of the largest useful delta."""
    if unsigned:
        delta_max, offset = mx / n_steps, 0.0
    else:
        delta_max, offset = 2.0 * np.maximum(np.abs(mn), np.abs(mx)) / n_steps, math.floor(-n_steps / 2)
    delta = delta_max[:, None] * (np.arange(1, 102, dtype=np.float64) / 100.0)[None, :]
    return delta, np.full(delta.shape, offset), np.ones(delta.shape, dtype=bool)


class _Bins:
    """The histograms' occupied columns ``[c0, c1)`` (any row non-empty), their probabilities and prefix sums.

    ``pdf`` (C, c1 - c0 + 2) holds the probabilities of bins ``c0 - 1 .. c1`` (the outer two zero);
    ``sums[k]`` (C, c1 - c0 + 1) the sums of ``p_i * i^k`` over bins ``i < c0 + j``: the same partial sums
    as a cumulative sum over all B bins, since empty bins add exact zeros.
    """

    def __init__(self, counts: np.ndarray, total):
        self.rows, self.nb = counts.shape
        used = np.flatnonzero(counts.any(axis=0))
        self.c0, c1 = (int(used[0]), int(used[-1]) + 1) if used.size else (0, 1)
        self.span = c1 - self.c0
        self.pdf = np.zeros((self.rows, self.span + 2))
        inner = self.pdf[:, 1:-1]
        np.divide(counts[:, self.c0 : c1], total, out=inner)  # == the full pdf on these columns
        i = np.arange(self.c0, c1, dtype=np.float64)
        self.sums = np.zeros((3, self.rows, self.span + 1))
        for k in range(3):
            np.cumsum(inner * i**k, axis=1, out=self.sums[k, :, 1:])
        self.nz_rows, nz_cols = np.nonzero(inner > 0)  # row-major: rows, then bins ascending
        self.nz_bins = nz_cols + self.c0
        self.p = inner[self.nz_rows, nz_cols]

    def column(self, bins: np.ndarray, width: int, shift: int) -> np.ndarray:
        """Flat index of bins ``(C, K)`` into row-major (C, width) tables whose column 0 is bin ``c0 - shift``."""
        col = bins - (self.c0 - shift)
        np.clip(col, 0, width - 1, out=col)
        col += (np.arange(self.rows) * width)[:, None]
        return col


def _saturation(bins: _Bins, lo, w, delta, offset, n_steps: int):
    """Clip bins ``a``, ``b`` (int (C, K), in ``[0, B]``), weighted saturation term (C, K), prefix sums of p at a, b.

    A grid lying entirely beside the histogram (all data clipped to one end) is charged the distance to
    that grid end itself (``a = b = B`` or ``0``); AIMET clamps it to the outermost bin, which makes such
    grids look free for near-constant data.
    """
    nb = bins.nb
    # clip ends in bin coordinates (bin i's midpoint sits at i)
    u_min = (delta * offset - lo[:, None]) / w[:, None] - 0.5
    u_max = (delta * (offset + n_steps) - lo[:, None]) / w[:, None] - 0.5
    a, b = np.floor(u_min + 0.5), np.floor(u_max + 0.5)
    missed_high, missed_low = a > nb - 1, b < 0  # all data below gmin / above gmax (a <= b)
    ua = np.clip(a, 0, nb)  # B when missed high, 0 when missed low
    np.clip(b, 0, nb - 1, out=b)
    b[missed_high] = nb
    ai, bi = ua.astype(np.int64), b.astype(np.int64)
    ua[missed_high] = u_min[missed_high]  # saturation target of the bins below a
    ub = np.where(missed_low, u_max, b)  # ... and of the bins from b on
    width = bins.span + 1
    col_a, col_b = bins.column(ai, width, 0), bins.column(bi, width, 0)
    head = [np.take(s, col_a) for s in bins.sums]  # sums over i < a
    total = bins.sums[:, :, -1:]
    tail = [total[k] - np.take(s, col_b) for k, s in enumerate(bins.sums)]  # sums over i >= b
    below = head[2] - 2 * ua * head[1] + ua * ua * head[0]
    above = tail[2] - 2 * ub * tail[1] + ub * ub * tail[0]
    sat = np.maximum(below, 0.0) + np.maximum(above, 0.0)
    return ai, bi, SATURATION_WEIGHT * sat * (w * w)[:, None], head[0], total[0] - tail[0]


def candidate_costs(pdf, lo, w, delta, offset, n_steps: int, pad: int | None = None) -> np.ndarray:
    """Cost (C, K) of K candidate grids against C histograms (pdf (C, B), lo/w (C,)): the dense form.

    The quantisation sum is a candidates x bins matrix over each row's non-empty bins (ascending) padded
    with empty ones to ``pad`` columns (default: the most non-empty bins of any row); the padding only
    decides the summation order.
    """
    ai, bi, sat, _, _ = _saturation(_Bins(pdf, 1.0), lo, w, delta, offset, n_steps)
    if pad is None:
        pad = max(1, int((pdf > 0).sum(axis=1).max()))
    order = np.argsort(pdf == 0, axis=1, kind="stable")[:, :pad]
    p = np.take_along_axis(pdf, order, axis=1)[:, None, :]
    idx = order[:, None, :].astype(np.float64)
    mid = lo[:, None, None] + (idx + 0.5) * w[:, None, None]
    d3 = delta[..., None]
    t = mid / d3 - offset[..., None]  # grid coordinate; fq error = delta * (t - q)
    q = np.clip(np.floor(t + 0.5), 0, n_steps)
    inside = (idx >= ai[..., None]) & (idx < bi[..., None])
    quant = np.sum(np.where(inside, p * (t - q) ** 2, 0.0), axis=-1) * delta**2
    return sat + quant


def best_grids(counts, lo, w, mn, mx, n_steps: int, symmetric: bool, unsigned: bool):
    """Best (delta, offset) per histogram row (counts (C, B), range ``[mn, mx]`` per row).

    Exactly the first lowest `candidate_costs` entry among the valid candidates, found by bounding,
    pruning and windowed sums (module docstring).
    """
    if symmetric:
        delta, offset, valid = symmetric_candidates(mn, mx, n_steps, unsigned)
    else:
        delta, offset, valid = asymmetric_candidates(mn, mx, n_steps)
    rows, nb = counts.shape
    total = counts.sum(axis=1, keepdims=True)
    tol = (4 * nb + 16) * _EPS  # > the relative effect of summation order and rounding on a cost
    all_valid = bool(valid.all())
    bins = _Bins(counts, total)
    ai, bi, sat, mass_a, mass_b = _saturation(bins, lo, w, delta, offset, n_steps)
    d2 = delta**2
    # bin a's term as in the dense form (lower bound); bins strictly inside add <= p/4 each (upper)
    t = (lo[:, None] + (ai + 0.5) * w[:, None]) / delta - offset
    q = np.clip(np.floor(t + 0.5), 0, n_steps)
    term_a = np.take(bins.pdf, bins.column(ai, bins.span + 2, 1)) * (t - q) ** 2
    term_a[ai >= bi] = 0.0
    lower = sat + term_a * d2
    upper = (sat + (term_a + 0.25 * (mass_b - mass_a) + tol) * d2) * (1.0 + tol)
    if not all_valid:
        upper[~valid] = np.inf
    keep = lower <= upper.min(axis=1, keepdims=True)
    if not all_valid:
        keep &= valid
    # survivors (flat, by row then candidate): sums over the non-empty bins of their window [a, b)
    rr, kk = np.nonzero(keep)
    keys = bins.nz_rows * nb + bins.nz_bins
    ja, jb = np.searchsorted(keys, rr * nb + ai[rr, kk]), np.searchsorted(keys, rr * nb + bi[rr, kk])
    n = jb - ja
    start = np.cumsum(n) - n
    pos = np.repeat(ja - start, n) + np.arange(int(n.sum()))
    nz_rows = bins.nz_rows[pos]
    t = lo[nz_rows] + (bins.nz_bins[pos] + 0.5) * w[nz_rows]
    t /= np.repeat(delta[rr, kk], n)
    t -= np.repeat(offset[rr, kk], n)
    q = t + 0.5
    np.floor(q, out=q)
    np.clip(q, 0, n_steps, out=q)
    t -= q
    np.square(t, out=t)
    t *= bins.p[pos]
    sums = np.zeros(rr.size)
    filled = n > 0
    if t.size:
        sums[filled] = np.add.reduceat(t, start[filled])
    cost = sat[rr, kk] + sums * d2[rr, kk]
    # per row: the lowest cost and the candidates within rounding of it
    per_row = np.bincount(rr, minlength=rows)
    low = np.full(rows, np.nan)
    low[per_row > 0] = np.minimum.reduceat(cost, (np.cumsum(per_row) - per_row)[per_row > 0])
    near = np.flatnonzero(cost <= low[rr] * (1.0 + 4.0 * tol))
    near_rows, near_k = rr[near], kk[near]
    lead = np.ones(near.size, dtype=bool)
    lead[1:] = near_rows[1:] != near_rows[:-1]
    best = np.zeros(rows, dtype=np.int64)
    best[near_rows[lead]] = near_k[lead]
    first = best[near_rows]  # exact duplicates of the first (same delta and offset) cost the same
    differ = delta[near_rows, near_k] != delta[near_rows, first]
    differ |= offset[near_rows, near_k] != offset[near_rows, first]
    bad = ~np.isfinite(low) | ~np.isfinite((lower if all_valid else np.where(valid, lower, 0.0)).sum(axis=1))
    redo = bad.copy()
    redo[near_rows[differ]] = True
    if redo.any():  # (near-)ties and non-finite rows: the dense form decides, as it would over all candidates
        cand = np.zeros((int(redo.sum()), delta.shape[1]), dtype=bool)
        tie = redo[near_rows]
        cand[np.cumsum(redo)[near_rows[tie]] - 1, near_k[tie]] = True
        cand[bad[redo]] = True  # non-finite rows: every candidate
        chunk = max(1, _CHUNK_ELEMENTS // (delta.shape[1] * nb))  # the dense evaluation's row chunks
        filled_bins = np.bincount(bins.nz_rows, minlength=rows)
        pads = np.maximum(np.maximum.reduceat(filled_bins, np.arange(0, rows, chunk)), 1)
        pads = np.repeat(pads, chunk)[:rows]
        pdf = counts[redo] / total[redo]
        best[redo] = _dense_pick(pdf, lo[redo], w[redo], delta[redo], offset[redo], valid[redo], cand,
                                 pads[redo], n_steps)
    r = np.arange(rows)
    return delta[r, best], offset[r, best]


def _dense_pick(pdf, lo, w, delta, offset, valid, cand, pads, n_steps: int) -> np.ndarray:
    """First lowest dense-form cost among the candidates flagged in ``cand`` (C, K), per row (index into K)."""
    count = cand.sum(axis=1)
    order = np.argsort(~cand, axis=1, kind="stable")[:, : int(count.max())]  # flagged ones, ascending
    idx = np.where(np.arange(order.shape[1]) < count[:, None], order, order[:, :1])
    best = np.empty(pdf.shape[0], dtype=np.int64)
    for pad in np.unique(pads):
        group = np.flatnonzero(pads == pad)
        step = max(1, _CHUNK_ELEMENTS // (idx.shape[1] * int(pad)))  # bounded temporaries; rows are independent
        for g in np.array_split(group, range(step, group.size, step)):
            ix = idx[g]
            d, o, v = (np.take_along_axis(x[g], ix, axis=1) for x in (delta, offset, valid))
            cost = np.where(v, candidate_costs(pdf[g], lo[g], w[g], d, o, n_steps, pad=int(pad)), np.inf)
            best[g] = ix[np.arange(g.size), np.argmin(cost, axis=1)]
    return best
