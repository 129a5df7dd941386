"""An AIMET script's sim quantizes the tensors aimet-onnx quantizes: with the three switches that turn this
project's accuracy defaults into AIMET's behaviour (``range_health=False``, ``depthwise_supergroups=False`` and,
for a script that keeps BatchNormalization, ``fold_batchnorm=False``) the encodings names exported for small
models equal aimet-onnx 2.42's (`tests.bn_models.AIMET_NAMES`, measured with it; compared live behind a skip).
Where the sim's defaults differ on purpose (folding, the calibrated decisions, depthwise supergroups) it warns
once, naming the switch."""
from __future__ import annotations

import copy
import json
import warnings

import onnx
import pytest

from quantsim import AimetDifferenceWarning, QuantizationSimModel
from quantsim.batch_norm_fold import fold_all_batch_norms_to_weight
from tests.bn_models import AIMET_NAMES, CLIP_BOUNDS, MODELS, conv_act, conv_bn_relu, input_feed


def _exported_names(tmp_path, model, **options) -> tuple[tuple[str, ...], tuple[str, ...]]:
    sim = QuantizationSimModel(model, progress=False, **options)
    sim.compute_encodings([input_feed(model)])
    sim.export(str(tmp_path), "m", encoding_version="1.0.0")
    encodings = json.loads((tmp_path / "m.encodings").read_text())
    return (tuple(sorted(e["name"] for e in encodings["activation_encodings"])),
            tuple(sorted(e["name"] for e in encodings["param_encodings"])))


def _expected(name: str, form: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    activations, params = AIMET_NAMES[name][form]
    return tuple(a for a in activations if a not in CLIP_BOUNDS), params


@pytest.mark.parametrize("name", sorted(MODELS))
def test_script_that_folds_first_exports_aimets_names(tmp_path, name):
    model = MODELS[name]()
    fold_all_batch_norms_to_weight(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AimetDifferenceWarning)  # nothing left to fold: no warning
        assert _exported_names(tmp_path, model, range_health=False, depthwise_supergroups=False) == \
            _expected(name, "folded")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_script_that_keeps_batchnorm_exports_aimets_names(tmp_path, name):
    assert _exported_names(tmp_path, MODELS[name](), fold_batchnorm=False, range_health=False,
                           depthwise_supergroups=False) == _expected(name, "kept")


def test_depthwise_conv_shares_the_activations_quantizer_unless_asked_for_aimets_placement(tmp_path):
    aimet = {"depthwise_supergroups": False}
    assert "conv_out" in _exported_names(tmp_path, conv_act(depthwise=True), **aimet)[0]
    assert "conv_out" in _exported_names(tmp_path, conv_act(depthwise=True, act="Relu6"), **aimet)[0]
    with pytest.warns(AimetDifferenceWarning, match="depthwise_supergroups=False") as record:
        assert "conv_out" not in _exported_names(tmp_path, conv_act(depthwise=True))[0]
    assert len([w for w in record if issubclass(w.category, AimetDifferenceWarning)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", AimetDifferenceWarning)  # explicit: no warning
        assert "conv_out" not in _exported_names(tmp_path, conv_act(depthwise=True), depthwise_supergroups=True)[0]
        assert "conv_out" not in _exported_names(tmp_path, conv_act(depthwise=False))[0]  # a plain Conv+Relu fuses


def test_implicit_batchnorm_fold_warns_once_naming_the_switch():
    with pytest.warns(AimetDifferenceWarning, match=r"bn -> conv.*fold_batchnorm=False") as record:
        sim = QuantizationSimModel(conv_bn_relu(), progress=False)
    assert len([w for w in record if issubclass(w.category, AimetDifferenceWarning)]) == 1
    assert any(d.rule == "batchnorm fold" and d.tensors == ("bn",) for d in sim.decisions)
    for explicit in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error", AimetDifferenceWarning)
            QuantizationSimModel(conv_bn_relu(), progress=False, fold_batchnorm=explicit)


def _heterogeneous_concat():
    model = MODELS["concat"]()
    for tensor in model.graph.initializer:  # one branch 1000x the other: calibration unties the Concat
        if tensor.name == "c2.weight":
            tensor.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor) * 1000.0, tensor.name))
    return model


def test_calibrated_decisions_warn_once_per_sim_unless_range_health_is_given():
    model = _heterogeneous_concat()
    feeds = [input_feed(model, seed) for seed in range(2)]
    sim = QuantizationSimModel(copy.deepcopy(model), progress=False)
    with pytest.warns(AimetDifferenceWarning, match="range_health=False"):
        sim.compute_encodings(feeds)
    assert sim.decisions
    with warnings.catch_warnings():
        warnings.simplefilter("error", AimetDifferenceWarning)
        sim.compute_encodings(feeds)  # once per sim
        QuantizationSimModel(copy.deepcopy(model), progress=False, range_health=True).compute_encodings(feeds)


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_same_names_as_aimet_onnx(tmp_path, name, fold):
    aimet_quantsim = pytest.importorskip("aimet_onnx.quantsim")
    from aimet_onnx.batch_norm_fold import fold_all_batch_norms_to_weight as aimet_fold

    theirs, ours = MODELS[name](), MODELS[name]()
    if fold:
        aimet_fold(theirs)
        fold_all_batch_norms_to_weight(ours)
    sim = aimet_quantsim.QuantizationSimModel(theirs)
    feed = input_feed(theirs)
    sim.compute_encodings(lambda session, _: session.run(None, feed), None)
    (tmp_path / "aimet").mkdir()
    sim.export(str(tmp_path / "aimet"), "m", encoding_version="1.0.0")
    encodings = json.loads((tmp_path / "aimet" / "m.encodings").read_text())
    aimet_names = (tuple(sorted(e["name"] for e in encodings["activation_encodings"] if e["name"] not in CLIP_BOUNDS)),
                   tuple(sorted(e["name"] for e in encodings["param_encodings"])))
    (tmp_path / "ours").mkdir()
    assert _exported_names(tmp_path / "ours", ours, fold_batchnorm=None if fold else False,
                           range_health=False) == aimet_names
