"""`auto_quantize`'s search order for the costlier candidates and AMP's phase-1 proxy (issue 30's speed work).

* The costlier candidates are scored everywhere first, cheapest first, up to the first meeting the target;
  the per-group mix then uses only the candidates up to that one, and when none meets, no mix is searched.
* AMP's phase 1 is scored by `OutputSQNR` (``phase1="proxy"``, the default) while phase 2 keeps the user's
  callback: the budget is still met (checked against a brute force over every per-group assignment), an
  executor's result equals the local one, and an interrupted search resumes from ``results_dir``.
"""
from __future__ import annotations

import itertools
import math
import multiprocessing
import pickle
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import amp_models as M  # tests/amp_models.py
import numpy as np
import onnxruntime as ort
import pytest

from mixed_precision import auto_quant, auto_quantize, bit_operations, layer_costs
from mixed_precision.auto_quant_proxy import MAX_DB, OutputSQNR, sqnr_db
from quantsim import InvalidArgumentError, QuantizationSimModel, int4, int8

FAST = {"quant_schemes": (), "adaround_iterations": 30, "seq_mse_candidates": 5, "progress": False}
LADDER = ["W8A8", "W8A16", "W16A16", "FP16"]


class Counting:
    """M.score, counting its calls (module level: picklable)."""

    def __init__(self, interrupt_at: int | None = None):
        self.calls, self.interrupt_at = 0, interrupt_at

    def __call__(self, session) -> float:
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        return M.score(session)


# the proxy ------------------------------------------------------------------------------------------------
def test_sqnr_is_the_hand_worked_ratio_in_decibels():
    # signal 3^2 + 4^2 = 25, noise 0^2 + 1^2 = 1: 10 log10(25) dB; a second output exact: MAX_DB; mean of both
    reference = [[np.array([3.0, 4.0]), np.array([1.0, 2.0])]]
    outputs = [[np.array([3.0, 3.0]), np.array([1.0, 2.0])]]
    assert sqnr_db(reference, outputs) == pytest.approx((10 * math.log10(25.0) + MAX_DB) / 2)
    # over two feeds the powers add up before the ratio: (25 + 25) / (1 + 4)
    two = [[np.array([3.0, 4.0])], [np.array([4.0, 3.0])]]
    got = [[np.array([3.0, 3.0])], [np.array([4.0, 1.0])]]
    assert sqnr_db(two, got) == pytest.approx(10 * math.log10(50.0 / 5.0))
    assert sqnr_db([[np.zeros(3)]], [[np.ones(3)]]) == -MAX_DB  # no signal, some noise
    assert sqnr_db([[np.ones(3)]], [[np.ones(4)]]) == 0.0  # another shape: as much noise as signal
    assert sqnr_db([[np.ones(2)]], [[np.array([1.0, np.nan])]]) == -MAX_DB  # NaN where the float model is finite
    assert sqnr_db([[np.array([np.inf, 2.0])]], [[np.array([5.0, 1.0])]]) == pytest.approx(10 * math.log10(4.0))


def test_the_proxy_scores_a_session_against_the_float_model_and_pickles():
    feeds = M.feeds(1)
    proxy = OutputSQNR(M.mlp(), feeds)
    float_session = ort.InferenceSession(M.mlp().SerializeToString(), providers=["CPUExecutionProvider"])
    assert proxy(float_session) == MAX_DB  # the float model itself: no noise
    sim = QuantizationSimModel(M.mlp(), progress=False)
    sim.compute_encodings(M.feeds())
    expected = float_session.run(None, feeds[0])[0].astype(np.float64)
    got = sim.session.run(None, feeds[0])[0].astype(np.float64)
    by_hand = 10 * math.log10(np.sum(expected ** 2) / np.sum((expected - got) ** 2))
    assert proxy(sim.session) == pytest.approx(by_hand, rel=1e-9)
    assert pickle.loads(pickle.dumps(proxy))(sim.session) == proxy(sim.session)


