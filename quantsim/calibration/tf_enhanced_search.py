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

1. per candidate, in O(1): the saturation term (same arithmetic as the dense form, from prefix sums
   over each row's non-empty bins, which equal the dense ones bit for bit), a lower bound (saturation
   + bin ``a``'s term, every other term being >= 0) and an upper bound (each bin strictly inside
   ``(a, b)`` adds at most ``p_i / 4`` since ``|t_i - q_i| <= 1/2`` there), with rounding slack;
2. candidates whose lower bound exceeds the row's smallest upper bound (or, with many survivors, the
   summed cost of the likeliest one: `_two_rounds`) cannot win and are dropped (typically > 90%);
3. the survivors' sums run over the non-empty bins of their own window ``[a, b)`` only: the same
   terms as the dense form in another order, so within ``B * eps`` relative of it;
4. when survivors other than exact duplicates (same delta and offset) of the first lie within that
   rounding margin of the minimum (exact or rounding-level ties: constant or integer-valued data, grids
   that clip everything alike; rare on real data), those candidates are re-evaluated by the dense form
   with the padding width the chunked all-candidates evaluation uses, so that ties resolve bit for bit
   as it does. Rows with non-finite costs take the dense form entirely.

Symmetric grids are nested, so their saturation only grows as they narrow: steps 1-4 first run on the
widest grids, narrower ones join only where a saturation bound does not rule them out (`_nested_search`;
at 8 bits the widest 16 of 101 almost always suffice). Rows are searched a few at a time (temporaries
stay in cache); independent searches may share one call (``starts``), each row getting its own result.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from quantsim.core.numerics import round_half_away

__all__ = ["SATURATION_WEIGHT", "asymmetric_candidates", "symmetric_candidates", "candidate_costs", "best_grids"]

SATURATION_WEIGHT = 3.0  # AIMET's GAMMA: saturation error weighs 3x the quantisation error
_CHUNK_ELEMENTS = 1 << 21  # rows x candidates x bins per step of the dense evaluation (sets its padding)
_SEARCH_CANDIDATES = 1 << 14  # rows x candidates per step of the pruned search (temporaries stay in cache)
_SYMMETRIC_CANDIDATES, _ASYMMETRIC_CANDIDATES = 101, 17 * 21 + 1
_WIDEST = 16  # symmetric search: the widest grids first (`_nested_search`)
_COARSE = 8  # ... then every 8th narrower one bounds the rest
_TWO_ROUNDS, _TWO_ROUNDS_MIN = 3, 256  # survivors per row (and in all) above which `_two_rounds` pays
_EPS = float(np.finfo(np.float64).eps)


@functools.cache
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


class _Rows:
    """Each row's non-empty bins (ascending), packed into (C, M + 1) tables, M the most of any row.

    Column ``j`` of row ``r`` holds its ``j``-th non-empty bin (``bin``: index, -1 as padding; ``p``:
    probability ``counts / total``, ``mid``: midpoint value); ``sums[k]`` column ``j`` the sum of
    ``p_i * i^k`` over its first ``j`` non-empty bins, i.e. over the bins below the ``j``-th: a cumulative
    sum over all B bins exactly (the same additions in the same order, less exact zeros). ``locate``
    finds the column of any bin.
    """

    def __init__(self, counts: np.ndarray, total: np.ndarray, lo: np.ndarray, w: np.ndarray):
        self.counts, self.total = counts, total
        self.rows, self.nb = counts.shape
        self.keys = np.flatnonzero(counts > 0)  # row * B + bin, ascending (bool: numpy's fast path)
        nz_rows, nz_bins = np.divmod(self.keys, self.nb)
        filled = np.bincount(nz_rows, minlength=self.rows)
        self.row_start = np.cumsum(filled) - filled
        width = int(filled.max(initial=0)) + 1
        self._shift = (np.arange(self.rows) * width - self.row_start)[:, None]
        col = np.arange(self.keys.size) + self._shift[nz_rows, 0]
        p = counts.ravel()[self.keys] / total[nz_rows, 0]  # == the dense pdf's entries
        shape = (self.rows, width)
        self.p, self.bin, self.mid = np.zeros(shape), np.full(shape, -1.0), np.zeros(shape)
        self.p.ravel()[col], self.bin.ravel()[col] = p, nz_bins
        self.mid.ravel()[col] = (nz_bins + 0.5) * w[nz_rows] + lo[nz_rows]
        self.sums = np.zeros((3, self.rows, width))  # column j: over the first j (0 .. M) non-empty bins
        head_p, head_bin = self.p[:, :-1], self.bin[:, :-1]  # the last column is always padding
        np.cumsum(head_p, axis=1, out=self.sums[0, :, 1:])
        np.cumsum(head_p * head_bin, axis=1, out=self.sums[1, :, 1:])
        np.cumsum(head_p * head_bin**2, axis=1, out=self.sums[2, :, 1:])
        self.totals = self.sums[:, :, -1:]

    def locate(self, bins: np.ndarray) -> np.ndarray:
        """Flat index (into (C, M + 1) tables) of the first non-empty bin ``>= bins`` (C, K) of each row."""
        return np.searchsorted(self.keys, bins + (np.arange(self.rows) * self.nb)[:, None]) + self._shift

    def p_at(self, bins: np.ndarray, col: np.ndarray) -> np.ndarray:
        """Probability of bins (C, K) found at ``col`` by `locate` (0 for empty bins)."""
        return np.where(np.take(self.bin, col) == bins, np.take(self.p, col), 0.0)

    def full_pdf(self, rows) -> np.ndarray:
        """The (len(rows), B) probabilities of the given rows (for the dense form)."""
        return self.counts[rows] / self.total[rows]


