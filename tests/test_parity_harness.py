"""The parity harness (`benchmarks.parity`) keeps working without aimet-onnx: a few steps run on the quantsim side
(defaults and AIMET's switches) and return the read-outs the table compares, and `compare` flags what it should."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from benchmarks.parity import fixtures as fx
from benchmarks.parity.__main__ import compare, differences
from benchmarks.parity.apis import AIMET_SWITCHES, quantsim_api
from benchmarks.parity.steps import STEPS, scratch
from quantsim import AimetDifferenceWarning


def _run(name: str, switches: bool = True) -> dict:
    tmp = scratch()
    try:
        return STEPS[name](quantsim_api(aimet_switches=switches), fx.build_model(), fx.calibration(), tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_fixture_is_a_valid_model_with_batchnorm_and_a_depthwise_conv():
    model = fx.build_model()
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("BatchNormalization") == 2 and any(
        a.name == "group" and a.i > 1 for n in model.graph.node for a in n.attribute)
    assert fx.float_outputs(model).shape == (16, 10)


def test_the_constructor_step_returns_logits_and_the_output_step():
    result = _run("constructor, defaults (W8A8, min-max, per-channel)")
    assert set(result) == {"out", "step"}
    assert result["out"].shape == (16, 10) and result["step"] > 0
    fp32 = fx.float_outputs(fx.build_model())
    assert 0 < np.max(np.abs(result["out"] - fp32)) < 0.2  # quantized, and close to FP32


def test_the_switches_reach_the_sim_and_keep_batchnorm():
    with_switches = _run("exported encodings names, BN kept (1.0.0)")
    with pytest.warns(AimetDifferenceWarning, match="fold_batchnorm=False"):  # each default names its switch
        defaults = _run("exported encodings names, BN kept (1.0.0)", switches=False)
    assert set(with_switches) == {"activations", "params"}
    assert {"bn1.scale", "bn2.scale"} <= set(with_switches["params"])  # fold_batchnorm=False keeps them
    assert not {"bn1.scale", "bn2.scale"} & set(defaults["params"])  # quantsim's default folds them
    assert "dw_out" in with_switches["activations"]  # depthwise_supergroups=False: AIMET's placement
    assert set(AIMET_SWITCHES) == {"fold_batchnorm", "range_health", "depthwise_supergroups", "int32_bias"}


def test_the_2_0_0_export_step_summarises_every_entry():
    encodings = _run("sim.export(..., encoding_version='2.0.0') contents")["encodings"]
    assert encodings["bn1.scale"] == ("uint8", 1, False)  # AIMET's norm-parameter rule: asymmetric at 8 bits
    assert encodings["bn1.bias"] == ("int32", 1, False) and encodings["conv1.bias"] == ("int32", 8, False)
    assert encodings["conv1.weight"] == ("int8", 8, False)


def test_compare_flags_output_and_read_out_differences():
    fp32 = np.zeros((2, 3))
    aimet = {"out": np.full((2, 3), 1.0), "step": 0.1, "names": ["a", "b"]}
    assert compare("x", aimet, {"out": np.full((2, 3), 1.05), "step": 0.1, "names": ["a", "b"]}, fp32) == (
        True, "max diff 0.05 (aimet err 1, tol 0.5)")
    ok, note = compare("x", aimet, {"out": np.full((2, 3), 2.0), "step": 0.1, "names": ["a", "b"]}, fp32)
    assert not ok and "max diff 1" in note
    ok, note = compare("x", aimet, {"out": aimet["out"], "step": 0.1, "names": ["a"]}, fp32)
    assert not ok and "names: aimet ['a', 'b'] vs ['a']" in note
    ok, note = compare("x", {"type": "NoneType"}, {"type": "AmpResult"}, fp32)
    assert not ok and "NoneType" in note


def test_compare_names_the_differing_entries_of_dicts_and_ignores_info_read_outs():
    ok, note = compare("x", {"json": {"a.json": ["k"], "b.json": ["k"]}, "info: entries": 6},
                       {"json": {"a.json": ["k", "m"]}, "info: entries": 2}, np.zeros(1))
    assert not ok
    assert "json['a.json']" in note and "only quantsim ['m']" in note and "json['b.json']: only aimet" in note
    assert "entries (not compared): aimet 6 vs 2" in note
    assert compare("x", {"info: entries": 6}, {"info: entries": 2}, np.zeros(1))[0]
    assert differences("k", 1, 2) == ["k: aimet 1 vs 2"]


@pytest.mark.parametrize("name", sorted(STEPS))
def test_every_step_has_a_unique_name_and_a_callable(name):
    assert callable(STEPS[name]) and name.strip() == name
