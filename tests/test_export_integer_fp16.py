"""Integer export of float16-compute models (onnxconverter-common's form, built in tests/fp16_models.py).

The sim quantizes a float16 tensor in float32 between Casts; the integer model carries the same codes, so
its kernels are those of the float32 model, Casts between float types pass the codes through, and only ops
left in float see float16 (their inputs dequantized in float32 then cast, as in the sim). The sim's float16
arithmetic (weights and outputs rounded to float16, 2^-11 relative) moves values lying that close to a
rounding midpoint: more one-step differences than a float32 model's (observed on the CNN below: 4.3% of
outputs at one step, none at two; its float32 twin: 1.3%), never more than the tolerance of the float32 tests.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
from fp16_models import fp16_cnn, fp16_mlp  # tests/fp16_models.py
from onnx import TensorProto, helper, numpy_helper
from test_export_integer import INTEGER_OPS, export_integer  # weight_codes="auto"

import quantsim

ARITHMETIC = frozenset({"Conv", "MatMul", "Gemm", "Add", "Mul", "Sub", "Relu", "Concat", "Tanh", "Sigmoid"})


def _sim(model, shape, count=4):
    rng = np.random.default_rng(0)
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(count)])
    return sim


def _steps(sim, exported, shape, grid_tensor: str) -> np.ndarray:
    """|integer - sim| of the one output in steps of ``grid_tensor``'s grid (the output is its Cast)."""
    feed = {"x": np.random.default_rng(9).standard_normal(shape).astype(np.float32)}
    got = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    want = sim.session.run(None, feed)[0]
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    scale = float(sim.qc_quantize_op_dict[grid_tensor].encoding.scale)
    return np.round(np.abs(got.astype(np.float64) - want) / scale)


def _assert_io_kept(model: onnx.ModelProto, elem_type: int = TensorProto.FLOAT) -> None:
    assert [v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)] == [elem_type] * 2


def test_fp16_cnn_runs_on_integer_kernels_with_only_the_blocked_resize_in_float():
    sim = _sim(fp16_cnn(), (4, 3, 16, 16))
    exported = export_integer(sim)
    onnx.checker.check_model(exported.model, full_check=True)
    assert [(e.node, e.op_type) for e in exported.report] == [("up", "Resize")]
    assert "interpolates" in exported.report[0].reason
    ops = Counter(n.op_type for n in exported.model.graph.node)
    assert ops["QLinearConv"] == 3 and ops["QLinearAdd"] == 1 and ops["QLinearConcat"] == 1 and ops["MaxPool"] == 1
    assert not {"Conv", "Add", "Relu", "Concat"} & set(ops)
    # the only float arithmetic is the Resize island's float32 dequantization (Cast -> [Sub] -> Mul) of its input
    resize = next(n for n in exported.model.graph.node if n.op_type == "Resize")
    producers = {o: n for n in exported.model.graph.node for o in n.output}
    assert producers[resize.input[0]].op_type == "Mul"
    assert ops["Mul"] == 1 and ops["Sub"] <= 1
    casts = [n for n in exported.model.graph.node if n.op_type == "Cast"]
    assert [c.attribute[0].i for c in casts] == [TensorProto.FLOAT]  # no float16 left: Casts pass codes through
    _assert_io_kept(exported.model)
    steps = _steps(sim, exported, (16, 3, 16, 16), "y_fp16")
    assert steps.max() <= 2 and np.mean(steps > 1) <= 0.001 and np.mean(steps >= 1) <= 0.08, \
        (steps.max(), np.mean(steps >= 1))


def test_fp16_mlp_is_fully_integer_and_matches_the_sim():
    sim = _sim(fp16_mlp(), (8, 16))
    exported = export_integer(sim)
    assert exported.report == []
    ops = {n.op_type for n in exported.model.graph.node}
    assert ops <= INTEGER_OPS | {"QuantizeLinear", "DequantizeLinear"} and not ARITHMETIC & ops
    assert "QGemm" in ops or "QLinearMatMul" in ops
    _assert_io_kept(exported.model)
    steps = _steps(sim, exported, (64, 16), "y_fp16")
    assert steps.max() <= 1 and np.mean(steps >= 1) <= 0.03


def test_integer_io_of_an_fp16_model_is_uint8_and_the_codes_are_the_sims():
    sim = _sim(fp16_mlp(), (8, 16))
    exported = export_integer(sim, integer_io=True)
    _assert_io_kept(exported.model, TensorProto.UINT8)
    x = np.random.default_rng(3).standard_normal((32, 16)).astype(np.float32)
    grid_in, grid_out = exported.io["x"], exported.io["y"]
    codes = np.clip(np.round(x / grid_in["scale"]) + grid_in["zero_point"], 0, 255).astype(np.uint8)
    got = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": codes})[0]
    want = sim.session.run(None, {"x": x})[0]
    real = (got.astype(np.float64) - grid_out["zero_point"]) * grid_out["scale"]
    assert np.round(np.abs(real - want) / grid_out["scale"]).max() <= 1  # the sim's output is float16-rounded


