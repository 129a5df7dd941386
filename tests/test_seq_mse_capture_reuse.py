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
