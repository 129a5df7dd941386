"""Tests for quantsim.calibration.tf_enhanced_search: the pruned TF-enhanced search equals the dense all-candidates search."""
import numpy as np
import pytest

import quantsim.calibration.tf_enhanced_search as tfe
from quantsim.calibration.histograms import HistogramObserver, _bin_index, _initial_grid
from quantsim.calibration.tf_enhanced_search import asymmetric_candidates, best_grids, candidate_costs, symmetric_candidates


def _dense_costs_reference(pdf, lo, w, delta, offset, n_steps):
    """The dense cost as first written (full-width prefix sums): `candidate_costs` must equal it bit for bit."""
    rows, nb = pdf.shape
    u_min = (delta * offset - lo[:, None]) / w[:, None] - 0.5
    u_max = (delta * (offset + n_steps) - lo[:, None]) / w[:, None] - 0.5
    a, b = np.floor(u_min + 0.5), np.floor(u_max + 0.5)
    missed_high, missed_low = a > nb - 1, b < 0
    a = np.where(missed_high, nb, np.where(missed_low, 0, np.clip(a, 0, nb - 1)))
    b = np.where(missed_high, nb, np.where(missed_low, 0, np.clip(b, 0, nb - 1)))
    ua, ub = np.where(missed_high, u_min, a), np.where(missed_low, u_max, b)
    ai, bi = a.astype(np.int64), b.astype(np.int64)
    i = np.arange(nb, dtype=np.float64)
    s0, s1, s2 = (np.concatenate([np.zeros((rows, 1)), np.cumsum(pdf * i**k, axis=1)], axis=1) for k in range(3))

    def head(s):
        return np.take_along_axis(s, ai, axis=1)

    def tail(s):
        return s[:, -1:] - np.take_along_axis(s, bi, axis=1)

    below = head(s2) - 2 * ua * head(s1) + ua * ua * head(s0)
    above = tail(s2) - 2 * ub * tail(s1) + ub * ub * tail(s0)
    sat = np.maximum(below, 0.0) + np.maximum(above, 0.0)
    order = np.argsort(pdf == 0, axis=1, kind="stable")[:, : max(1, int((pdf > 0).sum(axis=1).max()))]
    p = np.take_along_axis(pdf, order, axis=1)[:, None, :]
    idx = order[:, None, :].astype(np.float64)
    mid = lo[:, None, None] + (idx + 0.5) * w[:, None, None]
    t = mid / delta[..., None] - offset[..., None]
    q = np.clip(np.floor(t + 0.5), 0, n_steps)
    inside = (idx >= a[..., None]) & (idx < b[..., None])
    quant = np.sum(np.where(inside, p * (t - q) ** 2, 0.0), axis=-1) * delta**2
    return 3.0 * sat * (w * w)[:, None] + quant


