"""Where and IsNaN / IsInf in the integer export.

Found on Hugging Face transformers models exported by torch (BERT, RoBERTa, GPT-2, ViT, Wav2Vec2): attention
probabilities are guarded as ``Where(IsNaN(p), 0, p)`` (a fully masked row would be NaN), two float ops per
layer on ``[batch, heads, seq, seq]``. A quantized ``p`` is never NaN, so IsNaN is false everywhere; Where selects
codes once each branch is on the output grid, which is exact (quantizing commutes with selecting).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel

RNG = np.random.default_rng(21)


def _model(nodes, inits, shape, out_shape):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _export(model, shape):
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings([{"x": RNG.normal(size=shape).astype(np.float32)} for _ in range(4)])
    export = sim.export_integer(weight_codes="uint8")
    onnx.checker.check_model(export.model)
    session = ort.InferenceSession(export.model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sim, export, session


def _steps(sim, session, shape):
    feed = {"x": RNG.normal(size=shape).astype(np.float32)}
    got, want = session.run(None, feed)[0], sim.session.run(None, feed)[0]
    return np.abs(got - want) / float(sim.qc_quantize_op_dict["y"].encoding.scale)


def test_guarded_attention_probabilities_run_on_integer_kernels():
    shape = (2, 6, 8)
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "xt"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["bad"]),
             helper.make_node("Where", ["bad", "zero", "p"], ["p_safe"]),
             helper.make_node("MatMul", ["p_safe", "x"], ["y"])]
    inits = [numpy_helper.from_array((RNG.normal(size=(8, 8)) / 3).astype(np.float32), "wq"),
             numpy_helper.from_array(np.zeros((), np.float32), "zero")]
    sim, export, session = _export(_model(nodes, inits, shape, shape), shape)
    assert export.report == [], str(export.report)
    assert {"Where", "ConstantOfShape", "QLinearSoftmax"} <= {n.op_type for n in export.model.graph.node}
    steps = _steps(sim, session, shape)
    assert steps.max() <= 3 and np.mean(steps >= 1) <= 0.1  # QLinearSoftmax's one-step differences, carried


def test_where_moves_each_branch_to_the_output_grid_exactly():
    shape = (3, 16)
    nodes = [helper.make_node("Greater", ["x", "zero"], ["positive"]),
             helper.make_node("Where", ["positive", "x", "fill"], ["y"])]  # output grid != x's grid
    inits = [numpy_helper.from_array(np.zeros((), np.float32), "zero"),
             numpy_helper.from_array(np.full((1, 16), -0.3, np.float32), "fill")]
    sim, export, session = _export(_model(nodes, inits, shape, shape), shape)
    assert sim.qc_quantize_op_dict["y"].encoding.scale != sim.qc_quantize_op_dict["x"].encoding.scale
    assert [e.op_type for e in export.report] == ["Greater"], str(export.report)  # the comparison stays float
    for _ in range(5):
        assert _steps(sim, session, shape).max() == 0


def test_where_of_two_constants_stays_float_with_a_reason():
    shape = (2, 4)
    nodes = [helper.make_node("Greater", ["x", "zero"], ["positive"]),
             helper.make_node("Where", ["positive", "one", "minus"], ["w"]),
             helper.make_node("Add", ["x", "w"], ["y"])]
    inits = [numpy_helper.from_array(np.zeros((), np.float32), n) for n in ("zero",)]
    inits += [numpy_helper.from_array(np.float32(1.0), "one"), numpy_helper.from_array(np.float32(-1.0), "minus")]
    sim, export, session = _export(_model(nodes, inits, shape, shape), shape)
    assert [e.op_type for e in export.report if e.op_type == "Where"] == ["Where"]
    assert "two constants" in next(e.reason for e in export.report if e.op_type == "Where")
