"""AIMET 2.0.0 parity for Pad, Clip, Max, Min and Where (issue 13).

aimet-onnx derives an entry at export for a Pad's output from its data input (whatever the padding
value), and for Clip/Max/Min/Where outputs only when all their float data inputs (Clip's bounds, Where's
two branches) carry one and the same encoding. Reading such a file back gives the same sim: a derived
entry is not loaded onto a quantizer; an entry with another grid is.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import parser

import quantsim
from tests import tiny_cnn

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,2,6,6] x, float[1,2,6,6] y, bool[1,2,6,6] c) => (float[1,2,8,8] o1, float[1,2,6,6] o2,
   float[1,2,6,6] o3, float[1,2,6,6] o4, float[1,2,6,6] o5, float[1,2,6,6] o6) {
  r = Relu(x)
  s = Relu(y)
  pads = Constant<value = int64[8] {0,0,1,1,0,0,1,1}>()
  p = Pad(r, pads)
  o1 = Relu(p)
  hi = Constant<value = float {0.5}>()
  lo_r = ReduceMin<keepdims = 0>(r)
  hi_r = ReduceMax<keepdims = 0>(r)
  cl = Clip(r, lo_r, hi_r)
  o2 = Relu(cl)
  m = Max(r, r)
  o3 = Relu(m)
  w = Where(c, r, r)
  o4 = Relu(w)
  n = Min(r, s)
  o5 = Relu(n)
  v = Where(c, r, s)
  o6 = Relu(v)
}
"""
DISABLED = ("cl", "m", "w", "n", "v")  # outputs whose own quantizers a user turned off


def _feeds():
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(size=(1, 2, 6, 6)).astype(np.float32), "y": rng.normal(size=(1, 2, 6, 6)).astype(np.float32),
             "c": rng.normal(size=(1, 2, 6, 6)) > 0} for _ in range(3)]


def _sim(calibrate: bool = True) -> quantsim.QuantizationSimModel:
    sim = quantsim.QuantizationSimModel(parser.parse_model(TEXT), progress=False)
    for name in DISABLED:
        sim.qc_quantize_op_dict[name].enabled = False
    if calibrate:
        sim.compute_encodings(_feeds())
    return sim


def _entries(sim, tmp_path) -> dict[str, dict]:
    sim.export(tmp_path, "m", encoding_version="2.0.0")
    data = json.loads((tmp_path / "m.encodings").read_text())
    return {e["name"]: {k: v for k, v in e.items() if k != "name"} for e in data["encodings"]}


def test_aimet_derives_pad_and_clip_max_where_with_agreeing_inputs_only(tmp_path):
    entries = _entries(_sim(), tmp_path)
    r = entries["r"]
    assert entries["p"] == r  # Pad: from its data input
    assert entries["lo_r"] == r and entries["hi_r"] == r  # ReduceMin/Max select values: derived too
    assert entries["cl"] == r and entries["m"] == r and entries["w"] == r  # all data inputs on r's grid
    assert "n" not in entries and "v" not in entries  # Min(r, s), Where(c, r, s): two grids, nothing derived
    names = list(entries)
    assert names.index("p") > names.index("o1")  # derived entries come last, as AIMET writes them


def test_clip_with_plain_constant_bounds_derives_nothing(tmp_path):
    """``Clip(x, 0, 6)`` with unquantized constant bounds: AIMET's bounds have no encoding equal to x's."""
    text = TEXT.replace("cl = Clip(r, lo_r, hi_r)", "cl = Clip(r, hi, hi)")
    sim = quantsim.QuantizationSimModel(parser.parse_model(text), progress=False)
    sim.qc_quantize_op_dict["cl"].enabled = False
    sim.compute_encodings(_feeds())
    assert "cl" not in _entries(sim, tmp_path)


def test_round_trip_gives_back_the_same_sim(tmp_path):
    sim = _sim()
    _entries(sim, tmp_path)
    fresh = _sim(calibrate=False)
    assert quantsim.load_encodings_to_sim(fresh, tmp_path / "m.encodings", strict=True) == []
    assert tiny_cnn.snapshot(fresh) == tiny_cnn.snapshot(sim)
    for feed in _feeds()[:2]:
        for a, b in zip(sim.session.run(None, feed), fresh.session.run(None, feed)):
            np.testing.assert_array_equal(a, b)
    params = quantsim.QuantizationSimModel(parser.parse_model(TEXT), progress=False)
    params.set_and_freeze_param_encodings(str(tmp_path / "m.encodings"))  # no parameters here: nothing frozen
    assert not any(q.is_encoding_frozen() for q in params.qc_quantize_op_dict.values())


def test_a_pad_entry_on_another_grid_is_loaded_as_a_quantizer(tmp_path):
    sim = _sim()
    sim.export(tmp_path, "m", encoding_version="2.0.0")
    data = json.loads((tmp_path / "m.encodings").read_text())
    for entry in data["encodings"]:
        if entry["name"] == "p":
            entry["y_scale"] *= 2
    fresh = _sim(calibrate=False)
    with pytest.warns(UserWarning):
        mismatches = quantsim.load_encodings_to_sim(fresh, data, strict=False)
    assert ("p", "enabled") in [(m.name, m.field) for m in mismatches]
    assert fresh.qc_quantize_op_dict["p"].enabled


def test_file_validates_against_the_2_0_0_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).resolve().parent.parent / "docs" / "schemas" / "encodings-2.0.0.schema.json").read_text())
    _entries(_sim(), tmp_path)
    jsonschema.validate(json.loads((tmp_path / "m.encodings").read_text()), schema)
