"""AIMET's exception rules for norm layers' parameter quantizers (reference §1.3 step 8) and its int32 bias
entries (§1.7) on small built models: BatchNormalization / LayerNormalization parameters are asymmetric below
16 bits and never under 8; Group/Instance normalization parameters follow the output quantizer; a 2.0.0 export
writes an analytic ``s_in * s_w`` int32 bias for Conv and a statistical ``max|b| / 2^31`` one for norm layers.
Compared live with aimet-onnx behind a skip."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel, int4, int8, int16
from quantsim.encodings.int32_bias import INT32_MINIMUM_SCALE, statistical_bias_scale
from tests.bn_models import conv_bn_relu, input_feed

KEEP_BN = {"fold_batchnorm": False, "range_health": False, "depthwise_supergroups": False}


def _norm_model(op_type: str, opset: int = 21) -> onnx.ModelProto:
    """x[1,4,6,6] -> Conv 1x1 -> <norm op with scale/bias> -> y."""
    rng = np.random.default_rng(3)
    c = 4
    inits = [numpy_helper.from_array(rng.normal(0, .5, (c, c, 1, 1)).astype(np.float32), "conv.weight"),
             numpy_helper.from_array(rng.uniform(0.5, 2.0, c if op_type != "LayerNormalization" else 6).astype(np.float32),
                                     "norm.scale"),
             numpy_helper.from_array(rng.normal(0, .3, c if op_type != "LayerNormalization" else 6).astype(np.float32),
                                     "norm.bias")]
    attrs = {"num_groups": c} if op_type == "GroupNormalization" else {}
    nodes = [helper.make_node("Conv", ["x", "conv.weight"], ["conv_out"], name="conv"),
             helper.make_node(op_type, ["conv_out", "norm.scale", "norm.bias"], ["y"], name="norm", **attrs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    return model


def _sim(model, **kwargs) -> QuantizationSimModel:
    sim = QuantizationSimModel(model, progress=False, **{**KEEP_BN, **kwargs})
    sim.compute_encodings([input_feed(model)])
    return sim


@pytest.mark.parametrize("param_type, bits, symmetric", [(int8, 8, False), (int4, 8, False), (int16, 16, True)])
def test_batchnorm_scale_is_asymmetric_below_16_bits_and_at_least_8(param_type, bits, symmetric):
    sim = _sim(conv_bn_relu(), param_type=param_type)
    q = sim.qc_quantize_op_dict["bn.scale"]
    assert (q.enabled, q.bitwidth, q.use_symmetric_encodings) == (True, bits, symmetric)
    assert sim.qc_quantize_op_dict["conv.weight"].use_symmetric_encodings  # other params keep the config's symmetry
    if not symmetric:  # gamma is all positive: the asymmetric grid starts at 0 and spends every code on its range
        enc = q.get_encodings()[0]
        gamma = numpy_helper.to_array(next(i for i in conv_bn_relu().graph.initializer if i.name == "bn.scale"))
        assert enc.min == 0.0 and enc.max == pytest.approx(float(gamma.max()), rel=1e-6)


@pytest.mark.parametrize("param_type, bits, symmetric", [(int8, 8, False), (int16, 16, True)])
def test_layernorm_params_follow_the_batchnorm_rule(param_type, bits, symmetric):
    sim = _sim(_norm_model("LayerNormalization", 17), param_type=param_type)
    q = sim.qc_quantize_op_dict["norm.scale"]
    assert (q.bitwidth, q.use_symmetric_encodings) == (bits, symmetric)


@pytest.mark.parametrize("op_type", ["GroupNormalization", "InstanceNormalization"])
def test_group_and_instance_norm_params_copy_the_output_quantizer(op_type):
    sim = _sim(_norm_model(op_type), activation_type=int16)
    q, out = sim.qc_quantize_op_dict["norm.scale"], sim.qc_quantize_op_dict["y"]
    assert out.enabled and (out.bitwidth, out.use_symmetric_encodings) == (16, False)
    assert (q.bitwidth, q.use_symmetric_encodings) == (16, False)
    sym_cfg = {"defaults": {"ops": {"is_output_quantized": "True", "is_symmetric": "True"},
                            "params": {"is_quantized": "True", "is_symmetric": "False"}, "per_channel_quantization": "True"},
               "params": {}, "op_type": {}, "supergroups": [], "model_input": {"is_input_quantized": "True"},
               "model_output": {}}
    sim = _sim(_norm_model(op_type), config_file=sym_cfg)
    q = sim.qc_quantize_op_dict["norm.scale"]
    assert (q.bitwidth, q.use_symmetric_encodings) == (8, True)


def _entries(tmp_path, sim) -> dict[str, dict]:
    sim.export(str(tmp_path), "m", encoding_version="2.0.0")
    return {e["name"]: e for e in json.loads((tmp_path / "m.encodings").read_text())["encodings"]}


def test_export_writes_analytic_conv_bias_and_statistical_bn_bias(tmp_path):
    model = conv_bn_relu()
    sim = _sim(model)
    entries = _entries(tmp_path, sim)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    s_in = sim.qc_quantize_op_dict["x"].get_encodings()[0].delta
    s_w = np.array([e.delta for e in sim.qc_quantize_op_dict["conv.weight"].get_encodings()])
    conv_bias = entries["conv.bias"]
    assert conv_bias["output_dtype"] == "int32" and conv_bias["axis"] == 0 and "y_zero_point" not in conv_bias
    np.testing.assert_allclose(conv_bias["y_scale"], np.float32(s_in) * s_w.astype(np.float32), rtol=1e-6)
    bn_bias = entries["bn.B"]
    assert bn_bias["output_dtype"] == "int32" and "axis" not in bn_bias  # bn.scale is per tensor
    assert bn_bias["y_scale"] == pytest.approx(float(np.abs(values["bn.B"]).max()) / 2**31, rel=1e-12)
    assert entries["bn.scale"]["output_dtype"] == "uint8"


def test_statistical_bias_scale_has_a_floor_and_a_per_tensor_maximum():
    np.testing.assert_array_equal(statistical_bias_scale(np.zeros(3, np.float32), True), [INT32_MINIMUM_SCALE] * 3)
    assert float(statistical_bias_scale(np.array([1.0, -4.0], np.float32), False)) == 4.0 / 2**31


def test_layernorm_bias_is_statistical_and_no_bias_without_a_quantized_input(tmp_path):
    model = _norm_model("LayerNormalization", 17)
    entries = _entries(tmp_path, _sim(model))
    bias = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "norm.bias"))
    assert entries["norm.bias"]["y_scale"] == pytest.approx(float(np.abs(bias).max()) / 2**31, rel=1e-12)
    sim = QuantizationSimModel(model, progress=False, **KEEP_BN)
    sim.qc_quantize_op_dict["conv_out"].enabled = False  # the LayerNorm input has no integer grid
    sim.compute_encodings([input_feed(model)])
    assert "norm.bias" not in _entries(tmp_path, sim)


def test_int32_bias_entries_match_aimet(tmp_path):
    pytest.importorskip("aimet_onnx")
    from aimet_onnx.quantsim import QuantizationSimModel as AimetSim
    model = conv_bn_relu()
    aimet = AimetSim(model)
    aimet.compute_encodings([input_feed(model)])
    aimet.export(str(tmp_path), "a", encoding_version="2.0.0")
    theirs = {e["name"]: e for e in json.loads((tmp_path / "a.encodings").read_text())["encodings"]}
    ours = _entries(tmp_path, _sim(model))
    for name in ("conv.bias", "bn.B", "bn.scale"):
        assert ours[name]["output_dtype"] == theirs[name]["output_dtype"], name
        np.testing.assert_allclose(ours[name]["y_scale"], theirs[name]["y_scale"], rtol=1e-5, err_msg=name)


def _qdq_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def _run(model: onnx.ModelProto, feed) -> np.ndarray:
    import onnxruntime as ort
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _bias_dq(model: onnx.ModelProto, bias: str) -> tuple[np.ndarray, np.ndarray]:
    node = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == bias)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return inits[node.input[0]], inits[node.input[1]]


def test_qdq_export_gives_the_batchnorm_bias_a_statistical_int32_grid():
    model = conv_bn_relu()
    sim = _sim(model)
    qdq = sim.to_onnx_qdq(export_int32_bias=True)
    codes, scale = _bias_dq(qdq, "bn.B")
    bias = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "bn.B"))
    assert codes.dtype == np.int32 and scale.shape == () and scale == np.float32(np.abs(bias).max() / 2**31)
    np.testing.assert_allclose(codes * np.float64(scale), bias, atol=float(scale) / 2)  # rounding: half a step
    float_bias = sim.to_onnx_qdq(export_int32_bias=False)
    assert not any(n.op_type == "DequantizeLinear" and n.output[0] == "bn.B" for n in float_bias.graph.node)
    feed = input_feed(model, 4)
    np.testing.assert_allclose(_run(qdq, feed), _run(float_bias, feed), atol=1e-6)


def test_encodings_to_onnx_qdq_applies_a_kept_batchnorm_file_as_given(tmp_path):
    """A file written with BatchNormalization kept (names bn.scale, bn.B, conv_out) is applied to the model as
    it is: no fold, so every entry finds its tensor and the QDQ model is the sim's own export."""
    from quantsim import encodings_to_onnx_qdq
    model = conv_bn_relu(depthwise=True)
    sim = _sim(model)
    _entries(tmp_path, sim)
    qdq = encodings_to_onnx_qdq(conv_bn_relu(depthwise=True), str(tmp_path / "m.encodings"))
    own = sim.to_onnx_qdq(export_int32_bias=True, prequantize_constants=False)
    assert _qdq_counts(qdq) == _qdq_counts(own)
    dq_outputs = {n.output[0] for n in qdq.graph.node if n.op_type == "DequantizeLinear"}
    assert {"conv.bias", "bn.B"} <= dq_outputs and any(o.startswith("conv_out") for o in dq_outputs)
    feed = input_feed(model, 4)
    np.testing.assert_array_equal(_run(qdq, feed), _run(own, feed))


