"""Exports of large models stream to disk: the QDQ model's graph is built with its big weights as placeholders
(`quantsim.graph.deferred`) and each weight is computed and written one at a time. The oracle is the
in-memory QDQ model (`to_onnx_qdq()`); a session of the written file must match the sim bit for bit (no
int32 biases, no Q/DQ fusion)."""
from __future__ import annotations

import importlib
import weakref

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_large_model_memory import _mlp

import quantsim
import quantsim.graph.large_models as large_models
import quantsim.graph.session as session_module
from quantsim.export.qdq import qdq_skeleton
from quantsim.graph.deferred import DEFERRED_LOCATION, DeferredWeights
from quantsim.graph.file_set import STAGING_MARK

cache_module = importlib.import_module("quantsim.prepare.cache")


def _mapped_sim(monkeypatch, tmp_path, **kwargs) -> tuple[quantsim.QuantizationSimModel, list[dict]]:
    """A sim of an MLP file whose prepared weights stay mapped from the cache entry, calibrated."""
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache_module, "EXTERNAL_DATA_BYTES", 1)
    monkeypatch.setattr(session_module, "FILE_BACKED_MIN_BYTES", 1)
    model, feeds = _mlp()
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    sim = quantsim.QuantizationSimModel(path, progress=False, **kwargs)
    assert sim._index.weights is not None
    sim.compute_encodings(feeds)
    return sim, feeds


def _values(model: onnx.ModelProto) -> list[tuple[str, int, bytes]]:
    return [(t.name, t.data_type, numpy_helper.to_array(t).tobytes()) for t in model.graph.initializer]


def _exact_session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("types", [("int8", "int8"), ("int4", "int16")])  # int16: 16-bit weight containers
def test_streamed_qdq_export_of_a_large_model_equals_the_in_memory_one(monkeypatch, tmp_path, types):
    # float biases in the sim too (its MatMul bias Adds are on the int32 grid by default), so that the QDQ model
    # without int32 biases is the sim bit for bit
    sim, feeds = _mapped_sim(monkeypatch, tmp_path, param_type=types[0], activation_type=types[1], int32_bias=False)
    expected = sim.to_onnx_qdq(int32_bias=False)
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1000)  # written as graph + external data
    sim.to_onnx_qdq(int32_bias=False, path=tmp_path / "out" / "m.qdq.onnx")
    written = tmp_path / "out" / "m.qdq.onnx"
    assert (tmp_path / "out" / "m.qdq.onnx.data").is_file()
    assert not list((tmp_path / "out").glob(f".*{STAGING_MARK}*"))
    onnx.checker.check_model(str(written), full_check=True)
    got = onnx.load(str(written))
    assert _values(got) == _values(expected)
    assert got.graph.node == expected.graph.node
    session = _exact_session(written)
    for feed in feeds:
        for a, b in zip(sim.session.run(None, feed), session.run(None, feed)):
            np.testing.assert_array_equal(a, b)
    sim.export(tmp_path / "set", "m", qdq=True)  # the export set's QDQ model: int32 biases, streamed alike
    got = onnx.load(str(tmp_path / "set" / "m.qdq.onnx"))
    assert _values(got) == _values(sim.to_onnx_qdq())
    assert sim._index.weights is not None  # nothing copied the weights into the sim


def track_deferred_weights(monkeypatch) -> list[str]:
    """The names of the deferred weights computed from now on, in order; computing one while the previous is
    still alive fails the test (a streamed export holds one weight at a time)."""
    alive: list[weakref.ref] = []
    computed: list[str] = []
    original = DeferredWeights.array

    def tracked(self, tensor):
        assert all(ref() is None for ref in alive), "a deferred weight outlived its write"
        values = original(self, tensor)
        computed.append(tensor.name)
        alive.append(weakref.ref(values))
        return values

    monkeypatch.setattr(DeferredWeights, "array", tracked)
    return computed


