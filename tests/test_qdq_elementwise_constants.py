"""QDQ export of ``Add`` / ``Mul`` by a float constant between 8-bit Q/DQ (issue 13, QDQ latency).

Regression (bench_qdq on PP-OCRv4 det): the detector's learnable affine blocks (``y = a * x + b`` with
scalar ``a`` and ``b`` after every HardSwish) are ``Q(DQ(x) * a)`` and ``Q(DQ(x) + b)`` in the sim, the
constants float. onnxruntime fuses a Mul/Add into QLinearMul/QLinearAdd only when both inputs come from a
DequantizeLinear, so the QDQ model ran those 48 ops in float, each a DequantizeLinear, the op and a
QuantizeLinear over a whole feature map. The export now stores such a constant as exact 8-bit codes
behind a DequantizeLinear (a scalar: code 1, scale |c|) when the codes reproduce it bit for bit: the exact
export stays the sim, and onnxruntime's optimized graph holds QLinearMul / QLinearAdd.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_qdq_boolean_inputs import _session

from quantsim import QuantizationSimModel
from quantsim.export.qdq_constants import exact_codes

C = 4


def _affine_model(scale_vector: np.ndarray) -> onnx.ModelProto:
    """x -> Conv -> Relu -> Mul(a) -> Add(b) -> Mul(vector) -> Conv -> y, with scalar a < 0, b > 0; as many
    channels as ``scale_vector`` has values."""
    C = scale_vector.size
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((C, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
             numpy_helper.from_array(rng.standard_normal(C).astype(np.float32) * 0.1, "b1"),
             numpy_helper.from_array(np.array(-0.7310586, np.float32), "a"),
             numpy_helper.from_array(np.array([0.123], np.float32), "b"),
             numpy_helper.from_array(scale_vector.reshape(1, C, 1, 1), "v"),
             numpy_helper.from_array(rng.standard_normal((2, C, 1, 1)).astype(np.float32) * 0.3, "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["c1"]),
             helper.make_node("Mul", ["c1", "a"], ["m"]),
             helper.make_node("Add", ["b", "m"], ["s"]),  # constant first: either operand order fuses
             helper.make_node("Mul", ["s", "v"], ["t"]),
             helper.make_node("Conv", ["t", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _sim(model: onnx.ModelProto, float_constants: tuple[str, ...] = ()) -> QuantizationSimModel:
    sim = QuantizationSimModel(model, progress=False)
    for name in float_constants:  # the sim fake-quantizes a vector factor on an 8-bit grid unless told not to
        sim.qc_quantize_op_dict[name].enabled = False
    rng = np.random.default_rng(0)
    sim.compute_encodings([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)])
    return sim


def _assert_exact_export_is_the_sim(sim: QuantizationSimModel, inputs: list[np.ndarray]) -> None:
    """The exact QDQ export (int32 biases, as the sim adds them; Q/DQ fusion off) computes the sim's outputs bit
    for bit."""
    exact = _session(sim.to_onnx_qdq(weight_codes="auto"), fused=False)
    for x in inputs:
        np.testing.assert_array_equal(exact.run(None, {"x": x})[0], sim.session.run(None, {"x": x})[0])


def _optimized_ops(qdq: onnx.ModelProto, tmp_path) -> Counter:
    """Op counts of ``qdq`` as onnxruntime's Q/DQ fusion leaves it."""
    _session(qdq, fused=True, optimized=str(tmp_path / "opt.onnx"))
    return Counter(n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node)


def _constant_input(model: onnx.ModelProto, op: str, index: int) -> onnx.NodeProto | None:
    """The producer of the non-activation input of the ``index``-th ``op`` node, or None for an initializer."""
    producers = {o: n for n in model.graph.node for o in n.output}
    node = [n for n in model.graph.node if n.op_type == op][index]
    others = [producers.get(i) for i in node.input if producers.get(i) is None or
              producers[i].input[0] in {t.name for t in model.graph.initializer}]
    assert len(others) == 1
    return others[0]


