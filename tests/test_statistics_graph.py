"""The calibration graph's in-graph statistics: min/max reductions and strided histogram samples.

Oracle: numpy over the same tensors (the model exposes them as ordinary outputs next to the statistics).
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantsim
from quantsim.calibration import statistics_graph
from quantsim.calibration.run import CALIBRATION_EXECUTION_ORDER
from quantsim.calibration.statistics_graph import add_statistics_outputs, in_graph_statistics


def _identity_model(shape: list[int], opset: int, producer: str = "Identity") -> onnx.ModelProto:
    """x -> producer -> t (also a model output), so the oracle sees exactly what is reduced."""
    inits = []
    if producer == "Conv":  # a 1x1 identity convolution keeps the values and makes ORT use NCHWc
        c = shape[1]
        inits.append(numpy_helper.from_array(np.eye(c, dtype=np.float32).reshape(c, c, 1, 1), "w"))
        node = helper.make_node("Conv", ["x", "w"], ["t"], kernel_shape=[1, 1])
    else:
        node = helper.make_node(producer, ["x"], ["t"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("t", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model, feed):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("shape", [[7], [3, 5], [2, 3, 4], [2, 8, 5, 6], [2, 2, 3, 2, 3]])
def test_min_max_equal_numpy(opset, shape):
    rng = np.random.default_rng(len(shape) + opset)
    x = (rng.standard_normal(shape) * 3 + 0.5).astype(np.float32)
    model, out = add_statistics_outputs(_identity_model(shape, opset), ["t"], shapes={"t": tuple(shape)})
    onnx.checker.check_model(model)
    values = _run(model, {"x": x})
    lo, hi = out.minmax["t"]
    assert in_graph_statistics(values, out, "t") == (x.min(), x.max(), False, None)
    assert out.statistics == [lo, hi, out.nan_probes["t"]]
    # one node per statistic: the second stage (over rows) is numpy's
    assert len(model.graph.node) == 1 + 3
    if len(shape) >= 2:  # one value per row: the leading axes (two of them from rank 3 on)
        assert values[hi].shape == tuple(shape[:2 if len(shape) >= 3 else 1])


def test_unknown_rank_and_nonnegative_tensors():
    x = np.abs(np.random.default_rng(0).standard_normal((4, 6))).astype(np.float32) + 0.25
    model, out = add_statistics_outputs(_identity_model([4, 6], 13), ["t"], nonnegative=frozenset({"t"}))
    lo, hi = out.minmax["t"]
    assert lo is None  # the minimum of a non-negative tensor is never computed
    assert in_graph_statistics(_run(model, {"x": x}), out, "t")[:2] == (0.0, x.max())


def test_conv_output_max_goes_through_global_max_pool():
    x = np.random.default_rng(1).standard_normal((2, 8, 5, 7)).astype(np.float32)
    model, out = add_statistics_outputs(_identity_model([2, 8, 5, 7], 13, "Conv"), ["t"], shapes={"t": (2, 8, 5, 7)})
    assert "GlobalMaxPool" in {n.op_type for n in model.graph.node}
    values = _run(model, {"x": x})
    lo, hi, nan, _ = in_graph_statistics(values, out, "t")
    assert values[out.minmax["t"][1]].shape == (2, 8, 1, 1)  # per channel, on onnxruntime's NCHWc layout
    np.testing.assert_allclose([lo, hi], [values["t"].min(), values["t"].max()], rtol=0, atol=0)
    assert not nan


@pytest.mark.parametrize("shape", [(1, 1), (5,), (1, 6), (11,), (2, 6), (13,), (4, 10), (97,), (3, 2, 7), (2, 3, 4, 5)])
@pytest.mark.parametrize("declared", ["static", "dynamic"])
def test_histogram_sample_takes_every_step_th_row(monkeypatch, shape, declared):
    """Rank >= 2: rows ``[::step]`` of the [rows, last axis] view (elements when the last axis is known to be
    longer than HISTOGRAM_SAMPLE); rank 1: elements ``[::step]``; step = max(1, size // HISTOGRAM_SAMPLE)."""
    monkeypatch.setattr(statistics_graph, "HISTOGRAM_SAMPLE", 6)
    n = int(np.prod(shape))
    x = np.arange(n, dtype=np.float32).reshape(shape) - n / 3
    dims = list(shape) if declared == "static" else [f"d{i}" for i in range(len(shape))]
    model, out = add_statistics_outputs(_identity_model(dims, 13), [], ["t"], shapes={"t": tuple(dims)})
    onnx.checker.check_model(model)
    values = _run(model, {"x": x})
    step = max(1, x.size // 6)
    by_rows = len(shape) >= 2 and not (declared == "static" and shape[-1] > 6)
    want = x.reshape(-1, shape[-1])[::step] if by_rows else x.reshape(-1)[::step]
    np.testing.assert_array_equal(values[out.samples["t"]], want)
    assert values[out.samples["t"]].size < 2 * 6 + shape[-1]
    assert in_graph_statistics(values, out, "t")[:2] == (x.min(), x.max())


def test_long_rows_and_unknown_rank_are_sampled_by_element(monkeypatch):
    """A known last axis longer than HISTOGRAM_SAMPLE (one row would be too many values) and an unknown
    rank fall back to ``flat[::step]``."""
    monkeypatch.setattr(statistics_graph, "HISTOGRAM_SAMPLE", 6)
    x = np.arange(40, dtype=np.float32).reshape(2, 20)
    for shapes in ({"t": (2, 20)}, {}):
        model, out = add_statistics_outputs(_identity_model([2, 20], 13), [], ["t"], shapes=shapes)
        np.testing.assert_array_equal(_run(model, {"x": x})[out.samples["t"]], x.reshape(-1)[::6])


def test_sampled_nonnegative_tensor_has_no_minimum_and_its_histogram_starts_at_zero():
    x = np.abs(np.random.default_rng(3).standard_normal((4, 6))).astype(np.float32) + 0.25
    model, out = add_statistics_outputs(_identity_model([4, 6], 13), [], ["t"], nonnegative=frozenset({"t"}),
                                        shapes={"t": (4, 6)})
    lo, hi = out.minmax["t"]
    assert lo is None
    from quantsim.calibration.run import CalibrationSession

    session = CalibrationSession(None, out, {"t": "q"})
    values = _run(model, {"x": x})
    session._record(values)
    stats = session.stats["q"]
    assert (stats.min, stats.max) == (0.0, x.max())
    assert stats.histogram.observed_min == 0.0 and stats.histogram.count == x.size


def test_names_never_collide_and_model_outputs_are_kept():
    model = _identity_model([2, 3], 13)
    model.graph.node[0].output[0] = "t/calibration_max"  # a tensor already named like our output
    model.graph.output[0].name = "t/calibration_max"
    model, out = add_statistics_outputs(model, ["t/calibration_max"], ["t/calibration_max"])
    onnx.checker.check_model(model)
    assert out.model_outputs == ["t/calibration_max"]
    names = [o.name for o in model.graph.output]
    assert len(names) == len(set(names))


def test_empty_batch_is_skipped_and_infinite_batch_warns():
    """A tensor that is empty in a batch teaches nothing (no warning); an infinite one is ignored with one."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reciprocal", ["r"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sim = quantsim.QuantizationSimModel(model)
    sim.progress = False
    good = {"x": np.full((2, 3), 2.0, np.float32)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim.compute_encodings([good, {"x": np.zeros((0, 3), np.float32)}])
    assert not caught, [str(w.message) for w in caught]
    assert sim.qc_quantize_op_dict["y"].get_encodings()[0].max == pytest.approx(0.5, abs=0.01)
    with pytest.warns(RuntimeWarning, match="non-finite") as caught:
        sim.compute_encodings([good, {"x": np.zeros((1, 3), np.float32)}])  # 1/0 = inf in y
    assert "'y'" in str(caught[0].message)
    assert sim.qc_quantize_op_dict["y"].get_encodings()[0].max == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize("scheme", ["min_max", "tf_enhanced"])
def test_calibration_session_uses_priority_order(scheme):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    sim = quantsim.QuantizationSimModel(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                                        quant_scheme=scheme)
    sim.progress = False
    sim.compute_encodings([{"x": np.ones((2, 3), np.float32)}])
    session = sim._calibration_cache[1].current  # the onnxruntime session the calibration made
    options = session.get_session_options()
    assert options.execution_order == CALIBRATION_EXECUTION_ORDER
    # a one-shot job: no memory pattern
    assert not options.enable_mem_pattern
    # the user's session options still win
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sim = quantsim.QuantizationSimModel(model, quant_scheme=scheme, session_options_kwargs={"enable_mem_pattern": True})
    sim.progress = False
    sim.compute_encodings([{"x": np.ones((2, 3), np.float32)}])
    assert sim._calibration_cache[1].current.get_session_options().enable_mem_pattern


def test_non_finite_sample_values_stay_out_of_histograms():
    """A sample may hold NaN where the in-graph min/max are finite (onnxruntime's reductions skip NaN
    in most positions): those values are left out of the histogram, finite samples are binned whole."""
    from quantsim.calibration.histograms import HistogramObserver
    from quantsim.calibration.run import CalibrationSession
    from quantsim.calibration.statistics_graph import StatisticsOutputs

    outputs = StatisticsOutputs(["out"], minmax={"t": ("t/lo", "t/hi"), "u": ("u/lo", "u/hi")},
                                samples={"t": "t/sample", "u": "u/sample"})
    session = CalibrationSession(None, outputs, {"t": "qt", "u": "qu"})
    rng = np.random.default_rng(5)
    oracle = {"qt": HistogramObserver(), "qu": HistogramObserver()}
    for batch in range(3):
        values = {}
        for name in ("t", "u"):
            x = rng.normal(size=300).astype(np.float32) * (batch + 1)
            lo, hi = float(x.min()), float(x.max())
            if name == "t":
                x[rng.uniform(size=300) < 0.2] = np.nan
                x[7 + batch] = np.inf if batch == 1 else x[7 + batch]  # cannot happen with finite lo/hi, still left out
            values.update({f"{name}/lo": np.float32(lo), f"{name}/hi": np.float32(hi), f"{name}/sample": x})
            oracle["q" + name].update(x[np.isfinite(x)], value_range=(lo, hi))
        session._record(values)
    for name, want in oracle.items():
        got = session.stats[name].histogram
        np.testing.assert_array_equal(got.counts, want.counts)
        assert (got.lo, got.bin_width, got.count) == (want.lo, want.bin_width, want.count)


def test_nan_probe_does_not_overflow_into_a_false_nan():
    """Rows whose sums are finite but whose float32 total can overflow both ways (+inf + -inf = NaN, as
    numpy's pairwise float32 summation does here) hold no NaN: the rows' sums are added in float64."""
    x = np.full((16, 2), 1.5e38, np.float32)
    x[4:8] = x[12:16] = -1.5e38
    model, out = add_statistics_outputs(_identity_model([16, 2], 13), ["t"], shapes={"t": (16, 2)})
    values = _run(model, {"x": x})
    assert np.isfinite(values[out.nan_probes["t"]]).all()  # every row's sum is finite
    assert in_graph_statistics(values, out, "t")[:3] == (float(x.min()), float(x.max()), False)
    x[9, 1] = np.nan
    assert in_graph_statistics(_run(model, {"x": x}), out, "t")[2]
