"""Automatic mixed precision: the Pareto path against a brute-force enumeration, the budget, the cache,
executors (threads, a Dask cluster), the lite flip and bad input."""
import functools
import itertools
import json
import math
import pickle
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tiny_cnn
from amp_models import feeds, misleading_score, new_sim, score
from tiny_cnn import snapshot

from mixed_precision import (
    AMPSearchAlgo,
    CallbackFunc,
    candidate,
    choose_mixed_precision,
    flip_layers_to_higher_precision,
    layer_costs,
)
from quantsim import InvalidArgumentError, QuantizationDataType, QuantizationSimModel, float16, int4, int8, int16

W4, W8 = "W4A8", "W8A8"
SCHEMA = Path(__file__).resolve().parent.parent / "docs" / "schemas" / "amp-pareto.schema.json"


@functools.lru_cache(maxsize=1)
def _brute_force() -> dict[tuple[str, ...], float]:
    """Score of every weight-type combination of the MLP, each calibrated for itself."""
    scores = {}
    for combo in itertools.product(("int8", "int4"), repeat=3):
        sim = new_sim()
        for i, dtype in enumerate(combo):
            sim.qc_quantize_op_dict[f"W{i}"].set_precision(dtype)
        sim.compute_encodings(feeds())
        scores[combo] = score(sim.session)
    return scores


def _combo(point) -> tuple[str, ...]:
    return tuple("int4" if p == W4 else "int8" for p in point.precisions[:3])


def _run(sim, tmp_path, drop=0.02, **kwargs):
    kwargs.setdefault("clean_start", True)
    return choose_mixed_precision(sim, [W8, W4], score, score, drop, tmp_path, kwargs.pop("clean_start"), feeds(),
                                  **kwargs)


