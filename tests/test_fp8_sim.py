"""FP8 quantizers in the sim: calibration (AIMET 2.42's scale rule), the sim graph, encodings files, QDQ export
and import, and the integer export's refusal. Small built models (tests/tiny_cnn.py, tests/models.py).

Oracles: scales worked out from the model's weights and the calibration data by hand (``amax / 448``); the sim's
outputs against its exported QDQ model run by onnx's reference evaluator (an independent runtime); encodings
round-tripped through the files and the QDQ model.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tiny_cnn
from models import matmul
from onnx import TensorProto, numpy_helper
from onnx.reference import ReferenceEvaluator

from quantsim import (
    EncodingMismatchError,
    IntegerExportError,
    QSpec,
    QuantizationDataType,
    QuantizationSimModel,
    float8e4m3fn,
    float8e5m2,
    int8,
    load_encodings_to_sim,
)
from quantsim.errors import EncodingFormatError, InvalidArgumentError

E4M3_MAX, E5M2_MAX = 448.0, 57344.0


def _fp8_sim(param="float8e4m3fn", activation="float8e4m3fn", **kwargs) -> QuantizationSimModel:
    sim = tiny_cnn.new_sim(param_type=param, activation_type=activation, **kwargs)
    sim.compute_encodings(tiny_cnn.batches())
    return sim


def _weights() -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in tiny_cnn.make_model().graph.initializer}


def _ort(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    # onnxruntime 1.32's ReluQuantRewrite drops the Relu before a float8 QuantizeLinear (a zero point of 0 is
    # not the bottom of a float8 range): the sim's own sessions leave it out; so must a direct run
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"],
                                disabled_optimizers=["ReluQuantRewrite"]).run(None, feeds)[0]


def test_min_max_scales_are_amax_over_the_largest_value():
    sim = _fp8_sim(param="float8e5m2")
    w = _weights()["W"]
    x = np.concatenate([b["x"].ravel() for b in tiny_cnn.batches()])
    wq, xq = sim.qc_quantize_op_dict["W"], sim.qc_quantize_op_dict["x"]
    assert (wq.precision(), xq.precision()) == (float8e5m2, float8e4m3fn)
    assert wq.data_type == QuantizationDataType.float and wq.bitwidth == 8
    expected_w = np.abs(w).reshape(w.shape[0], -1).max(axis=1).astype(np.float64) / E5M2_MAX  # per out channel
    assert np.array_equal(wq.encoding.scale, expected_w) and wq.encoding.axis == 0
    assert float(xq.encoding.scale) == float(np.abs(x).max()) / E4M3_MAX
    (enc,) = xq.get_encodings()
    assert (enc.offset, enc.bw, enc.min, enc.max) == (0.0, 8, -enc.delta * E4M3_MAX, enc.delta * E4M3_MAX)
    assert not sim.qc_quantize_op_dict["B"].enabled  # biases stay float (default config), as in AIMET


def test_sim_session_matches_its_qdq_model_on_independent_runtimes():
    sim = _fp8_sim()
    qdq = sim.to_onnx_qdq()
    opset = next(o.version for o in qdq.opset_import if o.domain in ("", "ai.onnx"))
    assert opset >= 19
    zero_points = [t for t in qdq.graph.initializer if t.data_type == TensorProto.FLOAT8E4M3FN]
    assert zero_points and all(not np.any(numpy_helper.to_array(t).astype(np.float32)) for t in zero_points
                               if "zero_point" in t.name)
    assert {t.name: t.data_type for t in qdq.graph.initializer}["B"] == TensorProto.FLOAT  # no int32 bias
    feeds = tiny_cnn.batch(9, n=3)
    sim_out = sim.session.run(None, feeds)[0]
    np.testing.assert_allclose(ReferenceEvaluator(qdq).run(None, feeds)[0], sim_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_ort(qdq, feeds), sim_out)
    # the float8 rounding is really there: off the float model's outputs, on the QDQ reference's
    float_out = ort.InferenceSession(tiny_cnn.make_model().SerializeToString()).run(None, feeds)[0]
    assert np.abs(float_out - sim_out).max() > 1e-3


def test_qdq_weights_are_float8_codes_of_weight_over_scale():
    sim = _fp8_sim()
    w = _weights()["W"]
    enc = sim.qc_quantize_op_dict["W"].encoding
    codes = (w / enc.scale.reshape(-1, 1, 1, 1).astype(np.float32)).astype(np.float32)
    qdq = sim.to_onnx_qdq()
    stored = numpy_helper.to_array(next(t for t in qdq.graph.initializer if t.name == "W/quantized"))
    assert stored.dtype.name == "float8_e4m3fn" and stored.shape == w.shape
    np.testing.assert_array_equal(stored.astype(np.float32), codes.astype(stored.dtype).astype(np.float32))


def test_per_channel_matmul_weights_and_precision_setters():
    model, make_feeds = matmul()
    feeds = make_feeds(0, 4)
    sim = QuantizationSimModel(model, progress=False)
    sim.qc_quantize_op_dict["mm1.w"].set_precision("float8e5m2")
    sim.set_tensor_precision(["relu.out"], float8e4m3fn)
    sim.compute_encodings([feeds])
    wq = sim.qc_quantize_op_dict["mm1.w"]
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "mm1.w"))
    assert wq.encoding.axis == 1 and np.array_equal(wq.encoding.scale, np.abs(w).max(axis=0).astype(np.float64) / E5M2_MAX)
    assert sim.qc_quantize_op_dict["mm2.w"].precision() == int8
    qdq = sim.to_onnx_qdq()
    types = {t.name: t.data_type for t in qdq.graph.initializer}
    assert types["mm1.w/quantized"] == TensorProto.FLOAT8E5M2
    # opset 21: the all-zero float8 zero point is dropped, QuantizeLinear names the type (output_dtype)
    relu_q = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "relu.out/float")
    assert onnx.helper.get_attribute_value(next(a for a in relu_q.attribute if a.name == "output_dtype")) \
        == TensorProto.FLOAT8E4M3FN
    np.testing.assert_allclose(ReferenceEvaluator(qdq).run(None, feeds)[0], sim.session.run(None, feeds)[0],
                               rtol=1e-5, atol=1e-5)


def test_histogram_schemes_take_the_8_bit_grids_largest_magnitude():
    data = tiny_cnn.batches()
    data[0]["x"][0, 0, 0, 0] = 40.0  # an outlier, so TF-enhanced's grid is not the min-max one
    for scheme in ("tf_enhanced", "percentile"):
        fp8 = tiny_cnn.new_sim(param_type="float8e4m3fn", activation_type="float8e4m3fn", quant_scheme=scheme)
        ints = tiny_cnn.new_sim(quant_scheme=scheme)
        fp8.compute_encodings(data)
        ints.compute_encodings(data)
        grid = ints.qc_quantize_op_dict["x"].encoding  # the model input: the same statistics in both sims
        amax = max(abs(float(grid.min)), abs(float(grid.max)))
        assert float(fp8.qc_quantize_op_dict["x"].encoding.scale) == amax / E4M3_MAX, scheme


def test_encodings_2_0_0_entries_and_other_versions_refused(tmp_path):
    sim = _fp8_sim(param="float8e5m2")
    sim.export(tmp_path, "m", encoding_version="2.0.0")
    entries = {e["name"]: e for e in json.loads((tmp_path / "m.encodings").read_text())["encodings"]}
    assert set(entries) == {"W", "W2", "x", "r", "g", "f", "y"}  # f: Flatten's derived entry; no int32 bias
    w_scale = sim.qc_quantize_op_dict["W"].encoding.scale.tolist()
    assert entries["W"] == {"name": "W", "output_dtype": "float8e5m2", "axis": 0, "y_scale": w_scale}
    x_scale = float(sim.qc_quantize_op_dict["x"].encoding.scale)
    assert entries["x"] == {"name": "x", "output_dtype": "float8e4m3fn", "y_scale": x_scale}
    for version in ("0.6.1", "1.0.0"):
        with pytest.raises(EncodingFormatError, match="2.0.0"):
            sim.export(tmp_path, f"v{version}", encoding_version=version)
        assert not list(tmp_path.glob(f"v{version}*"))


def test_encodings_load_back(tmp_path):
    sim = _fp8_sim(param="float8e5m2")
    sim.export(tmp_path, "m", encoding_version="2.0.0")
    feeds = tiny_cnn.batch(4)
    expected = sim.session.run(None, feeds)[0]

    int_sim = tiny_cnn.new_sim()
    with pytest.raises(EncodingMismatchError, match="dtype"):
        load_encodings_to_sim(int_sim, tmp_path / "m.encodings")  # strict: an int8 sim is not float8
    with pytest.warns(UserWarning, match="dtype"):
        mismatches = load_encodings_to_sim(int_sim, tmp_path / "m.encodings", strict=False)
    assert {m.name for m in mismatches} == {"W", "W2", "x", "r", "g", "y"}
    assert int_sim.qc_quantize_op_dict["W"].precision() == float8e5m2
    np.testing.assert_array_equal(int_sim.session.run(None, feeds)[0], expected)

    other = tiny_cnn.new_sim(param_type="float8e5m2", activation_type="float8e4m3fn")
    assert load_encodings_to_sim(other, tmp_path / "m.encodings") == []  # strict, all match
    np.testing.assert_array_equal(other.session.run(None, feeds)[0], expected)

    frozen = tiny_cnn.new_sim(param_type="float8e5m2", activation_type="float8e4m3fn")
    frozen.set_and_freeze_param_encodings(str(tmp_path / "m.encodings"))
    wq = frozen.qc_quantize_op_dict["W"]
    assert wq.is_encoding_frozen() and wq.encoding.same_as(sim.qc_quantize_op_dict["W"].encoding)
    frozen.compute_encodings(tiny_cnn.batches(seed=5))
    assert wq.encoding.same_as(sim.qc_quantize_op_dict["W"].encoding)


def test_quantizer_load_encodings_round_trip_and_bad_input():
    sim = _fp8_sim()
    q = sim.qc_quantize_op_dict["W"]
    before = q.encoding
    records = q.get_encodings()
    q.load_encodings(records)
    assert q.encoding.same_as(before)
    records[0].offset = -3.0
    with pytest.raises(InvalidArgumentError, match="offset 0"):
        q.load_encodings(records)
    assert q.encoding.same_as(before)
    with pytest.raises(InvalidArgumentError, match="per block"):
        q.set_qspec(QSpec.blockwise(float8e4m3fn, 3, axis=0, block_axis=1))
    assert q.spec.dtype == float8e4m3fn


def test_bitwidth_and_data_type_setters_on_float8():
    sim = _fp8_sim(param="float8e5m2")
    q = sim.qc_quantize_op_dict["W"]
    q.set_bitwidth(8)  # same width: the format stays
    assert q.precision() == float8e5m2 and q.encoding is not None
    q.set_bitwidth(16)
    assert q.spec.dtype.bits == 16 and q.spec.is_float and q.encoding is None
    q.set_bitwidth(8)  # AIMET's (float, 8)
    assert q.precision() == float8e4m3fn
    q.data_type = QuantizationDataType.int
    assert q.precision() == int8


def test_from_onnx_qdq_round_trip():
    sim = _fp8_sim(param="float8e5m2")
    qdq = sim.to_onnx_qdq()
    back = QuantizationSimModel.from_onnx_qdq(qdq, param_type="float8e5m2", activation_type="float8e4m3fn",
                                              progress=False)
    for name in ("W", "W2", "x", "r", "g", "y"):
        mine, theirs = sim.qc_quantize_op_dict[name], back.qc_quantize_op_dict[name]
        assert theirs.precision() == mine.precision() and theirs.encoding.axis == mine.encoding.axis, name
        # a QDQ model holds float32 scales
        assert np.array_equal(theirs.encoding.scale, mine.encoding.scale.astype(np.float32)), name
    feeds = tiny_cnn.batch(2)
    np.testing.assert_array_equal(back.session.run(None, feeds)[0], sim.session.run(None, feeds)[0])


def test_legacy_float_8_bit_arguments_mean_float8e4m3fn():
    with pytest.warns(DeprecationWarning):
        sim = QuantizationSimModel(tiny_cnn.make_model(), default_param_bw=8, default_activation_bw=8,
                                   default_data_type=QuantizationDataType.float, progress=False)
    assert (sim.param_type, sim.activation_type) == (float8e4m3fn, float8e4m3fn)
    assert sim.qc_quantize_op_dict["x"].precision() == float8e4m3fn


def test_export_integer_refuses_float8_with_the_reason():
    sim = _fp8_sim()
    with pytest.raises(IntegerExportError, match="float8.*to_onnx_qdq"):
        sim.export_integer()


def test_fused_session_keeps_the_relu_before_a_float8_quantizer():
    # onnxruntime 1.32's ReluQuantRewrite drops that Relu (test_sim_session_matches_its_qdq_model...); the fused
    # session (onnxruntime's Q/DQ fusions allowed) must leave the rewrite out for float8 models
    sim = _fp8_sim()
    feeds = tiny_cnn.batch(9, n=3)
    np.testing.assert_array_equal(sim.fused_session().run(None, feeds)[0], sim.session.run(None, feeds)[0])


def test_encodings_to_onnx_qdq_with_a_float8_file(tmp_path):
    from quantsim import encodings_to_onnx_qdq

    sim = _fp8_sim()
    sim.export(tmp_path, "m", encoding_version="2.0.0")
    with pytest.warns(UserWarning, match="dtype"):  # the default int8 sim is told float8 by the file
        qdq = encodings_to_onnx_qdq(tiny_cnn.make_model(), tmp_path / "m.encodings")
    feeds = tiny_cnn.batch(5)
    np.testing.assert_array_equal(_ort(qdq, feeds), sim.session.run(None, feeds)[0])


@pytest.mark.parametrize("activation", ["float8e4m3fn", "float8e5m2"])
def test_integer_weights_with_float8_activations_keep_float_biases_in_the_qdq_export(activation):
    """int8 weights behind float8 activations: no integer accumulator exists (float8 input values are not
    integer multiples of s_in), so the sim adds the float bias and the export must too. The export read the
    float8 Q -> DQ pair's type from value_info the built graph lacks, took it for uint8 and wrote an int32 bias
    on s_in * s_w: the unfused QDQ model then differed from the sim (1.4% of the output range on tests/models.py conv_relu)."""
    sim = _fp8_sim(param="int8", activation=activation)
    qdq = sim.to_onnx_qdq()
    assert {t.name: t.data_type for t in qdq.graph.initializer}["B"] == TensorProto.FLOAT
    assert not any(t.data_type == TensorProto.INT32 for t in qdq.graph.initializer)
    feeds = tiny_cnn.batch(9, n=3)
    unfused = ort.SessionOptions()
    unfused.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(qdq.SerializeToString(), unfused, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(got, sim.session.run(None, feeds)[0])
    np.testing.assert_allclose(ReferenceEvaluator(qdq).run(None, feeds)[0], got, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("build", ["conv_relu", "matmul"])
def test_aimet_form_stores_the_float8_weights_the_sim_uses(build):
    """prequantize_constants=False (AIMET's form, and encodings_to_onnx_qdq's default) writes each weight as
    its fake-quantized float values. For float8 codes those were computed through int64, which truncates
    (4.5 -> 4): 11 of conv_relu's 216 first-layer weights were off by a float8 step, its output by 1.1%."""
    model, feeds = matmul() if build == "matmul" else _conv_relu()
    sim = QuantizationSimModel(model, param_type="float8e4m3fn", activation_type="int8", progress=False)
    sim.compute_encodings([feeds(i, 2) for i in range(3)])
    qdq = sim.to_onnx_qdq(prequantize_constants=False)
    floats = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer if t.name.endswith("/float")}
    assert floats
    for name, values in floats.items():
        weight = name.rsplit("/", 1)[0]
        original = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == weight))
        np.testing.assert_array_equal(values, sim.qc_quantize_op_dict[weight].quantize_dequantize(original))
    feed = feeds(7, 2)
    unfused = ort.SessionOptions()
    unfused.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(qdq.SerializeToString(), unfused, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_array_equal(got, sim.session.run(None, feed)[0])


def _conv_relu():
    from models import conv_relu
    return conv_relu()
