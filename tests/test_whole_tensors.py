"""Calibration with small tensors fetched whole (`quantsim.calibration.whole_tensors`) gives bit for bit the
encodings and decisions of in-graph statistics only: every scheme, range health on, varying batch shapes,
NaN/Inf and empty tensors."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel
from quantsim.calibration import whole_tensors
from quantsim.calibration.whole_tensors import choose_whole, inference_graph, model_inputs, tensor_bytes


def _mixed_model(seed: int = 0) -> onnx.ModelProto:
    """Conv/Relu (non-negative, NCHWc), a Concat of inputs 1000x apart (untied), rank-3 MatMul, Softmax,
    ReduceMean, Gemm; and a second output through x plus 1e4 at one pixel (a collapsed grid for range health)."""
    rng = np.random.default_rng(seed)
    spike = np.zeros((3, 8, 8), np.float32)
    spike[:, 2, 5] = 1e4
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("W1", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)), ("B1", rng.standard_normal(8).astype(np.float32)),
        ("W2", rng.standard_normal((8, 8, 1, 1)).astype(np.float32)), ("k", np.array(1000.0, np.float32)),
        ("W2b", rng.standard_normal((8, 8, 1, 1)).astype(np.float32)),
        ("shape", np.array([0, 16, 64], np.int64)), ("W3", rng.standard_normal((16, 12)).astype(np.float32)),
        ("spike", spike), ("W4", rng.standard_normal((5, 12)).astype(np.float32)),
        ("B4", rng.standard_normal(5).astype(np.float32))]]
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "W2"], ["c2"]),
        helper.make_node("Conv", ["r1", "W2b"], ["c3"]),
        helper.make_node("Mul", ["c3", "k"], ["big"]),
        helper.make_node("Concat", ["c2", "big"], ["cat"], axis=1),
        helper.make_node("Reshape", ["cat", "shape"], ["flat"]),
        helper.make_node("Transpose", ["flat"], ["t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["t", "W3"], ["m"]),
        helper.make_node("Softmax", ["m"], ["s"], axis=1),
        helper.make_node("Add", ["m", "s"], ["as"]),
        helper.make_node("ReduceMean", ["as"], ["g"], axes=[1], keepdims=0),
        helper.make_node("Gemm", ["g", "W4", "B4"], ["y"], transB=1),
        helper.make_node("Add", ["x", "spike"], ["h"]),
        helper.make_node("ReduceMean", ["h"], ["z"], axes=[2, 3], keepdims=0),
    ]
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _feeds(sizes=(2, 3, 2), seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32)} for n in sizes]


def _state(sim: QuantizationSimModel) -> tuple:
    quantizers = {}
    for q in sim.quantizers:
        e = q.encoding
        quantizers[q.name] = (q.enabled, str(q.spec), q.tensors, None if e is None else
                              (e.scale.tobytes(), e.zero_point.tobytes(), e.qmin, e.qmax, e.axis))
    return quantizers, [str(d) for d in sim.decisions]


def _calibrate(model, feeds, monkeypatch, *, whole: bool, batch_limit: int | None = None, **kwargs):
    limit = (1 << 40) if whole else 0
    monkeypatch.setattr(whole_tensors, "WHOLE_TENSOR_BYTES", 1 << 40 if whole else 0)
    monkeypatch.setattr(whole_tensors, "WHOLE_BATCH_BYTES", limit if batch_limit is None else batch_limit)
    sim = QuantizationSimModel(model, progress=False, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim.compute_encodings(feeds)
    messages = sorted(str(w.message) for w in caught if issubclass(w.category, RuntimeWarning))
    return sim, _state(sim), messages


@pytest.mark.parametrize("scheme", ["min_max", "tf_enhanced", "percentile"])
def test_whole_tensors_give_the_same_encodings_and_decisions(scheme, monkeypatch):
    model, feeds = _mixed_model(), _feeds()
    in_graph, expected, _ = _calibrate(model, feeds, monkeypatch, whole=False, quant_scheme=scheme)
    fetched, got, _ = _calibrate(model, feeds, monkeypatch, whole=True, quant_scheme=scheme)
    assert not in_graph._calibration_cache[1].whole
    sessions = fetched._calibration_cache[1]
    assert sessions.whole == set(sessions._observed) - {"x"}  # every tensor but the graph input, fetched whole
    assert {"r1", "big", "cat", "s"} <= sessions.whole
    assert {d.split(":")[0] for d in got[1]} >= {"untied concat", "range health"}, got[1]
    assert got == expected


def test_batches_of_other_shapes_are_sized_again_and_too_big_ones_move_to_in_graph(monkeypatch):
    model = _mixed_model(seed=3)
    feeds = _feeds((1, 2, 16, 1), seed=4)
    _, expected, _ = _calibrate(model, feeds, monkeypatch, whole=False, quant_scheme="tf_enhanced")
    light = inference_graph(model)
    first = sum(tensor_bytes(light, feeds[0], ["r1", "c2", "big", "cat", "m", "s", "as", "g", "h", "y", "z"]).values())
    # the first batch's tensors fit; the 16-row batch needs 16x: more than 4x the limit
    sim, got, _ = _calibrate(model, feeds, monkeypatch, whole=True, batch_limit=first, quant_scheme="tf_enhanced")
    assert got == expected
    assert sim._calibration_cache[1].whole == frozenset()  # moved to in-graph statistics for good
    sim, got, _ = _calibrate(model, feeds[:2], monkeypatch, whole=True, batch_limit=first, quant_scheme="tf_enhanced")
    assert sim._calibration_cache[1].whole  # a 2x batch stays within 4x: still fetched whole
    _, expected, _ = _calibrate(model, feeds[:2], monkeypatch, whole=False, quant_scheme="tf_enhanced")
    assert got == expected


def _nan_model() -> onnx.ModelProto:
    """s = Sqrt(x) (NaN where x < 0), r = Reciprocal(s) (Inf where x == 0), y = r * 1."""
    nodes = [helper.make_node("Sqrt", ["x"], ["s"]), helper.make_node("Reciprocal", ["s"], ["r"]),
             helper.make_node("Mul", ["r", "one"], ["y"])]
    graph = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
                              [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("scheme", ["min_max", "tf_enhanced"])
def test_nan_inf_and_empty_batches_are_handled_alike(scheme, monkeypatch):
    rng = np.random.default_rng(7)
    clean = rng.uniform(0.5, 4.0, (4, 16)).astype(np.float32)
    nan = clean.copy()
    nan[1, 5] = -1.0  # one NaN in s, then in r and y
    inf = clean.copy()
    inf[2, 3] = 0.0  # 1/0: Inf in r and y
    feeds = [{"x": clean}, {"x": nan}, {"x": np.zeros((0, 16), np.float32)}, {"x": inf}, {"x": clean * 2}]
    in_graph, expected, expected_warnings = _calibrate(_nan_model(), feeds, monkeypatch, whole=False,
                                                       quant_scheme=scheme)
    fetched, got, got_warnings = _calibrate(_nan_model(), feeds, monkeypatch, whole=True, quant_scheme=scheme)
    assert fetched._calibration_cache[1].whole == {"s", "r", "y"}
    assert got == expected
    assert got_warnings == expected_warnings and any("non-finite" in m for m in got_warnings)


def test_choose_whole_takes_the_smallest_within_both_limits():
    sizes = {"a": 10, "b": 40, "c": 30, "d": 5, "e": 100}
    assert choose_whole(sizes, tensor_limit=50, batch_limit=1000) == {"a", "b", "c", "d"}
    assert choose_whole(sizes, tensor_limit=50, batch_limit=45) == {"a", "c", "d"}  # 5 + 10 + 30
    assert choose_whole(sizes, tensor_limit=8, batch_limit=1000) == {"d"}
    assert choose_whole(sizes, tensor_limit=0, batch_limit=1000) == frozenset()


def test_tensor_bytes_match_the_arrays_and_inputs_are_described_without_a_session():
    import onnxruntime as ort

    model = _mixed_model()
    feed = _feeds((3,))[0]
    names = ["c1", "r1", "cat", "t", "m", "as", "g", "h", "y"]
    sizes = tensor_bytes(inference_graph(model), feed, names)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names[:-1])
    arrays = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"]).run(names[-1:] + names[:-1],
                                                                                                     feed)
    assert sizes == {n: a.nbytes for n, a in zip(names[-1:] + names[:-1], arrays)}
    [info] = model_inputs(model)
    assert (info.name, info.type, info.shape) == ("x", "tensor(float)", ["N", 3, 8, 8])


def test_calibration_session_describes_its_inputs_before_the_first_batch():
    sim = QuantizationSimModel(_mixed_model(), progress=False)
    seen = {}

    def callback(session):
        seen["inputs"] = [(i.name, i.type, i.shape) for i in session.get_inputs()]
        seen["outputs"] = [o.name for o in session.get_outputs()]
        for feed in _feeds():
            session.run(None, {seen["inputs"][0][0]: feed["x"]})

    sim.compute_encodings(callback)
    assert seen == {"inputs": [("x", "tensor(float)", ["N", 3, 8, 8])], "outputs": ["y", "z"]}
    assert sim.qc_quantize_op_dict["y"].encoding is not None


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("shape", "declared", "target"), [
    ((4, 6), (4, 6), 5),            # one row longer than the sample: element-wise
    ((8, 3), (8, 3), 5),            # whole rows
    ((2, 5, 3), ("N", 5, 3), 4),    # rows of a rank-3 tensor, batch unknown
    ((9,), (9,), 4),                # rank 1: element-wise
    ((3, 4), None, 5),              # shape unknown: element-wise
])
def test_whole_statistics_equal_the_in_graph_ones(shape, declared, target, dtype):
    """Oracle: the in-graph statistics of `add_statistics_outputs` run by onnxruntime on the same tensor."""
    from quantsim.calibration.statistics_graph import (
        WholeTensor,
        add_statistics_outputs,
        in_graph_statistics,
        samples_by_rows,
        whole_statistics,
    )

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "g",
                              [helper.make_tensor_value_info("x", elem, list(shape))],
                              [helper.make_tensor_value_info("y", elem, list(shape))])
    graph.node.append(helper.make_node("Identity", ["t"], ["y"]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    shapes = {} if declared is None else {"t": declared}
    model, out = add_statistics_outputs(model, ["t"], ["t"], shapes=shapes, elem_types={"t": elem},
                                        sample_sizes={"t": target})
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(dtype)
    values = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))
    whole = WholeTensor(False, target, samples_by_rows(declared, target))
    got_lo, got_hi, nan, sample = whole_statistics(x, whole)
    assert (got_lo, got_hi, nan) == in_graph_statistics(values, out, "t")[:3] == (float(x.min()), float(x.max()), False)
    expected = values[out.samples["t"]]
    assert sample.dtype == expected.dtype and sample.shape == expected.shape
    assert np.array_equal(sample, expected)
    assert whole_statistics(np.zeros((0, 3), dtype), whole) is None
    x.flat[1] = np.nan
    assert whole_statistics(x, whole)[2]
    assert whole_statistics(x, WholeTensor(True))[2]  # no minimum: the maximum finds the NaN


@pytest.mark.parametrize("scheme", ["min_max", "tf_enhanced"])
def test_constant_sampling_steps_hold_while_sizes_do_and_move_in_graph_when_they_change(scheme, monkeypatch):
    """In-graph samples use a constant step computed from the first batch's sizes; a batch of another size
    moves the calibration to steps computed in-graph. Oracle: everything fetched whole (numpy's samples)."""
    from quantsim.calibration import statistics_graph
    from quantsim.sim import calibration_build

    built: list[set[str]] = []
    original = calibration_build.add_statistics_outputs

    def spy(*args, **kwargs):
        model, outputs = original(*args, **kwargs)
        built.append({n.op_type for n in model.graph.node})
        return model, outputs

    monkeypatch.setattr(calibration_build, "add_statistics_outputs", spy)
    monkeypatch.setattr(calibration_build, "RANGE_SAMPLE", 50)  # steps above 1 on these small tensors
    monkeypatch.setattr(statistics_graph, "HISTOGRAM_SAMPLE", 70)
    model = _mixed_model(seed=5)
    same, other = _feeds((2, 2, 2), seed=6), _feeds((2, 3, 1), seed=6)
    for feeds, sessions_made in ((same, 1), (other, 2)):
        built.clear()
        sim, got, got_warnings = _calibrate(model, feeds, monkeypatch, whole=False, quant_scheme=scheme)
        sessions = sim._calibration_cache[1]
        assert sessions.constant_steps == (sessions_made == 1)
        assert len(built) == sessions_made and "Div" not in built[0]  # the first: constant steps
        if sessions_made == 2:
            assert "Div" in built[1]  # then: step = Size // target, in the graph
        _, expected, expected_warnings = _calibrate(model, feeds, monkeypatch, whole=True, quant_scheme=scheme)
        assert got == expected and got_warnings == expected_warnings


def test_a_wrong_inferred_size_is_caught_and_the_batch_run_again_with_in_graph_steps(monkeypatch):
    """Constant steps rest on ONNX shape inference; each such tensor's Size is fetched and compared, and a
    batch where one differs is run again on a session whose steps the graph computes (recorded once)."""
    from quantsim.calibration import statistics_graph
    from quantsim.sim import calibration_build

    monkeypatch.setattr(calibration_build, "RANGE_SAMPLE", 50)
    monkeypatch.setattr(statistics_graph, "HISTOGRAM_SAMPLE", 70)
    model, feeds = _mixed_model(seed=8), _feeds((2, 2), seed=9)
    _, expected, expected_warnings = _calibrate(model, feeds, monkeypatch, whole=True, quant_scheme="tf_enhanced")
    real = whole_tensors.tensor_sizes

    def wrong(light, feed, tensors):  # as if shape inference told 3x the elements of r1
        sizes = dict(real(light, feed, tensors))
        sizes["r1"] = (sizes["r1"][0] * 3, sizes["r1"][1])
        return sizes

    monkeypatch.setattr(whole_tensors, "tensor_sizes", wrong)
    sim, got, got_warnings = _calibrate(model, feeds, monkeypatch, whole=False, quant_scheme="tf_enhanced")
    assert not sim._calibration_cache[1].constant_steps
    assert got == expected and got_warnings == expected_warnings
    used = []

    def callback(session):
        for feed in feeds:
            session.run(None, feed)
        used.append(session.batches_used)

    sim.compute_encodings(callback)  # each batch recorded once, the one run again included
    assert used == [len(feeds)] and _state(sim) == expected