def test_bit_operations_are_counted_by_hand():
    """Three 8x8 Gemms: 64 MACs each per sample; with k of them at 4-bit weights, 1 - k/6 of W8A8's BOPs."""
    sim = new_sim()
    costs = layer_costs(sim)
    assert [(c.node, c.macs, c.input_quantizer, c.weight_quantizer) for c in costs] == [
        ("fc0", 64, "x", "W0"), ("fc1", 64, "h0", "W1"), ("fc2", 64, "h1", "W2")]
    from onnx import TensorProto, helper, numpy_helper
    conv = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], name="conv", pads=[1, 1, 1, 1], group=1)], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "W")])
    model = helper.make_model(conv, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    (cost,) = layer_costs(QuantizationSimModel(model, progress=False))
    assert cost.macs == 4 * 8 * 8 * 3 * 3 * 3  # out channels x positions x (in channels x kernel)
    symbolic = tiny_cnn.new_sim()  # x[N, 3, H, W]: a sample feed fixes N, H and W
    assert [c.macs for c in layer_costs(symbolic)] == [4 * 27, 5 * 4]
    sample = tiny_cnn.batch(n=2, hw=8)
    assert [c.macs for c in layer_costs(symbolic, sample)] == [2 * 4 * 8 * 8 * 27, 2 * 5 * 4]


def test_the_search_path_is_the_brute_force_pareto_front(tmp_path):
    brute = _brute_force()
    full = {combo: 1 - sum(t == "int4" for t in combo) / 6 for combo in brute}
    result = _run(new_sim(), tmp_path, drop=None)  # no budget: every point of the path is evaluated
    assert len(result.points) == 4 and result.phase2_evaluations >= 1
    for point in result.points:
        assert point.bitops_ratio == pytest.approx(full[_combo(point)], abs=1e-12)
        assert point.score == pytest.approx(brute[_combo(point)], rel=1e-6)
    true_front = {c for c in brute if not any(full[o] <= full[c] and brute[o] >= brute[c]
                                               and (full[o], brute[o]) != (full[c], brute[c]) for o in brute)}
    assert {_combo(p) for p in result.pareto_front} == true_front
    assert result.chosen.index == 0  # no budget: the sim stays at the baseline
    document = json.loads((tmp_path / "pareto.json").read_text())
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    assert [p["index"] for p in document["points"]] == [0, 1, 2, 3]
    assert document["points"][1]["precisions"] == list(result.points[1].precisions)
    assert {p["index"] for p in document["points"] if p["pareto_optimal"]} == {p.index for p in result.pareto_front}
    page = (tmp_path / "pareto.html").read_text()
    assert page.count("<tr") >= len(document["points"]) and "<svg" in page


@pytest.mark.parametrize("algo", [AMPSearchAlgo.Binary, AMPSearchAlgo.BruteForce])
def test_budget_is_met_by_the_cheapest_configuration(tmp_path, algo):
    brute = _brute_force()
    drop = 0.02
    target = -drop  # the float model scores 0
    cheapest = min((c for c in brute if brute[c] >= target), key=lambda c: sum(t == "int8" for t in c))
    sim = new_sim()
    result = _run(sim, tmp_path, drop=drop, amp_search_algo=algo, refine=False)  # AIMET's search alone
    assert result.budget_met and result.score >= target
    assert _combo(result.chosen) == cheapest == ("int8", "int4", "int8")
    assert result.refinement_trials == 0 and not any(p.refinement for p in result.points)
    assert result.bitops_ratio == pytest.approx(5 / 6)
    # one pass per candidate; binary search: point 2 (fails), point 1 (passes, stays); brute force: points
    # 1 and 2 (point 3 is W4A8 everywhere, already scored), then point 1 again
    assert result.calibration_passes == (4 if algo is AMPSearchAlgo.Binary else 5)
    assert result.phase1_evaluations == 3  # three groups with weights; the output's group has one choice
    # the sim is left in the chosen configuration, calibrated: it scores what the result says
    assert [sim.qc_quantize_op_dict[f"W{i}"].precision() for i in range(3)] == [int8, int4, int8]
    assert score(sim.session) == pytest.approx(result.score, rel=1e-9)
    # W4A8 and W8A8 differ only in the weights: W0 and W2 of W0, W1, W2 stay 8-bit, in 2 of 3 groups
    assert result.promoted_share == pytest.approx(2 / 3) and result.promoted_group_share == pytest.approx(2 / 3)


def test_refinement_takes_back_the_flips_a_misled_prefix_search_left_out(tmp_path):
    """Phase 1 ranks the flips the wrong way round, so the first prefix already breaks the budget and the
    prefix search keeps 8-bit weights everywhere; the refinement bisects the flips it left out and finds the
    brute-force optimum (W1 at 4 bits)."""
    brute = _brute_force()
    run = functools.partial(choose_mixed_precision, candidates=[W8, W4], eval_callback_for_phase1=misleading_score,
                            eval_callback_for_phase2=score, allowed_accuracy_drop=0.02,
                            forward_pass_callback=feeds())
    prefix_only = run(new_sim(), results_dir=tmp_path / "prefix", clean_start=True, refine=False)
    assert _combo(prefix_only.chosen) == ("int8", "int8", "int8") and prefix_only.bitops_ratio == 1.0
    sim = new_sim()
    result = run(sim, results_dir=tmp_path / "refined", clean_start=True)
    assert _combo(result.chosen) == ("int8", "int4", "int8") == min(
        (c for c in brute if brute[c] >= -0.02), key=lambda c: c.count("int8"))
    assert result.bitops_ratio == pytest.approx(5 / 6) and result.chosen.refinement
    # W0 alone (path point 1) is known to break the budget, so the flips left are [W2, W1]: both (fail),
    # W2 (fails), W1 (kept): three trials, each a new evaluation calibrated for itself
    assert result.refinement_trials == 3
    assert result.phase2_evaluations == prefix_only.phase2_evaluations + 3
    # one per candidate, two path points, three trials; the last trial is the kept one, so no final pass
    # (the prefix search alone ends with a pass for the baseline it returns to)
    assert result.calibration_passes == 7 and prefix_only.calibration_passes == 5
    assert [sim.qc_quantize_op_dict[f"W{i}"].precision() for i in range(3)] == [int8, int4, int8]
    assert score(sim.session) == pytest.approx(result.score, rel=1e-9)
    document = json.loads((tmp_path / "refined" / "pareto.json").read_text())
    assert document["counts"]["refinement_trials"] == 3
    assert [p["refinement"] for p in document["points"] if p["chosen"]] == [True]
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    resumed = run(new_sim(), results_dir=tmp_path / "refined", clean_start=False)  # same walk, all cached
    assert resumed.chosen == result.chosen and resumed.phase2_evaluations == 0
    limited = run(new_sim(), results_dir=tmp_path / "refined", clean_start=False, refine=2)
    assert limited.refinement_trials == 2 and _combo(limited.chosen) == ("int8", "int8", "int8")
    with pytest.raises(InvalidArgumentError, match="refine"):
        run(new_sim(), results_dir=tmp_path / "bad", clean_start=True, refine=-1)


def _raising_on_call(n: int):
    """The score callback, except that its ``n``-th call raises (an evaluation server going away)."""
    calls = []

    def flaky(session):
        calls.append(1)
        if len(calls) == n:
            raise RuntimeError("evaluation server went away")
        return score(session)

    return flaky


def test_a_callback_raising_during_the_refinement_restores_the_sim(tmp_path):
    sim = new_sim()
    sim.compute_encodings(feeds())
    before = snapshot(sim)
    flaky = _raising_on_call(7)  # float, two candidates everywhere, two path points, a trial: then the next

    with pytest.raises(RuntimeError, match="went away"):
        choose_mixed_precision(sim, [W8, W4], misleading_score, flaky, 0.02, tmp_path, True, feeds())
    assert snapshot(sim) == before


def test_a_budget_nothing_meets_leaves_the_highest_candidate_and_says_so(tmp_path):
    sim = new_sim()
    with pytest.warns(RuntimeWarning, match="no candidate meets the budget"):
        result = _run(sim, tmp_path, drop=1e-6)
    assert not result.budget_met and "no candidate meets" in result.message
    assert set(result.chosen.precisions) == {W8}
    assert all(q.precision() == int8 for q in sim.quantizers if q.enabled)
    assert all(q.encoding is not None for q in sim.quantizers if q.enabled)
    document = json.loads((tmp_path / "pareto.json").read_text())
    assert document["budget_met"] is False and document["points"][0]["chosen"]
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))


