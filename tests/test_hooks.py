"""The public extension hooks adaround/ and mixed_precision/ build on: weighted layers, weight
replacement, capture of intermediate tensors, quantizer groups and exact temporary changes."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_cnn import batch, batches, calibrated_sim, make_model, new_sim, snapshot

import quantsim
from quantsim import QuantizationSimModel, TensorCache


def _float_intermediate(model, tensor, feed):
    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    extended.graph.output.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None))
    session = ort.InferenceSession(extended.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([tensor], feed)[0]


# weighted layers ---------------------------------------------------------------------------------------
def test_weighted_layers_name_tensors_quantizer_and_following_activation():
    sim = calibrated_sim()
    conv, fc = sim.weighted_layers()
    assert (conv.op_type, conv.input, conv.weight, conv.bias) == ("Conv", "x", "W", "B")
    assert conv.activation is not None and conv.activation.op_type == "Relu"
    assert conv.weight_quantizer is sim.qc_quantize_op_dict["W"]
    assert fc.op_type == "Gemm" and fc.attributes["transB"] == 1 and fc.activation is None
    assert not conv.shared_weight


def test_clip_bounds_given_as_inputs_are_resolved():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="relu6")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    (layer,) = QuantizationSimModel(model, progress=False).weighted_layers()
    assert layer.activation.op_type == "Clip"
    assert (layer.activation.attributes["min"], layer.activation.attributes["max"]) == (0.0, 6.0)
    assert layer.bias is None


# weights -----------------------------------------------------------------------------------------------
def test_replace_weight_changes_the_sim_and_freezes_the_encoding():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["W"]
    before = sim.session.run(None, batch(9))[0]
    weight = sim.get_weight("W")
    weight[0] *= -1
    sim.replace_weight("W", weight, freeze=True)
    assert q.is_encoding_frozen()
    np.testing.assert_array_equal(sim.get_weight("W"), weight)
    after = sim.session.run(None, batch(9))[0]
    assert not np.allclose(before, after)
    sim.compute_encodings(batches())  # a frozen weight encoding survives calibration
    assert q.is_encoding_frozen()


def test_replace_weight_rejects_wrong_shapes_names_and_values():
    sim = calibrated_sim()
    with pytest.raises(quantsim.InvalidArgumentError, match="shape"):
        sim.replace_weight("W", np.zeros((1, 2), np.float32))
    with pytest.raises(quantsim.InvalidArgumentError, match="not a constant"):
        sim.replace_weight("c", np.zeros(1, np.float32))
    with pytest.raises(quantsim.InvalidArgumentError, match="finite"):
        sim.replace_weight("W", np.full(sim.get_weight("W").shape, np.nan, np.float32))


# capture -----------------------------------------------------------------------------------------------
def test_float_capture_equals_the_float_model():
    sim = calibrated_sim()
    feeds = batches(3, seed=5)
    captured = list(sim.capture(["c", "g"], feeds, quantized=False))
    assert len(captured) == 3
    for feed, values in zip(feeds, captured):
        np.testing.assert_allclose(values["c"], _float_intermediate(make_model(), "c", feed), rtol=1e-6, atol=1e-6)


def test_sim_capture_reads_values_on_the_quantizer_grid():
    sim = calibrated_sim()
    feed = batch(3)
    (values,) = sim.capture(["x", "r", "y"], [feed])
    for tensor in ("x", "r"):
        enc = sim.qc_quantize_op_dict[tensor].encoding
        codes = values[tensor] / np.float32(enc.scale) + enc.zero_point
        np.testing.assert_allclose(codes, np.rint(codes), atol=1e-3)
    assert not np.array_equal(values["x"], feed["x"])  # the quantized copy the consumers read
    np.testing.assert_array_equal(values["y"], sim.session.run(None, feed)[0])


def test_capture_names_an_unknown_tensor():
    with pytest.raises(quantsim.InvalidArgumentError, match="no_such_tensor"):
        next(calibrated_sim().capture(["no_such_tensor"], [batch()]))


def test_tensor_cache_spills_past_its_budget_and_cleans_up():
    arrays = [{"a": np.full((4, 4), i, np.float32)} for i in range(5)]
    with TensorCache(memory_budget_bytes=2 * 64) as cache:
        for entry in arrays:
            cache.append(entry)
        assert cache.spilled and cache.resident_bytes <= 128 and len(cache) == 5
        for i, entry in enumerate(cache):
            np.testing.assert_array_equal(entry["a"], arrays[i]["a"])
        folder = cache._folder
    assert not folder.exists()


# groups ------------------------------------------------------------------------------------------------
def test_every_enabled_quantizer_is_in_exactly_one_group():
    sim = calibrated_sim()
    groups = sim.quantizer_groups()
    names = [n for g in groups for n in g.quantizers]
    enabled = {q.name for q in sim.quantizers if q.enabled}
    assert sorted(names) == sorted(enabled)
    conv_group = next(g for g in groups if "W" in g.parameter_quantizers)
    assert conv_group.activation_quantizers == (sim.qc_quantize_op_dict["x"].name,)
    assert conv_group.nodes == ("conv",)
    fc_group = next(g for g in groups if "W2" in g.parameter_quantizers)
    # the Gemm reads Flatten(GlobalAveragePool(Relu)): the quantizer of the pooled tensor, not a later one
    assert len(fc_group.activation_quantizers) == 1


# temporary changes -------------------------------------------------------------------------------------
def test_temporary_state_restores_quantizers_weights_and_the_session():
    sim = calibrated_sim()
    session = sim.session
    before_state, before_out = snapshot(sim), session.run(None, batch(4))[0]
    weight = sim.get_weight("W")
    with sim.temporary_state():
        sim.qc_quantize_op_dict["W"].set_bitwidth(4)
        sim.qc_quantize_op_dict["r"].enabled = False
        sim.replace_weight("W2", np.zeros_like(sim.get_weight("W2")), freeze=False)
        changed = sim.session.run(None, batch(4))[0]
        assert not np.allclose(changed, before_out)
    assert snapshot(sim) == before_state
    np.testing.assert_array_equal(sim.get_weight("W"), weight)
    assert sim.session is session  # nothing rebuilt: the session of the restored state is current again
    np.testing.assert_array_equal(sim.session.run(None, batch(4))[0], before_out)


def test_temporary_state_restores_on_error_and_later_changes_rebuild():
    sim = calibrated_sim()
    before = snapshot(sim)
    with pytest.raises(KeyError):
        with sim.temporary_state():
            sim.qc_quantize_op_dict["W"].set_bitwidth(4)
            _ = sim.session
            raise KeyError("boom")
    assert snapshot(sim) == before
    session = sim.session
    sim.qc_quantize_op_dict["W"].set_bitwidth(4)
    assert sim.session is not session  # a later change still invalidates the restored session


def test_snapshot_is_cheap_enough_for_hundreds_of_evaluations():
    sim = calibrated_sim()
    feed = batch(1)
    reference = sim.session.run(None, feed)[0]
    for _ in range(200):
        with sim.temporary_state():
            sim.qc_quantize_op_dict["r"].enabled = False
    np.testing.assert_array_equal(sim.session.run(None, feed)[0], reference)


def test_uncalibrated_sim_capture_passes_activations_through():
    sim = new_sim()
    feed = batch(2)
    (values,) = sim.capture(["x"], [feed])
    np.testing.assert_array_equal(values["x"], feed["x"])


def test_transaction_keeps_changes_on_success_and_undoes_them_on_interrupt():
    sim = calibrated_sim()
    before = snapshot(sim)
    with pytest.raises(KeyboardInterrupt):
        with sim.transaction():
            sim.replace_weight("W", np.zeros_like(sim.get_weight("W")), freeze=True)
            raise KeyboardInterrupt
    assert snapshot(sim) == before and sim.get_weight("W").any()
    with sim.transaction():
        sim.qc_quantize_op_dict["W"].set_bitwidth(4)
    assert sim.qc_quantize_op_dict["W"].bitwidth == 4
    assert not sim._open_states  # the snapshot was released: later weight changes are not recorded


def test_compute_param_encodings_needs_no_data():
    sim = new_sim()
    assert sim.qc_quantize_op_dict["W"].encoding is None
    sim.compute_param_encodings()
    assert sim.qc_quantize_op_dict["W"].encoding is not None
    assert sim.qc_quantize_op_dict["r"].encoding is None


def test_a_capturer_keeps_the_model_it_was_made_from():
    sim = calibrated_sim()
    feed = batch(6)
    float_capturer = sim.capturer(["c"], quantized=False)
    (before,) = float_capturer([feed])
    sim.replace_weight("W", np.zeros_like(sim.get_weight("W")))
    (after,) = float_capturer([feed])
    np.testing.assert_array_equal(before["c"], after["c"])
    (fresh,) = sim.capture(["c"], [feed], quantized=False)
    assert not np.array_equal(fresh["c"], before["c"])  # capture() follows the sim as it is now


def test_capture_runs_only_what_the_captured_tensors_need():
    """A tensor early in the graph is captured without running the rest (here a Reshape that would fail)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Reshape", ["r", "bad_shape"], ["y"], name="reshape")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["A", "B"])],
        [numpy_helper.from_array(np.array([3, 5], np.int64), "bad_shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sim = QuantizationSimModel(model, progress=False)
    feed = {"x": np.arange(-4, 4, dtype=np.float32).reshape(2, 4)}
    (values,) = sim.capture(["r"], [feed], quantized=False)
    np.testing.assert_array_equal(values["r"], np.maximum(feed["x"], 0))


def test_capture_before_a_big_weight_leaves_the_weight_out():
    """The sim hands big weights to onnxruntime as arrays; a capture that prunes their node must not."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 3, 3, 3)).astype(np.float32)  # 6.9 KB: an in-memory placeholder
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64, 8, 8])],
                              [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sim = QuantizationSimModel(model, progress=False)
    feed = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    sim.compute_encodings([feed])
    (values,) = sim.capture(["x"], [feed])
    enc = sim.qc_quantize_op_dict["x"].encoding
    codes = values["x"] / np.float32(enc.scale) + enc.zero_point
    np.testing.assert_allclose(codes, np.rint(codes), atol=1e-3)
