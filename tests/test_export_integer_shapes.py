"""Integer export of graphs that compute from tensor shapes (issue 13: float ops left on real CNNs).

* A classifier head that flattens with ``Reshape(x, Concat(Shape(x)[:1], [-1]))`` (PP-OCR cls): shape
  inference loses the rank of the MatMul input; its MatMul + bias still runs as QGemm, the output shape
  taken from ``Shape`` at run time.
"""
from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper
from test_export_integer import _assert_integer_only, _export_checked, _feeds, _model, _named, _sim, _steps, _vi, _w


def _flatten_by_computed_shape():
    rng = np.random.default_rng(11)
    inits = [_named(_w(rng, 6, 3, 3, 3), "c.w"), _named(_w(rng, 6, scale=0.1), "c.b"),
             _named(_w(rng, 6, 4), "fc.w"), _named(_w(rng, 4, scale=0.1), "fc.b"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "rest")]
    nodes = [helper.make_node("Conv", ["x", "c.w", "c.b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
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
    return _model(nodes, [_vi("x", "N", 3, 8, 8)], [_vi("y", "N", 4)], inits)


def test_matmul_of_unknown_rank_runs_as_qgemm():
    sim = _sim(_flatten_by_computed_shape(), (4, 3, 8, 8))
    exported = _export_checked(sim)
    assert exported.report == [], str(exported.report)
    _assert_integer_only(exported.model)
    assert [n.op_type for n in exported.model.graph.node].count("QGemm") == 1
    steps = _steps(sim, exported, _feeds((16, 3, 8, 8), 3))["y"]
    assert steps.max() <= 1 and np.mean(steps > 0) <= 0.05, (steps.max(), np.mean(steps > 0))