def test_an_easy_budget_takes_the_cheapest_candidate_everywhere(tmp_path):
    result = _run(new_sim(), tmp_path, drop=10.0)
    assert result.budget_met and set(result.chosen.precisions) == {W4} and result.phase1_evaluations == 0


def test_resume_from_the_cache_and_refuse_a_stale_one(tmp_path):
    first = _run(new_sim(), tmp_path)
    again = _run(new_sim(), tmp_path, clean_start=False)
    assert again.phase1_evaluations == 0 and again.phase2_evaluations == 0 and again.cached_scores > 0
    assert again.chosen == first.chosen and again.phase1_scores == first.phase1_scores
    with pytest.warns(RuntimeWarning, match="not reused"):
        other = choose_mixed_precision(new_sim(), [W8, "W8A16", W4], score, score, 0.02, tmp_path, False, feeds())
    assert other.phase1_evaluations > 0 and other.cached_scores == 0


def test_an_interrupted_run_restores_the_sim_and_resumes(tmp_path):
    sim = new_sim()
    sim.compute_encodings(feeds())
    before = snapshot(sim)
    flaky = _raising_on_call(3)

    with pytest.raises(RuntimeError, match="went away"):
        choose_mixed_precision(sim, [W8, W4], flaky, score, 0.02, tmp_path, True, feeds())
    assert snapshot(sim) == before
    resumed = choose_mixed_precision(sim, [W8, W4], flaky, score, 0.02, tmp_path, False, feeds())
    assert resumed.phase1_evaluations == 1 and resumed.cached_scores >= 2
    assert _combo(resumed.chosen) == ("int8", "int4", "int8")


def test_thread_pool_gives_the_local_result(tmp_path):
    local = _run(new_sim(), tmp_path / "local")
    with ThreadPoolExecutor(2) as pool:
        threaded = _run(new_sim(), tmp_path / "threads", executor=pool, executor_chunks=2)
    assert threaded.phase1_scores == local.phase1_scores
    assert threaded.chosen == local.chosen


@pytest.mark.parametrize("processes", [False, True])
def test_a_dask_cluster_gives_the_local_result(tmp_path, processes):
    distributed = pytest.importorskip("distributed")
    local = _run(new_sim(), tmp_path / "local")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dask's own deprecation and port warnings
        with distributed.LocalCluster(n_workers=2 if processes else 1, threads_per_worker=1, processes=processes,
                                      dashboard_address=None) as cluster, distributed.Client(cluster) as client:
            remote = _run(new_sim(), tmp_path / "dask", executor=client.get_executor(), executor_chunks=3)
    assert remote.phase1_scores == local.phase1_scores
    assert remote.chosen == local.chosen


def test_the_sim_pickles_without_its_sessions():
    sim = new_sim()
    sim.compute_encodings(feeds())
    expected = sim.session.run(None, feeds(1, seed=9)[0])[0]
    copy = pickle.loads(pickle.dumps(sim))
    assert np.array_equal(copy.session.run(None, feeds(1, seed=9)[0])[0], expected)
    assert snapshot(copy) == snapshot(sim) and copy.config == sim.config


def test_candidates_in_aimet_form_and_by_name():
    assert candidate(((16, QuantizationDataType.int), (8, QuantizationDataType.int))).name == "W8A16"
    assert candidate(((8, "int"), (4, "int"))).name == "W4A8"
    assert candidate(((16, QuantizationDataType.float), (16, QuantizationDataType.float))).name == "FP16"
    mixed = candidate(((16, QuantizationDataType.float), (8, QuantizationDataType.int)))
    assert (mixed.name, mixed.param_type, mixed.activation_type) == ("W8AF16", int8, float16)
    fp8 = candidate(((8, QuantizationDataType.float), (8, QuantizationDataType.int)))  # simulated since FP8 landed
    assert (fp8.name, str(fp8.activation_type)) == ("W8AF8", "float8e4m3fn")


