"""AMP tells the truth and has AIMET's shape: costs and precisions read from the sim after calibration's
automatic decisions, AIMET's pareto list as the return value, phase 1 scoring groups alone, the config's
supported_kernels, and score caches that cannot be resumed from refused with the file named."""
import json
import math

import numpy as np
import pytest
import tiny_cnn
from amp_models import feeds, masked_feeds, masked_matmuls, new_sim, output_score, score
from tiny_cnn import snapshot

from mixed_precision import (
    AmpCacheError,
    ParetoEntry,
    choose_mixed_precision,
    layer_costs,
    simulated_bit_operations,
    simulated_dtypes,
)
from quantsim import ConfigError, QuantizationDataType, QuantizationSimModel, QuantizerGroup, QuantsimError, int16

MACS = 4 * 8 * 8  # each MatMul of the masked model: a [4,8] x [8,8] product
BASELINE_BOPS = 2 * MACS * 16 * 8  # W8A16 everywhere: both MatMuls read 16-bit activations and 8-bit weights


def _masked_run(tmp_path, drop, **kwargs):
    model, data = masked_matmuls(), masked_feeds()
    sim = QuantizationSimModel(model, progress=False)
    scored = output_score(model, data)
    return sim, choose_mixed_precision(sim, ["W8A16", "W8A8"], scored, scored, drop, tmp_path, True, data, **kwargs)


def test_the_masked_tensor_is_reported_at_the_16_bits_range_health_gives_it(tmp_path):
    """AMP asks for W8A8 everywhere; range health keeps the masked tensor at int16 (its 8-bit grid collapses).
    By hand: W8A8 then costs MACS*8*8 (mm1) + MACS*16*8 (mm2) = 0.75 of the baseline, not 0.5."""
    sim, result = _masked_run(tmp_path, drop=1e9)  # any configuration meets this budget: the cheapest is taken
    assert result.uniform_bitops["W8A8"] == pytest.approx((MACS * 64 + MACS * 128) / BASELINE_BOPS) == 0.75
    assert result.bitops_ratio == 0.75 == simulated_bit_operations(sim, layer_costs(sim)) / BASELINE_BOPS
    assert sim.qc_quantize_op_dict["m"].precision() == int16 and any(d.tensors == ("m",) for d in sim.decisions)
    assert result.configuration == {"mm1": "W8A8", "mm2": "W8A16", "y": "W8A8"}  # mm2's group: w2 int8, m int16
    document = json.loads((tmp_path / "pareto.json").read_text())
    chosen = next(p for p in document["points"] if p["chosen"])
    assert chosen["bitops_ratio"] == 0.75 and chosen["precisions"] == ["W8A8", "W8A16", "W8A8"]
    assert "W8A16 \u00d71" in (tmp_path / "pareto.html").read_text(encoding="utf-8")


def test_points_that_simulate_the_same_cost_the_same_and_no_flip_is_wasted(tmp_path):
    """The whole front (no budget): a flip of mm2's group to W8A8 changes nothing the sim runs (m stays int16,
    w2 is 8-bit in both candidates), so it is not a flip; every point's cost is what its types give."""
    sim, result = _masked_run(tmp_path, drop=None)
    assert all(p.flip is None or p.flip[0] != 1 for p in result.points)
    by_types = {}
    for p in result.points:
        by_types.setdefault(p.precisions, set()).add(p.bitops_ratio)
        types = dict(zip(("mm1", "mm2", "y"), p.precisions))
        bits = {"W8A16": 16, "W8A8": 8}
        assert p.bitops_ratio == pytest.approx(MACS * 8 * (bits[types["mm1"]] + bits[types["mm2"]]) / BASELINE_BOPS)
    assert all(len(costs) == 1 for costs in by_types.values())
    assert simulated_dtypes(sim)["m"] == int16  # left at the baseline (no budget), calibrated


