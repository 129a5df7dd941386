"""Histogram observers and the histogram-based encodings (TF-enhanced / SQNR, percentile). PURE numpy.

Histogram
    ``num_bins`` (512) equal bins, bin ``i`` covering ``[lo + i*w, lo + (i+1)*w)``; a value goes to
    ``floor((x - lo) / w)``. Like AIMET, the first batch with a finite value fixes the range: its
    ``[min, max]`` enlarged 3x about its centre (width 0.01 when ``min == max``). Unlike AIMET, nothing is
    ever dropped: when a later batch falls outside, the histogram *grows* by the smallest whole factor
    ``k >= 2`` of the bin width, with the old range shifted by a whole number ``m`` of old bins, so old bin
    ``i`` falls entirely into new bin ``(i + m) // k`` (counts move exactly, no interpolation). The spare
    room is split evenly on both sides of the needed span, so each growth at most doubles the needed
    resolution and the number of growths is logarithmic in the range ratio. Counts are plain counts
    (every finite value weighs the same); AIMET instead averages per-batch normalised PDFs, which only
    differs when batch sizes differ. Exact running min/max are kept alongside (O(bins) memory overall).

TF-enhanced (AIMET ``TfEnhancedEncodingAnalyzer``, reference §6.3)
    Range ``[mn, mx]``: exact observed extremes (AIMET: left edges of the first/last non-empty bins, within
    one bin of these), zero included, ``mx >= mn + 0.01``. Candidates ``(delta, offset)``, grid
    ``[delta*offset, delta*(offset + N)]``:

    * asymmetric: ``delta0 = (mx - mn)/N``, ``offset0 = round(mn/delta0)``; deltas ``f*delta0`` for
      ``f = 1/16 .. 17/16`` times offsets ``trunc(-N + i*N/20)``, ``i = 0..20``, each clamped into the
      ``(delta0, offset0)`` grid range (and re-expressed as ``delta = (max - min)/N``,
      ``offset = round(min/delta)``) unless it covers that range entirely (skipped), plus
      ``(delta0, offset0)`` itself. (AIMET's loop reuses a clamped delta for later offsets; here every
      candidate is clamped independently.)
    * symmetric: ``delta = f * 2*absmax/N``, ``f = 0.01 .. 1.01``, ``offset = floor(-N/2)``; unsigned
      symmetric (flag set, every non-zero channel ``mn == 0``): ``delta = f * mx/N``, offset 0.

    Cost of a candidate over bin midpoints ``c_i`` with probabilities ``p_i``: with ``a``/``b`` the bins
    holding the grid min/max, ``3 * (sum_{i<a} p_i (c_i - c_a)^2 + sum_{i>=b} p_i (c_i - c_b)^2)`` (saturation
    to the nearest representable bin) ``+ sum_{a<=i<b} p_i (c_i - fq(c_i))^2`` (quantisation, ``fq``
    rounding half away on the grid). The first lowest-cost candidate wins; `tf_enhanced` finds it (cost
    bounds drop most candidates unevaluated, the rest are summed over their own bins only, near-ties are
    settled by the full candidates x bins evaluation). The winner becomes an `Encoding` through
    `numerics.encoding_from_range` of its grid range (same grid conventions, strict/unsigned variants and
    scale floor as min-max). All-zero data gives the encoding of ``[-1, 1]``; nothing observed raises
    ``ValueError``. `tf_enhanced_encodings` / `tf_enhanced_encodings_of` give the encodings of many
    histograms / tensors from shared searches: the same encodings, the per-call overhead paid once.

Percentile (reference §6.4)
    ``p == 100``: left edge of the first / right edge of the last non-empty bin, tightened to the exact
    observed extremes (so it equals min-max). ``p < 100``: with the CDF over bins, min = left edge of the
    first bin with ``cdf >= 1 - p/100``, max = right edge of the last bin with ``cdf < p/100`` whose left
    edge is below the observed max (one bin above min when equal or missing), both clipped to the observed
    extremes; then `numerics.encoding_from_range`.
"""
from __future__ import annotations

import math

import numpy as np

from quantsim.calibration.tf_enhanced_search import SATURATION_WEIGHT, best_grids
from quantsim.core.numerics import Encoding, encoding_from_range
from quantsim.errors import InvalidArgumentError

