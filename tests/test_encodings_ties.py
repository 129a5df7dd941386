"""Encodings files round trip the sim's untied Concats onto a fresh sim, which ties them.

A sim whose calibration untied a Concat (inputs on grids of their own, output float: `quantsim.sim.decisions`)
writes one entry per input and none for the output. A fresh sim of the exported model ties the three
tensors to one quantizer again; loading the file must split that tie, not let the last entry win for all
three (the nudenet YOLOv8n head: boxes in pixels and class probabilities on the boxes' grid, F1 1.0 -> 0.67).

Oracles: the source sim's quantizers and outputs (what the file was written from), and numpy fake
quantization of the probabilities on their own grid (a hand check of what the narrow input must keep).
"""
import numpy as np
import pytest
from models import make_model  # tests/models.py
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel, fake_quantize, load_encodings_to_sim

ANCHORS, FEATURES, CLASSES = 32, 8, 3


def _head():
    """boxes (pixels, ~0..300) joined with class probabilities (0..1), as a YOLO head does."""
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("MatMul", ["feats", "wb"], ["box_raw"]),
             helper.make_node("Mul", ["box_raw", "box_scale"], ["boxes"]),
             helper.make_node("MatMul", ["feats", "wc"], ["logits"]),
             helper.make_node("Sigmoid", ["logits"], ["scores"]),
             helper.make_node("Concat", ["boxes", "scores"], ["detections"], axis=-1)]
    inits = [numpy_helper.from_array((rng.standard_normal((FEATURES, 4)) * 0.5).astype(np.float32), "wb"),
             numpy_helper.from_array((rng.standard_normal((FEATURES, CLASSES)) * 1.5).astype(np.float32), "wc"),
             numpy_helper.from_array(np.array(100.0, np.float32), "box_scale")]
    return make_model(nodes, [helper.make_tensor_value_info("feats", TensorProto.FLOAT, ["N", ANCHORS, FEATURES])],
                      [helper.make_tensor_value_info("detections", TensorProto.FLOAT, ["N", ANCHORS, 4 + CLASSES])],
                      inits)


def _feeds(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"feats": rng.standard_normal((2, ANCHORS, FEATURES)).astype(np.float32)} for _ in range(n)]


def _state(sim) -> dict:
    """tensor -> (enabled, precision, scale, zero point) of the quantizer on it."""
    out = {}
    for q in sim.quantizers:
        enc = q.encoding if q.enabled else None
        for t in q.tensors:
            out[t] = (q.enabled, str(q.precision()), None if enc is None else tuple(enc.scale.ravel().tolist()),
                      None if enc is None else tuple(enc.zero_point.ravel().tolist()))
    return out


@pytest.mark.parametrize("version", ["0.6.1", "1.0.0", "2.0.0"])
def test_untied_concat_survives_export_and_reload(tmp_path, version):
    sim = QuantizationSimModel(_head(), progress=False)
    sim.compute_encodings(_feeds(3, seed=1))
    assert [d.rule for d in sim.decisions] == ["untied concat"]
    sim.export(str(tmp_path), "head", encoding_version=version)

    fresh = QuantizationSimModel(str(tmp_path / "head.onnx"), progress=False)
    assert fresh.qc_quantize_op_dict["boxes"] is fresh.qc_quantize_op_dict["scores"]  # placement ties them
    load_encodings_to_sim(fresh, str(tmp_path / "head.encodings"), strict=False)

    assert fresh.qc_quantize_op_dict["boxes"] is not fresh.qc_quantize_op_dict["scores"]
    assert _state(fresh) == _state(sim)
    split = [d for d in fresh.decisions if d.rule == "encodings file"]  # the split is listed, not only logged
    assert len(split) == 1 and split[0].action == "untied" and {"boxes", "scores"} <= set(split[0].tensors)
    assert not fresh.qc_quantize_op_dict["detections"].enabled
    for feed in _feeds(2, seed=2):
        expected = sim.session.run(None, feed)[0]
        got = fresh.session.run(None, feed)[0]
        np.testing.assert_array_equal(got, expected)
        # the probabilities keep a grid of their own: within half a step of 1/255 (a shared grid over the
        # boxes' range would put them on steps of ~1 and round most to 0)
        scores = got[..., 4:]
        reference = fake_quantize(scores, sim.qc_quantize_op_dict["scores"].encoding)
        np.testing.assert_array_equal(scores, reference)
        assert float(sim.qc_quantize_op_dict["scores"].encoding.scale) < 1.0 / 200


def test_tied_tensors_with_one_grid_in_the_file_stay_tied(tmp_path):
    """A Concat the source sim kept tied (inputs of similar ranges): the file gives its tensors one grid,
    so the fresh sim's tie is kept."""
    model = _head()
    for init in model.graph.initializer:
        if init.name == "box_scale":
            init.CopyFrom(numpy_helper.from_array(np.array(0.2, np.float32), "box_scale"))
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings(_feeds(3, seed=1))
    assert not sim.decisions
    sim.export(str(tmp_path), "head")
    fresh = QuantizationSimModel(str(tmp_path / "head.onnx"), progress=False)
    load_encodings_to_sim(fresh, str(tmp_path / "head.encodings"), strict=False)
    tied = fresh.qc_quantize_op_dict["boxes"]
    assert tied is fresh.qc_quantize_op_dict["scores"] is fresh.qc_quantize_op_dict["detections"] and tied.enabled
    assert _state(fresh) == _state(sim)


def test_entries_for_some_tied_tensors_keep_the_rest_when_missing_ones_stay(tmp_path):
    """``disable_missing_quantizers=False``: tensors without an entry keep the shared grid they had."""
    sim = QuantizationSimModel(_head(), progress=False)
    sim.compute_encodings(_feeds(3, seed=1))
    sim.export(str(tmp_path), "head")
    fresh = QuantizationSimModel(str(tmp_path / "head.onnx"), progress=False, range_health=False)
    fresh.compute_encodings(_feeds(3, seed=1))
    shared = fresh.qc_quantize_op_dict["detections"]
    before = (float(shared.encoding.scale), int(shared.encoding.zero_point))
    load_encodings_to_sim(fresh, str(tmp_path / "head.encodings"), strict=False, disable_missing_quantizers=False)
    out = fresh.qc_quantize_op_dict["detections"]
    assert out.enabled and (float(out.encoding.scale), int(out.encoding.zero_point)) == before
    assert _state(fresh)["scores"] == _state(sim)["scores"] and _state(fresh)["boxes"] == _state(sim)["boxes"]
