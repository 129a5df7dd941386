"""int32 bias overflow: weight scales are widened after calibration so every bias fits ``s_in * s_w``.

An EfficientNet-Lite-like stem (tiny input scale, large bias) used to keep its Conv in float in the
integer export ("bias does not fit int32") and saturate the int32 bias in the QDQ export. Oracle: the
hand-computed bound ``|b| / (s_in s_w) <= 2^31 - 1`` and the sim's own outputs.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantsim
from quantsim.core.bias import int32_fitting_weight_scale, quantize_bias
from quantsim.export.reference import compare_with_onnxruntime

INT32_MAX = 2**31 - 1


def _stem_model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.01).astype(np.float32)
    w1[0] *= 0.01  # one channel with tiny weights: only it overflows
    b1 = np.linspace(-4, 4, 8).astype(np.float32)
    w2 = (rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="stem", pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"], name="relu6"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="head")]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"),
                                                        (np.zeros(4, np.float32), "b2"),
                                                        (np.float32(0), "lo"), (np.float32(6), "hi"))]
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feed(seed: int, n: int = 2) -> dict:
    return {"x": (np.random.default_rng(seed).random((n, 3, 8, 8)) * 1e-3).astype(np.float32)}  # tiny input grid


def _sim() -> quantsim.QuantizationSimModel:
    sim = quantsim.QuantizationSimModel(_stem_model(), progress=False)
    sim.compute_encodings([_feed(i) for i in range(3)])
    return sim


def test_fitting_scale_only_widens_the_overflowing_channels():
    bias = np.array([1.0, 1e-3, -5.0])
    scale = np.array([1e-6, 1e-6, 1e-2])
    fitted = int32_fitting_weight_scale(bias, 1e-4, scale)
    assert fitted is not None and fitted[1] == scale[1] and fitted[2] == scale[2] and fitted[0] > scale[0]
    codes, _ = quantize_bias(bias, 1e-4, fitted)
    assert np.abs(codes.astype(np.int64)).max() <= INT32_MAX and abs(int(codes[0])) > 0.999 * INT32_MAX
    assert int32_fitting_weight_scale(bias, 1.0, scale) is None
    per_tensor = int32_fitting_weight_scale(bias, 1e-4, 1e-6)
    assert per_tensor is not None and np.ndim(per_tensor) == 0 and 5.0 / (1e-4 * per_tensor) <= INT32_MAX


@pytest.mark.int8_kernels
def test_stem_conv_with_a_large_bias_stays_integer_and_all_exports_agree(tmp_path):
    sim = _sim()
    x_scale = float(sim.qc_quantize_op_dict["x"].encoding.scale)
    w_enc = sim.qc_quantize_op_dict["w1"].encoding
    ratio = np.abs(np.linspace(-4, 4, 8)) / (np.float32(x_scale) * w_enc.scale.astype(np.float32))
    assert ratio.max() <= INT32_MAX and ratio.max() > 0.99 * INT32_MAX  # widened just enough
    # the integer export lowers the stem (it used to run in float) and matches the sim and the executor
    exported = sim.export_integer()
    assert exported.report == [] and "QLinearConv" in {n.op_type for n in exported.model.graph.node}
    feed = _feed(10, 4)
    session = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    y_scale = float(sim.qc_quantize_op_dict["y"].encoding.scale)
    steps = np.abs(session.run(None, feed)[0] - sim.session.run(None, feed)[0]) / y_scale
    assert steps.max() <= 1.001
    for name, result in compare_with_onnxruntime(exported.model, feed).items():
        assert result["max_lsb_diff"] <= 1, (name, result)
    # the QDQ export's int32 bias is not saturated, and the encodings file carries the widened scale
    qdq = sim.to_onnx_qdq()
    bias_codes = [numpy_helper.to_array(t) for t in qdq.graph.initializer if t.data_type == TensorProto.INT32]
    assert bias_codes and all(np.abs(c.astype(np.int64)).max() < INT32_MAX for c in bias_codes)
    qdq_out = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert np.abs(qdq_out - sim.session.run(None, feed)[0]).max() / y_scale <= 1.001
    sim.export(str(tmp_path), "stem")
    saved = {e["name"]: e for e in json.loads((tmp_path / "stem.encodings").read_text())["param_encodings"]}
    assert np.allclose(saved["w1"]["scale"], w_enc.scale, rtol=1e-6)


def test_frozen_weight_encoding_is_left_alone_and_reported():
    sim = quantsim.QuantizationSimModel(_stem_model(), progress=False)
    sim.compute_param_encodings()
    frozen = sim.qc_quantize_op_dict["w1"].encoding
    sim.qc_quantize_op_dict["w1"].freeze_encodings()
    sim.compute_encodings([_feed(i) for i in range(3)])
    assert sim.qc_quantize_op_dict["w1"].encoding.same_as(frozen)
    reasons = {r.node: r.reason for r in sim.export_integer().report}
    assert "does not fit int32" in reasons["stem"]