def _saturation(bins, lo, w, delta, offset, n_steps: int):
    """Clip bins ``a``, ``b`` (int (C, K), in ``[0, B]``), weighted saturation term (C, K), prefix sums of p
    at a, b, and where `bins` (`_Rows`) keeps the partial sums at a.

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
    col_a, col_b = bins.locate(ai), bins.locate(bi)
    head = [np.take(s, col_a) for s in bins.sums]  # sums over i < a
    total = bins.totals
    tail = [total[k] - np.take(s, col_b) for k, s in enumerate(bins.sums)]  # sums over i >= b
    below = head[2] - 2 * ua * head[1] + ua * ua * head[0]
    above = tail[2] - 2 * ub * tail[1] + ub * ub * tail[0]
    sat = np.maximum(below, 0.0) + np.maximum(above, 0.0)
    return ai, bi, SATURATION_WEIGHT * sat * (w * w)[:, None], head[0], total[0] - tail[0], col_a


def candidate_costs(pdf, lo, w, delta, offset, n_steps: int, pad: int | None = None) -> np.ndarray:
    """Cost (C, K) of K candidate grids against C histograms (pdf (C, B), lo/w (C,)): the dense form.

    The quantisation sum is a candidates x bins matrix over each row's non-empty bins (ascending) padded
    with empty ones to ``pad`` columns (default: the most non-empty bins of any row); the padding only
    decides the summation order.
    """
    ai, bi, sat = _saturation(_Rows(pdf, np.ones((pdf.shape[0], 1)), lo, w), lo, w, delta, offset, n_steps)[:3]
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


class _DensePads:
    """Padding width of rows in the dense evaluation: the most non-empty bins of their chunk of rows,
    chunks counted from the first row of each search sharing the call (``starts``), as if alone."""

    def __init__(self, counts: np.ndarray, n_cand: int, starts=None):
        self.counts, self.n_cand, self.starts = counts, n_cand, starts

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        chunk = max(1, _CHUNK_ELEMENTS // (self.n_cand * self.counts.shape[1]))  # dense evaluation rows
        starts = np.zeros(1, dtype=np.int64) if self.starts is None else np.asarray(self.starts, dtype=np.int64)
        ends = np.append(starts[1:], self.counts.shape[0])
        seg = np.searchsorted(starts, rows, side="right") - 1
        first = starts[seg] + (rows - starts[seg]) // chunk * chunk
        last = np.minimum(first + chunk, ends[seg])
        pads = {}
        for f, e in set(zip(first.tolist(), last.tolist())):
            pads[f] = max(1, int(np.count_nonzero(self.counts[f:e] > 0, axis=1).max()))
        return np.array([pads[f] for f in first.tolist()], dtype=np.int64)


def best_grids(counts, lo, w, mn, mx, n_steps: int, symmetric: bool, unsigned: bool, starts=None):
    """Best (delta, offset) per histogram row (counts (C, B), range ``[mn, mx]`` per row).

    Exactly the first lowest `candidate_costs` entry among the valid candidates (module docstring).
    ``starts`` (first row of each) lets several searches share one call: each row's result is that of
    its own search.
    """
    rows, nb = counts.shape
    make = functools.partial(symmetric_candidates, unsigned=unsigned) if symmetric else asymmetric_candidates
    n_cand = _SYMMETRIC_CANDIDATES if symmetric else _ASYMMETRIC_CANDIDATES
    step = max(1, _SEARCH_CANDIDATES // n_cand)
    pads = _DensePads(counts, n_cand, starts)
    best_delta, best_offset = np.empty(rows), np.empty(rows)
    for s in range(0, rows, step):
        sl = slice(s, min(s + step, rows))
        ids, lo_c, w_c = np.arange(sl.start, sl.stop), lo[sl], w[sl]
        delta, offset, valid = make(mn[sl], mx[sl], n_steps)
        bins = _Rows(counts[sl], counts[sl].sum(axis=1, keepdims=True), lo_c, w_c)
        if symmetric:
            best = _nested_search(bins, lo_c, w_c, delta, offset, valid, n_steps, pads, ids)
        else:
            best = _search(bins, lo_c, w_c, delta, offset, valid, n_steps, pads, ids)[0]
        r = np.arange(best.size)
        best_delta[sl], best_offset[sl] = delta[r, best], offset[r, best]
    return best_delta, best_offset


def _nested_search(bins: _Rows, lo, w, delta, offset, valid, n_steps: int, pads, ids) -> np.ndarray:
    """Best symmetric candidate per row: the ``_WIDEST`` widest grids first, narrower ones only if needed.

    Symmetric grids are nested (delta grows with the candidate index, offset fixed): the clip bins of a
    narrower grid lie inside a wider one's, so its saturation term is at least as large. When a grid's
    saturation, less twice a bound on its rounding error, exceeds the best cost among the widest grids
    (plus rounding margin), it and every narrower grid cost more than that: the search over the wider
    ones gives the same first lowest candidate. The widest grid left out is tried first, then every
    ``_COARSE``-th narrower one for rows it does not settle (low bit widths, heavy tails).
    """
    k0 = delta.shape[1] - _WIDEST
    parts = _saturation(bins, lo, w, delta[:, k0 - 1 :], offset[:, k0 - 1 :], n_steps)  # + the widest left out
    best, low, bad = _search(bins, lo, w, delta[:, k0:], offset[:, k0:], valid[:, k0:], n_steps, pads, ids,
                             [x[:, 1:] for x in parts])
    nb, tol = bins.nb, (4 * bins.nb + 16) * _EPS
    # |u| bound for every candidate's clip targets (bin coordinates), then the rounding bound of `sat`
    u = np.maximum((delta[:, -1] * (np.abs(offset[:, -1]) + n_steps) + np.abs(lo)) / w + 1.0, nb)
    totals = bins.totals[:, :, 0]
    err = SATURATION_WEIGHT * w * w * (8 * nb + 64) * _EPS * (totals[2] + 2 * u * totals[1] + u * u * totals[0])
    with np.errstate(invalid="ignore", over="ignore"):
        limit = np.where(bad, np.nan, low * (1.0 + 8.0 * tol) + 2.0 * err)  # a saturation above: left out
        proven = parts[2][:, 0] > limit
    best = np.where(proven, best + k0, -1)
    todo = np.flatnonzero(~proven)
    if todo.size:
        coarse = np.arange(0, k0 - 1, _COARSE)
        sub = _Rows(bins.counts[todo], bins.total[todo], lo[todo], w[todo])
        sat = _saturation(sub, lo[todo], w[todo], delta[todo][:, coarse], offset[todo][:, coarse], n_steps)[2]
        with np.errstate(invalid="ignore"):
            above = sat > limit[todo, None]
        last = coarse.size - 1 - np.argmax(above[:, ::-1], axis=1)
        start = np.where(above.any(axis=1), coarse[last] + 1, 0)  # every grid up to the last one above is out
        for k in np.unique(start):
            rows = todo[start == k]
            bins_k = _Rows(bins.counts[rows], bins.total[rows], lo[rows], w[rows])
            best[rows] = k + _search(bins_k, lo[rows], w[rows], delta[rows, k:], offset[rows, k:], valid[rows, k:],
                                     n_steps, pads, ids[rows])[0]
    return best


def _search(bins: _Rows, lo, w, delta, offset, valid, n_steps: int, pads, ids, parts=None):
    """Index of the best candidate per row (module docstring, steps 1-4), the lowest windowed cost
    per row and the rows with non-finite costs; ``ids`` are the rows' indices in the whole call,
    ``parts`` the candidates' `_saturation` where already known."""
    rows, nb = bins.rows, bins.nb
    tol = (4 * nb + 16) * _EPS  # > the relative effect of summation order and rounding on a cost
    all_valid = bool(valid.all())
    ai, bi, sat, mass_a, mass_b, col_a = parts or _saturation(bins, lo, w, delta, offset, n_steps)
    d2 = delta**2
    # bin a's term as in the dense form (lower bound); bins strictly inside add <= p/4 each (upper)
    t = (lo[:, None] + (ai + 0.5) * w[:, None]) / delta - offset
    q = np.clip(np.floor(t + 0.5), 0, n_steps)
    term_a = bins.p_at(ai, col_a) * (t - q) ** 2
    term_a[ai >= bi] = 0.0
    lower = sat + term_a * d2
    upper = (sat + (term_a + 0.25 * (mass_b - mass_a) + tol) * d2) * (1.0 + tol)
    if not all_valid:
        upper[~valid] = np.inf
    keep = lower <= upper.min(axis=1, keepdims=True)
    if not all_valid:
        keep &= valid
    # survivors (by row, then candidate): sums over the non-empty bins of their window [a, b)
    survivors = int(keep.sum())
    if survivors > _TWO_ROUNDS * rows and survivors > _TWO_ROUNDS_MIN:  # many: `_two_rounds` drops more first
        rr, kk, cost = _two_rounds(bins, keep, lower, sat, mass_b - mass_a, ai, bi, delta, offset, n_steps, tol)
    else:
        rr, kk = np.nonzero(keep)
        cost = sat[keep] + d2[keep] * _window_sums(bins, rr, ai[keep], bi[keep], delta[keep], offset[keep], n_steps)
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
        best[redo] = _dense_pick(bins.full_pdf(redo), lo[redo], w[redo], delta[redo], offset[redo], valid[redo],
                                 cand, pads(ids[redo]), n_steps)
    return best, low, bad