def test_fp16_weights_are_quantized_from_their_fp16_values():
    """Weight codes are the sim's: ``round(w16 / s)`` of the float16 weights read as float32 (oracle: numpy)."""
    model = fp16_cnn()
    sim = _sim(model, (4, 3, 16, 16))
    exported = sim.export_integer(weight_codes="int8")  # int8 codes, not run here (load-checked only)
    values = {t.name: numpy_helper.to_array(t) for t in exported.model.graph.initializer}
    conv = next(n for n in exported.model.graph.node if n.op_type == "QLinearConv" and n.name == "c2")
    w16 = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "c2.w")
    assert w16.dtype == np.float16
    scale = np.asarray(sim.qc_quantize_op_dict["c2.w"].encoding.scale, np.float32).reshape(-1, 1, 1, 1)
    expected = np.clip(np.rint(w16.astype(np.float32) / scale), -128, 127)
    assert np.array_equal(values[conv.input[3]].astype(np.int64), expected.astype(np.int64))
    np.testing.assert_array_equal(values[conv.input[4]], scale.reshape(-1))


def _fp16_island_model() -> onnx.ModelProto:
    """x -> Cast(fp16) -> MatMul -> Tanh -> CumSum (no integer rule) -> MatMul -> Cast(fp32) -> y, in float16."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8)) / 3).astype(np.float16), name) for name in ("w1", "w2")]
    inits.append(numpy_helper.from_array(np.array(1, np.int64), "axis"))
    nodes = [helper.make_node("Cast", ["x"], ["x16"], name="cast_in", to=TensorProto.FLOAT16),
             helper.make_node("MatMul", ["x16", "w1"], ["m1"], name="mm1"),
             helper.make_node("Tanh", ["m1"], ["t"], name="tanh"),
             helper.make_node("CumSum", ["t", "axis"], ["c"], name="cumsum"),
             helper.make_node("MatMul", ["c", "w2"], ["y16"], name="mm2"),
             helper.make_node("Cast", ["y16"], ["y"], name="cast_out", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "island", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_an_fp16_op_left_in_float_computes_in_fp16_between_codes():
    sim = _sim(_fp16_island_model(), (8, 8))
    exported = export_integer(sim)
    assert [(e.node, e.op_type) for e in exported.report] == [("cumsum", "CumSum")]
    nodes = exported.model.graph.node
    producers = {o: n for n in nodes for o in n.output}
    cumsum = next(n for n in nodes if n.op_type == "CumSum")
    to_half = producers[cumsum.input[0]]  # its input: the float32 dequantization cast to float16, as in the sim
    assert to_half.op_type == "Cast" and to_half.attribute[0].i == TensorProto.FLOAT16
    consumer = next(n for n in nodes if cumsum.output[0] in n.input)  # its output: cast to float32, quantized
    assert consumer.op_type == "Cast" and consumer.attribute[0].i == TensorProto.FLOAT
    ops = {n.op_type for n in nodes}
    assert "Tanh" not in ops and "MatMul" not in ops  # the float16 Tanh is a table, the MatMuls integer kernels
    steps = _steps(sim, exported, (64, 8), "y16")
    assert steps.max() <= 2 and np.mean(steps >= 1) <= 0.05


def test_a_cast_of_a_float_value_stays_a_cast_and_the_ops_after_it_run_in_fp16():
    """Input quantizer disabled: the input Cast has no codes to pass, so it casts the float value (not
    reported: no arithmetic), and the layers reading it run in float16 as in the sim (reported)."""
    sim = _sim(fp16_mlp(), (8, 16))
    sim.qc_quantize_op_dict["x"].enabled = False
    exported = export_integer(sim)
    assert [(e.node, e.op_type) for e in exported.report] == [("mm1", "MatMul"), ("add1", "Add"), ("relu", "Relu")]
    assert "'x_fp16' has no enabled quantizer" in exported.report[0].reason
    casts = [n.attribute[0].i for n in exported.model.graph.node if n.op_type == "Cast"]
    assert casts == [TensorProto.FLOAT16, TensorProto.FLOAT]  # the input Cast; the Relu's value to its Q
    steps = _steps(sim, exported, (64, 16), "y_fp16")
    assert steps.max() <= 1