def test_streamed_export_computes_one_weight_at_a_time(monkeypatch, tmp_path):
    """Each deferred weight is computed once when written, and the previous one is gone by then; the graph
    handed to the writer holds none of them."""
    sim, _ = _mapped_sim(monkeypatch, tmp_path)
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1000)
    computed = track_deferred_weights(monkeypatch)
    skeleton, weights = qdq_skeleton(sim)
    deferred = [t.name for t in skeleton.graph.initializer if weights.holds(t)]
    assert len(deferred) >= 4 and not computed  # three MatMul weights' codes and the head, nothing computed yet
    assert all(len(t.raw_data) < 1024 for t in skeleton.graph.initializer)
    sim.export(tmp_path / "set", "m", qdq=True)
    assert sorted(computed) == sorted(set(computed))  # once each


def test_a_failed_streamed_write_leaves_the_previous_file(monkeypatch, tmp_path):
    sim, _ = _mapped_sim(monkeypatch, tmp_path)
    target = tmp_path / "out" / "m.qdq.onnx"
    sim.to_onnx_qdq(path=target)
    before = target.read_bytes()
    calls = []

    def failing(self, tensor):
        calls.append(tensor.name)
        if len(calls) == 2:
            raise OSError("disk full")
        return np.zeros(tuple(tensor.dims), helper.tensor_dtype_to_np_dtype(tensor.data_type))

    monkeypatch.setattr(DeferredWeights, "array", failing)
    with pytest.raises(OSError, match="disk full"):
        sim.to_onnx_qdq(path=target)
    assert target.read_bytes() == before
    assert not list(target.parent.glob(f".*{STAGING_MARK}*"))


def test_deferred_weights_check_what_they_compute():
    weights = DeferredWeights()
    assert not weights.accepts(TensorProto.INT4, (4096,)) and not weights.accepts(TensorProto.FLOAT, (8,))
    placeholder = weights.add("w", TensorProto.INT8, (32, 64), lambda: np.ones((32, 64)))
    assert placeholder.external_data[0].value == DEFERRED_LOCATION and weights.holds(placeholder)
    assert weights.array(placeholder).dtype == np.int8
    wide = weights.derive(placeholder, "w", TensorProto.INT16, lambda codes: codes.astype(np.int16) * 300)
    np.testing.assert_array_equal(weights.array(wide), np.full((32, 64), 300, np.int16))
    wrong = weights.add("v", TensorProto.FLOAT, (2, 512), lambda: np.ones((512, 2)))
    with pytest.raises(quantsim.QuantsimError, match="'v'.*shape"):
        weights.array(wrong)
    with pytest.raises(quantsim.QuantsimError, match="'x'"):
        weights.array(numpy_helper.from_array(np.ones(300, np.float32), "x"))


def test_streamed_export_with_uint8_weight_codes_equals_the_in_memory_one(monkeypatch, tmp_path):
    """weight_codes='uint8' shifts deferred weight codes as they are written (the shift is itself deferred):
    the file equals the in-memory uint8 export and dequantizes to the int8 export's weights."""
    sim, _ = _mapped_sim(monkeypatch, tmp_path)
    expected = sim.to_onnx_qdq(weight_codes="uint8")
    int8_values = {name: (kind, raw) for name, kind, raw in _values(sim.to_onnx_qdq())}
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1000)
    sim.export(tmp_path / "set", "m", qdq=True, weight_codes="uint8")
    got = onnx.load(str(tmp_path / "set" / "m.qdq.onnx"))
    assert _values(got) == _values(expected)
    shifted = [(name, raw) for name, kind, raw in _values(got)
               if kind == TensorProto.UINT8 and int8_values.get(name, (None,))[0] == TensorProto.INT8]
    assert shifted  # the MLP's weight codes moved to uint8 in place
    for name, raw in shifted:
        codes = np.frombuffer(raw, np.uint8).astype(np.int16) - 128
        np.testing.assert_array_equal(codes, np.frombuffer(int8_values[name][1], np.int8))
