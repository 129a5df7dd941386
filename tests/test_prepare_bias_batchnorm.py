"""``layer -> Add(per-channel bias) -> BatchNormalization`` (PaddlePaddle's ConvTranspose export, PP-OCR det's
upsampling head) folds into the layer: the Add folds in ``fold_channel_affine``, which then folds the
BatchNormalization that fold exposed. Oracle: onnx's reference evaluator on the original model (onnxruntime
for a grouped ConvTranspose, which the reference evaluator does not run)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from quantsim.prepare import prepare

RNG = np.random.default_rng(3)


def _model(op: str, group: int, cin: int = 4, cout: int = 6):
    shape = (cout, cin // group, 2, 2) if op == "Conv" else (cin, cout // group, 2, 2)
    inits = {"w": RNG.normal(size=shape), "bias": RNG.normal(size=(1, cout, 1, 1)),
             "g": RNG.uniform(0.5, 2, cout), "beta": RNG.normal(size=cout), "mean": RNG.normal(size=cout),
             "var": RNG.uniform(0.5, 2, cout)}
    nodes = [helper.make_node(op, ["x", "w"], ["y"], name="up", strides=[2, 2], group=group),
             helper.make_node("Add", ["y", "bias"], ["yb"], name="bias_add"),
             helper.make_node("BatchNormalization", ["yb", "g", "beta", "mean", "var"], ["z"], name="bn", epsilon=1e-5),
             helper.make_node("Relu", ["z"], ["out"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, cin, 5, 5])],
                              [helper.make_tensor_value_info("out", 1, None)],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("op,group", [("ConvTranspose", 1), ("ConvTranspose", 2), ("Conv", 1)])
def test_bias_add_then_batchnorm_fold_into_the_layer(op, group):
    model = _model(op, group)
    prepared = prepare(model, cache=False)
    assert [n.op_type for n in prepared.graph.node] == [op, "Relu"]
    x = RNG.normal(size=(2, 4, 5, 5)).astype(np.float32)
    if group == 1:
        want, got = (ReferenceEvaluator(m).run(None, {"x": x})[0] for m in (model, prepared))
    else:
        want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                     .run(None, {"x": x})[0] for m in (model, prepared))
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_batchnorm_stays_when_its_layer_output_is_shared():
    model = _model("ConvTranspose", 1)
    model.graph.node.append(helper.make_node("Sigmoid", ["yb"], ["side"], name="side"))
    model.graph.output.append(helper.make_tensor_value_info("side", 1, None))
    prepared = prepare(model, cache=False)
    assert "BatchNormalization" in [n.op_type for n in prepared.graph.node]
