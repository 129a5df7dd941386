"""QDQ export of a HardSwish spelled ``x * HardSigmoid(x)`` (issue 13, QDQ latency).

Regression (bench_qdq on PP-OCRv4 det, opset 12): `prepare` writes a decomposed HardSwish below opset 14
as ``Mul(x, HardSigmoid(x))``; in the QDQ model ``x`` is a DequantizeLinear output read twice, which
onnxruntime duplicates (one DequantizeLinear per reader): 24 extra passes over full feature maps. The
export now writes ``HardSwish(x)`` (ONNX defines it as that product; opset 13 raised to 14): the same
numbers, one DequantizeLinear.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel


def _hardswish_model(opset: int) -> onnx.ModelProto:
    """x -> Conv -> x * Clip(x + 3, 0, 6) / 6 (Paddle's decomposed HardSwish) -> Conv -> y."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.5, "w1"),
             numpy_helper.from_array(rng.standard_normal((2, 4, 1, 1)).astype(np.float32) * 0.3, "w2"),
             numpy_helper.from_array(np.array(3.0, np.float32), "three"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "three"], ["a"]),
             helper.make_node("Clip", ["a", "zero", "six"], ["r"]),
             helper.make_node("Mul", ["c", "r"], ["m"]),
             helper.make_node("Div", ["m", "six"], ["h"]),
             helper.make_node("Conv", ["h", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


@pytest.mark.parametrize("opset", [12, 13])
def test_gated_product_is_exported_as_hardswish(tmp_path, opset):
    sim = QuantizationSimModel(_hardswish_model(opset), progress=False)
    rng = np.random.default_rng(0)
    sim.compute_encodings([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32) * 2} for _ in range(4)])
    assert Counter(n.op_type for n in sim.model.graph.node)["HardSigmoid"] == 1  # the sim's spelling
    qdq = sim.to_onnx_qdq(weight_codes="auto")
    ops = Counter(n.op_type for n in qdq.graph.node)
    assert ops["HardSwish"] == 1 and ops["HardSigmoid"] == 0 and ops["Mul"] == 0
    assert {e.version for e in qdq.opset_import if e.domain in ("", "ai.onnx")} == {14}
    onnx.checker.check_model(qdq, full_check=True)

    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    exact = ort.InferenceSession(sim.to_onnx_qdq(int32_bias=False, weight_codes="auto").SerializeToString(),
                                 options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        feed = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32) * 3}
        np.testing.assert_array_equal(exact.run(None, feed)[0], sim.session.run(None, feed)[0])

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    ort.InferenceSession(qdq.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "opt.onnx")).graph.node
    gate_input = next(n.input[0] for n in optimized if n.op_type in ("HardSigmoid", "HardSwish"))
    readers = [n for n in optimized if gate_input in n.input]
    assert len(readers) == 2  # one DequantizeLinear output read by the gate and the product: no duplicate DQ