__all__ = [
    "HistogramObserver", "tf_enhanced_encoding_of", "tf_enhanced_encodings", "tf_enhanced_encodings_of",
    "DEFAULT_NUM_BINS", "MIN_RANGE", "SATURATION_WEIGHT",
]

DEFAULT_NUM_BINS = 512
MIN_RANGE = 0.01  # AIMET's minimum range (initial histogram width when min == max; TF-enhanced range)


def _initial_grid(mn: np.ndarray, mx: np.ndarray, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """(left edge, bin width) of histograms over ``[mn, mx]`` enlarged 3x (width 0.01 when empty)."""
    centre = 0.5 * (mn + mx)
    width = 3.0 * (mx - mn)
    lo = np.where(width > 0, centre - 0.5 * width, mn)
    width = np.where(width > 0, width, MIN_RANGE)
    # keep bins distinguishable from their edges for huge-magnitude constant data
    width = np.maximum(width, 4.0 * num_bins * np.spacing(np.abs(lo) + np.abs(mx)))
    return lo, width / num_bins


def _bin_index(x: np.ndarray, lo, w, num_bins: int, bounds: tuple[float, float] | None = None) -> np.ndarray:
    """Bin of each value (clipped into the histogram, which only fixes float rounding at the edges).

    ``x`` holds finite values; computed in ``x``'s float type with in-place passes. ``bounds`` (``<= x.min()``,
    ``>= x.max()``) lets the clip be skipped when the (monotone) scaling keeps both inside ``(-1, num_bins)``,
    where truncation alone gives the clipped bins.
    """
    if np.ndim(lo):  # per-channel grids (weights): float64 broadcasting
        with np.errstate(over="ignore", invalid="ignore"):
            idx = np.floor((x - lo) / w)
        return np.clip(idx, 0, num_bins - 1).astype(np.int64)
    ftype = x.dtype.type
    lo, scale = ftype(lo), ftype(1.0 / w)
    idx = np.subtract(x, lo, dtype=x.dtype)
    idx *= scale
    with np.errstate(over="ignore", invalid="ignore"):
        ends = None if bounds is None else ((ftype(bounds[0]) - lo) * scale, (ftype(bounds[1]) - lo) * scale)
    if ends is None or not (-1 < ends[0] and ends[1] < num_bins):
        np.clip(idx, 0, num_bins - 1, out=idx)
    return idx.astype(np.intp)  # truncation == floor for values >= 0


class HistogramObserver:
    """Streaming histogram of one tensor's values (all batches), 512 bins by default.

    Memory is O(num_bins): batches are binned and dropped. See the module docstring for the binning,
    range-growth and encoding rules. Non-finite values are ignored.
    """

    def __init__(self, num_bins: int = DEFAULT_NUM_BINS):
        if int(num_bins) < 2:
            raise InvalidArgumentError(f"num_bins must be >= 2, got {num_bins}")
        self.num_bins = int(num_bins)
        self.counts = np.zeros(self.num_bins, dtype=np.float64)
        self.lo = 0.0  # left edge of bin 0
        self.bin_width = 0.0
        self.count = 0  # number of finite values seen
        self._min = math.inf
        self._max = -math.inf

    # ---------------------------------------------------------------- state
    @property
    def is_empty(self) -> bool:
        return self.count == 0

    @property
    def observed_min(self) -> float:
        self._require_data()
        return self._min

    @property
    def observed_max(self) -> float:
        self._require_data()
        return self._max

    @property
    def edges(self) -> np.ndarray:
        """The ``num_bins + 1`` bin edges."""
        return self.lo + self.bin_width * np.arange(self.num_bins + 1, dtype=np.float64)

    def _require_data(self) -> None:
        if self.is_empty:
            raise InvalidArgumentError("no data observed: the histogram observer has not seen any finite value")

    # ---------------------------------------------------------------- accumulation
    def update(self, x: np.ndarray, value_range: tuple[float, float] | None = None) -> None:
        """Add the finite values of ``x`` (any shape) to the histogram, growing its range if needed.

        ``value_range`` may pass ``(x.min(), x.max())`` when the caller already knows them to be finite.
        Binning runs in float32 for float32 data (bin edges are 512ths of the range: far coarser than
        float32 rounding) with in-place passes, since this is the hot loop of histogram calibration.
        """
        x = np.asarray(x).reshape(-1)  # a view for strided 1-D samples
        if x.dtype not in (np.float32, np.float64):
            x = x.astype(np.float32)
        if value_range is None:
            mn, mx = (float(x.min()), float(x.max())) if x.size else (math.nan, math.nan)
        else:
            mn, mx = float(value_range[0]), float(value_range[1])
        if not (math.isfinite(mn) and math.isfinite(mx)):
            x = x[np.isfinite(x)]
            if x.size == 0:
                return
            mn, mx = float(x.min()), float(x.max())
        if self.is_empty:
            lo, w = _initial_grid(np.float64(mn), np.float64(mx), self.num_bins)
            self.lo, self.bin_width = float(lo), float(w)
        else:
            self._grow_to(mn, mx)
        idx = _bin_index(x, self.lo, self.bin_width, self.num_bins, (mn, mx))
        self.counts += np.bincount(idx, minlength=self.num_bins)
        self.count += int(x.size)
        self._min, self._max = min(self._min, mn), max(self._max, mx)

    def _grow_to(self, mn: float, mx: float) -> None:
        """Widen the histogram (whole-factor re-binning, counts kept exactly) until it holds [mn, mx]."""
        nb, w = self.num_bins, self.bin_width
        with np.errstate(over="ignore"):
            lo_pos, hi_pos = (mn - self.lo) / w, (mx - self.lo) / w
        if not (math.isfinite(lo_pos) and math.isfinite(hi_pos)):
            raise InvalidArgumentError("value range too wide for the histogram's resolution")
        first, last = math.floor(lo_pos), math.floor(hi_pos)
        below, above = max(0, -first), max(0, last - nb + 1)
        if below == 0 and above == 0:
            return
        factor = -(-(nb + below + above) // nb)  # ceil, >= 2
        shift = below + (nb * factor - nb - below - above) // 2  # old bin 0 becomes fine bin `shift`
        target = np.floor((np.arange(nb, dtype=np.float64) + float(shift)) / float(factor))
        target = np.clip(target, 0, nb - 1).astype(np.int64)
        self.counts = np.bincount(target, weights=self.counts, minlength=nb).astype(np.float64)
        self.lo = self.lo - float(shift) * w
        self.bin_width = w * float(factor)

    def merge(self, other: HistogramObserver) -> None:
        """Fold ``other`` in (tensors sharing one quantizer).

        Same bin grid (same width, edges a whole number of bins apart): exact. Otherwise this histogram
        grows to hold ``other``'s non-empty bins and each of ``other``'s bins is spread over the bins it
        overlaps in proportion to the overlap (values assumed uniform within a bin).
        """
        if other is self:
            raise InvalidArgumentError("cannot merge an observer into itself")
        if other.is_empty:
            return
        if self.is_empty:
            if other.num_bins != self.num_bins:
                raise InvalidArgumentError("cannot merge observers with different numbers of bins")
            self.counts, self.lo, self.bin_width = other.counts.copy(), other.lo, other.bin_width
            self.count, self._min, self._max = other.count, other._min, other._max
            return
        nz = np.flatnonzero(other.counts)
        o_edges = other.edges
        left, right = float(o_edges[nz[0]]), float(o_edges[nz[-1] + 1])
        self._grow_to(min(left, other._min), max(np.nextafter(right, -np.inf), other._max))
        shift = (other.lo - self.lo) / self.bin_width
        if other.bin_width == self.bin_width and shift == round(shift):
            idx = np.clip(np.arange(other.num_bins) + int(round(shift)), 0, self.num_bins - 1)
            np.add.at(self.counts, idx, other.counts)  # only empty bins of `other` can fall outside
        else:
            cum = np.concatenate([[0.0], np.cumsum(other.counts)])
            at_edges = np.interp(self.edges, o_edges, cum)
            at_edges[0], at_edges[-1] = 0.0, cum[-1]  # everything lands inside (range grown above)
            self.counts += np.maximum(np.diff(at_edges), 0.0)
        self.count += other.count
        self._min, self._max = min(self._min, other._min), max(self._max, other._max)

    # ---------------------------------------------------------------- encodings
    def tf_enhanced_encoding(
        self, bits: int, *, symmetric: bool, strict: bool = False, unsigned_symmetric: bool = False
    ) -> Encoding:
        """AIMET TF-enhanced (SQNR) encoding of everything observed (module docstring)."""
        return _tf_encodings([_observer_item(self)], bits, symmetric, strict, unsigned_symmetric)[0]

    def percentile_encoding(
        self, bits: int, percentile: float, *, symmetric: bool, strict: bool = False,
        unsigned_symmetric: bool = False,
    ) -> Encoding:
        """AIMET percentile encoding (``0 < percentile <= 100``; 100 gives the min-max range)."""
        lo, hi = self.percentile_range(percentile)
        return encoding_from_range(
            lo, hi, bits, symmetric=symmetric, strict=strict, unsigned_symmetric=unsigned_symmetric
        )

    def percentile_range(self, percentile: float) -> tuple[float, float]:
        """The ``[min, max]`` the percentile rule keeps (before zero is included)."""
        p = float(percentile)
        if not (0.0 < p <= 100.0):
            raise InvalidArgumentError(f"percentile must satisfy 0 < p <= 100, got {percentile!r}")
        self._require_data()
        edges, w = self.edges, self.bin_width
        nz = np.flatnonzero(self.counts)
        if p == 100.0:
            lo, hi = edges[nz[0]], edges[nz[-1] + 1]
        else:
            cdf = np.cumsum(self.counts) / self.counts.sum()
            lo = edges[int(np.argmax(cdf >= 1.0 - p / 100.0))]
            below = np.flatnonzero((cdf < p / 100.0) & (edges[:-1] < self._max))
            hi = edges[below[-1] + 1] if below.size else lo + w
            if hi <= lo:
                hi = lo + w
        lo = min(max(float(lo), self._min), self._max)
        hi = max(min(float(hi), self._max), lo)
        return lo, hi


# -------------------------------------------------------------------- TF-enhanced
_BATCH_ROWS = 1 << 11  # histogram rows per shared search of the batched encodings (bounded memory)


def _tf_encodings(items, bits, symmetric, strict, unsigned_symmetric) -> list[Encoding]:
    """TF-enhanced encodings of several tensors, ``items`` = (counts (C, B), lo, w, omin, omax, axis) each
    (per tensor when ``axis`` is None, C == 1): one search over all their rows, each tensor's result
    exactly that of its own search (`best_grids` ``starts``)."""
    strict = bool(strict and symmetric)
    n_steps = (1 << int(bits)) - 1 - (1 if strict else 0)
    grids: list[tuple[np.ndarray, np.ndarray, bool]] = []
    groups: dict[tuple[bool, int], list] = {}
    for i, (counts, lo, w, omin, omax, _) in enumerate(items):
        nz = (omin != 0.0) | (omax != 0.0)
        mn = np.minimum(omin, 0.0)
        mx = np.maximum(np.maximum(omax, 0.0), mn + MIN_RANGE)
        some, every = bool(nz.any()), bool(nz.all())
        unsigned = bool(symmetric and unsigned_symmetric and some and np.all(mn[nz] >= 0.0))
        grid_lo = np.full(omin.shape, 0.0 if unsigned else -1.0)  # AIMET's fixed [-1, 1] for all-zero data
        grids.append((grid_lo, np.ones(omin.shape), unsigned))
        if some:
            rows = (counts, lo, w, mn, mx) if every else (counts[nz], lo[nz], w[nz], mn[nz], mx[nz])
            groups.setdefault((unsigned, counts.shape[1]), []).append((i, slice(None) if every else nz, rows))
    for (unsigned, _), members in groups.items():
        sizes = [m[2][0].shape[0] for m in members]
        starts = np.cumsum([0] + sizes[:-1])
        columns = list(members[0][2]) if len(members) == 1 else [np.concatenate(x) for x in zip(*(m[2] for m in members))]
        counts_rows, lo_rows, w_rows, mn_rows, mx_rows = columns
        delta, offset = best_grids(counts_rows, lo_rows, w_rows, mn_rows, mx_rows, n_steps, symmetric, unsigned,
                                   starts=starts)
        for (i, nz, _), s, n in zip(members, starts, sizes):
            grids[i][0][nz] = delta[s : s + n] * offset[s : s + n]
            grids[i][1][nz] = delta[s : s + n] * (offset[s : s + n] + n_steps)
    encodings = []
    for (grid_lo, grid_hi, unsigned), item in zip(grids, items):
        axis = item[5]
        if axis is None:
            grid_lo, grid_hi = grid_lo[0], grid_hi[0]
        encodings.append(encoding_from_range(
            grid_lo, grid_hi, bits, symmetric=symmetric, strict=strict, unsigned_symmetric=unsigned, axis=axis
        ))
    return encodings


def _batched(items, bits, symmetric, strict, unsigned_symmetric) -> list[Encoding]:
    """`_tf_encodings` over an iterable of items, ``_BATCH_ROWS`` histogram rows at a time."""
    out, pending, rows = [], [], 0
    for item in items:
        pending.append(item)
        rows += item[0].shape[0]
        if rows >= _BATCH_ROWS:
            out += _tf_encodings(pending, bits, symmetric, strict, unsigned_symmetric)
            pending, rows = [], 0
    return out + (_tf_encodings(pending, bits, symmetric, strict, unsigned_symmetric) if pending else [])


def _observer_item(obs: HistogramObserver):
    obs._require_data()
    arr = lambda v: np.array([v])  # noqa: E731
    return obs.counts[None], arr(obs.lo), arr(obs.bin_width), arr(obs._min), arr(obs._max), None


def tf_enhanced_encodings(
    observers, bits: int, *, symmetric: bool, strict: bool = False, unsigned_symmetric: bool = False
) -> list[Encoding]:
    """`HistogramObserver.tf_enhanced_encoding` of several observers (same flags) in one search: the
    same encodings, with the per-call overhead paid once."""
    return _batched(map(_observer_item, observers), bits, symmetric, strict, unsigned_symmetric)


def tf_enhanced_encoding_of(
    x: np.ndarray, bits: int, *, symmetric: bool, strict: bool = False, unsigned_symmetric: bool = False,
    axis: int | None = None, num_bins: int = DEFAULT_NUM_BINS,
) -> Encoding:
    """TF-enhanced encoding of one tensor (e.g. a weight), per tensor or per channel along ``axis``.

    Per channel, each slice gets its own one-batch histogram (range = its extremes enlarged 3x) and its
    own search; histograms and costs are computed for many channels at once. Returns scale shape ``()``
    or ``(C,)`` with ``axis`` set. Non-finite values are ignored; a slice without finite values raises.
    """
    return _tf_encodings([_tensor_item(x, axis, num_bins)], bits, symmetric, strict, unsigned_symmetric)[0]


def tf_enhanced_encodings_of(
    tensors, bits: int, *, symmetric: bool, strict: bool = False, unsigned_symmetric: bool = False,
    num_bins: int = DEFAULT_NUM_BINS,
) -> list[Encoding]:
    """`tf_enhanced_encoding_of` of several ``(x, axis)`` pairs (same flags) in shared searches: the same
    encodings, with the per-call overhead paid once per ``_BATCH_ROWS`` channels."""
    items = (_tensor_item(x, axis, num_bins) for x, axis in tensors)
    return _batched(items, bits, symmetric, strict, unsigned_symmetric)


def _tensor_item(x, axis: int | None, num_bins: int):
    """(counts, lo, w, omin, omax, axis) of one tensor: one histogram, or one per slice along ``axis``."""
    if axis is None:
        obs = HistogramObserver(num_bins)
        obs.update(np.asarray(x, dtype=np.float64))
        return _observer_item(obs)
    x = np.asarray(x)
    moved = np.moveaxis(x, axis % x.ndim, 0)
    if (x.size and x.dtype in (np.float32, np.float64) and x.ndim > 1 and axis % x.ndim == x.ndim - 1
            and x.flags.c_contiguous):
        item = _last_axis_item(x, num_bins)
        if item is not None:
            return (*item, axis)
    rows = np.ascontiguousarray(moved, dtype=np.float64).reshape(moved.shape[0], -1)  # one copy at most
    if rows.shape[1] == 0:
        raise InvalidArgumentError("no data observed: a channel has no finite values")
    omin, omax = rows.min(axis=1), rows.max(axis=1)
    if np.isfinite(omin).all() and np.isfinite(omax).all():
        lo, w = _initial_grid(omin, omax, num_bins)
        return _channel_histograms(rows, lo, w, num_bins), lo, w, omin, omax, axis
    finite = np.isfinite(rows)
    if not np.all(finite.any(axis=1)):
        raise InvalidArgumentError("no data observed: a channel has no finite values")
    omin = np.where(finite, rows, np.inf).min(axis=1)
    omax = np.where(finite, rows, -np.inf).max(axis=1)
    lo, w = _initial_grid(omin, omax, num_bins)
    idx = _bin_index(np.where(finite, rows, omin[:, None]), lo[:, None], w[:, None], num_bins)
    flat = (idx + num_bins * np.arange(rows.shape[0])[:, None]).ravel()
    counts = np.bincount(flat, weights=finite.ravel().astype(np.float64), minlength=rows.shape[0] * num_bins)
    return counts.reshape(rows.shape[0], num_bins), lo, w, omin, omax, axis


_TILE_ROWS, _TILE_CHANNELS = 512, 64  # a tile of `_last_axis_item`: 256 KiB of float64 temporaries


def _last_axis_item(x: np.ndarray, num_bins: int) -> tuple | None:
    """`_tensor_item`'s (counts, lo, w, omin, omax) of a C-contiguous float ``x`` whose channels are its last
    axis (a MatMul or Gemm weight) when every channel is finite, else None: the same values without the float64
    copy of ``x`` in channel order, whose strided gather dominated (0.3-0.5 s for a 4096x4096 weight, a TLB miss
    per value). The ranges are reductions of ``x`` as it lies (exact in its own type); the histograms bin tiles
    of ``x`` in place (`_block_counts`, as `_channel_histograms` does for rows)."""
    channels = x.shape[-1]
    table = x.reshape(-1, channels)
    omin = table.min(axis=0).astype(np.float64)
    omax = table.max(axis=0).astype(np.float64)
    if not (np.isfinite(omin).all() and np.isfinite(omax).all()):
        return None
    lo, w = _initial_grid(omin, omax, num_bins)
    counts = np.zeros((channels, num_bins))
    for c in range(0, channels, _TILE_CHANNELS):
        part = slice(c, c + _TILE_CHANNELS)
        for r in range(0, table.shape[0], _TILE_ROWS):
            counts[part] += _block_counts(table[r : r + _TILE_ROWS, part], lo[part], w[part], num_bins, 1)
    return counts, lo, w, omin, omax


_BIN_CHUNK = 1 << 15  # values binned per step of `_channel_histograms` (temporaries stay in cache)


def _channel_histograms(rows: np.ndarray, lo: np.ndarray, w: np.ndarray, num_bins: int) -> np.ndarray:
    """(C, num_bins) counts of finite rows (C, n), row ``c`` binned on its own grid: `_bin_index`'s
    arithmetic (float64 ``floor((x - lo) / w)``, clipped), in place and a few rows at a time."""
    n_rows, n = rows.shape
    counts = np.empty((n_rows, num_bins))
    step = max(1, _BIN_CHUNK // max(n, 1))
    for s in range(0, n_rows, step):
        counts[s : s + step] = _block_counts(rows[s : s + step], lo[s : s + step], w[s : s + step], num_bins, 0)
    return counts


def _block_counts(block: np.ndarray, lo: np.ndarray, w: np.ndarray, num_bins: int, axis: int) -> np.ndarray:
    """(C, num_bins) counts of a 2-D ``block`` whose C channels lie along ``axis`` (0: rows, 1: columns), each
    binned on its own grid ``lo``/``w`` with `_bin_index`'s arithmetic (float64 ``floor((x - lo) / w)``, clipped)."""
    channels = block.shape[axis]
    along = (slice(None), None) if axis == 0 else (None, slice(None))
    with np.errstate(over="ignore", invalid="ignore"):
        idx = np.subtract(block, lo[along], dtype=np.float64)
        idx /= w[along]
    np.floor(idx, out=idx)
    np.clip(idx, 0, num_bins - 1, out=idx)
    idx += (num_bins * np.arange(channels, dtype=np.float64))[along]  # exact: small integers
    return np.bincount(idx.astype(np.intp).ravel(), minlength=channels * num_bins).reshape(channels, num_bins)
