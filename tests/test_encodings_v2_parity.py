"""AIMET 2.0.0 parity: the entries aimet-onnx 2.42 writes, and reading them back to the same sim.

Regression (issue 13): the 2.0.0 export left out the derived entries of data-movement outputs (AIMET's
example file lists ``flat`` for a Flatten) and the int32 bias of a layer whose input is such an output
(``fc.bias`` there); loading a file that has them must not enable quantizers the sim did not have.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import quantsim
from tests import tiny_cnn
from tests.models import BUILDERS
from tests.test_fidelity import make_sim


def _entries(path) -> list[dict]:
    return json.loads(path.read_text())["encodings"]


def test_tiny_cnn_has_the_entries_aimet_writes(tmp_path):
    """AIMET 2.42 on Conv -> Relu -> Flatten -> Gemm writes weights, int32 biases (Gemm's too, on the
    Flatten's grid), the activations and ``flat``; in that order (parameters, activations, derived)."""
    sim = tiny_cnn.calibrated_sim()
    sim.export(tmp_path, "m", encoding_version="2.0.0")
    entries = _entries(tmp_path / "m.encodings")
    names = [e["name"] for e in entries]
    assert sorted(names) == sorted(["W", "B", "W2", "B2", "x", "r", "g", "f", "y"])
    assert set(names[:4]) == {"W", "B", "W2", "B2"} and names[-1] == "f"
    by_name = {e["name"]: e for e in entries}
    assert {k: v for k, v in by_name["f"].items() if k != "name"} == {
        k: v for k, v in by_name["g"].items() if k != "name"}
    s_in = np.float32(by_name["g"]["y_scale"])
    s_w = np.asarray(by_name["W2"]["y_scale"], np.float32)
    assert by_name["B2"]["output_dtype"] == "int32" and by_name["B2"]["axis"] == 0
    np.testing.assert_allclose(by_name["B2"]["y_scale"], s_in * s_w, rtol=1e-7)
    assert "f" not in {e["name"] for e in json.loads(_export(sim, tmp_path, "1.0.0"))["activation_encodings"]}


def _export(sim, tmp_path, version: str) -> str:
    sim.export(tmp_path, f"v{version}", encoding_version=version)
    return (tmp_path / f"v{version}.encodings").read_text()


def test_derived_entries_follow_chains_of_data_movement(tmp_path):
    """mixed: MaxPool output and the Reshape after GlobalAveragePool are derived; the Gemm's bias uses
    the Reshape's derived grid."""
    model, feeds = BUILDERS["mixed"]()
    sim = make_sim(model, feeds)
    sim.export(tmp_path, "m", encoding_version="2.0.0")
    by_name = {e["name"]: e for e in _entries(tmp_path / "m.encodings")}
    assert not sim.qc_quantize_op_dict["pool.out"].enabled and not sim.qc_quantize_op_dict["flat.out"].enabled
    assert by_name["pool.out"]["y_scale"] == by_name["relu1.out"]["y_scale"]
    assert by_name["flat.out"]["y_scale"] == by_name["gap.out"]["y_scale"]
    assert "fc.b" in by_name and by_name["fc.b"]["output_dtype"] == "int32"


@pytest.mark.parametrize("name", ["mixed", "pool"])
def test_2_0_0_round_trip_gives_back_the_same_sim(tmp_path, name):
    model, feeds = BUILDERS[name]()
    sim = make_sim(model, feeds)
    sim.export(tmp_path, "m", encoding_version="2.0.0")
    fresh = make_sim(model, feeds, calibrate=False)
    assert quantsim.load_encodings_to_sim(fresh, tmp_path / "m.encodings", strict=True) == []
    assert tiny_cnn.snapshot(fresh) == tiny_cnn.snapshot(sim)
    for seed in (0, 100):
        feed = feeds(seed, 2)
        for a, b in zip(sim.session.run(None, feed), fresh.session.run(None, feed)):
            np.testing.assert_array_equal(a, b)


def test_an_entry_that_is_not_its_inputs_grid_is_loaded_as_a_quantizer(tmp_path):
    """Only entries equal to their input's grid are derived: another grid on a data-movement output is a
    real quantizer the file asks for (a mismatch with the sim's disabled one, not silently dropped)."""
    sim = tiny_cnn.calibrated_sim()
    sim.export(tmp_path, "m", encoding_version="2.0.0")
    data = json.loads((tmp_path / "m.encodings").read_text())
    for entry in data["encodings"]:
        if entry["name"] == "f":
            entry["y_scale"] *= 2
    fresh = tiny_cnn.new_sim()
    with pytest.warns(UserWarning):
        mismatches = quantsim.load_encodings_to_sim(fresh, data, strict=False)
    assert [(m.name, m.field) for m in mismatches] == [("f", "enabled")]
    assert fresh.qc_quantize_op_dict["f"].enabled


def test_float16_quantizers_are_omitted_from_2_0_0_as_aimet_does(tmp_path):
    """aimet-onnx 2.42 writes no 2.0.0 entry for a float16 quantizer (its ``to_qnn_encoding_dict``
    returns ``{}`` for [b]float16); 1.0.0 carries it."""
    sim = tiny_cnn.new_sim()
    sim.qc_quantize_op_dict["r"].set_precision(quantsim.float16)
    sim.compute_encodings(tiny_cnn.batches())
    sim.export(tmp_path, "m", encoding_version="2.0.0")
    names = {e["name"] for e in _entries(tmp_path / "m.encodings")}
    assert "r" not in names
    assert "g" in names  # the rest is written as usual
    one = json.loads(_export(sim, tmp_path, "1.0.0"))
    assert {"name": "r", "dtype": "FLOAT", "bw": 16, "enc_type": "PER_TENSOR"} in one["activation_encodings"]


def test_loading_2_0_0_keeps_the_sims_float16_quantizers(tmp_path):
    """2.0.0 cannot name a float16 quantizer, so its absence from the file is no request to disable it: a sim
    with the same float16 overrides loads its own export back unchanged (aimet-onnx 2.42 keeps them too). The
    loader disabled them as 'missing', and the re-loaded sim silently ran those tensors in float32."""
    def half_sim():
        sim = tiny_cnn.new_sim()
        for name in ("r", "W2"):
            sim.qc_quantize_op_dict[name].set_precision(quantsim.float16)
        return sim
    sim = half_sim()
    sim.compute_encodings(tiny_cnn.batches())
    sim.export(tmp_path, "m", encoding_version="2.0.0")
    fresh = half_sim()
    quantsim.load_encodings_to_sim(fresh, tmp_path / "m.encodings", strict=False)
    assert fresh.qc_quantize_op_dict["r"].enabled and fresh.qc_quantize_op_dict["W2"].enabled
    assert tiny_cnn.snapshot(fresh) == tiny_cnn.snapshot(sim)
    feed = tiny_cnn.batch(5)
    np.testing.assert_array_equal(fresh.session.run(None, feed)[0], sim.session.run(None, feed)[0])