def _two_rounds(bins: _Rows, keep, lower, sat, mass, ai, bi, delta, offset, n_steps: int, tol: float):
    """`_search`'s survivors and their costs, found in two rounds: the survivor per row whose cost looks
    lowest (inside bins at 1/12 each) is summed first; its cost (plus rounding margin) is an upper bound
    of the row's lowest cost, which drops more candidates than the bounds alone. Rows, then candidates."""
    d2 = delta**2
    r1 = np.flatnonzero(keep.any(axis=1))
    k1 = np.argmin(np.where(keep, lower + mass * d2 / 12.0, np.inf)[r1], axis=1)
    cost1 = sat[r1, k1] + d2[r1, k1] * _window_sums(bins, r1, ai[r1, k1], bi[r1, k1], delta[r1, k1],
                                                    offset[r1, k1], n_steps)
    keep = keep.copy()
    with np.errstate(invalid="ignore"):
        keep[r1] &= lower[r1] <= (cost1 * (1.0 + 8.0 * tol))[:, None]
    keep[r1, k1] = False
    rr, kk = np.nonzero(keep)
    cost = sat[keep] + d2[keep] * _window_sums(bins, rr, ai[keep], bi[keep], delta[keep], offset[keep], n_steps)
    order = np.lexsort((np.concatenate([k1, kk]), np.concatenate([r1, rr])))
    return np.concatenate([r1, rr])[order], np.concatenate([k1, kk])[order], np.concatenate([cost1, cost])[order]


def _window_sums(bins: _Rows, rows, a, b, delta, offset, n_steps: int) -> np.ndarray:
    """``sum p_i (t_i - q_i)^2`` over the non-empty bins ``i`` in ``[a, b)`` of row ``rows`` (one per candidate)."""
    if rows.size == 0:
        return np.zeros(0)
    base = (rows * bins.nb)[:, None]
    ja, jb = np.searchsorted(bins.keys, np.stack([a, b], axis=1) + base).T - bins.row_start[rows]
    c0, c1 = int(ja.min()), int(jb.max())  # the windows, in the rows' packed columns
    if c1 <= c0:
        return np.zeros(rows.size)
    t = bins.mid[rows, c0:c1]
    with np.errstate(over="ignore", invalid="ignore"):  # columns outside a window are dropped below
        t /= delta[:, None]
        t -= offset[:, None]
        q = np.floor(t + 0.5)
        np.clip(q, 0, n_steps, out=q)
        t -= q
        np.square(t, out=t)
        t *= bins.p[rows, c0:c1]
    cols = np.arange(c0, c1)
    t[(cols < ja[:, None]) | (cols >= jb[:, None])] = 0.0
    return t.sum(axis=1)


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
