"""Loading encodings (issue 28.7, 28.8): a 32-bit activation entry disables its quantizer and says so; weight
encodings that do not fit the weights they land on (frozen from a BatchNormalization-folded sim onto an
unfolded one, another model's file) warn, naming the tensors and the likely cause; encodings made for the
weights (min-max, Sequential MSE) do not.

aimet-onnx 2.42 (measured with its own load_encodings_to_sim on a Conv+Relu model, 1.0.0 file): an activation
entry ``{"dtype": "INT", "bw": 32, ...}`` loads with ``strict=False`` as an enabled 32-bit quantizer (an int32
grid: practically float) and returns a bitwidth mismatch (8 vs 32); ``{"dtype": "FLOAT", "bw": 32}`` raises
(only float16 is a known float encoding), with the sim unchanged.
"""
from __future__ import annotations

import copy
import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quantsim import (
    EncodingFormatError,
    EncodingMismatchError,
    QuantizationSimModel,
    QuantsimWarning,
    load_encodings_to_sim,
)
from quantsim.core.numerics import encoding_from_range
from quantsim.encodings.fit import MSE_RATIO_LIMIT, weight_fit


def conv_bn_model(seed: int = 0, channels: int = 8) -> onnx.ModelProto:
    """x -> Conv -> BatchNormalization -> Relu -> Conv -> BatchNormalization -> Relu -> GAP -> Flatten -> Gemm,
    BatchNormalization scales and variances spread like a trained network's (gamma/sqrt(var) from ~0.1 to ~13)."""
    rng = np.random.default_rng(seed)

    def init(name, values):
        return numpy_helper.from_array(np.asarray(values, np.float32), name)

    inits, nodes, x = [], [], "x"
    for i, cin in enumerate((3, channels), 1):
        inits += [init(f"w{i}", rng.normal(size=(channels, cin, 3, 3))), init(f"s{i}", rng.uniform(0.2, 3, channels)),
                  init(f"b{i}", rng.normal(size=channels)), init(f"m{i}", rng.normal(size=channels)),
                  init(f"v{i}", rng.uniform(0.05, 4, channels))]
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1] * 4),
                  helper.make_node("BatchNormalization", [f"c{i}", f"s{i}", f"b{i}", f"m{i}", f"v{i}"], [f"n{i}"],
                                   name=f"bn{i}"),
                  helper.make_node("Relu", [f"n{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    inits += [init("fw", rng.normal(size=(channels, 10))), init("fb", rng.normal(size=10))]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["p"], name="gap"),
              helper.make_node("Flatten", ["p"], ["f"], name="flat"),
              helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "conv_bn", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", 1, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


FEEDS = [{"x": np.random.default_rng(i).normal(size=(1, 3, 8, 8)).astype(np.float32)} for i in range(4)]


def _sim(seed: int = 0, **kwargs) -> QuantizationSimModel:
    return QuantizationSimModel(conv_bn_model(seed), param_type="int4", progress=False, **kwargs)


@pytest.fixture(scope="module")
def folded_file(tmp_path_factory):
    """Encodings of the default (BatchNormalization-folded) sim, W4A8."""
    folder = tmp_path_factory.mktemp("fit")
    sim = _sim()
    sim.compute_encodings(FEEDS)
    sim.export(str(folder), "folded", export_model=False)
    return folder / "folded.encodings"


def _fit_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "do not fit the weights" in str(w.message)]


def _freeze(sim, path) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim.set_and_freeze_param_encodings(str(path))
    return _fit_warnings(caught)


# --- 28.8: weight encodings that do not fit their weights -------------------------------------------------
def test_encodings_frozen_from_a_folded_sim_onto_an_unfolded_one_warn_naming_tensors_and_cause(folded_file):
    unfolded = _sim(fold_batchnorm=False)
    (message,) = _freeze(unfolded, folded_file)
    lines = message.splitlines()
    assert "the encodings of 2 weight(s) do not fit" in lines[0]
    assert "keeps BatchNormalization unfolded" in lines[0] and "folded it" in lines[0]
    assert sorted(line.split()[0] for line in lines[1:]) == ["w1", "w2"]  # fw has no BatchNormalization: it fits
    assert all("% of values clipped" in line for line in lines[1:])
    assert unfolded.qc_quantize_op_dict["w1"].is_encoding_frozen()  # a warning: the call still does what it did


def test_the_same_file_on_the_same_kind_of_sim_does_not_warn(folded_file):
    assert _freeze(_sim(), folded_file) == []
    sim = _sim()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_encodings_to_sim(sim, str(folded_file))
    assert _fit_warnings(caught) == []


def test_loading_a_whole_file_onto_an_unfolded_sim_warns_too(folded_file):
    sim = _sim(fold_batchnorm=False)
    with pytest.warns(QuantsimWarning, match="do not fit the weights"):
        load_encodings_to_sim(sim, str(folded_file), strict=False)


def test_another_models_file_warns(folded_file):
    (message,) = _freeze(_sim(seed=7), folded_file)
    named = sorted(line.split()[0] for line in message.splitlines()[1:])
    assert "another model's" in message and named and set(named) <= {"w1", "w2", "fw"}


def test_sequential_mse_encodings_on_their_own_weights_do_not_warn(tmp_path):
    from adaround import apply_seq_mse

    sim = _sim()
    sim.compute_encodings(FEEDS)
    apply_seq_mse(sim, FEEDS, num_candidates=20)  # clips on purpose: some channels' grids reach under half
    sim.export(str(tmp_path), "seq", export_model=False)
    assert _freeze(_sim(), tmp_path / "seq.encodings") == []


def test_weight_fit_by_hand():
    w = np.array([[-1.0, -0.5, 0.25, 1.0], [-0.02, 0.01, 0.0, 0.02]], np.float32)  # two channels, axis 0
    own = encoding_from_range(*([w.min(axis=1), w.max(axis=1)]), 8, symmetric=True, axis=0)
    fit = weight_fit("w", w, own)
    assert fit.mse_ratio == pytest.approx(1.0) and fit.clipped_fraction == 0 and fit.fits
    assert fit.reach_low == pytest.approx(1) and fit.reach_high == pytest.approx(1)
    swapped = encoding_from_range(np.array([-0.02, -1.0]), np.array([0.02, 1.0]), 8, symmetric=True, axis=0)
    fit = weight_fit("w", w, swapped)  # channel 0 clipped to +-0.02, channel 1 on a grid 50x too wide
    assert fit.clipped_fraction == pytest.approx(4 / 8)  # every value of channel 0 lies beyond +-0.02
    assert fit.reach_low == pytest.approx(0.02) and fit.reach_high == pytest.approx(50)
    assert fit.mse_ratio > MSE_RATIO_LIMIT and not fit.fits
    assert "w (" in fit.describe() and "% of values clipped" in fit.describe()
    wide = encoding_from_range(-3.0, 3.0, 8, symmetric=True)  # per tensor, 3x too wide: 9x the rounding error
    fit = weight_fit("w", np.linspace(-1, 1, 1001, dtype=np.float32), wide)
    assert fit.mse_ratio == pytest.approx(9, rel=0.15) and fit.reach_high == pytest.approx(3)
    assert not fit.fits
    assert weight_fit("z", np.zeros(4, np.float32), wide).fits  # no error at all: fits whatever the grid
    clipped = encoding_from_range(-0.25, 0.25, 8, symmetric=True)  # clipping alone (Sequential MSE's way)
    fit = weight_fit("w", np.linspace(-1, 1, 1001, dtype=np.float32), clipped)
    assert fit.mse_ratio > MSE_RATIO_LIMIT and fit.reach_high == pytest.approx(0.25) and fit.fits
    assert fit.clipped_fraction == pytest.approx(0.75, abs=0.01)
    dead = np.stack([np.linspace(-1, 1, 9), np.zeros(9)]).astype(np.float32)  # a dead channel at the scale floor
    floor = encoding_from_range(np.array([-1.0, 0.0]), np.array([1.0, 0.0]), 4, symmetric=True, axis=0)
    assert weight_fit("w", dead, floor).reach_high == pytest.approx(1)


# --- 28.7: 32-bit activation entries ---------------------------------------------------------------------
def _exported(tmp_path) -> dict:
    sim = _sim()
    sim.compute_encodings(FEEDS)
    sim.export(str(tmp_path), "m", export_model=False)
    return json.loads((tmp_path / "m.encodings").read_text())


def _with_wide_activation(data: dict, float_entry: bool = False) -> tuple[dict, str]:
    data = copy.deepcopy(data)
    entry = next(e for e in data["activation_encodings"] if e["name"] != "x")
    if float_entry:
        name = entry["name"]
        entry.clear()
        entry.update(name=name, dtype="FLOAT", bw=32, enc_type="PER_TENSOR")
    else:
        entry["bw"] = 32
    return data, entry["name"]


def _outputs(sim) -> np.ndarray:
    return np.concatenate([sim.session.run(None, feed)[0] for feed in FEEDS])


def test_a_32_bit_activation_entry_disables_its_quantizer_and_says_so(tmp_path):
    data, name = _with_wide_activation(_exported(tmp_path))
    sim = _sim()
    with pytest.raises(EncodingMismatchError, match="32-bit encoding"):
        load_encodings_to_sim(sim, copy.deepcopy(data), strict=True)
    assert sim.qc_quantize_op_dict[name].enabled  # a failed strict load changes nothing
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mismatches = load_encodings_to_sim(sim, data, strict=False)
    said = " ".join(str(w.message) for w in caught)
    assert f"{name}: a 32-bit encoding" in said and "quantizer is disabled, so the tensor runs in float" in said
    assert "not loaded" not in said
    assert not sim.qc_quantize_op_dict[name].enabled  # what the warning says is what happened
    assert [(m.name, m.field, m.sim_value, m.file_value) for m in mismatches] == [(name, "bitwidth", 8, 32)]
    reference = _sim()  # the rest of the file loaded, that one quantizer off: the same outputs
    good = copy.deepcopy(data)
    good["activation_encodings"] = [e for e in good["activation_encodings"] if e["name"] != name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_encodings_to_sim(reference, good, strict=False)
    assert not reference.qc_quantize_op_dict[name].enabled
    np.testing.assert_array_equal(_outputs(sim), _outputs(reference))


def test_a_32_bit_activation_entry_disables_even_without_disable_missing_quantizers(tmp_path):
    data, name = _with_wide_activation(_exported(tmp_path))
    sim = _sim()
    with pytest.warns(UserWarning, match="disabled"):
        load_encodings_to_sim(sim, data, strict=False, disable_missing_quantizers=False)
    assert not sim.qc_quantize_op_dict[name].enabled


def test_a_float32_activation_entry_is_refused_like_aimet_does(tmp_path):
    data, name = _with_wide_activation(_exported(tmp_path), float_entry=True)
    sim = _sim()
    with pytest.raises(EncodingFormatError, match=f"'{name}'.*only float16"):
        load_encodings_to_sim(sim, data, strict=False)
    assert sim.qc_quantize_op_dict[name].enabled and sim.qc_quantize_op_dict[name].bitwidth == 8