# costlier candidates everywhere first -----------------------------------------------------------------------
def test_the_mix_stops_at_the_first_candidate_meeting_the_target_everywhere():
    """W8A8 misses 1e-3, W8A16 everywhere misses, W16A16 everywhere meets: FP16 (costlier) is never scored,
    and the mix is W8A8/W8A16/W16A16 only."""
    result = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-3, candidates=LADDER, **FAST)
    uniform = [s for s in result.steps if s.stage == "uniform"]
    assert [s.settings["precision"] for s in uniform] == ["W8A16", "W16A16"]
    assert [s.met for s in uniform] == [False, True]
    mixes = [s for s in result.steps if s.stage in ("amp", "exhaustive")]
    assert mixes and {s.settings["candidates"] for s in mixes} == {"W8A8/W8A16/W16A16"}
    assert "FP16" not in " ".join(s.label for s in result.steps)
    assert result.budget_met and result.relative_bops <= uniform[1].relative_bops
    assert not any(q.precision().is_float for q in result.sim.quantizers if q.enabled and q.param_type != "bias")


def test_a_cheap_candidate_meeting_everywhere_cuts_the_mix_to_two():
    """With 2e-3, W8A16 everywhere already meets: the mix is W8A8/W8A16 (W16A16 and FP16 never scored)."""
    result = auto_quantize(M.mlp(), M.feeds(), M.score, 2e-3, candidates=LADDER, **FAST)
    assert [s.settings["precision"] for s in result.steps if s.stage == "uniform"] == ["W8A16"]
    assert {s.settings["candidates"] for s in result.steps if s.stage in ("amp", "exhaustive")} == {"W8A8/W8A16"}
    assert result.budget_met


def test_no_candidate_meeting_everywhere_searches_no_mix_and_says_so():
    score = Counting()
    with pytest.warns(RuntimeWarning, match="no candidate meets the target even everywhere"):
        result = auto_quantize(M.mlp(), M.feeds(), score, 0.0, candidates=["W8A8", "W8A16", "W16A16"], **FAST)
    stages = [s.stage for s in result.steps]
    assert "amp" not in stages and "exhaustive" not in stages
    assert [s.settings["precision"] for s in result.steps if s.stage == "uniform"] == ["W8A16", "W16A16"]
    assert not result.budget_met and result.score == max(s.score for s in result.steps)
    # the float model, one per step, the chosen one's QDQ export and sim: nothing else was evaluated
    assert score.calls == 1 + len(result.steps) + 2 == result.counts["callback_evaluations"]
    assert result.counts["proxy_evaluations"] == 0
    assert M.score(result.sim.session) == pytest.approx(result.score, rel=1e-6)


# AMP's phase 1 on the proxy ------------------------------------------------------------------------------------
def _bops(sim) -> float:
    return bit_operations(layer_costs(sim, M.feeds(1)[0]),
                          {q.name: (q.precision() if q.enabled else None) for q in sim.quantizers})


def _every_assignment(drop: float) -> list[tuple[float, float]]:
    """(relative cost, score) of every W4A8/W8A8 per-group assignment scoring >= float - drop (brute force)."""
    model = M.mlp()
    reference = QuantizationSimModel(model, progress=False)
    for q in reference.quantizers:
        q.enabled = False
    target = M.score(reference.session) - drop
    full = _bops(QuantizationSimModel(model, progress=False))
    found = []
    for choice in itertools.product((int4, int8), repeat=4):
        sim = QuantizationSimModel(model, progress=False)
        by_name = {q.name: q for q in sim.quantizers}
        for group, weight_type in zip(sim.quantizer_groups(), choice):
            for name in group.quantizers:
                if by_name[name].role == "param" and by_name[name].param_type != "bias":
                    by_name[name].set_precision(weight_type)
        sim.compute_encodings(M.feeds())
        score = M.score(sim.session)
        if score >= target:
            found.append((_bops(sim) / full, score))
    return found


