"""What tf2onnx writes at opset 9 (`benchmarks/bench_tf9.py` found these on Keras exports), on small models
built with onnx.helper at opset 9: the sim computes the float model's function (onnxruntime running the
opset-9 file is the oracle) and every export handles the old spellings."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantsim
from quantsim.errors import PrepareError, PrepareWarning
from quantsim.prepare import passes as qp

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "cache"))


def _model(nodes, x_shape, initializers, opset=9, y_shape=None):
    graph = helper.make_graph(nodes, "tf2onnx", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=4 if opset < 10 else 5)


def _run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _resize_model(op, mode, scales, opset):
    """Conv -> Upsample/Resize -> Conv, NCHW, the resize's scales a constant."""
    w1 = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = RNG.standard_normal((2, 4, 1, 1)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node(op, ["a", "scales"], ["u"], mode=mode, name="resize"),
             helper.make_node("Conv", ["u", "w2"], ["y"], name="conv2")]
    return _model(nodes, [1, 3, 5, 7], {"w1": w1, "w2": w2, "scales": np.asarray(scales, np.float32)}, opset)


# Upsample (opset 9) and Resize (opset 10): onnx's version converter gave them opset 11's half-pixel defaults --
@pytest.mark.parametrize("op, opset", [("Upsample", 9), ("Resize", 10)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 1.5, 1.34]])
def test_legacy_upsample_keeps_its_function_through_the_opset_upgrade(op, opset, mode, scales):
    model = _resize_model(op, mode, scales, opset)
    x = RNG.standard_normal((1, 3, 5, 7)).astype(np.float32)
    upgraded, modified = qp.upgrade_opset(onnx.ModelProto.FromString(model.SerializeToString()))
    assert modified
    np.testing.assert_array_equal(_run(upgraded, x), _run(model, x))
    resize = next(n for n in upgraded.graph.node if n.op_type == "Resize")
    attributes = {a.name: helper.get_attribute_value(a) for a in resize.attribute}
    assert attributes["coordinate_transformation_mode"] == b"asymmetric"
    assert attributes.get("nearest_mode") == (b"floor" if mode == "nearest" else None)


def test_opset10_nearest_downsampling_rounds_up_as_onnxruntime_does():
    model = _resize_model("Resize", "nearest", [1, 1, 0.75, 0.6], 10)
    x = RNG.standard_normal((1, 3, 5, 7)).astype(np.float32)
    upgraded, _ = qp.upgrade_opset(onnx.ModelProto.FromString(model.SerializeToString()))
    np.testing.assert_array_equal(_run(upgraded, x), _run(model, x))


def test_opset10_nearest_up_and_down_at_once_is_a_clear_error():
    model = _resize_model("Resize", "nearest", [1, 1, 0.75, 1.5], 10)
    with pytest.raises(PrepareError, match="'resize'.*upsamples some axes and downsamples others"):
        quantsim.QuantizationSimModel(model, progress=False)


def test_opset10_nearest_with_computed_scales_warns_and_assumes_upsampling():
    model = _resize_model("Resize", "nearest", [1, 1, 2, 2], 10)
    model.graph.node.insert(1, helper.make_node("Identity", ["scales"], ["computed"], name="computed"))
    model.graph.node[2].input[1] = "computed"
    x = RNG.standard_normal((1, 3, 5, 7)).astype(np.float32)
    expected = _run(model, x)
    with pytest.warns(PrepareWarning, match="'resize'.*computed scales.*floor"):
        upgraded, _ = qp.upgrade_opset(model)
    np.testing.assert_array_equal(_run(upgraded, x), expected)


def test_sim_of_an_opset9_bilinear_upsample_follows_the_float_model():
    """End to end: with its quantizers off the sim is the float model (it was shifted by half a pixel)."""
    model = _resize_model("Upsample", "linear", [1, 1, 2, 2], 9)
    feeds = [{"x": RNG.standard_normal((1, 3, 5, 7)).astype(np.float32)} for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = quantsim.QuantizationSimModel(model, progress=False)
        sim.compute_encodings(feeds)
    expected = _run(model, feeds[0]["x"])
    quantized = sim.session.run(None, feeds[0])[0]
    steps = np.abs(quantized - expected).max() / sim.qc_quantize_op_dict["y"].get_encodings()[0].delta
    assert steps <= 3.0  # half a pixel off is dozens of steps


# Keras ZeroPadding2D -> strided Conv: the sim's int32 bias did not follow the Pad the QDQ export follows -----
def _padded_conv_model(mode):
    w1 = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = RNG.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Pad", ["r"], ["p"], pads=[0, 0, 0, 0, 0, 0, 1, 1], mode=mode, name="pad"),
             helper.make_node("Conv", ["p", "w2", "b2"], ["y"], strides=[2, 2], name="conv2")]
    constants = {"w1": w1, "w2": w2, "b1": RNG.standard_normal(8).astype(np.float32) * 0.1,
                 "b2": RNG.standard_normal(4).astype(np.float32) * 0.1}
    return _model(nodes, [1, 3, 8, 8], constants)


