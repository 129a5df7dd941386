"""Sequential MSE keeps one sim graph for its per-layer captures and patches only the weights whose
encoding changed (`quantsim.sim.capture`): the chosen ranges must be bit for bit those of a full rebuild
per layer, and anything other than a constant's encoding must still rebuild."""
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_adaround import _data, _sim

from adaround import SeqMseParams, apply_seq_mse
from quantsim import QuantizationSimModel, encoding_from_range
from quantsim.sim import capture


def _ranges(sim):
    return {layer.node: (layer.weight_quantizer.encoding.scale.copy(), layer.weight_quantizer.encoding.zero_point.copy())
            for layer in sim.weighted_layers()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for node in a:
        np.testing.assert_array_equal(a[node][0], b[node][0], err_msg=node)
        np.testing.assert_array_equal(a[node][1], b[node][1], err_msg=node)


@pytest.mark.parametrize("params", [SeqMseParams(), SeqMseParams(inp_symmetry="asym", loss_fn="sqnr"),
                                    SeqMseParams(num_candidates=7, loss_fn="l1")])
def test_kept_graph_chooses_the_ranges_a_rebuild_per_layer_chooses(params, monkeypatch):
    kept = _sim(activation_type="int4")
    reports = apply_seq_mse(kept, _data(), params)
    assert sum(r.status == "optimized" for r in reports) == 4
    assert "_capture_graph" not in vars(kept)  # the kept graph (a copy of the changed weights) goes with the run
    with monkeypatch.context() as patch:
        patch.setattr(capture._SimGraph, "update", lambda self, sim: False)
        rebuilt = _sim(activation_type="int4")
        apply_seq_mse(rebuilt, _data(), params)
    _assert_same(_ranges(kept), _ranges(rebuilt))
    assert any(not np.array_equal(r[0], s[0]) for r, s in zip(_ranges(kept).values(),
                                                              _ranges(_sim(activation_type="int4")).values()))


def _captured(sim, tensor="y"):
    return [batch[tensor] for batch in sim.capture([tensor], _data(2))]


def test_patched_capture_equals_a_fresh_build_after_each_kind_of_change():
    sim = _sim()
    fresh = _sim()
    names = [t.name for t in sim.model.graph.output]
    _captured(sim, names[0])  # builds the kept graph
    kept = sim._capture_graph
    # a weight encoding (patched in place)
    layer = sim.weighted_layers()[1]
    w = sim.get_weight(layer.weight)
    narrow = encoding_from_range(w.min(axis=(1, 2, 3)) * 0.5, w.max(axis=(1, 2, 3)) * 0.5, 4, axis=0, symmetric=True)
    for s in (sim, fresh):
        s.qc_quantize_op_dict[layer.weight].set_encoding(narrow)
    fresh.__dict__.pop("_capture_graph", None)
    np.testing.assert_array_equal(_captured(sim, names[0]), _captured(fresh, names[0]))
    assert sim._capture_graph is kept  # patched, not rebuilt
    # an activation encoding (the graph's Q/DQ parameters): rebuilt
    act = next(q for q in sim.quantizers if q.role == "activation" and q.enabled and q.is_initialized())
    enc = act.encoding
    wider = encoding_from_range(enc.min * 2, enc.max * 2, enc.bits, symmetric=False)
    for s in (sim, fresh):
        s.qc_quantize_op_dict[act.name].set_encoding(wider)
    np.testing.assert_array_equal(_captured(sim, names[0]), _captured(fresh, names[0]))
    assert sim._capture_graph is not kept
    kept = sim._capture_graph
    # replaced weights, quantized (AdaRound's rounded ones) or not (a bias): patched
    other = sim.weighted_layers()[0]
    for s in (sim, fresh):
        s.replace_weight(other.weight, s.get_weight(other.weight) * 0.5)
        s.replace_weight(other.bias, s.get_weight(other.bias) + 0.25)
    fresh.__dict__.pop("_capture_graph", None)
    np.testing.assert_array_equal(_captured(sim, names[0]), _captured(fresh, names[0]))
    assert sim._capture_graph is kept


def test_a_failed_run_leaves_no_stale_graph():
    sim = _sim()
    before = _captured(sim, sim.model.graph.output[0].name)
    with pytest.raises(ZeroDivisionError):
        with sim.transaction():
            q = sim.qc_quantize_op_dict[sim.weighted_layers()[0].weight]
            w = sim.get_weight(sim.weighted_layers()[0].weight)
            q.set_encoding(encoding_from_range(w.min(axis=(1, 2, 3)) * 0.3, w.max(axis=(1, 2, 3)) * 0.3, 4, axis=0,
                                               symmetric=True))
            _captured(sim, sim.model.graph.output[0].name)
            raise ZeroDivisionError
    np.testing.assert_array_equal(_captured(sim, sim.model.graph.output[0].name), before)


_CLS = Path.home() / ".cache/quantsim/models/ppocr"


@pytest.mark.skipif(not _CLS.exists(), reason="the PP-OCR models are not cached (benchmarks/suite/fetch.py)")
def test_real_model_ranges_are_those_of_a_rebuild_per_layer(monkeypatch):
    import sys
    pytest.importorskip("PIL", reason="the text lines of the real model's data are rendered with Pillow (bench extra)")
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.suite import cases as C

    case = C.cls_case(_CLS, C.QUICK)

    def run():
        sim = QuantizationSimModel(onnx.load(str(case.model_path)), param_type="int4", progress=False)
        sim.compute_encodings(case.calib)
        apply_seq_mse(sim, case.calib)
        return _ranges(sim)

    kept = run()
    monkeypatch.setattr(capture._SimGraph, "update", lambda self, sim: False)
    _assert_same(kept, run())


def _residual_model():
    """Conv-Relu -> Conv -> Add(skip from the first Relu) -> Relu -> Conv: a value kept across a cut."""
    rng = np.random.default_rng(3)
    from onnx import TensorProto, helper, numpy_helper

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                       name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3")]
    graph = helper.make_graph(nodes, "res", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [init("w1", 6, 3, 3, 3), init("w2", 6, 6, 3, 3), init("w3", 4, 6, 1, 1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_staged_capture_equals_a_whole_capture_through_changes_in_any_order():
    from quantsim import StagedCapturer

    feeds = [{"x": np.random.default_rng(s).standard_normal((2, 3, 8, 8)).astype(np.float32)} for s in range(3)]
    sim = QuantizationSimModel(_residual_model(), param_type="int4", activation_type="int8", progress=False)
    sim.compute_encodings(feeds)
    staged = StagedCapturer(sim, feeds)
    layers = sim.weighted_layers()

    def check(tensors):
        got = staged(tensors)
        whole = list(sim.capturer(tensors)(feeds))
        assert len(got) == len(whole) == 3
        for a, b in zip(got, whole):
            for t in tensors:
                np.testing.assert_array_equal(a[t], b[t], err_msg=t)

    for layer in layers:  # Seq MSE's order: capture a layer's input, then change its weight
        check([layer.input])
        w = sim.get_weight(layer.weight)
        q = sim.qc_quantize_op_dict[layer.weight]
        q.set_encoding(encoding_from_range(w.min(axis=(1, 2, 3)) * 0.6, w.max(axis=(1, 2, 3)) * 0.6, 4, axis=0,
                                           symmetric=True))
    check([layers[-1].input, layers[0].input, "y"])  # backwards and several at once
    sim.replace_weight(layers[0].weight, sim.get_weight(layers[0].weight) * 0.9)  # upstream of everything kept
    check([layers[-1].input])
    act = next(q for q in sim.quantizers if q.role == "activation" and q.enabled and q.is_initialized())
    act.set_encoding(encoding_from_range(act.encoding.min * 3, act.encoding.max * 3, 8, symmetric=False))
    check([layers[1].input, layers[2].input])  # a rebuilt graph: started again from the model inputs
    with pytest.raises(Exception, match="cannot capture"):
        staged(["no_such_tensor"])


def _branching_model():
    """Two Conv branches read the input and are added, then a Gemm-like 1x1 Conv: two independent layers."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(8)

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                       name)

    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "wc"], ["y"], name="conv_c")]
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [init("wa", 6, 3, 3, 3), init("wb", 6, 3, 3, 3), init("wc", 4, 6, 1, 1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_levels_group_independent_layers():
    from adaround.levels import independent_levels

    sim = QuantizationSimModel(_branching_model(), param_type="int4", progress=False)
    assert [[layer.node for layer in level] for level in independent_levels(sim, sim.weighted_layers())] == \
        [["conv_a", "conv_b"], ["conv_c"]]
    sim = QuantizationSimModel(_residual_model(), param_type="int4", progress=False)
    assert [[layer.node for layer in level] for level in independent_levels(sim, sim.weighted_layers())] == \
        [["conv1"], ["conv2"], ["conv3"]]


@pytest.mark.parametrize("pool", ["threads", "processes"])
@pytest.mark.parametrize("params", [SeqMseParams(), SeqMseParams(inp_symmetry="asym", loss_fn="l1")])
def test_executor_results_equal_the_local_run_bit_for_bit(pool, params):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    feeds = [{"x": np.random.default_rng(s).standard_normal((2, 3, 8, 8)).astype(np.float32)} for s in range(3)]

    def run(executor=None):
        sim = QuantizationSimModel(_branching_model(), param_type="int4", activation_type="int8", progress=False)
        sim.compute_encodings(feeds)
        reports = apply_seq_mse(sim, feeds, params, executor=executor)
        return _ranges(sim), [(r.node, r.loss_before, r.loss_after) for r in reports]

    local = run()
    # processes are spawned: a fork of this process, whose onnxruntime sessions hold threads, can hang
    spawn = multiprocessing.get_context("spawn")
    with (ThreadPoolExecutor(2) if pool == "threads" else ProcessPoolExecutor(2, mp_context=spawn)) as executor:
        remote = run(executor)
    _assert_same(local[0], remote[0])
    assert local[1] == remote[1]