@pytest.mark.parametrize("candidates, message", [
    ([W8, "W3A8"], "unknown precision 'W3A8'"),
    ([W8, ((32, QuantizationDataType.float), (8, QuantizationDataType.int))], "float32 has no simulation"),
    ([W8, ((12, QuantizationDataType.float), (8, QuantizationDataType.int))], "float bitwidth 12"),
    ([W8, W8], "at least two distinct candidates"),
    ("W8A8", "must be a list"),
])
def test_bad_candidates_are_refused_before_anything_changes(tmp_path, candidates, message):
    sim = new_sim()
    with pytest.raises(InvalidArgumentError, match=message):
        choose_mixed_precision(sim, candidates, score, score, 0.01, tmp_path, True, feeds())


def test_bad_callbacks_budgets_and_data(tmp_path):
    sim = new_sim()
    sim.compute_encodings(feeds())
    before = snapshot(sim)
    with pytest.raises(InvalidArgumentError, match="returned nan"):
        choose_mixed_precision(sim, [W8, W4], lambda s: math.nan, score, 0.02, tmp_path, True, feeds())
    with pytest.raises(InvalidArgumentError, match="not a number"):
        choose_mixed_precision(sim, [W8, W4], score, lambda s: "good", 0.02, tmp_path, True, feeds())
    with pytest.raises(InvalidArgumentError, match="allowed_accuracy_drop"):
        choose_mixed_precision(sim, [W8, W4], score, score, -1, tmp_path, True, feeds())
    with pytest.raises(InvalidArgumentError, match="one-shot iterator"):
        choose_mixed_precision(sim, [W8, W4], score, score, 0.02, tmp_path, True, iter(feeds()))
    with pytest.raises(InvalidArgumentError, match="eval_callback_for_phase1 must be callable"):
        choose_mixed_precision(sim, [W8, W4], None, score, 0.02, tmp_path, True, feeds())
    assert snapshot(sim) == before
    frozen = new_sim()
    frozen.compute_encodings(feeds())
    for q in frozen.quantizers:
        if q.enabled:
            q.freeze_encodings()
    with pytest.raises(InvalidArgumentError, match="every enabled quantizer is frozen"):
        choose_mixed_precision(frozen, [W8, W4], score, score, 0.02, tmp_path, True, feeds())
    for q in sim.quantizers:
        q.enabled = False
    with pytest.raises(InvalidArgumentError, match="no enabled quantizer"):
        choose_mixed_precision(sim, [W8, W4], score, score, 0.02, tmp_path, True, feeds())


def test_aimet_callback_func_and_a_callable_forward_pass(tmp_path):
    def evaluate(session, scale):
        return scale * score(session)

    def forward(session):
        for feed in feeds():
            session.run(None, feed)

    result = choose_mixed_precision(new_sim(), [((8, "int"), (8, "int")), ((8, "int"), (4, "int"))],
                                    CallbackFunc(evaluate, 1.0), CallbackFunc(evaluate, 1.0), 0.02, tmp_path, True,
                                    forward)
    assert _combo(result.chosen) == ("int8", "int4", "int8")


def test_lite_flip_promotes_the_least_scoring_layers():
    sim = new_sim()
    flipped = flip_layers_to_higher_precision(sim, {"fc0": 0.1, "fc1": 0.9, "fc2": 0.5}, 50.0, (int16, int16))
    assert flipped == ["fc0", "fc2"]  # ceil(3 * 50%) = 2, lowest scores first
    q = sim.qc_quantize_op_dict
    assert [q[n].precision() for n in ("W0", "W2", "x", "y")] == [int16] * 4
    # as in aimet-onnx: fc0's output grid sits after relu0 (fused), so it belongs to the relu0 node
    assert [q[n].precision() for n in ("W1", "h0", "h1")] == [int8] * 3 and not q["B0"].enabled
    sim.compute_encodings(feeds())  # the flipped quantizers recalibrate
    assert flip_layers_to_higher_precision(new_sim(), {"fc0": 1.0}, 0.0) == []
    with pytest.raises(InvalidArgumentError, match="not in the prepared model"):
        flip_layers_to_higher_precision(new_sim(), {"nope": 1.0})
    with pytest.raises(InvalidArgumentError, match="not a higher precision"):
        flip_layers_to_higher_precision(new_sim(), {"fc0": 1.0}, 10, "W8A8")
    with pytest.raises(InvalidArgumentError, match="percent_to_flip"):
        flip_layers_to_higher_precision(new_sim(), {"fc0": 1.0}, 150)
