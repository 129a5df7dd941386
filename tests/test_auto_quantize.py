"""`mixed_precision.auto_quantize`: the cheapest configuration meeting an accuracy budget.

The oracle for "cheapest" is a brute force written here from public names only: every assignment of the
candidates to the sim's quantizer groups, each calibrated for itself and scored, its cost read from the
quantizers (`layer_costs` + `bit_operations`). auto_quantize must land on the oracle's cheapest passing
configuration (same cost, same score) for budgets where its cheaper stages (Sequential MSE + AdaRound at
W4A8 everywhere) fail.
"""
from __future__ import annotations

import itertools
import json
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import amp_models as M  # tests/amp_models.py
import numpy as np
import pytest

from mixed_precision import auto_quantize, bit_operations, layer_costs
from mixed_precision.auto_quant_result import REPORT_FILES
from quantsim import InvalidArgumentError, QuantizationSimModel, int4, int8

FAST = {"quant_schemes": (), "adaround_iterations": 30, "seq_mse_candidates": 5, "progress": False}


def _bops(sim) -> float:
    return bit_operations(layer_costs(sim, M.feeds(1)[0]),
                          {q.name: (q.precision() if q.enabled else None) for q in sim.quantizers})


def _oracle(drop: float) -> tuple[float, float]:
    """(relative cost, score) of the cheapest W4A8/W8A8 per-group assignment scoring >= float - drop."""
    model = M.mlp()
    reference = QuantizationSimModel(model, progress=False)
    for q in reference.quantizers:
        q.enabled = False
    target = M.score(reference.session) - drop
    full = None
    found = []
    groups = QuantizationSimModel(model, progress=False).quantizer_groups()
    assert len(groups) == 4  # three Gemm layers and the output
    for choice in itertools.product((int4, int8), repeat=len(groups)):
        sim = QuantizationSimModel(model, progress=False)
        by_name = {q.name: q for q in sim.quantizers}
        for group, weight_type in zip(sim.quantizer_groups(), choice):
            for name in group.quantizers:
                q = by_name[name]
                if q.role == "param" and q.param_type != "bias":
                    q.set_precision(weight_type)
        sim.compute_encodings(M.feeds())
        if full is None:  # the costliest candidate everywhere: W8A8
            w8 = QuantizationSimModel(model, progress=False)
            full = _bops(w8)
        score = M.score(sim.session)
        if score >= target:
            found.append((_bops(sim) / full, score))
    return min(found)


@pytest.mark.parametrize("drop", [0.02, 0.2])
def test_the_cheapest_passing_configuration_is_the_brute_force_one(drop):
    result = auto_quantize(M.mlp(), M.feeds(), M.score, drop, candidates=["W4A8", "W8A8"], **FAST)
    cost, score = _oracle(drop)
    assert result.budget_met and result.score >= result.target
    assert result.relative_bops == pytest.approx(cost, rel=1e-9)
    assert result.score == pytest.approx(score, rel=1e-6)
    assert result.chosen.stage == "exhaustive"
    assert [s.stage for s in result.steps][:2] == ["defaults", "seq_mse+adaround"]  # cheap to expensive
    assert M.score(result.sim.session) == pytest.approx(result.score, rel=1e-6)  # the sim is the chosen one


def test_a_generous_budget_stops_at_the_cheap_uniform_stage():
    result = auto_quantize(M.mlp(), M.feeds(), M.score, 5.0, candidates=["W4A8", "W8A8"], **FAST)
    assert result.chosen.stage == "seq_mse+adaround" and result.chosen.settings["precision"] == "W4A8"
    assert [s.stage for s in result.steps] == ["defaults", "seq_mse+adaround"]
    weights = [q for q in result.sim.quantizers if q.enabled and q.role == "param" and q.param_type != "bias"]
    assert weights and all(q.bitwidth == 4 and q.is_encoding_frozen() for q in weights)


def test_an_impossible_budget_says_so_and_returns_the_best_point():
    with pytest.warns(RuntimeWarning, match="would need an allowed drop of at least"):
        result = auto_quantize(M.mlp(), M.feeds(), M.score, 0.0, candidates=["W8A8", "W8A16"], **FAST)
    assert not result.budget_met
    assert result.score == max(s.score for s in result.steps)
    assert result.score < result.reference_score
    assert M.score(result.sim.session) == pytest.approx(result.score, rel=1e-6)  # the sim is the best point


def test_costlier_candidates_rescue_a_tight_budget_and_reports_are_written(tmp_path):
    result = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-3, results_dir=tmp_path,
                           candidates=["W8A8", "W8A16", "W16A16"], **FAST)
    assert result.budget_met
    assert result.chosen.stage in ("exhaustive", "amp")
    assert 0 < result.relative_bops <= 1.0
    assert result.relative_bops == pytest.approx(_bops(result.sim) / _full_bops("W16A16"), rel=1e-9)
    written = json.loads((tmp_path / REPORT_FILES[0]).read_text())
    assert written["score"] == result.score and len(written["steps"]) == len(result.steps)
    assert "<svg" in (tmp_path / REPORT_FILES[2]).read_text()
    assert result.pareto[0].relative_bops == min(s.relative_bops for s in result.steps)


