"""`auto_quantize` scores what deploys: each configuration on its QDQ export in onnxruntime's fused kernels.

The sim (float sums of dequantized products) and onnxruntime's integer kernels (exact int32 sums, a float
multiplier) round values within ~1e-6 of a midpoint differently; on a deep model the flips grow, and the
search chose on the sim a configuration whose export missed the budget (PP-OCRv4 rec: CER 0.0093 in the sim,
0.0182 exported). The oracle here is the callback on the chosen sim's QDQ export, run in a default
onnxruntime session built from the exported file (uint8 weight codes: exact on every CPU), on a three-layer
convolution net where the sim and that export differ (checked, not assumed).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mixed_precision import auto_quant, auto_quantize
from quantsim import InvalidArgumentError, QuantizationSimModel

FAST = {"quant_schemes": (), "adaround_iterations": 5, "seq_mse_candidates": 2, "progress": False}
CHANNELS = 32


def conv_net(seed: int = 0, layers: int = 3) -> onnx.ModelProto:
    """3x3 convolutions of 32 channels: 288-term sums, enough near-ties among 16k outputs to see flips."""
    rng = np.random.default_rng(seed)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((CHANNELS, CHANNELS, 3, 3)) / np.sqrt(9 * CHANNELS)).astype(np.float32)
        b = (0.1 * rng.standard_normal(CHANNELS)).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"y{i}"], pads=[1, 1, 1, 1]))
        x = f"y{i}"
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [2, CHANNELS, 16, 16])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def feeds(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, CHANNELS, 16, 16)).astype(np.float32)} for _ in range(count)]


CALIBRATION, EVALUATION = feeds(2, 1), feeds(4, 7)
_FLOAT = ort.InferenceSession(conv_net().SerializeToString(), providers=["CPUExecutionProvider"])
_EXPECTED = [_FLOAT.run(None, f)[0] for f in EVALUATION]


def score(session) -> float:
    """Minus the mean squared error to the float model: any one-step flip changes it."""
    got = [session.run(None, f)[0] for f in EVALUATION]
    return -float(np.mean([np.mean((e.astype(np.float64) - g) ** 2) for e, g in zip(_EXPECTED, got)]))


def exported_score(sim: QuantizationSimModel) -> float:
    qdq = sim.to_onnx_qdq(weight_codes="uint8")
    return score(ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"]))


def _require_a_gap(sim: QuantizationSimModel) -> None:
    if score(sim.session) == exported_score(sim):
        pytest.skip("the sim and its fused export agree on this CPU's kernels: nothing to tell apart")


def test_the_uniform_stages_score_the_export():
    result = auto_quantize(conv_net(), CALIBRATION, score, 1.0, candidates=["W8A8"], **FAST)
    assert result.chosen.stage == "defaults"
    _require_a_gap(result.sim)
    assert result.score == exported_score(result.sim)
    assert result.deployed_score == result.score


def test_amp_chooses_on_the_export(monkeypatch):
    monkeypatch.setattr(auto_quant, "EXHAUSTIVE_LIMIT", 1)  # the mix of W8A8 and the first meeting candidate: AMP
    sim = QuantizationSimModel(conv_net(), progress=False)
    sim.compute_encodings(CALIBRATION)
    _require_a_gap(sim)  # W8A8 everywhere: the sim and the export differ
    reference = score(_FLOAT)
    # W8A8 everywhere misses, W8A16 everywhere meets with room: AMP finds a cheaper mix of the two
    drop = 0.85 * (reference - score(sim.session))
    result = auto_quantize(conv_net(), CALIBRATION, score, drop,
                           candidates=["W8A8", "W8A16", "W16A16", "FP16"], **FAST)
    assert result.chosen.stage == "amp" and result.budget_met
    assert result.score == exported_score(result.sim) >= result.target
    assert result.deployed_score == result.score


def test_score_on_sim_keeps_the_sims_scores():
    result = auto_quantize(conv_net(), CALIBRATION, score, 1.0, candidates=["W8A8"], score_on="sim", **FAST)
    _require_a_gap(result.sim)
    assert result.score == score(result.sim.session) != result.deployed_score


def test_score_on_must_be_known():
    with pytest.raises(InvalidArgumentError, match="score_on"):
        auto_quantize(conv_net(), CALIBRATION, score, 1.0, candidates=["W8A8"], score_on="fused", **FAST)


@pytest.mark.parametrize(("param_type", "activation_type", "named"),
                         [("int8", "int8", False), ("int8", "int16", True), ("float16", "float16", True)])
def test_print_sim_names_the_float_kernel_difference_of_wide_layers(param_type, activation_type, named):
    sim = QuantizationSimModel(conv_net(), param_type=param_type, activation_type=activation_type, progress=False)
    sim.compute_encodings(CALIBRATION)
    section = str(sim)[str(sim).index("sim vs deployed"):]
    assert ("float kernels:" in section) is named
    assert "score the export (auto_quantize does" in section


def test_score_on_both_scores_the_lower_and_the_result_reports_each():
    result = auto_quantize(conv_net(), CALIBRATION, score, 1.0, candidates=["W8A8"], score_on="both", **FAST)
    _require_a_gap(result.sim)
    own, exported = score(result.sim.session), exported_score(result.sim)
    assert result.score == min(own, exported)
    assert result.sim_score == own and result.deployed_score == exported
    assert result.to_dict()["sim_score"] == own


def test_a_target_between_the_sim_and_its_export_is_named_and_both_refuses_it():
    sim = QuantizationSimModel(conv_net(), progress=False)
    sim.compute_encodings(CALIBRATION)
    _require_a_gap(sim)
    own, exported = score(sim.session), exported_score(sim)
    reference = score(_FLOAT)
    drop = reference - (own + exported) / 2  # the target halfway: one of the two meets it, the other not
    mode, missing = ("export", "the sim itself") if exported > own else ("sim", "its QDQ export")
    with pytest.warns(RuntimeWarning, match=f"{missing} .*scores .* below the target") as caught:
        result = auto_quantize(conv_net(), CALIBRATION, score, drop, candidates=["W8A8"], score_on=mode, **FAST)
    assert {w.filename for w in caught} == {__file__}  # at the caller's line
    assert result.budget_met and result.score == max(own, exported)
    with pytest.warns(RuntimeWarning, match="budget not met"):
        careful = auto_quantize(conv_net(), CALIBRATION, score, drop, candidates=["W8A8"], score_on="both", **FAST)
    assert not careful.budget_met and careful.score == min(own, exported)
