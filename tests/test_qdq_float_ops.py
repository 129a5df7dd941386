"""QDQ export of weighted ops whose activation input the sim keeps float.

Regression (issue 13): such an op (magika's Conv behind float LayerNorm statistics) kept
``DequantizeLinear`` on its weight, which onnxruntime runs at every inference and which takes the Conv off
its blocked NCHWc kernels (2.8x slower than FP32). The export now stores the fake-quantized float weight
there; an op whose input is quantized keeps its integer weight + DequantizeLinear for fusion.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel
from quantsim.core.numerics import fake_quantize
from tests import tiny_cnn


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _exact(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_float_input_conv_gets_a_float_weight_and_quantized_gemm_keeps_its_dq():
    sim = tiny_cnn.new_sim()
    sim.qc_quantize_op_dict["x"].enabled = False  # the Conv reads a float tensor
    sim.compute_encodings(tiny_cnn.batches())
    qdq = sim.to_onnx_qdq()
    producers, inits = _producers(qdq), _initializers(qdq)
    conv = next(n for n in qdq.graph.node if n.op_type == "Conv")
    gemm = next(n for n in qdq.graph.node if n.op_type == "Gemm")
    assert conv.input[1] == "W" and "W" not in producers and inits["W"].dtype == np.float32
    weight_q = sim.qc_quantize_op_dict["W"]
    expected = fake_quantize(sim.get_weight("W"), weight_q.encoding)
    np.testing.assert_array_equal(inits["W"], expected.astype(np.float32))
    assert producers[gemm.input[0]].op_type == "DequantizeLinear"
    assert producers[gemm.input[1]].op_type == "DequantizeLinear"  # fused by onnxruntime: codes stay
    assert producers[gemm.input[2]].op_type == "DequantizeLinear"  # int32 bias
    assert sum(n.op_type == "DequantizeLinear" and n.input[0] in inits and inits[n.input[0]].ndim == 4
               for n in qdq.graph.node) == 0
    exact = _exact(sim.to_onnx_qdq(int32_bias=False))
    for seed in (10, 11):
        feed = tiny_cnn.batch(seed)
        np.testing.assert_array_equal(exact.run(None, feed)[0], sim.session.run(None, feed)[0])


def _shared_weight_model() -> onnx.ModelProto:
    """a -> MatMul(W) -> u ; b -> Relu -> MatMul(W) -> v: one weight, one float-input and one quantized use."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "W")
    nodes = [
        helper.make_node("ReduceSum", ["a", "axes"], ["s"], name="stat", keepdims=1),
        helper.make_node("Sqrt", ["s"], ["root"], name="root"),
        helper.make_node("Div", ["a", "root"], ["n"], name="norm"),
        helper.make_node("MatMul", ["n", "W"], ["u"], name="mm_float"),
        helper.make_node("Relu", ["b"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W"], ["v"], name="mm_quant"),
    ]
    graph = helper.make_graph(
        nodes, "shared",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 8]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("u", TensorProto.FLOAT, ["N", 6]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, ["N", 6])],
        [w, numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.int8_kernels
def test_shared_weight_keeps_its_dq_for_the_quantized_use_and_a_float_copy_for_the_other():
    model = _shared_weight_model()
    rng = np.random.default_rng(0)
    feeds = [{"a": np.abs(rng.standard_normal((4, 8))).astype(np.float32) + 0.1,
              "b": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(4)]
    sim = QuantizationSimModel(model, progress=False)
    sim.qc_quantize_op_dict["n"].enabled = False  # whatever placement chose, this input is float now
    sim.compute_encodings(feeds)
    qdq = sim.to_onnx_qdq()
    producers = _producers(qdq)
    by_name = {n.name: n for n in qdq.graph.node}
    float_use, quant_use = by_name["mm_float"], by_name["mm_quant"]
    assert float_use.input[1] != "W" and float_use.input[1] not in producers
    assert producers[quant_use.input[1]].op_type == "DequantizeLinear"
    exact = _exact(sim.to_onnx_qdq(int32_bias=False))
    default = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = feeds[0]
    reference = sim.session.run(None, feed)
    for a, b in zip(reference, exact.run(None, feed)):
        np.testing.assert_array_equal(a, b)
    step = float(sim.qc_quantize_op_dict["v"].encoding.scale)
    np.testing.assert_array_equal(default.run(None, feed)[0], reference[0])  # float MatMul: same kernel
    assert np.abs(default.run(None, feed)[1] - reference[1]).max() <= step * 1.0001


def _chain_model() -> onnx.ModelProto:
    """x -> MatMul(W1) -> Reshape -> Transpose -> Reshape -> MatMul(W2) -> y: attention's head merge."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W2"),
             numpy_helper.from_array(np.array([0, 3, 2, 4], np.int64), "split_shape"),
             numpy_helper.from_array(np.array([0, 3, 8], np.int64), "merge_shape")]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("Reshape", ["h", "split_shape"], ["heads"], name="split"),
        helper.make_node("Transpose", ["heads"], ["moved"], name="move", perm=[0, 1, 3, 2]),
        helper.make_node("Reshape", ["moved", "merge_shape"], ["merged"], name="merge"),
        helper.make_node("MatMul", ["merged", "W2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_chains_of_data_movement_get_a_derived_pair_after_every_op():
    """Regression: only the first op of a Reshape -> Transpose -> Reshape chain got its derived Q/DQ, so
    the MatMul after it read a float tensor and ran in float (MiniLM's attention output projections)."""
    model = _chain_model()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((2, 3, 8)).astype(np.float32)} for _ in range(4)]
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings(feeds)
    qdq = sim.to_onnx_qdq()
    producers = _producers(qdq)
    by_name = {n.name: n for n in qdq.graph.node}
    for op in ("split", "move", "merge"):
        out = by_name[op].output[0]
        assert [u.op_type for u in qdq.graph.node if out in u.input] == ["QuantizeLinear"], op
    mm2 = by_name["mm2"]
    assert producers[mm2.input[0]].op_type == "DequantizeLinear"
    assert producers[mm2.input[1]].op_type == "DequantizeLinear"
    exact = _exact(sim.to_onnx_qdq(int32_bias=False))
    np.testing.assert_array_equal(exact.run(None, feeds[0])[0], sim.session.run(None, feeds[0])[0])