@pytest.mark.parametrize("representable", [True, False])
def test_scalar_affine_constants_become_exact_codes_and_fuse(tmp_path, representable):
    vector = np.array([0.5, -1.0, 1.5, 2.0] if representable else [0.5, 1e-3, 1.5, 2.0], np.float32)
    sim = _sim(_affine_model(vector), () if representable else ("v",))
    qdq = sim.to_onnx_qdq(weight_codes="auto")
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    for op, index, value in (("Mul", 0, np.float32(-0.7310586)), ("Add", 0, np.float32(0.123))):
        dq = _constant_input(qdq, op, index)
        assert dq is not None and dq.op_type == "DequantizeLinear"
        codes = inits[dq.input[0]]
        assert codes.dtype in (np.uint8, np.int8)
        zero_point = inits[dq.input[2]] if len(dq.input) > 2 else 0
        got = (codes.astype(np.int64) - np.int64(zero_point)).astype(np.float32) * inits[dq.input[1]]
        assert got.reshape(-1)[0].tobytes() == value.tobytes()  # bit for bit
    vector_input = _constant_input(qdq, "Mul", 1)
    # the sim's 8-bit vector factor takes its own grid's codes; a float one off every 8-bit grid (2.0 / 1e-3
    # steps) stays a float initializer
    assert (vector_input is not None) == representable

    x = [np.random.default_rng(7).standard_normal((1, 3, 8, 8)).astype(np.float32) * 1.3 for _ in range(3)]
    _assert_exact_export_is_the_sim(sim, x)

    ops = _optimized_ops(qdq, tmp_path)
    assert ops["QLinearMul"] == (2 if representable else 1) and ops["QLinearAdd"] == 1
    assert ops["Add"] == 0 and ops["Mul"] == (0 if representable else 1)


def test_a_constant_held_outside_the_export_is_read_through_its_weights(tmp_path):
    """A float vector constant of 1 KiB or more is a deferred placeholder in the QDQ export (streamed to disk when
    written); the rule reads it through the export's weights, and the exact export is still the sim (magika's
    LayerNorm factors once made the export fail here: onnx tried to open the placeholder's location)."""
    channels = 320  # 1280 bytes of float32: deferred
    vector = np.random.default_rng(2).standard_normal(channels).astype(np.float32)
    sim = _sim(_affine_model(vector))  # fake-quantized by the sim: a placeholder computed when written
    qdq = sim.to_onnx_qdq(weight_codes="auto")
    sim.to_onnx_qdq(weight_codes="auto", path=tmp_path / "m.qdq.onnx")
    written = onnx.load(str(tmp_path / "m.qdq.onnx"))
    assert [t.name for t in written.graph.initializer] == [t.name for t in qdq.graph.initializer]
    _assert_exact_export_is_the_sim(sim, [np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)])


def test_exact_codes_oracle():
    u8, i8 = TensorProto.UINT8, TensorProto.INT8
    codes, scale, zp = exact_codes(np.array(-0.3, np.float32), u8)
    assert (int(codes), scale, zp) == (0, np.float32(0.3), 1)
    codes, scale, zp = exact_codes(np.array([0.5, 1.0, -1.5], np.float32), i8)
    assert codes.tolist() == [1, 2, -3] and scale == np.float32(0.5) and zp == 0
    codes, scale, zp = exact_codes(np.array([0.5, 1.0, -1.5], np.float32), u8)
    assert codes.tolist() == [4, 5, 0] and zp == 3
    assert exact_codes(np.array([1e-3, 1.0], np.float32), u8) is None  # 1000 steps: no 8-bit grid
    assert exact_codes(np.array([0.1, 0.25], np.float32), i8) is None  # 2.5 steps: not integer multiples
    assert exact_codes(np.array([np.inf], np.float32), i8) is None
    assert exact_codes(np.array([1.0], np.float64), i8) is None  # float32 constants only
    codes, scale, zp = exact_codes(np.array([-128.0, 127.0], np.float32), i8)
    assert codes.tolist() == [-128, 127] and scale == 1.0