def test_the_result_is_aimets_pareto_list(tmp_path):
    result = choose_mixed_precision(new_sim(), ["W8A8", "W4A8"], score, score, 0.02, tmp_path, True, feeds())
    assert isinstance(result, list) and len(result) == sum(1 for p in result.points if p.flip and not p.refinement)
    int_ = QuantizationDataType.int
    for entry, point in zip(result, [p for p in result.points if p.flip and not p.refinement]):
        assert isinstance(entry, ParetoEntry) and isinstance(entry.quantizer_group, QuantizerGroup)
        bitops, eval_score, group, candidate = entry  # AIMET unpacks its entries like this
        assert (bitops, eval_score, group) == (point.bitops_ratio, point.score, result.groups[point.flip[0]])
        assert candidate == ((8, int_), (4, int_))
    assert result.pareto_list == list(result)
    easy = choose_mixed_precision(new_sim(), ["W8A8", "W4A8"], score, score, 10.0, tmp_path / "easy", True, feeds())
    assert easy == [] and easy.budget_met  # AIMET returns None here; the attributes still say what happened


def test_phase1_scores_each_group_alone_as_aimet_does(tmp_path):
    """phase1_optimize=False: each (group, candidate) score is the score of a sim with only that group's
    quantizers enabled, at the candidate, calibrated for itself: recomputed here independently."""
    result = choose_mixed_precision(new_sim(), ["W8A8", "W4A8"], score, score, 0.02, tmp_path, True, feeds(),
                                    phase1_optimize=False)
    assert result.phase1_scores
    for (g, _), value in result.phase1_scores.items():
        sim = new_sim()
        members = set(result.groups[g].quantizers)
        for q in sim.quantizers:
            q.enabled = q.enabled and q.name in members
        for n in result.groups[g].parameter_quantizers:
            sim.qc_quantize_op_dict[n].set_precision("int4")
        sim.compute_encodings(feeds())
        assert value == score(sim.session)
    optimized = choose_mixed_precision(new_sim(), ["W8A8", "W4A8"], score, score, 0.02, tmp_path / "o", True, feeds())
    assert optimized.calibration_passes < result.calibration_passes
    ranked = sorted(result.phase1_scores, key=result.phase1_scores.get)  # the same order of harm
    assert ranked == sorted(optimized.phase1_scores, key=optimized.phase1_scores.get)


def _kernel(act, param=None):
    entry = {"activation": {"bitwidth": act, "dtype": "int"}}
    if param:
        entry["param"] = {"bitwidth": param, "dtype": "int"}
    return entry


def _kernel_config(conv_kernels):
    return {"defaults": {"ops": {"is_output_quantized": "True"}, "params": {"is_quantized": "True",
                                                                           "is_symmetric": "True"},
                         "supported_kernels": [_kernel(8, 8), _kernel(8, 4)]},
            "params": {"bias": {"is_quantized": "False"}}, "op_type": {"Conv": {"supported_kernels": conv_kernels}},
            "supergroups": [{"op_list": ["Conv", "Relu"]}], "model_input": {"is_input_quantized": "True"},
            "model_output": {}}


def test_supported_kernels_restrict_each_groups_candidates(tmp_path):
    """The config's Conv runs only W8A8 kernels: the Conv's group (its weight and the model input it reads)
    never goes to W4A8 unless use_all_amp_candidates=True; the Gemm's group follows the defaults. (aimet-onnx
    2.42 on this model and config, recorded: its group (W, x) supports only W8A8, every other group both.)"""
    data = tiny_cnn.batches()
    scored = output_score(tiny_cnn.make_model(), data)
    results = {}
    for use_all in (False, True):
        sim = tiny_cnn.new_sim(config_file=_kernel_config([_kernel(8, 8)]))
        results[use_all] = choose_mixed_precision(sim, ["W8A8", "W4A8"], scored, scored, None, tmp_path / str(use_all),
                                                  True, data, use_all_amp_candidates=use_all)
    conv = next(g for g, group in enumerate(results[False].groups) if group.nodes == ("conv",))
    assert all(p.precisions[conv] == "W8A8" for p in results[False].points)
    assert (conv, "W4A8") not in results[False].phase1_scores and (conv, "W4A8") in results[True].phase1_scores
    assert any(p.precisions[conv] == "W4A8" for p in results[True].points)
    sim = tiny_cnn.new_sim(config_file=_kernel_config([_kernel(16, 16)]))
    before = snapshot(sim)
    with pytest.raises(ConfigError, match=r"quantizer group conv .*Conv"):
        choose_mixed_precision(sim, ["W8A8", "W4A8"], scored, scored, None, tmp_path / "none", True, data)
    assert snapshot(sim) == before


def _cache(tmp_path):
    return tmp_path / ".cache" / "amp_scores.json"