def test_encodings_to_onnx_qdq_matches_aimet_on_a_kept_batchnorm_file(tmp_path):
    pytest.importorskip("aimet_onnx")
    import aimet_onnx
    from aimet_onnx.quantsim import QuantizationSimModel as AimetSim

    from quantsim import encodings_to_onnx_qdq
    model = conv_bn_relu(depthwise=True)
    aimet = AimetSim(model)
    aimet.compute_encodings([input_feed(model)])
    aimet.export(str(tmp_path), "a", encoding_version="2.0.0")
    encodings = json.loads((tmp_path / "a.encodings").read_text())
    theirs = aimet_onnx.encodings_to_onnx_qdq(conv_bn_relu(depthwise=True), json.loads(json.dumps(encodings)))
    ours = encodings_to_onnx_qdq(conv_bn_relu(depthwise=True), encodings)
    assert _qdq_counts(ours) == _qdq_counts(theirs)
    feed = input_feed(model, 4)
    np.testing.assert_allclose(_run(ours, feed), _run(theirs, feed), atol=1e-5)


def test_matmul_add_bias_gets_the_analytic_per_column_scale(tmp_path):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, .5, (6, 5)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(0, .5, (5,)).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "b"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings([{"x": rng.standard_normal((2, 6)).astype(np.float32)}])
    entry = _entries(tmp_path, sim)["b"]
    s_in = sim.qc_quantize_op_dict["x"].get_encodings()[0].delta
    s_w = np.array([e.delta for e in sim.qc_quantize_op_dict["W"].get_encodings()], np.float32)  # one per column
    assert entry["output_dtype"] == "int32" and entry["axis"] == 0
    np.testing.assert_allclose(entry["y_scale"], np.float32(s_in) * s_w, rtol=1e-6)


