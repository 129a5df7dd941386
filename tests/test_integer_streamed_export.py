"""The integer export of a large model streams to disk: its graph is built over placeholders
(`quantsim.graph.deferred`) and each weight's codes (or float values, for an op left in float) are computed when
`IntegerExport.save` writes them, one at a time, or when ``.model`` is first read. The oracle is the same
export materialized in memory (``.model``, then saved): the streamed files must be the same bytes."""
from __future__ import annotations

import pickle

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_qdq_streamed_export import _mapped_sim, track_deferred_weights

import quantsim
import quantsim.graph.large_models as large_models
from quantsim.export.integer.shapes import fold_shape_arithmetic
from quantsim.graph.file_set import STAGING_MARK


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("codes", ["int8", "uint8"])
def test_streamed_integer_export_writes_the_in_memory_export_bytes(monkeypatch, tmp_path, codes):
    sim, feeds = _mapped_sim(monkeypatch, tmp_path)
    in_memory = sim.export_integer(weight_codes=codes)
    in_memory.model  # noqa: B018 - materialized: saved from memory like before streaming
    in_memory.save(tmp_path / "memory" / "m")
    sim.export_integer(weight_codes=codes).save(tmp_path / "streamed" / "m")
    assert _files(tmp_path / "streamed") == _files(tmp_path / "memory")
    assert sim._index.weights is not None  # the float weights were never copied into the sim


def test_large_integer_export_uses_external_data_and_runs(monkeypatch, tmp_path):
    sim, feeds = _mapped_sim(monkeypatch, tmp_path)
    expected = sim.export_integer(weight_codes="auto").model
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1000)  # written as graph + external data
    onnx_path, _ = sim.export_integer(weight_codes="auto").save(tmp_path / "out" / "m")
    assert (tmp_path / "out" / "m.onnx.data").is_file()
    assert not list((tmp_path / "out").glob(f".*{STAGING_MARK}*"))
    onnx.checker.check_model(str(onnx_path), full_check=True)
    got = onnx.load(str(onnx_path))
    assert [(t.name, numpy_helper.to_array(t).tobytes()) for t in got.graph.initializer] == \
        [(t.name, numpy_helper.to_array(t).tobytes()) for t in expected.graph.initializer]
    assert got.graph.node == expected.graph.node
    theirs = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ours = ort.InferenceSession(expected.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        np.testing.assert_array_equal(theirs.run(None, feed)[0], ours.run(None, feed)[0])


def test_integer_export_computes_one_weight_at_a_time(monkeypatch, tmp_path):
    """Nothing is computed while the graph is built (the load check reads placeholders as typed inputs); saving
    computes each placeholder once, the previous one gone by then; a float weight (its quantizer disabled:
    the MatMul stays float) is deferred like the codes."""
    sim, _ = _mapped_sim(monkeypatch, tmp_path)
    sim.qc_quantize_op_dict["w1"].enabled = False
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1000)
    computed = track_deferred_weights(monkeypatch)
    exported = sim.export_integer()
    assert not computed
    skeleton = exported._model
    assert all(len(t.raw_data) < 1024 for t in skeleton.graph.initializer)
    deferred = {t.name: t.data_type for t in skeleton.graph.initializer if exported._weights.holds(t)}
    assert deferred.get("w1") == TensorProto.FLOAT and sum(t == TensorProto.INT8 for t in deferred.values()) == 3
    exported.save(tmp_path / "out" / "m")
    assert sorted(computed) == sorted(deferred)  # each once, the ones of the model only


def test_an_export_of_a_changed_sim_is_refused(monkeypatch, tmp_path):
    sim, feeds = _mapped_sim(monkeypatch, tmp_path)
    exported = sim.export_integer()
    sim.compute_encodings(feeds[:1])  # new encodings: the placeholders would no longer match the graph's scales
    with pytest.raises(quantsim.InvalidStateError, match="export_integer"):
        exported.save(tmp_path / "out" / "m")
    with pytest.raises(quantsim.InvalidStateError, match="export_integer"):
        exported.model  # noqa: B018
    assert not (tmp_path / "out" / "m.onnx").exists()
    copied = pickle.loads(pickle.dumps(sim.export_integer()))  # pickled complete, before the sim changes
    fresh = sim.export_integer()
    model = fresh.model  # read once, complete: later changes to the sim do not reach it
    sim.compute_encodings(feeds[:1])
    assert fresh.model is model
    fresh.save(tmp_path / "out" / "m")
    assert copied.model.SerializeToString() == model.SerializeToString()


def test_shape_folding_copies_no_weight():
    """`fold_shape_arithmetic` folds a Shape -> Gather -> Cast -> Mul chain (a scale computed from the input's
    width) and leaves the MatMul weight out of its copy: the weight is returned as the model's own tensor."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    inits = [weight, numpy_helper.from_array(np.array(3, np.int64), "axis"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "axis"], ["width"]),
             helper.make_node("Cast", ["width"], ["widthf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["widthf", "half"], ["scale"]), helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Mul", ["m", "scale"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    folded, kept_out, count = fold_shape_arithmetic(model, {"x": [1, 2, 4, 16]})
    assert count == 4 and [n.op_type for n in folded.graph.node] == ["MatMul", "Mul"]
    assert len(kept_out) == 1 and kept_out[0] is model.graph.initializer[0]
    assert "w" not in {t.name for t in folded.graph.initializer} | {i.name for i in folded.graph.input}
    scale = next(t for t in folded.graph.initializer if t.name == "scale")
    assert float(numpy_helper.to_array(scale)) == 8.0


def test_export_at_a_higher_opset_converts_the_skeleton_only(monkeypatch, tmp_path):
    """``export_integer(opset=higher)`` converts the model's skeleton (`large_models.converted_skeleton`): the
    weights stay mapped and are read by name, never copied in through ``sim.model``; the export computes what
    the export at the model's own opset computes, weight for weight."""
    sim, feeds = _mapped_sim(monkeypatch, tmp_path)
    native = sim.export_integer(weight_codes="uint8").model
    assert native.opset_import[0].version == 17

    def refused(self):
        raise AssertionError("sim.model copies the weights in")

    monkeypatch.setattr(type(sim), "model", property(refused))
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1000)  # written as graph + external data
    onnx_path, _ = sim.export_integer(weight_codes="uint8", opset=19).save(tmp_path / "out" / "m")
    converted = onnx.load(str(onnx_path))
    assert {o.version for o in converted.opset_import if o.domain == ""} == {19}
    assert [(t.name, numpy_helper.to_array(t).tobytes()) for t in converted.graph.initializer] == \
        [(t.name, numpy_helper.to_array(t).tobytes()) for t in native.graph.initializer]
    theirs = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ours = ort.InferenceSession(native.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        np.testing.assert_array_equal(theirs.run(None, feed)[0], ours.run(None, feed)[0])