@pytest.mark.parametrize("drop", [0.02, 0.2])
def test_amp_on_the_proxy_meets_the_budget_the_brute_force_confirms(monkeypatch, drop):
    """The W4A8/W8A8 mix through AMP (the exhaustive limit lowered to force it), phase 1 on the proxy: the
    chosen configuration is one the brute force finds passing (same cost and score), and no passing
    assignment is beaten by more than the chosen one's cost."""
    monkeypatch.setattr(auto_quant, "EXHAUSTIVE_LIMIT", 1)
    result = auto_quantize(M.mlp(), M.feeds(), M.score, drop, candidates=["W4A8", "W8A8"],
                           **{**FAST, "adaround_iterations": 0, "seq_mse_candidates": 0})
    passing = _every_assignment(drop)
    assert result.chosen.stage == "amp" and result.budget_met
    assert result.counts["proxy_evaluations"] > 0
    assert any(cost == pytest.approx(result.relative_bops, rel=1e-9) and score == pytest.approx(result.score, rel=1e-6)
               for cost, score in passing)
    assert M.score(result.sim.session) == pytest.approx(result.score, rel=1e-6)
    assert min(cost for cost, _ in passing) <= result.relative_bops


@pytest.mark.parametrize("pool", [ThreadPoolExecutor, ProcessPoolExecutor])
def test_the_proxy_phase_1_on_an_executor_gives_the_local_result(pool):
    kwargs = dict(candidates=LADDER, **FAST)
    local = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-3, **kwargs)
    assert local.chosen.stage == "amp" and local.counts["proxy_evaluations"] > 0
    # processes are spawned: a fork of this process, whose onnxruntime sessions hold threads, can die at random
    options = {"mp_context": multiprocessing.get_context("spawn")} if pool is ProcessPoolExecutor else {}
    with pool(2, **options) as executor:
        remote = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-3, executor=executor, **kwargs)
    assert remote.score == local.score and remote.relative_bops == local.relative_bops
    assert remote.counts == local.counts
    assert [q.precision() for q in remote.sim.quantizers] == [q.precision() for q in local.sim.quantizers]


def test_phase_1_on_the_callback_is_the_old_search():
    proxy = Counting()
    on_proxy = auto_quantize(M.mlp(), M.feeds(), proxy, 1e-3, candidates=LADDER, **FAST)
    callback = Counting()
    on_callback = auto_quantize(M.mlp(), M.feeds(), callback, 1e-3, candidates=LADDER, phase1="callback", **FAST)
    assert on_callback.counts["proxy_evaluations"] == 0 and on_proxy.counts["proxy_evaluations"] > 0
    assert callback.calls == on_callback.counts["callback_evaluations"]
    assert proxy.calls == on_proxy.counts["callback_evaluations"] < callback.calls
    assert on_callback.budget_met and on_proxy.budget_met
    assert "phase-1 proxy (output SQNR) evaluations" in on_proxy.message
    assert "phase-1 callback evaluations" in on_callback.message


def test_an_interrupted_proxy_search_resumes_from_results_dir(tmp_path):
    clean = Counting()
    expected = auto_quantize(M.mlp(), M.feeds(), clean, 1e-3, candidates=LADDER, **FAST)
    first = Counting(interrupt_at=clean.calls - 4)  # inside AMP's phase 2
    with pytest.raises(KeyboardInterrupt):
        auto_quantize(M.mlp(), M.feeds(), first, 1e-3, results_dir=tmp_path, candidates=LADDER, **FAST)
    resumed = Counting()
    result = auto_quantize(M.mlp(), M.feeds(), resumed, 1e-3, results_dir=tmp_path, candidates=LADDER,
                           clean_start=False, **FAST)
    assert result.score == expected.score and result.relative_bops == expected.relative_bops
    assert [s.settings for s in result.steps] == [s.settings for s in expected.steps]
    assert resumed.calls < clean.calls - 4  # the steps and AMP's scores before the interruption are cached
    with pytest.warns(RuntimeWarning, match="callback or phase1"):  # another phase 1: the scores are not reused
        auto_quantize(M.mlp(), M.feeds(), Counting(), 1e-3, results_dir=tmp_path, candidates=LADDER,
                      clean_start=False, phase1="callback", **FAST)


