"""float16 and float64 models end to end: sim, calibration, encodings export/reload, QDQ export."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from tiny_cnn import make_model  # tests/tiny_cnn.py

from quantsim import IntegerExportError, QuantizationSimModel, load_encodings_to_sim


def _mlp() -> onnx.ModelProto:
    """x[N,8] -> MatMul -> Add -> Relu -> MatMul -> y[N,4] (ops onnxruntime's CPU provider runs in float64)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "B1"),
             numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "W2")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["m"], name="mm1"), helper.make_node("Add", ["m", "B1"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"), helper.make_node("MatMul", ["r", "W2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", 1, ["N", 8])],
                              [helper.make_tensor_value_info("y", 1, ["N", 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _as(model: onnx.ModelProto, dtype) -> onnx.ModelProto:
    """The same model computing in ``dtype`` (weights converted, inputs/outputs retyped)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    for tensor in converted.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(dtype), tensor.name))
    for value in (*converted.graph.input, *converted.graph.output):
        value.type.tensor_type.elem_type = elem
    return converted


CASES = [("float16", make_model, (2, 3, 8, 8)), ("float16", _mlp, (4, 8)), ("float64", _mlp, (4, 8))]


def _feeds(shape, dtype, count=3):
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal(shape).astype(dtype)} for _ in range(count)]


@pytest.mark.parametrize("dtype,build,shape", CASES, ids=[f"{d}-{b.__name__}" for d, b, _ in CASES])
def test_a_non_float32_model_calibrates_simulates_and_exports(tmp_path, dtype, build, shape):
    model = _as(build(), dtype)
    feeds = _feeds(shape, dtype)
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings(feeds)
    out = sim.session.run(None, feeds[0])[0]
    assert out.dtype == np.dtype(dtype)  # the model keeps its own types
    # oracle: the float32 model's sim with the very same encodings (exported and loaded by tensor name)
    sim.export(str(tmp_path), "m", qdq=True)
    reference = QuantizationSimModel(build(), progress=False)
    load_encodings_to_sim(reference, str(tmp_path / "m.encodings"))
    expected = reference.session.run(None, {"x": feeds[0]["x"].astype(np.float32)})[0]
    step = float(np.asarray(sim.qc_quantize_op_dict["y"].encoding.scale))
    # float64 computes more exactly than float32: at most a one-step flip; float16 rounding adds a few more
    tolerance = 1.01 if dtype == "float64" else 3.01
    assert np.abs(out.astype(np.float64) - expected).max() <= tolerance * step
    # the QDQ export runs on onnxruntime in the model's type and agrees with the sim
    qdq = ort.InferenceSession(str(tmp_path / "m.qdq.onnx"), providers=["CPUExecutionProvider"])
    exported = qdq.run(None, feeds[0])[0]
    assert exported.dtype == np.dtype(dtype)
    assert np.abs(exported.astype(np.float64) - out).max() <= tolerance * step
    # a reload reproduces the sim exactly
    again = QuantizationSimModel(model, progress=False)
    load_encodings_to_sim(again, str(tmp_path / "m.encodings"))
    assert np.array_equal(again.session.run(None, feeds[0])[0], out)


def test_integer_export_keeps_float16_io_and_says_what_runs_instead_of_float64():
    sim = QuantizationSimModel(_as(_mlp(), np.float16), progress=False)
    feeds = _feeds((4, 8), np.float16)
    sim.compute_encodings(feeds)
    exported = sim.export_integer(weight_codes="uint8")  # exact on every CPU
    assert exported.report == []
    assert [v.type.tensor_type.elem_type for v in (*exported.model.graph.input, *exported.model.graph.output)] == \
        [onnx.TensorProto.FLOAT16] * 2
    got = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    want = sim.session.run(None, feeds[0])[0]
    step = float(np.asarray(sim.qc_quantize_op_dict["y"].encoding.scale))
    assert got.dtype == np.float16 and np.round(np.abs(got.astype(np.float64) - want) / step).max() <= 1
    sim = QuantizationSimModel(_as(_mlp(), np.float64), progress=False)
    sim.compute_encodings(_feeds((4, 8), np.float64))
    with pytest.raises(IntegerExportError, match="computes in DOUBLE.*QDQ export"):
        sim.export_integer()


def test_fp16_precision_on_a_float16_model_is_exact_and_float64_rounds_to_half():
    for dtype in (np.float16, np.float64):
        sim = QuantizationSimModel(_as(_mlp(), dtype), progress=False)
        sim.compute_encodings(_feeds((4, 8), dtype))
        for q in sim.quantizers:
            q.enabled = q.name == "r"
        sim.qc_quantize_op_dict["r"].set_precision("float16")
        feed = _feeds((4, 8), dtype, 1)[0]
        float_model = ort.InferenceSession(_as(_mlp(), dtype).SerializeToString(), providers=["CPUExecutionProvider"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = sim.session.run(None, feed)[0]
        want = float_model.run(None, feed)[0]
        if dtype == np.float16:
            assert np.array_equal(got, want)  # rounding a float16 tensor to float16 changes nothing
        else:
            assert not np.array_equal(got, want) and np.allclose(got, want, rtol=2e-3, atol=2e-3)
