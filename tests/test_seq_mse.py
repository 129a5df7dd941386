"""Sequential MSE: per-channel ranges that minimise each layer's output error, checked by brute force."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_adaround import _cnn, _data, _float_sim, _output_mse, _sim

import quantsim
from adaround import apply_adaround, apply_seq_mse
from quantsim import QuantizationSimModel, encoding_from_range, fake_quantize


def _gemm_model():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 8)).astype(np.float32)
    w[:, 0] *= 8  # outliers: the full range wastes the grid on most channels
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), w


def test_choice_equals_a_brute_force_search_over_the_outputs():
    model, w = _gemm_model()
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.standard_normal((16, 6)).astype(np.float32)} for _ in range(3)]
    sim = QuantizationSimModel(model, param_type="int4", progress=False)
    sim.compute_encodings(feeds)
    x = np.concatenate([next(iter(sim.capture(["x"], [f]))) ["x"] for f in feeds])
    reports = apply_seq_mse(sim, feeds, num_candidates=10)
    q = sim.qc_quantize_op_dict["w"]
    assert reports[0].status == "optimized" and q.is_encoding_frozen()
    assert reports[0].loss_after <= reports[0].loss_before
    lo, hi = np.minimum(w.min(axis=0), 0), np.maximum(w.max(axis=0), 0)
    for channel in range(w.shape[1]):
        errors = []
        for i in range(10):
            f = (i + 1) / 10
            enc = encoding_from_range(lo[channel] * f, hi[channel] * f, 4, symmetric=True)
            errors.append(np.sum((x @ (fake_quantize(w[:, channel], enc) - w[:, channel])) ** 2))
        best = (np.argmin(errors) + 1) / 10
        assert q.encoding.max[channel] == pytest.approx(hi[channel] * best, rel=1e-5) or q.encoding.min[channel] == \
            pytest.approx(lo[channel] * best, rel=1e-5)
    np.testing.assert_array_equal(sim.get_weight("w"), w)  # weights untouched, only the ranges change


def test_seq_mse_then_adaround_improves_the_output():
    reference, held_out = _float_sim(_cnn()), _data(4, seed=9)
    sim = _sim()
    nearest = _output_mse(sim, reference, held_out)
    reports = apply_seq_mse(sim, _data())
    assert all(r.loss_after <= r.loss_before for r in reports)
    after_seq = _output_mse(sim, reference, held_out)
    assert after_seq < nearest
    rounded = apply_adaround(sim, _data(), num_iterations=300)
    assert all(r.status == "rounded" for r in rounded)  # frozen Seq MSE ranges are kept, the weights rounded
    for layer in sim.weighted_layers():
        w = sim.get_weight(layer.weight)
        np.testing.assert_array_equal(fake_quantize(w, layer.weight_quantizer.encoding), w)


@pytest.mark.parametrize("symmetry", ["asym", "symfp"])
def test_other_input_symmetries_run(symmetry):
    reports = apply_seq_mse(_sim(), _data(2), num_candidates=5, inp_symmetry=symmetry)
    assert {r.status for r in reports} == {"optimized"}


def test_bad_arguments():
    sim = _sim()
    with pytest.raises(quantsim.InvalidArgumentError, match="num_candidates"):
        apply_seq_mse(sim, _data(1), num_candidates=0)
    with pytest.raises(quantsim.InvalidArgumentError, match="inp_symmetry"):
        apply_seq_mse(sim, _data(1), inp_symmetry="both")
    with pytest.raises(quantsim.InvalidArgumentError, match="nodes_to_exclude"):
        apply_seq_mse(sim, _data(1), nodes_to_exclude=["relu1"])
    reports = {r.node: r for r in apply_seq_mse(sim, _data(1), nodes_to_exclude=["fc"])}
    assert "fc" not in reports or reports["fc"].status == "skipped"
    again = {r.node: r for r in apply_seq_mse(sim, _data(1))}
    assert again["conv1"].status == "skipped" and "frozen" in again["conv1"].reason