@pytest.mark.parametrize("bad", ["sqnr", None, 1])
def test_a_bad_phase1_is_named(bad):
    with pytest.raises(InvalidArgumentError, match="phase1 must be one of 'proxy', 'callback'"):
        auto_quantize(M.mlp(), M.feeds(), M.score, 0.1, phase1=bad, **FAST)


def test_the_counts_are_in_the_report(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-3, candidates=LADDER, results_dir=tmp_path, **FAST)
    assert set(result.counts) == {"callback_evaluations", "proxy_evaluations", "calibration_passes"}
    assert result.to_dict()["counts"] == result.counts
    assert f"{result.counts['proxy_evaluations']} proxy evaluations" in result.summary()
    assert f"{result.counts['calibration_passes']} calibration passes" in result.message


# the scores AMP is handed -------------------------------------------------------------------------------------
def test_amp_is_handed_the_scores_it_would_compute(monkeypatch, tmp_path):
    """The candidates everywhere (and the base) that auto_quantize scored before the mix are handed to AMP
    (``known_scores``) instead of being evaluated again: they must be the scores AMP computes itself on the
    same sim (a pickled copy, run without them), and the search must end where it would without them."""
    real = auto_quant.choose_mixed_precision
    seen = {}

    def spy(sim, candidates, eval1, eval2, drop, folder, clean_start, data, **kwargs):
        known = kwargs.pop("known_scores")
        alone = real(pickle.loads(pickle.dumps(sim)), candidates, eval1, eval2, drop, tmp_path / "alone", True, data,
                     **kwargs)
        handed = real(sim, candidates, eval1, eval2, drop, folder, clean_start, data, known_scores=known, **kwargs)
        seen.update(known=known, alone=alone, handed=handed)
        return handed

    monkeypatch.setattr(auto_quant, "choose_mixed_precision", spy)
    # on the sim's session: the export-scoring callback exports the sim auto_quantize built, not the spy's copy
    result = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-3, candidates=LADDER, score_on="sim", **FAST)
    known, alone, handed = seen["known"], seen["alone"], seen["handed"]
    assert set(known) == {"float", "W8A8", "W8A16", "W16A16"} and result.chosen.stage == "amp"
    for name in ("W8A8", "W8A16", "W16A16"):
        assert known[name] == alone.uniform_scores[name]
    assert known["float"] == result.reference_score == pytest.approx(alone.float_score, abs=1e-9)
    assert handed.phase2_evaluations == alone.phase2_evaluations - 4
    assert handed.chosen.bitops_ratio == alone.chosen.bitops_ratio and handed.score == alone.score


def test_known_scores_are_checked():
    from mixed_precision import choose_mixed_precision

    with pytest.raises(InvalidArgumentError, match="'W4A4' is neither 'float' nor one of the candidates"):
        choose_mixed_precision(M.new_sim(), ["W8A8", "W16A16"], M.score, M.score, 0.1, "unused", True, M.feeds(),
                               known_scores={"W4A4": 1.0})
    with pytest.raises(InvalidArgumentError, match="known_scores\\['float'\\]"):
        choose_mixed_precision(M.new_sim(), ["W8A8", "W16A16"], M.score, M.score, 0.1, "unused", True, M.feeds(),
                               known_scores={"float": float("nan")})


def test_no_mix_when_the_meeting_candidate_costs_what_the_base_does(monkeypatch):
    """When the first candidate meeting the target everywhere costs what the base does (as the sim runs them:
    range health can leave every activation at 16 bits under W8A8 too), no mix can be cheaper: none is
    searched. Costs are made equal here by reading every sim as costing the same."""
    monkeypatch.setattr(auto_quant._Search, "relative_bops", lambda self, sim: 0.5)
    result = auto_quantize(M.mlp(), M.feeds(), M.score, 2e-3, candidates=LADDER, **FAST)
    assert [s.stage for s in result.steps][-1] == "uniform" and result.chosen.stage == "uniform"
    assert result.budget_met and "no mix was searched" in result.message