def test_apply_exception_rules_restores_the_norm_rule_after_a_precision_change():
    from quantsim import apply_exception_rules
    sim = _sim(conv_bn_relu())
    q = sim.qc_quantize_op_dict["bn.scale"]
    q.set_precision(int4)
    q.use_symmetric_encodings = True
    sim.qc_quantize_op_dict["conv.weight"].set_precision(int4)
    assert apply_exception_rules(sim) == ["bn.scale"]
    assert (q.bitwidth, q.use_symmetric_encodings) == (8, False)
    assert sim.qc_quantize_op_dict["conv.weight"].bitwidth == 4  # other parameters keep what they were given
    assert apply_exception_rules(sim) == []  # nothing left to change


def test_mixed_precision_never_takes_a_batchnorm_scale_below_8_bits(tmp_path):
    from mixed_precision import CallbackFunc, choose_mixed_precision
    from quantsim import QuantizationDataType
    model = conv_bn_relu()
    feeds = [input_feed(model, s) for s in range(3)]
    sim = _sim(model, param_type=int4)
    i = QuantizationDataType.int
    fp32 = _run(model, feeds[0])

    def closeness(session, _):
        out = session.run(None, feeds[0])[0]
        return float(1 - np.linalg.norm(out - fp32) / np.linalg.norm(fp32))

    forward = CallbackFunc(lambda session, batches: [session.run(None, f) for f in batches], feeds)
    choose_mixed_precision(sim, [((8, i), (4, i)), ((8, i), (8, i))], CallbackFunc(closeness), CallbackFunc(closeness),
                           1.0, str(tmp_path / "amp"), True, forward)  # any drop allowed: 4-bit weights everywhere
    assert sim.qc_quantize_op_dict["conv.weight"].bitwidth == 4
    q = sim.qc_quantize_op_dict["bn.scale"]
    assert (q.bitwidth, q.use_symmetric_encodings) == (8, False)
