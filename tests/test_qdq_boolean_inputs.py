"""QDQ export of weighted ops that read a bool tensor cast to float (one-hot encodings, masks).

Regression (issue 13, bench_qdq on magika): the sim leaves magika's one-hot ``Cast(Equal(bytes, 0..256))``
float (it feeds the decomposed LayerNorm's statistics), so its embedding MatMul got a float weight and ran
in FP32: the MatMul and the Cast to float were 13% of the QDQ model's kernel time, where
quantize_static's model runs QLinearMatMul. The values 0 and 1 are the codes 0 and 1 of a grid with
scale 1, so the export now feeds such an op ``DequantizeLinear(Cast(bool, to=uint8), 1)``: the same
values, and with the 8-bit weight behind its DequantizeLinear onnxruntime runs the op on integer kernels
(MatMulIntegerToFloat). Its result is the sim's bit for bit when each row holds one 1 (a one-hot: a single
product, code * scale, is what DequantizeLinear computes too); with several ones the integer sum is exact
where the sim's float sum rounds.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel

VOCAB, DIM = 16, 8


def _one_hot_matmul(op: str = "MatMul") -> onnx.ModelProto:
    """ids (int64 [B, L]) -> Equal(ids[..., None], 0..V-1) -> Cast(float) -> MatMul/Gemm(W) -> y."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
    inits = [numpy_helper.from_array(np.arange(VOCAB, dtype=np.int64).reshape(1, 1, VOCAB), "vocab"),
             numpy_helper.from_array(np.array([2], np.int64), "axis"), numpy_helper.from_array(w, "W"),
             numpy_helper.from_array(np.array([-1, VOCAB], np.int64), "flat")]
    nodes = [helper.make_node("Unsqueeze", ["ids", "axis"], ["ids3"]),
             helper.make_node("Equal", ["ids3", "vocab"], ["hot"]),
             helper.make_node("Cast", ["hot"], ["hot_f"], to=TensorProto.FLOAT)]
    if op == "MatMul":
        nodes.append(helper.make_node("MatMul", ["hot_f", "W"], ["y"]))
    else:
        nodes += [helper.make_node("Reshape", ["hot_f", "flat"], ["hot_2d"]), helper.make_node("Gemm", ["hot_2d", "W"], ["y"])]
    out_shape = [10, DIM] if op == "Gemm" else [2, 5, DIM]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _sim(model: onnx.ModelProto) -> QuantizationSimModel:
    sim = QuantizationSimModel(model, progress=False)
    for name in ("hot_f", "hot_2d", "y"):  # input and output stay float, as magika's placement leaves them
        if name in sim.qc_quantize_op_dict:
            sim.qc_quantize_op_dict[name].enabled = False
    rng = np.random.default_rng(0)
    sim.compute_encodings([{"ids": rng.integers(0, VOCAB, (2, 5))} for _ in range(3)])
    return sim


def _session(model: onnx.ModelProto, fused: bool, optimized: str | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if not fused:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    if optimized:
        options.optimized_model_filepath = optimized
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_one_hot_matmul_reads_uint8_codes_and_runs_on_integer_kernels(tmp_path):
    sim = _sim(_one_hot_matmul())
    qdq = sim.to_onnx_qdq()
    producers = {o: n for n in qdq.graph.node for o in n.output}
    matmul = next(n for n in qdq.graph.node if n.op_type == "MatMul")
    dq = producers[matmul.input[0]]
    assert dq.op_type == "DequantizeLinear"
    cast = producers[dq.input[0]]
    assert cast.op_type == "Cast" and cast.input[0] == "hot"
    assert helper.get_attribute_value(cast.attribute[0]) == TensorProto.UINT8
    scale = next(t for t in qdq.graph.initializer if t.name == dq.input[1])
    assert numpy_helper.to_array(scale) == 1.0
    assert not [n for n in qdq.graph.node if n.op_type == "Cast" and n.output[0] == "hot_f"]  # the float Cast is gone
    assert producers[matmul.input[1]].op_type == "DequantizeLinear"  # 8-bit weight codes, not a float weight
    _session(qdq, fused=True, optimized=str(tmp_path / "opt.onnx"))
    ops = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    assert "MatMulIntegerToFloat" in ops and "MatMul" not in ops


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
@pytest.mark.parametrize("fused", [False, True])
def test_one_hot_export_is_the_sim_bit_for_bit(op, fused):
    sim = _sim(_one_hot_matmul(op))
    # one-hot codes 0/1 times int8 weights cannot saturate even on CPUs without VNNI: fused runs here too
    session = _session(sim.to_onnx_qdq(int32_bias=not fused), fused=fused)
    rng = np.random.default_rng(1)
    for _ in range(4):
        feed = {"ids": rng.integers(-2, VOCAB + 2, (2, 5))}  # out-of-vocabulary ids: all-zero rows
        np.testing.assert_array_equal(sim.session.run(None, feed)[0], session.run(None, feed)[0])


def test_float_cast_kept_for_other_readers():
    model = _one_hot_matmul()
    model.graph.node.append(helper.make_node("ReduceSum", ["hot_f"], ["count"], keepdims=0))
    model.graph.output.append(helper.make_tensor_value_info("count", TensorProto.FLOAT, []))
    sim = _sim(model)
    qdq = sim.to_onnx_qdq()
    assert [n for n in qdq.graph.node if n.op_type == "Cast" and n.output[0] == "hot_f"]
    feed = {"ids": np.arange(10).reshape(2, 5)}
    for a, b in zip(sim.session.run(None, feed), _session(qdq, fused=False).run(None, feed)):
        np.testing.assert_allclose(a, b, atol=0)


def test_unnamed_nodes_get_the_codes_once_and_in_order():
    """Nodes are inserted by position, not by name: with unnamed MatMuls (names are optional in ONNX) the
    bool input's codes are built once, ahead of their first reader, and the model computes the same."""
    from quantsim.export.qdq import codes_for_boolean_inputs

    w = np.arange(-8, 8, dtype=np.int8).reshape(4, 4)
    inits = [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(np.array(0.5, np.float32), "w_s"),
             numpy_helper.from_array(np.array(0, np.int8), "w_zp")]
    nodes = [helper.make_node("Cast", ["hot"], ["hot_f"], to=TensorProto.FLOAT),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"]),
             helper.make_node("MatMul", ["hot_f", "w"], ["y1"]),
             helper.make_node("MatMul", ["hot_f", "w"], ["y2"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("hot", TensorProto.BOOL, [3, 4])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, [3, 4]) for y in ("y1", "y2")],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feed = {"hot": np.eye(4, dtype=bool)[[0, 2, 3]]}
    want = _session(model, fused=False).run(None, feed)
    converted = codes_for_boolean_inputs(onnx.ModelProto.FromString(model.SerializeToString()))
    onnx.checker.check_model(converted, full_check=True)
    assert [n.op_type for n in converted.graph.node].count("DequantizeLinear") == 2  # the weight's and the codes'
    for a, b in zip(want, _session(converted, fused=False).run(None, feed)):
        np.testing.assert_array_equal(a, b)