def _full_bops(name: str) -> float:
    types = {"W16A16": {"param_type": "int16", "activation_type": "int16"}}[name]
    return _bops(QuantizationSimModel(M.mlp(), progress=False, **types))


class _Interrupting:
    """M.score, raising KeyboardInterrupt at call number ``at`` (then never again)."""

    def __init__(self, at: int | None):
        self.at, self.calls = at, 0

    def __call__(self, session) -> float:
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return M.score(session)


def test_an_interrupted_search_resumes_where_it_stopped(tmp_path):
    clean = _Interrupting(None)
    expected = auto_quantize(M.mlp(), M.feeds(), clean, 0.02, candidates=["W4A8", "W8A8"], **FAST)
    first = _Interrupting(5)
    with pytest.raises(KeyboardInterrupt):
        auto_quantize(M.mlp(), M.feeds(), first, 0.02, results_dir=tmp_path, candidates=["W4A8", "W8A8"], **FAST)
    resumed = _Interrupting(None)
    result = auto_quantize(M.mlp(), M.feeds(), resumed, 0.02, results_dir=tmp_path, candidates=["W4A8", "W8A8"],
                           clean_start=False, **FAST)
    assert result.relative_bops == expected.relative_bops and result.score == pytest.approx(expected.score)
    assert [s.settings for s in result.steps] == [s.settings for s in expected.steps]
    assert sum(s.cached for s in result.steps) == 3  # the three steps scored before the interruption
    assert resumed.calls == clean.calls - 3


def test_a_raising_callback_propagates_and_leaves_the_model_alone():
    model = M.mlp()
    before = model.SerializeToString()

    def broken(session):
        raise ValueError("metric failed")

    with pytest.raises(ValueError, match="metric failed"):
        auto_quantize(model, M.feeds(), broken, 0.1, **FAST)
    assert model.SerializeToString() == before


def test_an_executor_gives_the_local_result():
    kwargs = dict(candidates=["W8A8", "W8A16", "W16A16", "FP16"], **FAST)
    local = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-3, **kwargs)
    assert local.chosen.stage == "amp"  # 4 candidates over the groups: past the exhaustive limit
    with ThreadPoolExecutor(2) as pool:
        remote = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-3, executor=pool, **kwargs)
    assert remote.score == local.score and remote.relative_bops == local.relative_bops
    assert [q.precision() for q in remote.sim.quantizers] == [q.precision() for q in local.sim.quantizers]


def test_a_target_config_filters_the_candidates(tmp_path):
    import quantsim
    config = json.loads((Path(quantsim.__file__).parent / "sim" / "configs" / "default_config_per_channel.json")
                        .read_text())
    config["defaults"]["supported_kernels"] = [
        {"activation": {"bitwidth": 8, "dtype": "int"}, "param": {"bitwidth": 8, "dtype": "int"}},
        {"activation": {"bitwidth": 16, "dtype": "int"}, "param": {"bitwidth": 8, "dtype": "int"}}]
    path = tmp_path / "target.json"
    path.write_text(json.dumps(config))
    result = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-3, target=path, **FAST)
    named = {s.settings.get("precision") for s in result.steps} | {s.settings.get("candidates") for s in result.steps}
    assert "W4A8" not in str(named) and "FP16" not in str(named) and "W16A16" not in str(named)
    assert {q.bitwidth for q in result.sim.quantizers if q.enabled and q.param_type != "bias"} <= {8, 16}


def test_a_time_budget_stops_the_search_early():
    result = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-6, candidates=["W8A8", "W16A16"], time_budget=1e-3,
                           **FAST)
    assert len(result.steps) == 1 and "time budget" in result.message


def test_cle_that_would_change_the_float_model_is_skipped(monkeypatch):
    import adaround

    def perturbing(model):
        w = model.graph.initializer[0]
        values = np.frombuffer(w.raw_data, np.float32).copy() * 1.5
        w.raw_data = values.tobytes()
        return model

    monkeypatch.setattr(adaround, "equalize_model", perturbing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-6, candidates=["W8A8"], **FAST)
    assert "CLE skipped" in result.message and "cle" not in [s.stage for s in result.steps]