def _dense_search(counts, lo, w, mn, mx, n_steps, symmetric, unsigned):
    """First lowest dense cost among the valid candidates, rows in chunks of `_CHUNK_ELEMENTS` (the spec)."""
    if symmetric:
        delta, offset, valid = symmetric_candidates(mn, mx, n_steps, unsigned)
    else:
        delta, offset, valid = asymmetric_candidates(mn, mx, n_steps)
    pdf = counts / counts.sum(axis=1, keepdims=True)
    chunk = max(1, tfe._CHUNK_ELEMENTS // (delta.shape[1] * counts.shape[1]))
    best = np.empty(counts.shape[0], dtype=np.int64)
    for s in range(0, counts.shape[0], chunk):
        sl = slice(s, s + chunk)
        cost = _dense_costs_reference(pdf[sl], lo[sl], w[sl], delta[sl], offset[sl], n_steps)
        best[sl] = np.argmin(np.where(valid[sl], cost, np.inf), axis=1)
    rows = np.arange(counts.shape[0])
    return delta[rows, best], offset[rows, best]


def _channels(rng, kind, rows, size):
    x = rng.normal(size=(rows, size)) * rng.uniform(0.01, 3.0, size=(rows, 1))
    if kind == "integers":
        x = np.round(x * 3)  # exact ties between grids
    elif kind == "few_values":
        x = rng.choice(rng.normal(size=5), size=(rows, size))
    elif kind == "constant":
        x[::2] = rng.uniform(-2, 2)
    elif kind == "outliers":
        x[:, 0] *= 50
    elif kind == "relu":
        x = np.maximum(x, 0.0)
    elif kind == "skewed":
        x = rng.lognormal(0, 1.5, size=(rows, size))
    return x


def _histograms(x, num_bins):
    omin, omax = x.min(axis=1), x.max(axis=1)
    lo, w = _initial_grid(omin, omax, num_bins)
    idx = _bin_index(x, lo[:, None], w[:, None], num_bins)
    counts = np.stack([np.bincount(r, minlength=num_bins) for r in idx]).astype(np.float64)
    mn = np.minimum(omin, 0.0)
    mx = np.maximum(np.maximum(omax, 0.0), mn + 0.01)
    return counts, lo, w, mn, mx


@pytest.mark.parametrize("kind", ["normal", "integers", "few_values", "constant", "outliers", "relu", "skewed"])
@pytest.mark.parametrize("bits", [3, 8, 16])
def test_pruned_search_equals_dense_search_exactly(kind, bits):
    rng = np.random.default_rng([bits, len(kind)])
    n_steps = (1 << bits) - 1
    counts, lo, w, mn, mx = _histograms(_channels(rng, kind, 90, 60), 512)  # > 1 chunk of rows
    for symmetric, unsigned in ((False, False), (True, False), (True, kind == "relu")):
        got = best_grids(counts, lo, w, mn, mx, n_steps, symmetric, unsigned)
        want = _dense_search(counts, lo, w, mn, mx, n_steps, symmetric, unsigned)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_ties_are_settled_by_the_dense_form(monkeypatch):
    calls = []
    real = tfe._dense_pick
    monkeypatch.setattr(tfe, "_dense_pick", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    rng = np.random.default_rng(11)
    two_values = np.where(rng.uniform(size=(60, 40)) < 0.5, 0.0, rng.uniform(0.1, 2, size=(60, 1)))
    counts, lo, w, mn, mx = _histograms(two_values, 64)  # grids that differ but cost exactly the same
    for n_steps, symmetric in ((6, True), (15, False), (15, True)):
        calls.clear()
        got = best_grids(counts, lo, w, mn, mx, n_steps, symmetric, False)
        want = _dense_search(counts, lo, w, mn, mx, n_steps, symmetric, False)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert sum(calls) > 0  # the tie path ran


def test_non_finite_costs_fall_back_to_the_dense_search():
    rng = np.random.default_rng(12)
    counts, lo, w, mn, mx = _histograms(rng.normal(size=(5, 50)) * 1e290, 512)
    with np.errstate(all="ignore"):
        got = best_grids(counts, lo, w, mn, mx, 255, False, False)
        want = _dense_search(counts, lo, w, mn, mx, 255, False, False)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_candidate_costs_is_the_dense_reference_bit_for_bit():
    rng = np.random.default_rng(13)
    for num_bins, kind in ((512, "outliers"), (64, "integers"), (7, "normal"), (512, "constant")):
        counts, lo, w, mn, mx = _histograms(_channels(rng, kind, 6, 300), num_bins)
        pdf = counts / counts.sum(axis=1, keepdims=True)
        for symmetric in (False, True):
            cands = symmetric_candidates(mn, mx, 255, False) if symmetric else asymmetric_candidates(mn, mx, 255)
            delta, offset = cands[0], cands[1]
            np.testing.assert_array_equal(candidate_costs(pdf, lo, w, delta, offset, 255),
                                          _dense_costs_reference(pdf, lo, w, delta, offset, 255))


def test_asymmetric_candidates_match_the_clamped_aimet_grid():
    rng = np.random.default_rng(14)
    mn = np.minimum(rng.normal(size=20), 0.0)
    mx = np.maximum(rng.normal(size=20), 0.0) + 0.01
    mn[:3] = 0.0
    for n_steps in (15, 255):
        delta, offset, valid = asymmetric_candidates(mn, mx, n_steps)
        delta0 = (mx - mn) / n_steps
        offset0 = np.sign(mn / delta0) * np.floor(np.abs(mn / delta0) + 0.5)
        gmin, gmax = delta0 * offset0, delta0 * offset0 + delta0 * n_steps
        k = 0
        for f in np.arange(1, 18) / 16.0:
            for o in np.trunc(-n_steps + n_steps / 20.0 * np.arange(21)):
                d = f * delta0
                tmin, tmax = d * o, d * o + d * n_steps
                ok = ~((tmin < gmin) & (tmax > gmax))
                dd = (np.minimum(tmax, gmax) - np.maximum(tmin, gmin)) / n_steps
                ok &= dd > 0
                np.testing.assert_array_equal(valid[:, k], ok)
                np.testing.assert_array_equal(delta[ok, k], dd[ok])
                c = np.maximum(tmin, gmin)[ok] / dd[ok]
                np.testing.assert_array_equal(offset[ok, k], np.sign(c) * np.floor(np.abs(c) + 0.5))
                k += 1
        np.testing.assert_array_equal(delta[:, -1], delta0)
        assert valid[:, -1].all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unclipped_binning_equals_clipped_binning(dtype):
    rng = np.random.default_rng(15)
    for scale, shift in ((1.0, 0.0), (1e-3, 5.0), (1e4, -3e4), (1.0, 1e6)):
        x = (rng.normal(size=5000) * scale + shift).astype(dtype)
        obs = HistogramObserver()
        obs.update(x[:100])
        mn, mx = float(x.min()), float(x.max())
        obs._grow_to(mn, mx)
        edges = np.array([mn, mx, obs.lo, obs.edges[-1]], dtype=dtype)  # values right at the edges
        x = np.concatenate([x, np.clip(edges, mn, mx)])
        got = _bin_index(x, obs.lo, obs.bin_width, obs.num_bins, (mn, mx))
        np.testing.assert_array_equal(got, _bin_index(x, obs.lo, obs.bin_width, obs.num_bins))


def test_strided_samples_bin_like_contiguous_copies():
    rng = np.random.default_rng(16)
    data = rng.normal(size=(4, 3000)).astype(np.float32)
    a, b = HistogramObserver(), HistogramObserver()
    for batch in data:
        view = batch[::3]
        a.update(view, value_range=(float(batch.min()), float(batch.max())))
        b.update(np.ascontiguousarray(view), value_range=(float(batch.min()), float(batch.max())))
    np.testing.assert_array_equal(a.counts, b.counts)
    assert (a.lo, a.bin_width, a.count) == (b.lo, b.bin_width, b.count)


def _spy_search(monkeypatch):
    """Record (rows, candidates) of every windowed search."""
    seen = []
    real = tfe._search

    def spy(bins, lo, w, delta, *args):
        seen.append(delta.shape)
        return real(bins, lo, w, delta, *args)

    monkeypatch.setattr(tfe, "_search", spy)
    return seen


@pytest.mark.parametrize("kind", ["normal", "integers", "few_values", "constant", "outliers", "relu", "skewed"])
def test_nested_search_in_small_chunks_equals_dense_search(monkeypatch, kind):
    seen = _spy_search(monkeypatch)
    monkeypatch.setattr(tfe, "_SEARCH_CANDIDATES", 101 * 7)  # several search chunks of 7 rows
    rng = np.random.default_rng([7, len(kind)])
    counts, lo, w, mn, mx = _histograms(_channels(rng, kind, 40, 30), 512)
    for bits in (3, 8, 16):
        n_steps = (1 << bits) - 1
        for unsigned in {False, kind == "relu"}:
            got = best_grids(counts, lo, w, mn, mx, n_steps, True, unsigned)
            want = _dense_search(counts, lo, w, mn, mx, n_steps, True, unsigned)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
    assert {k for _, k in seen} >= {tfe._WIDEST}


def test_nested_search_widest_first_then_narrower_when_clipping_wins(monkeypatch):
    seen = _spy_search(monkeypatch)
    rng = np.random.default_rng(21)
    x = rng.normal(size=(30, 400))
    x[15:, 0] = 40.0  # 4-bit grids clip this outlier: the best grid is far narrower than the widest ones
    counts, lo, w, mn, mx = _histograms(x, 512)
    for n_steps in (255, 15):
        seen.clear()
        got = best_grids(counts, lo, w, mn, mx, n_steps, True, False)
        want = _dense_search(counts, lo, w, mn, mx, n_steps, True, False)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        if n_steps == 255:
            assert seen == [(30, tfe._WIDEST)]  # Gaussian weights: the best grid is among the widest
        else:  # 4 bits: narrower grids win, and most of the narrowest are still left out
            assert seen[0] == (30, tfe._WIDEST) and sum(r for r, _ in seen[1:]) == 30
            assert all(tfe._WIDEST < k < 101 for _, k in seen[1:])


def test_concatenated_searches_equal_separate_calls(monkeypatch):
    """``starts`` pads the tie re-evaluation per search, so one call over several searches changes nothing."""
    rng = np.random.default_rng(22)
    two_values = np.where(rng.uniform(size=(17, 40)) < 0.5, 0.0, rng.uniform(0.1, 2, size=(17, 1)))
    mixed = np.concatenate([two_values, rng.normal(size=(6, 40)), np.round(rng.normal(size=(6, 40)) * 2)])
    counts, lo, w, mn, mx = _histograms(mixed, 64)
    sizes = [5, 1, 7, 2, 6, 8]
    starts = np.cumsum([0] + sizes[:-1])
    for symmetric, n_steps in ((True, 6), (False, 15), (True, 255)):
        n_cand = 101 if symmetric else 358
        monkeypatch.setattr(tfe, "_CHUNK_ELEMENTS", n_cand * 64 * 3)  # dense chunks of 3 rows: pads differ
        joint = best_grids(counts, lo, w, mn, mx, n_steps, symmetric, False, starts=starts)
        for s, n in zip(starts, sizes):
            sl = slice(s, s + n)
            alone = best_grids(counts[sl], lo[sl], w[sl], mn[sl], mx[sl], n_steps, symmetric, False)
            np.testing.assert_array_equal(joint[0][sl], alone[0])
            np.testing.assert_array_equal(joint[1][sl], alone[1])
        pads = tfe._DensePads(counts, n_cand, starts)(np.arange(counts.shape[0]))
        for s, n in zip(starts, sizes):
            own = tfe._DensePads(counts[s : s + n], n_cand)(np.arange(n))
            np.testing.assert_array_equal(pads[s : s + n], own)


def test_packed_rows_give_full_width_partial_sums_bit_for_bit():
    rng = np.random.default_rng(23)
    counts, lo, w, _, _ = _histograms(_channels(rng, "skewed", 9, 200), 512)
    counts[3] = 0.0
    counts[3, 100] = 5.0  # a single non-empty bin
    total = counts.sum(axis=1, keepdims=True)
    pdf = counts / total
    packed = tfe._Rows(counts, total, lo, w)
    bins = rng.integers(0, 513, size=(9, 50))
    bins[:, :3] = [0, 511, 512]
    col = packed.locate(bins)
    i = np.arange(512, dtype=np.float64)
    for k in range(3):
        full = np.concatenate([np.zeros((9, 1)), np.cumsum(pdf * i**k, axis=1)], axis=1)  # over all bins
        np.testing.assert_array_equal(np.take(packed.sums[k], col), np.take_along_axis(full, bins, axis=1))
        np.testing.assert_array_equal(packed.totals[k], full[:, -1:])
    padded = np.concatenate([pdf, np.zeros((9, 1))], axis=1)
    np.testing.assert_array_equal(packed.p_at(bins, col), np.take_along_axis(padded, bins, axis=1))


@pytest.mark.parametrize("rounds", [-1, 10**6])  # always / never the two-round survivor sums
def test_two_round_and_one_round_sums_equal_dense_search(monkeypatch, rounds):
    monkeypatch.setattr(tfe, "_TWO_ROUNDS", rounds)
    monkeypatch.setattr(tfe, "_TWO_ROUNDS_MIN", -1)
    for seed, kind in enumerate(["normal", "integers", "few_values", "constant", "outliers", "skewed"]):
        rng = np.random.default_rng([31, seed])
        counts, lo, w, mn, mx = _histograms(_channels(rng, kind, 25, 80), 512)
        for symmetric, n_steps in ((False, 255), (True, 255), (False, 15), (True, 7)):
            got = best_grids(counts, lo, w, mn, mx, n_steps, symmetric, False)
            want = _dense_search(counts, lo, w, mn, mx, n_steps, symmetric, False)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("scheme", ["tf_enhanced", "percentile"])
def test_sim_batched_encodings_equal_one_quantizer_at_a_time(scheme):
    """compute_encodings groups TF-enhanced searches across quantizers; each result equals its own search."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from models import BUILDERS  # tests/models.py

    import quantsim
    from quantsim.calibration.encode import fixed_range_encoding

    model, make_feed = BUILDERS["mixed"]()
    feeds = [make_feed(seed, 4) for seed in range(3)]
    sim = quantsim.QuantizationSimModel(model, quant_scheme=scheme, param_type="int4")
    sim.progress = False
    sim.compute_encodings(feeds)
    session = sim._calibration_session([q for q in sim._quantizers if q.name in sim.activation_names])
    for feed in feeds:
        session.run(None, feed)
    stats = session.finish()
    checked = 0
    for q in sim._quantizers:
        if q.encoding is None or q.spec.is_float:
            continue
        scheme, request = q.calibration_scheme, q.encoding_request()
        if q.name in stats:  # the scheme's one-at-a-time form
            expected = (fixed_range_encoding(request, stats[q.name]) if request.fixed_range is not None
                        else scheme.from_stats(request, stats[q.name]))
        elif sim._is_constant_quantizer(q):
            expected = scheme.from_values(request, sim._constant_values(q))
        else:
            continue
        # the batched graph's statistics can differ from the single one's by a float32 rounding (onnxruntime picks
        # kernels per graph and CPU: seen on AVX2-only x86), so the grid is compared to that precision
        assert (q.encoding.bits, q.encoding.signed, q.encoding.axis) == (expected.bits, expected.signed, expected.axis)
        np.testing.assert_allclose(q.encoding.scale, expected.scale, rtol=1e-6, err_msg=q.name)
        np.testing.assert_array_equal(q.encoding.zero_point, expected.zero_point, err_msg=q.name)
        checked += 1
    assert checked >= 4
