"""A Relu / Clip before a float8 QuantizeLinear in the QDQ export: onnxruntime's default session must compute
what the sim computes (its Relu/Clip-into-Q rewrites dropped them: output wrong by most of its range), and the
model read back has the Relu / Clip again."""
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantsim


def _model(activation: str) -> tuple:
    rng = np.random.default_rng(0)
    act = [helper.make_node("Relu", ["c0"], ["r0"], name="act")] if activation == "relu" else [
        helper.make_node("Clip", ["c0", "lo", "hi"], ["r0"], name="act")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"), *act,
             helper.make_node("Conv", ["r0", "w1", "b1"], ["y"], name="conv1")]
    inits = [numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32) * 0.3, "w0"),
             numpy_helper.from_array(rng.normal(size=8).astype(np.float32) * 0.1, "b0"),
             numpy_helper.from_array(rng.normal(size=(4, 8, 1, 1)).astype(np.float32) * 0.3, "w1"),
             numpy_helper.from_array(rng.normal(size=4).astype(np.float32) * 0.1, "b1"),
             numpy_helper.from_array(np.array(0.5, np.float32), "lo"), numpy_helper.from_array(np.array(2.0, np.float32), "hi")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    data = [{"x": rng.normal(size=(1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    return model, data


@pytest.mark.parametrize("dtype", ["float8e4m3fn", "float8e5m2"])
@pytest.mark.parametrize("activation", ["relu", "clip"])
def test_default_session_runs_the_float8_export_as_the_sim(dtype, activation):
    model, data = _model(activation)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = quantsim.QuantizationSimModel(model, activation_type=dtype, param_type=dtype, progress=False)
        sim.compute_encodings(data)
        qdq = sim.to_onnx_qdq()
    ops = [n.op_type for n in qdq.graph.node]
    assert "Relu" not in ops and "Clip" not in ops and "Max" in ops
    default = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in data:  # float accumulation order may move a near-tie by one float8 step; a dropped Relu moves most
        got, want = default.run(None, feed)[0], sim.session.run(None, feed)[0]
        assert np.mean(got != want) <= 0.01 and np.abs(got - want).max() <= 0.05 * np.abs(want).max()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = quantsim.QuantizationSimModel.from_onnx_qdq(qdq, progress=False)
    assert [n.op_type for n in back.model.graph.node] == [n.op_type for n in model.graph.node]
    for feed in data:
        np.testing.assert_array_equal(back.session.run(None, feed)[0], sim.session.run(None, feed)[0])


def test_integer_grids_keep_their_relu():
    """uint8/int8 grids: the rewrite is right there (the clamp is redundant), and the export is unchanged."""
    model, data = _model("relu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = quantsim.QuantizationSimModel(model, progress=False)
        sim.compute_encodings(data)
        qdq = sim.to_onnx_qdq()
    assert "Relu" in [n.op_type for n in qdq.graph.node]


def test_a_float16_models_relu_reaching_the_quantizer_through_a_cast_is_kept():
    """A float16 model quantizes a float32 view: Relu(fp16) -> Cast(float) -> float8 Q. onnxruntime removes the
    Cast pair around its own float32 Relu before ReluQuantRewrite runs, and the Relu was dropped in a default
    session (an MLP's output wrong by 1.5 of 1.9)."""
    from fp16_models import fp16_mlp
    model = fp16_mlp()
    rng = np.random.default_rng(0)
    shape = [d.dim_value or 2 for d in model.graph.input[0].type.tensor_type.shape.dim]
    data = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = quantsim.QuantizationSimModel(model, activation_type="float8e4m3fn", param_type="float8e4m3fn",
                                            progress=False)
        sim.compute_encodings(data[:3])
        qdq = sim.to_onnx_qdq()
    assert "Relu" not in [n.op_type for n in qdq.graph.node]
    default = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in data:  # float16 accumulation order may move a near-tie by one float8 step; a dropped Relu moves most
        got, want = default.run(None, feed)[0], sim.session.run(None, feed)[0]
        assert np.abs(got - want).max() <= 0.12 * np.abs(want).max()
