"""apply_adaround end to end on small built models: better than nearest rounding, weights on the grid,
frozen encodings, mixed precision handled layer by layer, bad input, and nothing changed by a failure."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_cnn import batches, make_model, snapshot

import adaround
import adaround.layer_job
import quantsim
from adaround import Adaround, AdaroundParameters, apply_adaround
from quantsim import QuantizationSimModel, fake_quantize


def _cnn(seed: int = 0) -> onnx.ModelProto:
    """Conv-Relu -> depthwise Conv-Clip(0,6) -> Conv (no activation) -> GAP -> Flatten -> Gemm."""
    rng = np.random.default_rng(seed)

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name)

    inits = [init("w1", 8, 3, 3, 3), init("b1", 8), init("w2", 8, 1, 3, 3), init("w3", 6, 8, 1, 1), init("b3", 6),
             init("w4", 5, 6), init("b4", 5)]
    inits += [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="dw", group=8, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"], name="relu6"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="pw"),
        helper.make_node("GlobalAveragePool", ["c3"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w4", "b4"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _data(count=6, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, 3, 10, 10)).astype(np.float32)} for _ in range(count)]


def _sim(model=None, **kwargs):
    kwargs.setdefault("param_type", "int4")
    sim = QuantizationSimModel(_cnn() if model is None else model, progress=False, **kwargs)
    sim.compute_encodings(_data())
    return sim


def _output_mse(sim, reference, feeds):
    return float(np.mean([np.mean((sim.session.run(None, f)[0] - reference.session.run(None, f)[0]) ** 2)
                          for f in feeds]))


def _float_sim(model):
    sim = QuantizationSimModel(model, progress=False)
    for q in sim.quantizers:
        q.enabled = False
    return sim


def test_adaround_beats_nearest_rounding_on_every_layer_and_at_the_output():
    sim = _sim()
    reference, held_out = _float_sim(_cnn()), _data(4, seed=9)
    before = _output_mse(sim, reference, held_out)
    reports = apply_adaround(sim, _data(), num_iterations=2000)
    assert [r.node for r in reports] == ["conv1", "dw", "pw", "fc"]
    assert {r.mode for r in reports} == {"sampled", "moments"}
    for report in reports:
        assert report.status == "rounded"
        assert report.loss_after <= report.loss_before * 1.001, report
    assert sum(r.loss_after for r in reports) < 0.9 * sum(r.loss_before for r in reports)
    assert _output_mse(sim, reference, held_out) < before


def test_rounded_weights_sit_on_the_grid_with_frozen_encodings():
    sim = _sim()
    apply_adaround(sim, _data(2), num_iterations=50)
    for layer in sim.weighted_layers():
        q = layer.weight_quantizer
        assert q.is_encoding_frozen()
        weight = sim.get_weight(layer.weight)
        np.testing.assert_array_equal(fake_quantize(weight, q.encoding), weight)
    frozen = {q.name: q.encoding for q in sim.quantizers if q.role == "param" and q.is_encoding_frozen()}
    sim.compute_encodings(_data(2))
    assert all(sim.qc_quantize_op_dict[n].encoding is e for n, e in frozen.items())


def test_mixed_precision_sims_are_handled_layer_by_layer():
    sim = _sim(param_type="int8")
    sim.qc_quantize_op_dict["w1"].set_bitwidth(4)
    sim.qc_quantize_op_dict["w3"].set_precision("float16")
    sim.qc_quantize_op_dict["w4"].enabled = False
    sim.compute_encodings(_data(2))
    reports = {r.node: r for r in apply_adaround(sim, _data(2), num_iterations=30)}
    assert reports["conv1"].status == "rounded" and reports["dw"].status == "rounded"
    assert reports["pw"].status == "skipped" and "float16" in reports["pw"].reason
    assert reports["fc"].status == "skipped" and "disabled" in reports["fc"].reason


def test_frozen_layers_are_left_alone(tmp_path):
    sim = _sim()
    apply_adaround(sim, _data(2), num_iterations=20, nodes_to_include=["conv1"])
    sim.export(tmp_path, "ada")  # ada.onnx holds the rounded weights
    fresh = _sim(str(tmp_path / "ada.onnx"))
    fresh.set_and_freeze_param_encodings(str(tmp_path / "ada.encodings"))
    weight = fresh.get_weight("w1")
    reports = {r.node: r for r in apply_adaround(fresh, _data(2), num_iterations=20)}
    assert reports["conv1"].status == "skipped" and "frozen" in reports["conv1"].reason
    np.testing.assert_array_equal(fresh.get_weight("w1"), weight)


def test_bad_input_is_named():
    sim = _sim()
    with pytest.raises(quantsim.InvalidArgumentError, match="'nope' .no such node"):
        apply_adaround(sim, _data(1), num_iterations=5, nodes_to_include=["nope"])
    with pytest.raises(quantsim.InvalidArgumentError, match="'relu1' .has no constant weight"):
        apply_adaround(sim, _data(1), num_iterations=5, nodes_to_include=["relu1"])
    with pytest.raises(quantsim.InvalidArgumentError, match="num_iterations"):
        apply_adaround(sim, _data(1), num_iterations=0)
    with pytest.raises(quantsim.InvalidArgumentError, match="empty"):
        apply_adaround(sim, [], num_iterations=5)
    with pytest.raises(quantsim.QuantsimError, match="batch 0"):
        apply_adaround(sim, [{"wrong": np.zeros((1, 3, 10, 10), np.float32)}], num_iterations=5)


def test_failure_or_interrupt_leaves_the_sim_exactly_as_it_was(monkeypatch):
    sim = _sim()
    before = snapshot(sim)
    weights = {n: sim.get_weight(n) for n in ("w1", "w2", "w3", "w4")}
    calls = []

    original = adaround.layer_job.optimize_rounding

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # after the first layer's weights were replaced
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(adaround.layer_job, "optimize_rounding", interrupted)
    with pytest.raises(KeyboardInterrupt):
        apply_adaround(sim, _data(2), num_iterations=10)
    assert snapshot(sim) == before
    for name, value in weights.items():
        np.testing.assert_array_equal(sim.get_weight(name), value)


def test_all_zero_weights_stay_zero():
    model = _cnn()
    for tensor in model.graph.initializer:
        if tensor.name == "w3":
            tensor.CopyFrom(numpy_helper.from_array(np.zeros((6, 8, 1, 1), np.float32), "w3"))
    sim = _sim(model)
    reports = {r.node: r for r in apply_adaround(sim, _data(2), num_iterations=20)}
    assert reports["pw"].status == "rounded"
    assert not sim.get_weight("w3").any()


def test_uncalibrated_activations_warn_and_round_against_float_inputs():
    sim = QuantizationSimModel(make_model(), param_type="int4", progress=False)
    with pytest.warns(quantsim.QuantsimWarning, match="uncalibrated"):
        reports = apply_adaround(sim, batches(2), num_iterations=20)
    assert all(r.status == "rounded" for r in reports)


def test_legacy_api_writes_parameter_encodings_for_a_new_sim(tmp_path):
    params = AdaroundParameters(data_loader=[d["x"] for d in _data(3)], num_batches=2, default_num_iterations=30)
    rounded = Adaround.apply_adaround(_cnn(), params, tmp_path, "legacy", default_param_bw=4,
                                      ignore_quant_ops_list=["fc"], default_quant_scheme="min_max")
    encodings = (tmp_path / "legacy.encodings").read_text()
    assert '"param_encodings"' in encodings and "w1" in encodings and "r1" not in encodings.split("param_encodings")[0]
    sim = QuantizationSimModel(rounded, param_type="int4", progress=False)
    sim.set_and_freeze_param_encodings(str(tmp_path / "legacy.encodings"))
    w1 = sim.get_weight("w1")
    np.testing.assert_array_equal(fake_quantize(w1, sim.qc_quantize_op_dict["w1"].encoding), w1)
    with pytest.raises(quantsim.InvalidArgumentError, match="ignore_quant_ops_list"):
        Adaround.apply_adaround(_cnn(), params, tmp_path, "x", ignore_quant_ops_list=["nope"])


def test_blockwise_int4_weights_are_rounded_on_their_blocks():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((16, 6)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    feeds = [{"x": rng.standard_normal((32, 16)).astype(np.float32)} for _ in range(3)]
    sim = QuantizationSimModel(model, param_type="int4", progress=False)
    q = sim.qc_quantize_op_dict["w"]
    q.set_qspec(quantsim.QSpec(quantsim.int4, quantsim.PerBlock(axis=1, block_axis=0, block_size=8), symmetric=True))
    sim.compute_encodings(feeds)
    (report,) = apply_adaround(sim, feeds, num_iterations=1500)
    assert report.status == "rounded" and report.loss_after <= report.loss_before
    assert q.encoding.block_size == 8 and q.encoding.scale.shape == (6, 2)
    rounded = sim.get_weight("w")
    np.testing.assert_array_equal(fake_quantize(rounded, q.encoding), rounded)