@pytest.mark.parametrize("bad, match", [
    ({"allowed_accuracy_drop": -1}, "allowed_accuracy_drop"),
    ({"time_budget": 0}, "time_budget"),
    ({"calibration_data": []}, "at least one feed dict"),
    ({"calibration_data": {"x": np.zeros((1, 8), np.float32)}}, "sequence of feed dicts"),
    ({"candidates": ["W3A3"]}, "unknown precision"),
])
def test_bad_arguments_are_named(bad, match):
    args = {"model": M.mlp(), "calibration_data": M.feeds(), "eval_callback": M.score, "allowed_accuracy_drop": 0.1}
    args.update(bad)
    with pytest.raises(InvalidArgumentError, match=match):
        auto_quantize(**args, **FAST)


def test_a_shipped_target_profile_keeps_every_choice_legal():
    from quantsim import load_target
    profile = load_target("gpu-qdq")  # int8 symmetric and float16, no int16, no int4
    result = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-3, target="gpu-qdq", **FAST)
    tried = " ".join(str(s.settings) for s in result.steps)
    assert "W4A8" not in tried and "W8A16" not in tried and "W16A16" not in tried
    assert result.sim.target == profile
    for q in result.sim.quantizers:
        if q.enabled and q.param_type != "bias":
            assert (profile.param_type_allowed(q.precision()) if q.role == "param"
                    else profile.activation_type_allowed(q.precision()))


def _chain(layers: int):
    """x -> ``layers`` Gemm(8x8) -> y: one quantizer group per layer (and the output's)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"W{i}"))
        out = "y" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"W{i}"], [out], name=f"fc{i}"))
        x = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_exhaustive_limit_is_checked_without_listing_the_space():
    """Issue 30: with a few hundred groups the mix's configurations were listed (4^237) before the limit was
    checked, so auto_quantize never reached AMP. The count is per group now: 40 layers of 4 candidates answer
    at once, and a small space lists exactly the distinct configurations, cheapest first."""
    from mixed_precision.amp_space import AmpSpace
    from mixed_precision.auto_quant import EXHAUSTIVE_LIMIT, small_space
    from mixed_precision.presets import candidate

    ladder = [candidate(c) for c in ("W8A8", "W8A16", "W16A16", "FP16")]
    large = AmpSpace.build(QuantizationSimModel(_chain(40), progress=False), ladder)
    assert len(large.groups) >= 40 and small_space(large, EXHAUSTIVE_LIMIT) is None
    small = AmpSpace.build(QuantizationSimModel(_chain(1), progress=False), ladder[:2])
    listed = small_space(small, EXHAUSTIVE_LIMIT)
    every = sorted({small.canonical(c) for c in itertools.product(range(2), repeat=len(small.groups))},
                   key=lambda c: (small.bops(c), c))
    assert listed == every and 1 < len(listed) <= EXHAUSTIVE_LIMIT


def test_a_time_budget_stops_the_amp_stage_between_its_evaluations(monkeypatch):
    """AMP is one step of the search: the budget used to be checked only before it, so a big AMP ran to its
    end. Each evaluation here "takes" 400 s of a fake wall clock (the search's own step timing is real and
    tiny): with 1,000 s the AMP stage stops after a few evaluations, and the search says the budget stopped it."""
    from mixed_precision import auto_quant

    class Clock:
        now = 0.0

        def time(self) -> float:
            return self.now

        def perf_counter(self) -> float:
            return auto_quant_time.perf_counter()

    import time as auto_quant_time

    clock = Clock()
    calls = []

    def slow_score(session):
        calls.append(clock.now)
        clock.now += 400.0
        return M.score(session)

    monkeypatch.setattr(auto_quant, "time", clock)
    result = auto_quantize(M.mlp(), M.feeds(), slow_score, 1e-4, candidates=["W8A8", "W8A16", "W16A16"],
                           time_budget=1000.0, **FAST)
    assert "amp" not in [s.stage for s in result.steps] and "time budget" in result.message
    before_amp = 1 + len(result.steps)  # the float model, then one evaluation per step before AMP
    assert len(calls) - before_amp - 2 <= 3  # the last two calls score the chosen QDQ export and the sim
    unbounded = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-4, candidates=["W8A8", "W8A16", "W16A16"], **FAST)
    assert "amp" in [s.stage for s in unbounded.steps]  # without the budget the same search reaches AMP's end


def test_the_result_scores_the_deployed_qdq_model():
    """``deployed_score`` is the callback on the chosen sim's QDQ export in onnxruntime's integer kernels:
    recomputed here from the exported file in a default session (uint8 weight codes, exact on every CPU)."""
    import onnxruntime as ort

    result = auto_quantize(M.mlp(), M.feeds(), M.score, 1e-3, candidates=["W8A8", "W16A16"], **FAST)
    qdq = result.sim.to_onnx_qdq(weight_codes="uint8")
    session = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    assert result.deployed_score is not None
    assert result.deployed_score == pytest.approx(M.score(session), rel=1e-6, abs=1e-9)
    assert result.to_dict()["deployed_score"] == result.deployed_score
    assert "integer kernels scores" in result.summary()
