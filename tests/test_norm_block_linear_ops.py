"""``linear_ops_in_norm_blocks``: the speed-for-accuracy option for linear ops between decomposed norms.

Regression (issue 13, bench_qdq on magika): the normalization-statistics rule keeps the whole span from a
decomposed LayerNorm's reductions to the next one's 1/std float, so magika's Conv between its two
LayerNorms ran in FP32 in the QDQ export (1.75-2.1x quantize_static's latency). Quantizing the whole block
as quantize_static does gives 4.7% top-1 in the exact sim; quantizing only the Conv's input and output
keeps the accuracy close and lets onnxruntime run QLinearConv. Default off (placement unchanged).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel

D = 16


def _layer_norm(x: str, tag: str) -> list[onnx.NodeProto]:
    """Decomposed LayerNorm over the last axis: (x - mean) / sqrt(var + eps)."""
    return [helper.make_node("ReduceMean", [x, "axes"], [f"{tag}_mean"]),
            helper.make_node("Sub", [x, f"{tag}_mean"], [f"{tag}_d"]),
            helper.make_node("Mul", [f"{tag}_d", f"{tag}_d"], [f"{tag}_sq"]),
            helper.make_node("ReduceMean", [f"{tag}_sq", "axes"], [f"{tag}_var"]),
            helper.make_node("Add", [f"{tag}_var", "eps"], [f"{tag}_ve"]),
            helper.make_node("Sqrt", [f"{tag}_ve"], [f"{tag}_std"]),
            helper.make_node("Div", [f"{tag}_d", f"{tag}_std"], [f"{tag}_out"])]


def _two_norms() -> onnx.ModelProto:
    """x -> LayerNorm -> Transpose -> Transpose -> MatMul(W) + b -> LayerNorm -> y."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "axes"), numpy_helper.from_array(np.float32(1e-5), "eps"),
             numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(D).astype(np.float32), "b")]
    nodes = [*_layer_norm("x", "ln0"), helper.make_node("Transpose", ["ln0_out"], ["t0"], perm=[1, 0, 2]),
             helper.make_node("Transpose", ["t0"], ["t1"], perm=[1, 0, 2]),
             helper.make_node("MatMul", ["t1", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["h"]),
             *_layer_norm("h", "ln1")]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2, 4, D])],
                              [helper.make_tensor_value_info("ln1_out", f, [2, 4, D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _sim(option: bool) -> QuantizationSimModel:
    sim = QuantizationSimModel(_two_norms(), progress=False, linear_ops_in_norm_blocks=option)
    rng = np.random.default_rng(0)
    sim.compute_encodings([{"x": rng.standard_normal((2, 4, D)).astype(np.float32)} for _ in range(3)])
    return sim


def _quantized(sim: QuantizationSimModel, name: str) -> bool:
    q = sim.qc_quantize_op_dict.get(name)
    return q is not None and q.enabled


def test_default_keeps_the_linear_op_between_norms_float():
    sim = _sim(False)
    assert not any(_quantized(sim, n) for n in ("ln0_out", "t1", "m", "h"))


def test_option_quantizes_the_linear_ops_input_and_output_and_the_statistics_stay_float(tmp_path):
    sim = _sim(True)
    assert _quantized(sim, "ln0_out") and _quantized(sim, "h")  # input (back through the Transposes), output
    assert not _quantized(sim, "t0") and not _quantized(sim, "t1")  # data movement: on the input's grid
    assert not any(_quantized(sim, n) for n in ("ln0_var", "ln0_std", "ln1_var", "ln1_std", "ln1_d"))
    qdq = sim.to_onnx_qdq()
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    ort.InferenceSession(qdq.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    assert "MatMul" not in ops and "Gemm" not in ops and {"QLinearMatMul", "MatMulIntegerToFloat", "QGemm"} & set(ops)
    exact_options = ort.SessionOptions()
    exact_options.add_session_config_entry("session.disable_quant_qdq", "1")
    exact = ort.InferenceSession(sim.to_onnx_qdq(int32_bias=False).SerializeToString(), exact_options,
                                 providers=["CPUExecutionProvider"])
    feed = {"x": np.random.default_rng(9).standard_normal((2, 4, D)).astype(np.float32)}
    np.testing.assert_array_equal(sim.session.run(None, feed)[0], exact.run(None, feed)[0])
