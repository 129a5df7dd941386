"""QDQ export around Pad and recurrent ops: where onnxruntime runs float that need not be.

Regression (issue 13, bench_qdq on the wider suite): a Pad between a quantized tensor and a Conv left the
Conv's input float (the sim does not quantize a Pad's output: it is on the input's grid), so the Conv ran
in FP32 with a float weight (Silero VAD's STFT Conv: 70% of its QDQ model's time, 4.4x quantize_static's
latency); an LSTM's quantized weights ran ``DequantizeLinear`` at every inference (ddddocr 1.10-1.44x).
The export now adds a derived Q/DQ after a Pad whose written values are on the grid, and stores
recurrent weights as their fake-quantized float values, and leaves out Q/DQ pairs on outputs nothing
reads (the LSTM's unused final states); these forms compute exactly the sim's numbers.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from quantsim import QuantizationSimModel

RNG = np.random.default_rng(7)


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _pad_conv(mode: str, value: float | None) -> onnx.ModelProto:
    """x -> Relu -> Pad(mode, value) -> Conv(3x3) -> y."""
    inits = {"W": RNG.standard_normal((4, 2, 3, 3)).astype(np.float32), "B": RNG.standard_normal(4).astype(np.float32),
             "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}
    pad_inputs = ["r", "pads"]
    if value is not None:
        inits["v"] = np.array(value, np.float32)
        pad_inputs.append("v")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pad", pad_inputs, ["p"], mode=mode),
             helper.make_node("Conv", ["p", "W", "B"], ["y"])]
    f = onnx.TensorProto.FLOAT
    return _model(nodes, [helper.make_tensor_value_info("x", f, [1, 2, 8, 8])],
                  [helper.make_tensor_value_info("y", f, [1, 4, 8, 8])], inits)


def _feeds(shapes: dict[str, tuple[int, ...]], n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()} for _ in range(n)]


def _exact(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _optimized_ops(model: onnx.ModelProto, tmp_path) -> list[str]:
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]


def _check_exact(sim: QuantizationSimModel, feeds) -> None:
    # the default export (int32 biases): the sim puts a Conv's bias after an on-grid Pad on s_in * s_w too
    exact = _exact(sim.to_onnx_qdq())
    for feed in feeds:
        for a, b in zip(sim.session.run(None, feed), exact.run(None, feed)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("mode", "value"), [("constant", None), ("constant", 0.0), ("reflect", None),
                                             ("edge", None)])
def test_pad_on_the_grid_gets_a_derived_pair_and_the_conv_fuses(mode, value, tmp_path):
    sim = QuantizationSimModel(_pad_conv(mode, value), progress=False)
    sim.compute_encodings(_feeds({"x": (1, 2, 8, 8)}, 3, 0))
    assert not sim.qc_quantize_op_dict["p"].enabled  # the sim leaves the Pad's output alone
    qdq = sim.to_onnx_qdq()
    producers = {o: n for n in qdq.graph.node for o in n.output}
    conv = next(n for n in qdq.graph.node if n.op_type == "Conv")
    assert producers[conv.input[0]].op_type == "DequantizeLinear"
    assert producers[conv.input[1]].op_type == "DequantizeLinear"  # integer weight for the integer kernel
    assert "QLinearConv" in _optimized_ops(qdq, tmp_path)
    _check_exact(sim, _feeds({"x": (1, 2, 8, 8)}, 2, 5))


def test_pad_with_a_value_off_the_grid_keeps_its_output_float(tmp_path):
    """-inf (or any value a Q/DQ round trip would move) is not on the grid: no pair, the export stays exact."""
    sim = QuantizationSimModel(_pad_conv("constant", 1e-7), progress=False)
    sim.compute_encodings(_feeds({"x": (1, 2, 8, 8)}, 3, 0))
    qdq = sim.to_onnx_qdq()
    producers = {o: n for n in qdq.graph.node for o in n.output}
    conv = next(n for n in qdq.graph.node if n.op_type == "Conv")
    assert producers[conv.input[0]].op_type == "Pad"
    _check_exact(sim, _feeds({"x": (1, 2, 8, 8)}, 2, 5))


def _lstm(op_type: str = "LSTM") -> onnx.ModelProto:
    """x [T, 1, 6] -> LSTM/GRU (hidden 5) -> Y."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op_type]
    inits = {"W": RNG.standard_normal((1, gates * 5, 6)).astype(np.float32) * 0.3,
             "R": RNG.standard_normal((1, gates * 5, 5)).astype(np.float32) * 0.3,
             "B": RNG.standard_normal((1, 2 * gates * 5)).astype(np.float32) * 0.1}
    nodes = [helper.make_node(op_type, ["x", "W", "R", "B"], ["Y", "Y_h"], hidden_size=5)]  # Y_h: read by nothing
    f = onnx.TensorProto.FLOAT
    return _model(nodes, [helper.make_tensor_value_info("x", f, [4, 1, 6])],
                  [helper.make_tensor_value_info("Y", f, [4, 1, 1, 5])], inits)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_recurrent_weights_are_stored_fake_quantized_without_dequantize(op_type):
    sim = QuantizationSimModel(_lstm(op_type), progress=False)
    sim.compute_encodings(_feeds({"x": (4, 1, 6)}, 3, 1))
    assert sim.qc_quantize_op_dict["W"].enabled and sim.qc_quantize_op_dict["R"].enabled
    qdq = sim.to_onnx_qdq()
    producers = {o: n for n in qdq.graph.node for o in n.output}
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    node = next(n for n in qdq.graph.node if n.op_type == op_type)
    for slot in (1, 2):
        assert node.input[slot] not in producers and inits[node.input[slot]].dtype == np.float32
    w = sim.qc_quantize_op_dict["W"]
    assert len(np.unique(np.round(inits[node.input[1]][0] / np.reshape(w.encoding.scale, (-1, 1)), 3))) <= 256
    read = {i for n in qdq.graph.node for i in n.input}
    assert not [n for n in qdq.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                and n.output[0] not in read and n.output[0] not in {o.name for o in qdq.graph.output}]  # no dead pairs
    _check_exact(sim, _feeds({"x": (4, 1, 6)}, 2, 9))
