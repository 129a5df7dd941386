"""Integer export of an SVTR/ViT-style attention block (PP-OCRv4 rec's look-alike).

Classification of the block's ops and what the export makes of them (module docstrings of
`quantsim.export.integer.linear`, `.elementwise`, `.movement`, `.layernorm`):

* Q·K^T and attn·V (MatMul of two activations) -> QLinearMatMul, uint8 on both sides (u8u8 is exact on
  AVX2 without VNNI, so these run on onnxruntime here);
* Softmax -> com.microsoft QLinearSoftmax; the attention scale (Mul by a scalar) -> QLinearMul;
* Reshape / Transpose / Slice / Squeeze on the uint8 codes;
* the QKV and projection MatMul + bias -> QGemm (int8 weights: compared through the reference executor,
  onnxruntime's u8s8 kernels saturate on this CPU);
* LayerNorm: no integer kernel in onnxruntime; decomposed (ReduceMean ... Div) it becomes one float
  LayerNormalization between DequantizeLinear and QuantizeLinear (opset >= 17), exact on the data below.

Measured (seeded, ORT 1.32): the attention core (q, k, v inputs) vs the sim: scores 0 steps, probabilities
max 1 step on 0.02-0.06%, attn·V max 1 step on 0.03-0.14%; the fused LayerNorm: 0 differences over 131k
values; the whole block through the reference executor: max 1 step on 2-4% of outputs.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from models import GraphBuilder  # tests/models.py
from onnx import TensorProto, helper, numpy_helper

import quantsim
from quantsim.export.integer.export import export_integer
from quantsim.export.reference import run_integer_model

T, C, H = 16, 32, 2


def _block(until: str | None = None, opset: int = 17, dims: tuple = ("N", T, C)) -> onnx.ModelProto:
    """x -> decomposed LayerNorm -> QKV MatMul+bias -> Reshape/Transpose/Slice/Squeeze -> q*scale, q·k^T,
    Softmax, ·v -> Transpose/Reshape -> projection MatMul+bias -> residual Add (cut after ``until``)."""
    rng = np.random.default_rng(0)
    d = C // H
    graph = GraphBuilder()
    inits, nodes, const, node = graph.inits, graph.nodes, graph.const, graph.node

    def weight(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    mean = node("ReduceMean", ["x"], "ln.mean", axes=[-1])
    centered = node("Sub", ["x", mean], "ln.centered")
    var = node("ReduceMean", [node("Pow", [centered, const("two", np.float32(2))], "ln.square")], "ln.var", axes=[-1])
    std = node("Sqrt", [node("Add", [var, const("eps", np.float32(1e-5))], "ln.var_eps")], "ln.std")
    h = node("Div", [centered, std], "ln.normed")
    h = node("Mul", [h, const("gamma", (1 + 0.1 * rng.standard_normal(C)).astype(np.float32))], "ln.scaled")
    h = node("Add", [h, const("beta", (0.1 * rng.standard_normal(C)).astype(np.float32))], "ln.out")
    qkv = node("Add", [node("MatMul", [h, const("w_qkv", weight(C, 3 * C))], "qkv.mm"),
                       const("b_qkv", (0.05 * rng.standard_normal(3 * C)).astype(np.float32))], "qkv")
    t = node("Transpose", [node("Reshape", [qkv, const("shape5", np.array([0, -1, 3, H, d], np.int64))], "qkv.r")],
             "qkv.t", perm=[2, 0, 3, 1, 4])
    parts = []
    for i, name in enumerate("qkv"):
        part = node("Slice", [t, const(f"start{i}", np.array([i], np.int64)), const(f"end{i}", np.array([i + 1], np.int64)),
                              const(f"axis{i}", np.array([0], np.int64))], f"{name}.slice")
        parts.append(node("Squeeze", [part, const(f"squeeze{i}", np.array([0], np.int64))], f"{name}.sq"))
    q = node("Mul", [parts[0], const("scale", np.float32(d ** -0.5))], "q.scaled")
    scores = node("MatMul", [q, node("Transpose", [parts[1]], "k.t", perm=[0, 1, 3, 2])], "scores")
    attn = node("MatMul", [node("Softmax", [scores], "probs", axis=-1), parts[2]], "attn")
    o = node("Reshape", [node("Transpose", [attn], "attn.t", perm=[0, 2, 1, 3]),
                         const("shape3", np.array([0, -1, C], np.int64))], "attn.r")
    o = node("Add", [node("MatMul", [o, const("w_o", weight(C, C))], "proj.mm"),
                     const("b_o", (0.05 * rng.standard_normal(C)).astype(np.float32))], "proj")
    node("Add", ["x", o], "y")
    if until is not None:
        nodes = nodes[:[n.name for n in nodes].index(until) + 1]
    used = {i for n in nodes for i in n.input}
    out = until or "y"
    out_dims = ["N", H, T, d] if out == "attn" else list(dims)
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_dims)],
                              [i for i in inits if i.name in used])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _feed(seed: int, batch: int = 8) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(100 + seed).standard_normal((batch, T, C)).astype(np.float32)}


def _sim(model: onnx.ModelProto) -> quantsim.QuantizationSimModel:
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings([_feed(seed) for seed in range(4)])
    return sim


def _steps(sim, got: np.ndarray, want: np.ndarray, name: str) -> np.ndarray:
    scale = float(sim.qc_quantize_op_dict[name].encoding.scale)
    return np.round(np.abs(np.asarray(got, np.float64) - want) / scale)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_decomposed_layer_norm_is_one_float_layer_normalization_equal_to_the_sim():
    sim = _sim(_block("ln.normed"))
    exported = export_integer(sim)
    ops = _ops(exported.model)
    assert ops.count("LayerNormalization") == 1
    assert not {"ReduceMean", "Pow", "Sqrt", "Div"} & set(ops)
    assert [(e.node, e.op_type) for e in exported.report] == [("ln.mean", "LayerNormalization")]
    assert "no integer LayerNorm kernel" in exported.report[0].reason
    session = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in (10, 11):
        feed = _feed(seed, 64)
        want = sim.session.run(None, feed)[0]
        assert _steps(sim, session.run(None, feed)[0], want, "ln.normed").max() == 0
        assert _steps(sim, run_integer_model(exported.model, feed, float_fallback=True)["ln.normed"], want,
                      "ln.normed").max() == 0


def test_layer_norm_over_a_dynamic_last_dim_takes_its_width_from_gamma():
    sim = _sim(_block("ln.out", dims=("N", "T", "C")))
    assert sim.model.graph.input[0].type.tensor_type.shape.dim[2].dim_param == "C"
    exported = export_integer(sim)
    assert _ops(exported.model).count("LayerNormalization") == 1 and len(exported.report) == 1
    feed = _feed(13, 64)
    got = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    steps = _steps(sim, got[0], sim.session.run(None, feed)[0], "ln.out")
    assert steps.max() <= 1 and (steps >= 1).mean() <= 0.01  # gamma / beta on QLinearMul / QLinearAdd (float multipliers)


def test_layer_norm_below_opset_17_stays_decomposed_and_says_how_to_fuse():
    sim = _sim(_block("ln.normed", opset=13))
    exported = export_integer(sim)
    reasons = {e.node: e.reason for e in exported.report}
    assert "ReduceMean" in _ops(exported.model) and "LayerNormalization" not in _ops(exported.model)
    assert "export_integer(opset=17)" in reasons["ln.mean"]
    fused = export_integer(sim, opset=17)
    assert _ops(fused.model).count("LayerNormalization") == 1 and len(fused.report) == 1


def test_layer_norm_with_a_float_output_in_the_sim_stays_as_the_sim_computes_it():
    sim = _sim(_block("ln.normed"))
    sim.qc_quantize_op_dict["ln.normed"].enabled = False
    exported = export_integer(sim)
    assert "LayerNormalization" not in _ops(exported.model)
    assert "has no enabled quantizer" in {e.node: e.reason for e in exported.report}["ln.mean"]
    feed = _feed(12)
    got = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    np.testing.assert_array_equal(got[0], sim.session.run(None, feed)[0])


def _core() -> onnx.ModelProto:
    """q·scale, q·k^T, Softmax, ·v on three activation inputs (no weights: u8u8 kernels only)."""
    d = C // H
    nodes = [helper.make_node("Mul", ["q", "scale"], ["qs"], name="qs"),
             helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qs", "kt"], ["scores"], name="scores"),
             helper.make_node("Softmax", ["scores"], ["probs"], name="probs", axis=-1),
             helper.make_node("MatMul", ["probs", "v"], ["attn"], name="attn")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", H, T, d]) for n in "qkv"]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", H, T, d if n == "attn" else T])
               for n in ("scores", "probs", "attn")]
    graph = helper.make_graph(nodes, "core", inputs, outputs, [numpy_helper.from_array(np.float32(d ** -0.5), "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_attention_core_runs_on_integer_kernels_within_one_step_of_the_sim():
    def feed(seed, batch=8):
        rng = np.random.default_rng(seed)
        return {k: (2 * rng.standard_normal((batch, H, T, C // H))).astype(np.float32) for k in "qkv"}

    sim = quantsim.QuantizationSimModel(_core(), progress=False)
    sim.compute_encodings([feed(seed) for seed in range(4)])
    exported = export_integer(sim)
    assert not exported.report
    ops = _ops(exported.model)
    assert ops.count("QLinearMatMul") == 2 and "QLinearSoftmax" in ops and "QLinearMul" in ops
    assert not {"MatMul", "Softmax", "Mul"} & set(ops)
    session = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    data = feed(20, 64)
    for name, got, want in zip(("scores", "probs", "attn"), session.run(None, data), sim.session.run(None, data)):
        steps = _steps(sim, got, want, name)
        assert steps.max() <= 1 and (steps >= 1).mean() <= 0.005, (name, steps.max(), (steps >= 1).mean())


def test_attention_block_lowers_everything_but_the_layer_norm():
    sim = _sim(_block())
    exported = export_integer(sim)
    assert [e.op_type for e in exported.report] == ["LayerNormalization"]
    ops = _ops(exported.model)
    assert ops.count("QLinearMatMul") == 2 and ops.count("QGemm") == 2 and "QLinearSoftmax" in ops
    assert not {"MatMul", "Softmax", "Add", "Div", "Pow", "Sqrt", "ReduceMean"} & set(ops)
    assert ops.count("Sub") == ops.count("Mul") == 1  # the LayerNorm input's dequantize: Cast -> Sub -> Mul
    for seed in (10, 11):
        feed = _feed(seed)
        got = run_integer_model(exported.model, feed, float_fallback=True)["y"]
        steps = _steps(sim, got, sim.session.run(None, feed)[0], "y")
        assert steps.max() <= 2 and (steps >= 1).mean() <= 0.06, (steps.max(), (steps >= 1).mean())


def test_attention_block_on_onnxruntime_kernels():
    sim = _sim(_block())
    exported = export_integer(sim, weight_codes="auto")  # uint8 codes where this CPU's u8 x s8 kernels saturate
    session = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = _feed(10)
    steps = _steps(sim, session.run(None, feed)[0], sim.session.run(None, feed)[0], "y")
    assert steps.max() <= 3 and (steps >= 1).mean() <= 0.1, (steps.max(), (steps >= 1).mean())


def test_difference_of_two_activations_below_opset_14_stays_float_and_loads():
    """The uint8 Sub that negates codes has no onnxruntime kernel before opset 14 (a decomposed LayerNorm's
    ``x - mean`` at opset 12 used to make export_integer raise 'does not load')."""
    nodes = [helper.make_node("Relu", ["a"], ["r"], name="r"), helper.make_node("Sub", ["a", "r"], ["y"], name="s")]
    graph = helper.make_graph(nodes, "difference", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    sim = quantsim.QuantizationSimModel(model, progress=False)
    feed = {"a": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    sim.compute_encodings([feed])
    exported = export_integer(sim)
    assert [(e.node, e.op_type) for e in exported.report] == [("s", "Sub")] and "opset >= 14" in exported.report[0].reason
    got = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_array_equal(got, sim.session.run(None, feed)[0])
    assert "QLinearAdd" in _ops(export_integer(sim, opset=14).model)
