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


# ``linear_ops_in_norm_blocks="all"``: only each norm layer's own statistics stay float -------------------------
_LN_STATS = ("mean", "d", "sq", "var", "ve", "std")


def _shape_leak_norms() -> onnx.ModelProto:
    """`_two_norms` plus shape arithmetic read from the first norm's output (Shape -> Reshape of the MatMul's
    output): a shape edge is not a path of values, so it must not join the two norm layers."""
    model = _two_norms()
    g = model.graph
    mm = next(n for n in g.node if n.op_type == "MatMul")
    mm.output[0] = "m0"
    at = list(g.node).index(mm) + 1
    for offset, node in enumerate([helper.make_node("Shape", ["ln0_out"], ["s"]),
                                   helper.make_node("Reshape", ["m0", "s"], ["m"])]):
        g.node.insert(at + offset, node)
    return model


def test_per_layer_statistics_are_each_norm_layers_own():
    from quantsim.graph.index import GraphIndex
    from quantsim.graph.tensor_roles import find_normalization_statistics

    for model in (_two_norms(), _shape_leak_norms()):
        index = GraphIndex(model)
        own = {f"{tag}_{s}" for tag in ("ln0", "ln1") for s in _LN_STATS}
        assert find_normalization_statistics(index, per_layer=True) == own
        assert {"ln0_out", "m", "h"} <= find_normalization_statistics(index)  # the span rule: one block


def _moments_norm(x: str, tag: str) -> list[onnx.NodeProto]:
    """LayerNorm as E[x^2] - E[x]^2 with a Reciprocal of the Sqrt (jax2tf's form): x - mean is only scaled."""
    return [helper.make_node("ReduceMean", [x, "axes"], [f"{tag}_mean"]),
            helper.make_node("Mul", [x, x], [f"{tag}_sq"]),
            helper.make_node("ReduceMean", [f"{tag}_sq", "axes"], [f"{tag}_msq"]),
            helper.make_node("Mul", [f"{tag}_mean", f"{tag}_mean"], [f"{tag}_m2"]),
            helper.make_node("Sub", [f"{tag}_msq", f"{tag}_m2"], [f"{tag}_var"]),
            helper.make_node("Add", [f"{tag}_var", "eps"], [f"{tag}_ve"]),
            helper.make_node("Sqrt", [f"{tag}_ve"], [f"{tag}_std"]),
            helper.make_node("Reciprocal", [f"{tag}_std"], [f"{tag}_inv"]),
            helper.make_node("Mul", [f"{tag}_inv", "gamma"], [f"{tag}_scale"]),
            helper.make_node("Sub", [x, f"{tag}_mean"], [f"{tag}_d"]),
            helper.make_node("Mul", [f"{tag}_d", f"{tag}_scale"], [f"{tag}_out"])]


def test_per_layer_statistics_of_the_moments_form_stop_at_the_reciprocal():
    from quantsim.graph.index import GraphIndex
    from quantsim.graph.tensor_roles import find_normalization_statistics

    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "axes"), numpy_helper.from_array(np.float32(1e-5), "eps"),
             numpy_helper.from_array(rng.standard_normal(D).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32), "W")]
    nodes = [*_moments_norm("x", "a"), helper.make_node("MatMul", ["a_out", "W"], ["c"]), *_moments_norm("c", "b")]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2, 4, D])],
                              [helper.make_tensor_value_info("b_out", f, [2, 4, D])], inits)
    index = GraphIndex(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8))
    own = {f"{t}_{s}" for t in "ab" for s in ("mean", "sq", "msq", "m2", "var", "ve", "std", "inv")}
    assert find_normalization_statistics(index, per_layer=True) == own
    assert "c" in find_normalization_statistics(index)


def test_option_all_quantizes_the_block_between_norms_and_exports_it_on_integer_kernels():
    sim = _sim("all")  # type: ignore[arg-type]
    assert all(_quantized(sim, n) for n in ("ln0_out", "h", "ln1_out"))
    assert not any(_quantized(sim, f"{tag}_{s}") for tag in ("ln0", "ln1") for s in _LN_STATS)
    float_ops = [e.op_type for e in sim.export_integer(weight_codes="auto").report]
    assert "MatMul" not in float_ops and float_ops.count("Add") <= 2  # left float: the norms' own ops (eps Adds)


def test_option_rejects_other_values():
    import pytest

    from quantsim import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="linear_ops_in_norm_blocks"):
        QuantizationSimModel(_two_norms(), progress=False, linear_ops_in_norm_blocks="some")


def test_a_sqrt_of_a_dimension_is_no_statistic():
    """Found on timm's XCiT (TorchScript export): after an L2 normalization (a ReduceL2, a reduction), the
    attention scale ``1 / sqrt(sqrt(head_dim))`` is computed from ``Shape(q)``; the rule walked back from that
    Sqrt through the Shape into the activations and marked 1,354 tensors, the whole network from the first
    reduction on, as norm statistics (all float). A shape edge ends the path in both directions."""
    from quantsim.graph.index import GraphIndex
    from quantsim.graph.tensor_roles import find_normalization_statistics

    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "last"),
             numpy_helper.from_array(np.float32(1.0), "one"),
             numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32), "W")]
    nodes = [helper.make_node("ReduceL2", ["x", "axes"], ["norm"]),  # F.normalize: x / ||x||
             helper.make_node("Div", ["x", "norm"], ["unit"]),
             helper.make_node("MatMul", ["unit", "W"], ["q"]),
             helper.make_node("Shape", ["q"], ["q_shape"]),
             helper.make_node("Gather", ["q_shape", "last"], ["head_dim"]),
             helper.make_node("Cast", ["head_dim"], ["head_dim_f"], to=TensorProto.FLOAT),
             helper.make_node("Sqrt", ["head_dim_f"], ["root"]),
             helper.make_node("Sqrt", ["root"], ["root2"]),
             helper.make_node("Div", ["one", "root2"], ["scale"]),
             helper.make_node("Mul", ["q", "scale"], ["q_scaled"]),
             helper.make_node("Transpose", ["q_scaled"], ["k"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q_scaled", "k"], ["y"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    assert find_normalization_statistics(GraphIndex(model)) == frozenset()
    sim = QuantizationSimModel(model, progress=False)
    assert all(_quantized(sim, name) for name in ("x", "unit", "q_scaled", "y"))
