"""ReduceMean / ReduceSum over trailing axes is a global average pool: QLinearGlobalAveragePool in the integer export.

Found on torchvision models exported by torch's dynamo exporter (opset 18), which writes every
``adaptive_avg_pool2d(1)`` as ``ReduceMean(axes=[-1, -2], keepdims=1)``: 1 to 31 float ops per CNN (ResNet,
MobileNet, EfficientNet, RegNet). Axes as an attribute (opset <= 17) or a constant input (18+), negative or
not, keepdims 0 or 1, channels first or last. Trailing axes that do not start at the third are reduced after
a Reshape of the codes to ``[batch, kept, reduced]``; a ReduceSum (MobileViTv2's separable attention sums
attention-weighted keys over the last axis) is the mean on a grid ``N`` times finer. Other reductions stay
float with a reason.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel

SHAPE = (2, 4, 5, 6)


def _out_shape(axes, keepdims, channels_last):
    dims = [SHAPE[0], SHAPE[2], SHAPE[3], SHAPE[1]] if channels_last else list(SHAPE)
    reduced = {a % 4 for a in axes}
    return [1 if i in reduced else d for i, d in enumerate(dims) if keepdims or i not in reduced]


def _model(axes, keepdims, opset, channels_last=False, op="ReduceMean"):
    rng = np.random.default_rng(5)
    weight = numpy_helper.from_array(rng.normal(size=(4, 4, 1, 1)).astype(np.float32) / 2, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"])]
    source = "r"
    if channels_last:
        nodes.append(helper.make_node("Transpose", ["r"], ["nhwc"], perm=[0, 2, 3, 1]))
        source = "nhwc"
    inits = [weight]
    if opset >= (13 if op == "ReduceSum" else 18):  # axes became an input
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        nodes.append(helper.make_node(op, [source, "axes"], ["y"], keepdims=keepdims))
    else:
        nodes.append(helper.make_node(op, [source], ["y"], axes=axes, keepdims=keepdims))
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, _out_shape(axes, keepdims, channels_last))
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                              [output], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _feed(seed):
    return {"x": np.random.default_rng(seed).normal(size=SHAPE).astype(np.float32)}


def _export(model):
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings([_feed(seed) for seed in range(4)])
    export = sim.export_integer(weight_codes="uint8")
    onnx.checker.check_model(export.model)
    return sim, export


@pytest.mark.parametrize("axes, keepdims, opset, channels_last, op", [
    ([2, 3], 1, 17, False, "ReduceMean"), ([-1, -2], 1, 18, False, "ReduceMean"), ([2, 3], 0, 18, False, "ReduceMean"),
    ([-2, -1], 0, 13, False, "ReduceMean"), ([1, 2], 1, 18, True, "ReduceMean"), ([1, 2], 0, 17, True, "ReduceMean"),
    ([3], 1, 18, False, "ReduceMean"), ([-1], 0, 17, False, "ReduceMean"), ([1, 2, 3], 1, 18, False, "ReduceMean"),
    ([1, 2, 3], 0, 17, False, "ReduceMean"), ([-1], 1, 18, False, "ReduceSum"), ([2, 3], 0, 13, False, "ReduceSum"),
    ([1, 2], 1, 18, True, "ReduceSum")])
def test_trailing_reduction_is_a_global_average_pool(axes, keepdims, opset, channels_last, op):
    sim, export = _export(_model(axes, keepdims, opset, channels_last, op))
    assert export.report == [], str(export.report)
    ops = [n.op_type for n in export.model.graph.node]
    assert "QLinearGlobalAveragePool" in ops and "ReduceMean" not in ops
    session = ort.InferenceSession(export.model.SerializeToString(), providers=["CPUExecutionProvider"])
    scale = float(sim.qc_quantize_op_dict["y"].encoding.scale)
    for seed in range(10, 14):
        got, want = session.run(None, _feed(seed))[0], sim.session.run(None, _feed(seed))[0]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= scale * 1.01  # one step: the kernel's fixed-point mean


@pytest.mark.parametrize("axes, op", [([1], "ReduceMean"), ([2], "ReduceMean"), ([1, 3], "ReduceSum")])
def test_other_reductions_stay_float_with_a_reason(axes, op):
    sim, export = _export(_model(axes, 1, 17, op=op))
    assert [e.op_type for e in export.report] == [op]
    assert "not a global average pool" in export.report[0].reason
