"""Per-layer analysis: group sensitivity leaves the sim as it was; tensor health finds a collapsed grid."""
import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_cnn import batches, calibrated_sim, make_model, snapshot

from mixed_precision import group_sensitivity, report_dict, tensor_health
from quantsim import QuantizationSimModel


def _sqnr_eval(feeds):
    reference = QuantizationSimModel(make_model(), progress=False)
    for q in reference.quantizers:
        q.enabled = False
    expected = [reference.session.run(None, f)[0] for f in feeds]

    def evaluate(session):
        got = [session.run(None, f)[0] for f in feeds]
        signal = sum(float(np.sum(e ** 2)) for e in expected)
        noise = sum(float(np.sum((e - g) ** 2)) for e, g in zip(expected, got)) or 1e-30
        return 10 * np.log10(signal / noise)

    return evaluate


def test_group_sensitivity_scores_each_group_and_restores_the_sim():
    sim = calibrated_sim(param_type="int4")
    before = snapshot(sim)
    evaluate = _sqnr_eval(batches(2, seed=20))
    float_score, quantized, groups = group_sensitivity(sim, evaluate)
    assert float_score > 100 and quantized < float_score  # float equals the reference up to rounding
    assert {n for g in groups for n in g.nodes} == {"conv", "fc"}
    for g in groups:
        assert g.alone >= quantized - 1e-6 and g.without >= quantized - 1e-6
    assert snapshot(sim) == before
    report = report_dict(float_score, quantized, groups, [])
    json.dumps(report)
    assert report["groups"][0]["alone"] <= report["groups"][-1]["alone"]


def test_group_sensitivity_restores_the_sim_when_the_callback_raises():
    sim = calibrated_sim()
    before = snapshot(sim)
    calls = []

    def failing(session):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("user callback failed")
        return 1.0

    with pytest.raises(RuntimeError, match="user callback"):
        group_sensitivity(sim, failing)
    assert snapshot(sim) == before


def test_tensor_health_flags_a_collapsed_grid():
    """An additive constant with -1e4 on some positions makes one 8-bit grid useless for the rest (not an
    attention mask, which placement leaves float, and with the sim's own range-health fix off)."""
    mask = np.zeros((1, 8), np.float32)
    mask[0, :2] = -1e4
    graph = helper.make_graph([helper.make_node("Add", ["x", "mask"], ["scores"], name="add"),
                               helper.make_node("Sigmoid", ["scores"], ["y"], name="sigmoid")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                              [numpy_helper.from_array(mask, "mask")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sim = QuantizationSimModel(model, progress=False, range_health=False)
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((16, 8)).astype(np.float32)} for _ in range(2)]
    sim.compute_encodings(feeds)
    health = {h.tensor: h for h in tensor_health(sim, feeds)}
    assert "scores" in health and health["scores"].codes_used < 16 and "collapsed" in health["scores"].verdict
    assert health["x"].verdict == "ok"
    # the -1e4 entries dominate the energy: SQNR alone looks fine (why codes are counted), and the
    # collapsed tensor comes first in the report
    order = [h.tensor for h in tensor_health(sim, feeds)]
    assert order.index("scores") < order.index("x")
