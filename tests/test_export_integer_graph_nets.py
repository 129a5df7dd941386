"""Integer export of a message-passing graph network as torch's dynamo exporter writes it.

The exporter spells ``torch.zeros_like(h).scatter_add(0, dst, messages)`` as ``Expand`` of a 0-d float
constant (0.0) to ``Shape(h)`` followed by ``ScatterElements(reduction="add")``; messages are gathered with
``GatherND`` / ``Gather`` on the node dimension; node and edge counts are dynamic. The 0-d constant, once
quantized, is an integer initializer of shape ``()``: the export failed writing it (numpy's
``ascontiguousarray`` turns a 0-d array into a 1-d one) with "deferred values: computed shape (1,) is not the
declared ()", while the sim and the QDQ export ran the model.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from models import GraphBuilder  # tests/models.py
from onnx import TensorProto, helper

import quantsim
from quantsim.export.reference import run_integer_model
from quantsim.graph.deferred import DeferredArray

D_IN, D = 6, 16


def _graph_net() -> onnx.ModelProto:
    """x [nodes, 6], edge_index [2, edges] -> Gemm+Relu -> messages GatherND(h, src) -> zeros Expand(0.0) ->
    ScatterElements add at dst -> residual Add -> LayerNormalization -> Gemm head."""
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    const, node = g.const, g.node

    def weight(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    h = node("Relu", [node("Gemm", ["x", const("w_in", weight(D, D_IN)), const("b_in", weight(D))], "h.lin",
                           transB=1)], "h")
    src = node("Gather", ["edge_index", const("zero_i", np.int64(0))], "src", axis=0)
    dst = node("Gather", ["edge_index", const("one_i", np.int64(1))], "dst", axis=0)
    messages = node("GatherND", [h, node("Unsqueeze", [src, const("last", np.array([-1], np.int64))], "src.col")],
                    "messages")
    zeros = node("Expand", [const("zero_f", np.float32(0.0)), node("Shape", [h], "h.shape")], "zeros")
    index = node("Expand", [node("Unsqueeze", [dst, "last"], "dst.col"), node("Shape", [messages], "m.shape")],
                 "dst.index")
    agg = node("ScatterElements", [zeros, index, messages], "agg", axis=0, reduction="add")
    y = node("LayerNormalization", [node("Add", [h, agg], "residual"), const("gamma", 1 + weight(D) / 4),
                                    const("beta", weight(D) / 4)], "y.norm", axis=-1)
    node("Gemm", [y, const("w_out", weight(3, D)), const("b_out", weight(3))], "out", transB=1)
    graph = helper.make_graph(g.nodes, "graph_net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["nodes", D_IN]),
                               helper.make_tensor_value_info("edge_index", TensorProto.INT64, [2, "edges"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["nodes", 3])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _feeds(seed: int, n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        nodes, edges = 12 + 3 * i, 30 + 7 * i  # dynamic node and edge counts
        out.append({"x": rng.standard_normal((nodes, D_IN)).astype(np.float32),
                    "edge_index": rng.integers(0, nodes, (2, edges)).astype(np.int64)})
    return out


def test_a_0d_deferred_value_keeps_its_shape():
    values = DeferredArray((), np.uint8, lambda: np.asarray(3, np.int64)).array()
    assert values.shape == () and values.dtype == np.uint8 and int(values) == 3


def test_graph_net_exports_to_integer_and_matches_the_sim():
    model = _graph_net()
    sim = quantsim.QuantizationSimModel(model)
    sim.compute_encodings(_feeds(0, 6))
    exported = sim.export_integer(weight_codes="uint8").model  # uint8 x uint8 kernels are exact on every CPU
    ops = {n.op_type for n in exported.graph.node}
    assert {"QGemm", "ScatterElements", "GatherND"} <= ops
    producers = {o: n for n in exported.graph.node for o in n.output}
    gather_nd = next(n for n in exported.graph.node if n.op_type == "GatherND")
    assert producers[gather_nd.input[0]].op_type == "QGemm"  # GatherND moves the uint8 codes of h
    step = float(sim.qc_quantize_op_dict["out"].encoding.scale.reshape(-1)[0])
    session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in _feeds(1, 3):  # node and edge counts never seen in calibration
        sim_out = sim.session.run(None, feed)[0]
        ort_out = session.run(None, feed)[0]
        ref_out = run_integer_model(exported, feed, float_fallback=True)["out"]  # ScatterElements add, LayerNorm: float
        assert ort_out.shape == sim_out.shape == (feed["x"].shape[0], 3)
        assert np.max(np.abs(ref_out - sim_out)) <= 2 * step + 1e-6
        assert np.max(np.abs(ort_out - sim_out)) <= 2 * step + 1e-6
