"""Integer export of graphs that compute from tensor shapes (issue 13: float ops left on real CNNs).

Convolutions and the Gemm have one input channel (K = 1): on AVX2 CPUs without VNNI onnxruntime's u8s8
kernels saturate int16 pair sums (``VPMADDUBSW``), which would blur the step bounds these tests check.

* A classifier head that flattens with ``Reshape(x, Concat(Shape(x)[:1], [-1]))`` (PP-OCR cls): shape
  inference loses the rank of the MatMul input; its MatMul + bias still runs as QGemm, the output shape
  taken from ``Shape`` at run time.
* A YOLOv8-like box decode whose anchor centres and stride are computed from ``Shape``: with the input
  shape known (``input_shapes=`` or static declared dims) they fold into constants on exact grids and the
  decode runs on integer kernels; with dynamic dims they stay float and the report says how to fold them.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from test_export_integer import _assert_integer_only, _export_checked, _feeds, _model, _named, _sim, _steps, _vi, _w

from quantsim.errors import InvalidArgumentError
from quantsim.export.integer.export import export_integer


def _flatten_by_computed_shape():
    rng = np.random.default_rng(11)
    inits = [_named(_w(rng, 1, 1, 1, 1), "c.w"), _named(_w(rng, 1, scale=0.1), "c.b"),
             _named(_w(rng, 1, 4), "fc.w"), _named(_w(rng, 4, scale=0.1), "fc.b"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "rest")]
    nodes = [helper.make_node("Conv", ["x", "c.w", "c.b"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
             helper.make_node("Shape", ["p"], ["s"], name="shape"),
             helper.make_node("Cast", ["s"], ["s32"], name="to_int32", to=6),
             helper.make_node("Slice", ["s32", "zero", "one"], ["n32"], name="batch"),
             helper.make_node("Cast", ["n32"], ["n"], name="to_int64", to=7),
             helper.make_node("Concat", ["n", "rest"], ["flat_shape"], name="flat_shape", axis=0),
             helper.make_node("Reshape", ["p", "flat_shape"], ["flat"], name="flatten"),
             helper.make_node("MatMul", ["flat", "fc.w"], ["mm"], name="fc"),
             helper.make_node("Add", ["mm", "fc.b"], ["y"], name="fc_bias")]
    return _model(nodes, [_vi("x", "N", 1, 8, 8)], [_vi("y", "N", 4)], inits)


def test_matmul_of_unknown_rank_runs_as_qgemm():
    sim = _sim(_flatten_by_computed_shape(), (4, 1, 8, 8))
    exported = _export_checked(sim)
    assert exported.report == [], str(exported.report)
    _assert_integer_only(exported.model)
    assert [n.op_type for n in exported.model.graph.node].count("QGemm") == 1
    steps = _steps(sim, exported, _feeds((16, 1, 8, 8), 3))["y"]
    assert steps.max() <= 1 and np.mean(steps > 0) <= 0.05, (steps.max(), np.mean(steps > 0))


def _anchor_head(batch="N", size="S"):
    """A YOLOv8-like box decode at toy size: anchor centres ``Range(0, W) + 0.5`` from ``Shape`` of the feature
    map, ``anchors -/+ distances``, centre and size, times the stride ``input H / feature H`` (shape arithmetic)."""
    rng = np.random.default_rng(12)
    ints = {"two": [2], "three": [3], "zero_i": 0, "row": [-1, 1], "col": [1, -1], "halves": [2, 2], "axis0": [0]}
    inits = [_named(_w(rng, 4, 1, 1, 1), "c.w"), _named(_w(rng, 4, scale=0.1), "c.b")]
    inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    inits += [numpy_helper.from_array(np.float32(v), k) for k, v in (("f0", 0.0), ("f1", 1.0), ("half", 0.5),
                                                                       ("f2", 2.0))]
    n = helper.make_node
    nodes = [n("Conv", ["x", "c.w", "c.b"], ["feat"], name="conv", strides=[2, 2]),
             n("Shape", ["feat"], ["fs"], name="feat_shape"), n("Shape", ["x"], ["xs"], name="input_shape"),
             n("Gather", ["fs", "two"], ["h"], name="h"), n("Gather", ["fs", "three"], ["w"], name="w"),
             n("Concat", ["h", "w"], ["hw"], name="hw", axis=0),
             n("Gather", ["fs", "zero_i"], ["h0"], name="h0", axis=0),
             n("Squeeze", ["h", "axis0"], ["hs"], name="hs"), n("Squeeze", ["w", "axis0"], ["ws"], name="ws"),
             n("Cast", ["hs"], ["hf"], name="hf", to=1), n("Cast", ["ws"], ["wf"], name="wf", to=1),
             n("Range", ["f0", "hf", "f1"], ["ry"], name="ry"), n("Range", ["f0", "wf", "f1"], ["rx"], name="rx"),
             n("Add", ["ry", "half"], ["cy"], name="cy"), n("Add", ["rx", "half"], ["cx"], name="cx"),
             n("Reshape", ["cy", "row"], ["cy2"], name="cy2"), n("Reshape", ["cx", "col"], ["cx2"], name="cx2"),
             n("Expand", ["cy2", "hw"], ["ay"], name="ay"), n("Expand", ["cx2", "hw"], ["ax"], name="ax"),
             n("Unsqueeze", ["ax", "axis0"], ["ax3"], name="ax3"), n("Unsqueeze", ["ay", "axis0"], ["ay3"], name="ay3"),
             n("Concat", ["ax3", "ay3"], ["anchors"], name="anchors", axis=0),
             n("Gather", ["xs", "two"], ["xh"], name="xh"), n("Cast", ["xh"], ["xhf"], name="xhf", to=1),
             n("Cast", ["h"], ["fhf"], name="fhf", to=1), n("Div", ["xhf", "fhf"], ["stride"], name="stride"),
             n("Split", ["feat", "halves"], ["lt", "rb"], name="split", axis=1),
             n("Sub", ["anchors", "lt"], ["x1y1"], name="x1y1"), n("Add", ["anchors", "rb"], ["x2y2"], name="x2y2"),
             n("Sub", ["x2y2", "x1y1"], ["wh"], name="wh"),
             n("Add", ["x1y1", "x2y2"], ["c2"], name="c2"), n("Div", ["c2", "f2"], ["c"], name="c"),
             n("Concat", ["c", "wh"], ["box"], name="box", axis=1),
             n("Mul", ["box", "stride"], ["y"], name="scale_by_stride")]
    return _model(nodes, [_vi("x", batch, 1, size, size)], [_vi("y", batch, 4, "H", "W")], inits)


def test_shape_derived_anchor_grid_folds_with_input_shapes():
    sim = _sim(_anchor_head(), (4, 1, 16, 16), spread=3.0)
    dynamic = _export_checked(sim)  # dynamic dims: the anchor arithmetic stays float, and the report says why
    float_ops = {e.op_type for e in dynamic.report}
    assert {"Range", "Add"} <= float_ops
    assert all("input_shapes" in e.reason for e in dynamic.report if e.op_type == "Add"), str(dynamic.report)
    exported = _export_checked(sim, input_shapes={"x": [4, 1, 16, 16]})
    assert exported.report == [], str(exported.report)
    _assert_integer_only(exported.model)
    assert [d.dim_value for d in exported.model.graph.input[0].type.tensor_type.shape.dim] == [4, 1, 16, 16]
    feed = _feeds((4, 1, 16, 16), 9, spread=3.0)
    steps = _steps(sim, exported, feed)["y"]
    assert steps.max() <= 2 and np.mean(steps > 0) <= 0.05, (steps.max(), np.mean(steps > 0))
    assert np.abs(_steps(sim, dynamic, feed)["y"]).max() <= 2
    session = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="x"):  # another size is refused, not decoded with the wrong anchors
        session.run(None, _feeds((4, 1, 32, 32), 1))


def test_static_inputs_fold_without_input_shapes():
    sim = _sim(_anchor_head(batch=2, size=16), (2, 1, 16, 16), spread=3.0)
    exported = _export_checked(sim)
    assert exported.report == [], str(exported.report)
    with pytest.raises(InvalidArgumentError, match="dim 2 is declared 16, not 32"):
        export_integer(sim, input_shapes={"x": [2, 1, 32, 32]})


@pytest.mark.parametrize("shapes, message", [({"image": [1, 1, 8, 8]}, "not a graph input"),
                                             ({"x": [1, 1, 8]}, "rank 3"), ({"x": [1, 4, 8, 8]}, "dim 1"),
                                             ({"x": [0, 1, 8, 8]}, "positive")])
def test_bad_input_shapes_name_the_input(shapes, message):
    sim = _sim(_anchor_head(), (2, 1, 16, 16))
    with pytest.raises(InvalidArgumentError, match=message):
        export_integer(sim, input_shapes=shapes)


def test_shapes_known_only_after_folding_fold_too():
    """Found on torchvision's Swin: a window padding ``(7 - W % 7) % 7`` (Mod, which ONNX data propagation does not
    evaluate) feeds a Pad, whose output shape builds the shifted-window mask (ConstantOfShape ...). Inference
    learns the Pad's shape only once the pads are folded to a constant, so the fold repeats until no Shape is
    left; one round left the mask arithmetic float."""
    ints = {"hw_axes": [2, 3], "eight": [8, 8], "six_zeros": [0] * 6}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    n = helper.make_node
    fill = helper.make_tensor("fill", 1, [1], [0.25])
    nodes = [n("Shape", ["x"], ["xs"], name="xs"), n("Gather", ["xs", "hw_axes"], ["hw"], name="hw"),
             n("Mod", ["hw", "eight"], ["rest"], name="rest"), n("Sub", ["eight", "rest"], ["short"], name="short"),
             n("Mod", ["short", "eight"], ["pad_hw"], name="pad_hw"),
             n("Concat", ["six_zeros", "pad_hw"], ["pads"], name="pads", axis=0),
             n("Pad", ["x", "pads"], ["padded"], name="pad"), n("Shape", ["padded"], ["ps"], name="ps"),
             n("ConstantOfShape", ["ps"], ["mask"], name="mask", value=fill),
             n("Add", ["padded", "mask"], ["y"], name="add_mask")]
    model = _model(nodes, [_vi("x", 1, 1, 5, 5)], [_vi("y", 1, 1, 8, 8)], inits)
    sim = _sim(model, (1, 1, 5, 5))
    exported = _export_checked(sim)
    assert exported.report == [], str(exported.report)
    steps = _steps(sim, exported, _feeds((1, 1, 5, 5), 7))["y"]
    assert steps.max() <= 1