def _division_model() -> onnx.ModelProto:
    """x -> Conv -> Relu -> Div(8) -> Div(sqrt 2) -> Conv -> y (attention's 1/sqrt(d), GELU's 1/sqrt(2))."""
    rng = np.random.default_rng(6)
    inits = [numpy_helper.from_array(rng.standard_normal((C, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
             numpy_helper.from_array(np.array(8.0, np.float32), "eight"),
             numpy_helper.from_array(np.array(1.4142135, np.float32), "root2"),
             numpy_helper.from_array(rng.standard_normal((2, C, 1, 1)).astype(np.float32) * 0.3, "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["c1"]),
             helper.make_node("Div", ["c1", "eight"], ["d1"]),
             helper.make_node("Div", ["d1", "root2"], ["d2"]),
             helper.make_node("Conv", ["d2", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_division_by_a_power_of_two_becomes_a_fused_multiplication(tmp_path):
    sim = _sim(_division_model())
    qdq = sim.to_onnx_qdq(weight_codes="auto")
    ops = Counter(n.op_type for n in qdq.graph.node)
    assert ops["Div"] == 1 and ops["Mul"] == 1  # by 8 -> times 0.125; by sqrt(2) has no exact reciprocal
    div = next(n for n in qdq.graph.node if n.op_type == "Div")
    assert div.input[1] == "root2"
    x = [np.random.default_rng(9).standard_normal((1, 3, 8, 8)).astype(np.float32) * 2 for _ in range(3)]
    _assert_exact_export_is_the_sim(sim, x)
    optimized = _optimized_ops(qdq, tmp_path)
    assert optimized["QLinearMul"] == 1 and optimized["Div"] == 1


def test_power_of_two_reciprocal_is_exact():
    from quantsim.export.qdq_constants import _power_of_two_reciprocal

    assert _power_of_two_reciprocal(np.array([8.0, -0.25], np.float32)).tolist() == [0.125, -4.0]
    assert _power_of_two_reciprocal(np.array(3.0, np.float32)) is None
    assert _power_of_two_reciprocal(np.array(0.0, np.float32)) is None
    assert _power_of_two_reciprocal(np.array(2.0 ** 127, np.float32)) is None  # 2^-127 is subnormal
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 1e3
    np.testing.assert_array_equal(x / np.float32(8), x * np.float32(0.125))  # the identity the rewrite relies on


def _qdq_binary(op: str, constant: float, in_scale: float, out_scale: float) -> onnx.ModelProto:
    """codes (uint8 [256]) -> DQ(in_scale, 7) -> op(constant) -> Q(out_scale, 3) -> codes."""
    inits = [numpy_helper.from_array(np.array(in_scale, np.float32), "si"), numpy_helper.from_array(np.array(7, np.uint8), "zi"),
             numpy_helper.from_array(np.array(out_scale, np.float32), "so"), numpy_helper.from_array(np.array(3, np.uint8), "zo"),
             numpy_helper.from_array(np.array(constant, np.float32), "c")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "si", "zi"], ["xf"]), helper.make_node(op, ["xf", "c"], ["yf"]),
             helper.make_node("QuantizeLinear", ["yf", "so", "zo"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [256])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [256])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("op, constant, in_scale, out_scale, fused", [
    ("Add", 1.0, 2 / 255, 2 / 255, False),  # GELU's 1 + erf(x): 127.5 steps, every result on a tie
    ("Add", 0.05, 0.1, 0.1, False),  # half a step
    ("Add", 0.0371, 0.1, 0.1, True),
    ("Mul", 0.5, 0.1, 0.1, False),  # odd codes times a half: ties
    ("Mul", -0.7310586, 0.02, 0.03, True),
    ("Div", 4.0, 0.02, 0.007, True),  # sevenths of a step: never a half
])
def test_fused_only_where_every_input_code_rounds_clear_of_a_tie(op, constant, in_scale, out_scale, fused):
    from quantsim.export.qdq_constants import codes_for_elementwise_constants

    model = _qdq_binary(op, constant, in_scale, out_scale)
    reference = _session(model, fused=False)
    rewritten = codes_for_elementwise_constants(onnx.ModelProto.FromString(model.SerializeToString()))
    ops = Counter(n.op_type for n in rewritten.graph.node)
    assert (ops["DequantizeLinear"] == 2) == fused
    x = {"x": np.arange(256, dtype=np.uint8)}
    want = reference.run(None, x)[0]
    np.testing.assert_array_equal(_session(rewritten, fused=False).run(None, x)[0], want)  # the same model
    if fused:  # onnxruntime's QLinearAdd / QLinearMul give the unfused codes for every input code
        np.testing.assert_array_equal(_session(rewritten, fused=True).run(None, x)[0], want)