@pytest.mark.parametrize("corrupt, message", [
    (lambda doc: doc["scores"].update(float=math.nan), r"score 'float': nan is not a finite number"),
    (lambda doc: doc["scores"].update({"uniform:W4A8": "high"}), r"score 'uniform:W4A8'"),
    (lambda doc: doc.update(scores=[1, 2]), r"'scores' must be an object"),
    (lambda doc: doc["observed"].update({"uniform:W8A8": {"bops": -1, "dtypes": {}}}), r"observed 'uniform:W8A8'"),
    (lambda doc: doc["observed"].update({"uniform:W8A8": {"bops": 1, "dtypes": {"x": "int7"}}}), "int7"),
])
def test_a_cache_that_cannot_be_resumed_from_is_refused_naming_the_file(tmp_path, corrupt, message):
    choose_mixed_precision(new_sim(), ["W8A8", "W4A8"], score, score, 0.02, tmp_path, True, feeds())
    document = json.loads(_cache(tmp_path).read_text())
    corrupt(document)
    _cache(tmp_path).write_text(json.dumps(document))
    sim = new_sim()
    sim.compute_encodings(feeds())
    before = snapshot(sim)
    with pytest.raises(AmpCacheError, match=message) as error:
        choose_mixed_precision(sim, ["W8A8", "W4A8"], score, score, 0.02, tmp_path, False, feeds())
    assert str(_cache(tmp_path)) in str(error.value) and "clean_start=True" in str(error.value)
    assert isinstance(error.value, QuantsimError) and snapshot(sim) == before
    _cache(tmp_path).write_text("{not json")
    with pytest.raises(AmpCacheError, match="not readable JSON"):
        choose_mixed_precision(sim, ["W8A8", "W4A8"], score, score, 0.02, tmp_path, False, feeds())
    fresh = choose_mixed_precision(sim, ["W8A8", "W4A8"], score, score, 0.02, tmp_path, True, feeds())
    assert np.isfinite(fresh.float_score)  # clean_start replaces it


def test_a_resumed_run_reports_the_same_simulated_costs(tmp_path):
    _, first = _masked_run(tmp_path, drop=600.0)
    model, data = masked_matmuls(), masked_feeds()
    scored = output_score(model, data)
    again = choose_mixed_precision(QuantizationSimModel(model, progress=False), ["W8A16", "W8A8"], scored, scored,
                                   600.0, tmp_path, False, data)
    assert again.phase2_evaluations == 0 and list(again.points) == list(first.points)


def test_a_tensor_range_health_leaves_float_costs_a_float_operand_and_comes_back_at_16_bits(tmp_path):
    """Fill -1e9: asked for 8 bits, the masked tensor's 8- and 16-bit grids both collapse and the sim leaves it
    float; W8A8 everywhere then costs MACS*8*8 + MACS*(32*sqrt(1.5))*8 (a float32 operand, `FLOAT_BITS_FACTOR`),
    more than W8A16 everywhere: no flip of mm2's group is taken, and a budget W8A8 everywhere meets does not
    make it the choice. Left at the baseline, the tensor is quantized again, at 16 bits."""
    model, data = masked_matmuls(-1e9), masked_feeds()
    scored = output_score(model, data)
    for drop in (None, 1e15):
        sim = QuantizationSimModel(model, progress=False)
        result = choose_mixed_precision(sim, ["W8A16", "W8A8"], scored, scored, drop, tmp_path / str(drop), True,
                                        data)
        expected = (MACS * 8 * 8 + MACS * 32 * math.sqrt(1.5) * 8) / BASELINE_BOPS
        assert result.uniform_bitops["W8A8"] == pytest.approx(expected) and expected > 1
        assert all(p.precisions[1] == "W8A16" for p in result.points)  # mm2's group never flipped
        assert result.bitops_ratio <= 1.0
        assert result.bitops_ratio == simulated_bit_operations(sim, layer_costs(sim)) / BASELINE_BOPS
    assert result.chosen.precisions == ("W8A8", "W8A16", "W8A8") and result.bitops_ratio == 0.75
    fresh = QuantizationSimModel(model, progress=False)
    choose_mixed_precision(fresh, ["W8A16", "W8A8"], scored, scored, None, tmp_path / "fresh", True, data)
    m = fresh.qc_quantize_op_dict["m"]
    assert m.enabled and m.precision() == int16  # re-enabled after the W8A8 pass left it float