@pytest.mark.parametrize("mode", ["constant", "reflect"])
def test_bias_after_a_pad_is_on_the_int32_grid_in_the_sim_as_in_the_qdq_export(mode):
    model = _padded_conv_model(mode)
    feeds = [{"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings(feeds)
    qdq = sim.to_onnx_qdq()
    producer = {o: n for n in qdq.graph.node for o in n.output}
    constants = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    conv2 = [n for n in qdq.graph.node if n.op_type == "Conv"][-1]
    dequantize = producer[conv2.input[2]]
    assert constants[dequantize.input[0]].dtype == np.int32  # the export adds it on s_in * s_w
    exported = constants[dequantize.input[0]].astype(np.float32) * constants[dequantize.input[1]]
    simulated = next(numpy_helper.to_array(t) for t in sim.sim_model().graph.initializer if t.name == "b2")
    np.testing.assert_array_equal(simulated, exported)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(qdq.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for feed in feeds:
        np.testing.assert_array_equal(session.run(None, feed)[0], sim.session.run(None, feed)[0])


# Keras GlobalMaxPooling2D: GlobalMaxPool stayed float in the integer export ---------------------------------
def test_global_max_pool_runs_on_codes_in_the_integer_export():
    w = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    dense = RNG.standard_normal((8, 5)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalMaxPool", ["r"], ["g"], name="pool"),
             helper.make_node("Squeeze", ["g"], ["s"], axes=[2, 3], name="squeeze"),  # opset-9 axes attribute
             helper.make_node("MatMul", ["s", "dense"], ["m"], name="dense"),
             helper.make_node("Add", ["m", "dense_bias"], ["y"], name="dense_bias")]
    model = _model(nodes, [1, 3, 8, 8], {"w": w, "b": RNG.standard_normal(8).astype(np.float32) * 0.1,
                                         "dense": dense, "dense_bias": RNG.standard_normal(5).astype(np.float32)})
    feeds = [{"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings(feeds)
    integer = sim.export_integer(weight_codes="uint8")
    assert [e.op_type for e in integer.report if e.op_type == "GlobalMaxPool"] == []
    reduce_max = next(n for n in integer.model.graph.node if n.op_type == "ReduceMax")
    producer = {o: n for n in integer.model.graph.node for o in n.output}
    assert producer[reduce_max.input[0]].op_type == "QLinearConv"  # the Relu is the conv's clamp: uint8 codes
    session = ort.InferenceSession(integer.model.SerializeToString(), providers=["CPUExecutionProvider"])
    step = sim.qc_quantize_op_dict["y"].get_encodings()[0].delta
    for feed in feeds:
        assert np.abs(session.run(None, feed)[0] - sim.session.run(None, feed)[0]).max() <= step * 1.01


# Hardmax before opset 13 works on the flattened trailing block; the converter adapts Softmax but not Hardmax --
@pytest.mark.parametrize("axis", [None, 1, 2, 3])
def test_opset9_hardmax_keeps_its_function_through_the_opset_upgrade(axis):
    w = RNG.standard_normal((4, 3, 1, 1)).astype(np.float32)
    kwargs = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Hardmax", ["c"], ["y"], name="hardmax", **kwargs)]
    model = _model(nodes, [2, 3, 4, 5], {"w": w})
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    upgraded, _ = qp.upgrade_opset(onnx.ModelProto.FromString(model.SerializeToString()))
    np.testing.assert_array_equal(_run(upgraded, x), _run(model, x))
    assert [n.name for n in upgraded.graph.node if n.op_type == "Hardmax"] == ["hardmax"]


def test_integer_export_of_an_opset9_pad_keeps_no_unread_constant():
    """The converter gives an opset-9 Pad an explicit float value input; its code replaces it in the integer
    model, which kept the float constant unread (onnxruntime warned about it at every load)."""
    model = _padded_conv_model("constant")
    feeds = [{"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings(feeds)
    integer = sim.export_integer(weight_codes="uint8").model
    pad = next(n for n in integer.graph.node if n.op_type == "Pad")
    assert len(pad.input) == 3  # the uint8 code of the value
    read = {name for node in integer.graph.node for name in node.input}
    assert [t.name for t in integer.graph.initializer if t.name not in read] == []


def test_tensors_the_converter_renamed_keep_their_names_in_the_sim():
    """onnx's version converter names the outputs of the nodes it rewrites ``_v_<n>``: the sim's quantizer and
    encodings names then matched nothing in the user's opset-9 model."""
    model = _resize_model("Upsample", "nearest", [1, 1, 2, 2], 9)
    feeds = [{"x": RNG.standard_normal((1, 3, 5, 7)).astype(np.float32)} for _ in range(2)]
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings(feeds)
    assert "u" in sim.activation_names
    assert not [name for name in sim.activation_names if name.startswith("_v_")]
    assert [n.name for n in sim.prepared_model.graph.node if n.op_type == "Resize"] == ["resize"]


def test_tables_of_ops_with_4d_scalar_constants_build_without_onnxruntime_warnings(capfd):
    """tf2onnx writes a scalar operand as a [1, 1, 1, 1] constant (Keras' hard_sigmoid: Add, Min, Max): the
    lookup-table graph declared a [256] output and onnxruntime printed a shape-merge warning per export."""
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Add", ["c", "half"], ["a"], name="add"),
             helper.make_node("Min", ["a", "one"], ["m"], name="min"),
             helper.make_node("Max", ["m", "zero"], ["y"], name="max")]
    scalar = {"half": 0.5, "one": 1.0, "zero": 0.0}
    model = _model(nodes, [1, 3, 6, 6], {"w": w, **{k: np.full((1, 1, 1, 1), v, np.float32) for k, v in scalar.items()}})
    feeds = [{"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)} for _ in range(2)]
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings(feeds)
    capfd.readouterr()
    integer = sim.export_integer(weight_codes="uint8")
    assert "Error merging shape info" not in capfd.readouterr().err
    session = ort.InferenceSession(integer.model.SerializeToString(), providers=["CPUExecutionProvider"])
    step = sim.qc_quantize_op_dict["y"].get_encodings()[0].delta
    assert np.abs(session.run(None, feeds[0])[0] - sim.session.run(None, feeds[0])[0]).max() <= step * 1.01
