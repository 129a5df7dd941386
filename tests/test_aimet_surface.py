"""aimet-onnx 2.42's ``QuantizationSimModel`` / ``QcQuantizeOp`` calls beyond the core surface, on the tiny CNN.

Expected values come from aimet-onnx 2.42 runs on the same model and data (tests/tiny_cnn.py, min-max,
default per-channel config): the input quantizer ``x`` calibrates to ``scale 0.027824606614954332, offset -136``;
``clamp_activation_encodings(sim, 1.0)`` makes it ``min -1, max 1, delta 2/255, offset -128``;
``fold_param_quantizers`` leaves the session's outputs bit-identical and the quantizers enabled;
``remove_quantizers`` rewires readers and graph outputs back to the unquantized names; ``OpMode`` values are
``updateStats 0, oneShotQuantizeDequantize 1, quantizeDequantize 2, passThrough 3``; an uncalibrated parameter
reads 1, an uncalibrated activation 0, both 2 after calibration. The last test compares with aimet-onnx itself
where it is installed."""
from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from tiny_cnn import batch, batches, calibrated_sim, make_model, new_sim

import quantsim
from quantsim import (
    InvalidArgumentError,
    InvalidStateError,
    ModelView,
    NotSupportedError,
    OpMode,
    QuantizationSimModel,
    UnknownQuantizerError,
    clamp_activation_encodings,
)
from quantsim.sim.config import CONFIG_DIR

AIMET_X_SCALE, AIMET_X_OFFSET = 0.027824606614954332, -136.0


# sim.model ----------------------------------------------------------------------------------------
def test_sim_model_is_a_view_whose_model_is_the_model_proto(tmp_path):
    sim = calibrated_sim()
    view = sim.model
    assert isinstance(view, ModelView) and isinstance(view.model, onnx.ModelProto)
    assert [n.op_type for n in view.graph.node] == ["Conv", "Relu", "GlobalAveragePool", "Flatten", "Gemm"]
    assert [n.name for n in view.nodes()] == [n.name for n in view.model.graph.node]
    assert view.get_initializer("W") is view.model.graph.initializer[0] and view.get_initializer("nope") is None
    assert view.SerializeToString() == view.model.SerializeToString()
    onnx.save(view, str(tmp_path / "a.onnx"))  # onnx.save takes it like the ModelProto
    view.save_model_to_file(tmp_path / "b.onnx")
    assert onnx.load(str(tmp_path / "a.onnx")) == onnx.load(str(tmp_path / "b.onnx")) == view.model
    onnx.checker.check_model(view)
    copied = copy.deepcopy(view)
    assert type(copied) is onnx.ModelProto and copied == view.model and copied is not view.model
    assert type(pickle.loads(pickle.dumps(view))) is onnx.ModelProto
    assert quantsim.prepare(view) == quantsim.prepare(view.model)  # quantsim's functions take the view
    again = QuantizationSimModel(view, progress=False)
    assert again.param_names == sim.param_names


# AIMET sim methods --------------------------------------------------------------------------------
def test_get_supported_kernels_in_aimets_shape():
    assert new_sim().get_supported_kernels() == {"defaults": {}}  # as aimet-onnx for a config without kernels
    config = __import__("json").loads((CONFIG_DIR / "default_config_per_channel.json").read_text())
    kernel = {"activation": {"bitwidth": 16, "dtype": "int"}, "param": {"bitwidth": 8, "dtype": "int"}}
    config["defaults"]["supported_kernels"] = [kernel]
    config["op_type"]["Conv"] = {"supported_kernels": [{"activation": {"bitwidth": 8, "dtype": "int"}}]}
    found = new_sim(config_file=config).get_supported_kernels()
    assert found == {"defaults": [kernel], "Conv": [{"activation": {"bitwidth": 8, "dtype": "int"}}]}
    assert type(found["defaults"][0]["param"]) is dict


def test_fold_param_quantizers_bakes_the_weights_and_keeps_the_outputs():
    sim = calibrated_sim()
    feed = batch(9)
    before = sim.session.run(None, feed)[0]
    state = sim.snapshot()
    encodings = {name: sim.qc_quantize_op_dict[name].get_encodings() for name in ("W", "W2")}
    folded = sim.fold_param_quantizers()
    assert sorted(folded) == ["W", "W2"]  # biases are not quantized by the default config
    np.testing.assert_array_equal(sim.session.run(None, feed)[0], before)  # as in aimet-onnx: bit-identical
    for name in folded:
        q = sim.qc_quantize_op_dict[name]
        weight = sim.get_weight(name)
        assert q.enabled and q.is_encoding_frozen() and q.get_encodings() == encodings[name]
        np.testing.assert_array_equal(q.quantize_dequantize(weight), weight)  # the weights are on their grid
    sim.compute_encodings(batches(scale=3.0))  # aimet-onnx fails here; the frozen grid stays
    assert sim.qc_quantize_op_dict["W"].get_encodings() == encodings["W"]
    sim.restore(state)
    assert not np.array_equal(sim.get_weight("W"), sim.qc_quantize_op_dict["W"].quantize_dequantize(sim.get_weight("W")))


def _aimet_style_model() -> onnx.ModelProto:
    """x -> QcQuantizeOp -> Relu -> QcQuantizeOp -> graph output, as an aimet-onnx sim model holds them."""
    nodes = [
        helper.make_node("QcQuantizeOp", ["x"], ["x_updated"], name="QcQuantizeOp_x", domain="aimet.customop.cpu"),
        helper.make_node("Relu", ["x_updated"], ["y"], name="relu"),
        helper.make_node("QcQuantizeOp", ["y"], ["y_updated"], name="QcQuantizeOp_y", domain="aimet.customop.cpu"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y_updated", onnx.TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("aimet.customop.cpu", 1)])


def test_remove_quantizers_rewires_like_aimet_and_returns_the_float_model_of_a_sim():
    model = _aimet_style_model()
    out = QuantizationSimModel.remove_quantizers(model)
    assert out is model  # in place, returned
    assert [(n.op_type, list(n.input), list(n.output)) for n in out.graph.node] == [("Relu", ["x"], ["y"])]
    assert [o.name for o in out.graph.output] == ["y"]
    np.testing.assert_array_equal(ReferenceEvaluator(out).run(None, {"x": np.array([-1, 2], np.float32)})[0], [0, 2])
    sim = calibrated_sim()
    assert QuantizationSimModel.remove_quantizers(sim.model) is sim.model.model
    with pytest.warns(UserWarning, match="QuantizeLinear"):
        QuantizationSimModel.remove_quantizers(sim.to_onnx_qdq())


def test_clamp_activation_encodings_matches_aimet():
    sim = calibrated_sim()
    x = sim.qc_quantize_op_dict["x"]
    (enc,) = x.get_encodings()
    assert enc.delta == pytest.approx(AIMET_X_SCALE, rel=1e-12) and enc.offset == AIMET_X_OFFSET
    sim.qc_quantize_op_dict["y"].freeze_encodings()
    frozen = sim.qc_quantize_op_dict["y"].get_encodings()
    clamped = clamp_activation_encodings(sim, 1.0)
    assert "x" in clamped and "y" not in clamped
    (enc,) = x.get_encodings()  # aimet-onnx: delta 2/255, offset -128 (it reports the clamped min -1 and max 1;
    assert enc.delta == pytest.approx(2 / 255, rel=1e-12) and enc.offset == -128.0  # here min/max are the grid's)
    assert (enc.min, enc.max) == (pytest.approx(-128 * 2 / 255), pytest.approx(127 * 2 / 255))
    assert sim.qc_quantize_op_dict["y"].get_encodings() == frozen
    assert clamp_activation_encodings(sim, 1.0) == []  # already inside
    for bad in (0, -1.0, float("nan"), "1"):
        with pytest.raises(InvalidArgumentError, match="clamp_val"):
            x.clip_and_recompute_encodings(bad)
    x.enabled = False
    assert x.clip_and_recompute_encodings(0.5) is None  # disabled: nothing done, as in AIMET


def test_get_op_quantizers_set_quantizers_and_attributes(tmp_path):
    sim = calibrated_sim(path=tmp_path)
    inputs, outputs, params = sim.get_op_quantizers("conv")
    table = sim.qc_quantize_op_dict
    assert inputs == [table["x"]] and outputs == [table["c"]] and params == {"weight": table["W"], "bias": table["B"]}
    node = next(n for n in sim.model.graph.node if n.name == "fc")
    assert sim.get_op_quantizers(node)[2]["weight"] is table["W2"]
    with pytest.raises(InvalidArgumentError, match="closest"):
        sim.get_op_quantizers("cnov")
    sim.set_quantizers({"g": table["r"]})  # tie g to r's quantizer
    assert table["g"] is table["r"] and "g" in table["r"].tensors and len(sim.quantizers) == len(set(map(id, table.values())))
    sim.compute_encodings(batches())
    with pytest.raises(InvalidArgumentError, match="cannot share"):
        sim.set_quantizers({"W": table["x"]})
    with pytest.raises(UnknownQuantizerError):
        sim.set_quantizers({"nope": table["x"]})
    sim.save_model_graph("graph")
    assert {n.op_type for n in onnx.load(str(tmp_path / "graph.onnx")).graph.node} >= {"QuantizeLinear", "Conv"}
    assert sim.input_quantizers_name == []  # as aimet-onnx: no constants quantized as activations here
    assert [n.name for n in sim.input_name_to_nodes["x"]] == ["conv"] and sim.output_name_to_node["y"].name == "fc"
    assert set(sim.activation_dtypes) == {"W", "B", "W2", "B2", "x", "c", "r", "g", "f", "y"} - {"c", "f"} | {
        t for t in sim.activation_names}
    assert all(d == np.float32 for d in sim.activation_dtypes.values())
    assert sim.quant_args == {"activation_bitwidth": 8, "dtype": "int", "is_symmetric": True, "param_bitwidth": 8,
                              "per_channel_quantization": True, "quant_scheme": "min_max"}  # aimet-onnx's values
    with pytest.raises(NotSupportedError, match="get_op_quantizers"):
        sim.connected_graph  # noqa: B018
    with pytest.warns(DeprecationWarning):
        session = QuantizationSimModel.build_session(sim.model, ["CPUExecutionProvider"])
    assert session.run(None, batch(1))[0].shape == (2, 5)


# quantizer ----------------------------------------------------------------------------------------
def test_op_mode_reads_and_writes_aimets_values():
    assert [(m.name, int(m)) for m in OpMode] == [("updateStats", 0), ("oneShotQuantizeDequantize", 1),
                                                 ("quantizeDequantize", 2), ("passThrough", 3)]
    sim = new_sim()
    w, x = sim.qc_quantize_op_dict["W"], sim.qc_quantize_op_dict["x"]
    assert (w.op_mode, x.op_mode) == (OpMode.oneShotQuantizeDequantize, OpMode.updateStats)
    with pytest.raises(InvalidStateError, match="no encoding"):
        x.op_mode = OpMode.quantizeDequantize
    sim.compute_encodings(batches())
    assert (w.op_mode, x.op_mode) == (OpMode.quantizeDequantize, OpMode.quantizeDequantize)
    x.op_mode = OpMode.passThrough
    assert not x.enabled and x.op_mode == OpMode.passThrough
    x.op_mode = 2  # plain ints, as aimet's pybind enum allows
    assert x.enabled and x.encoding is not None
    x.op_mode = OpMode.updateStats  # collect again: the encoding goes, the next calibration computes it
    assert x.enabled and x.encoding is None and x.op_mode == OpMode.updateStats
    with pytest.raises(InvalidArgumentError, match="op_mode"):
        x.op_mode = 7


def test_reset_encoding_stats_and_the_deprecated_encodings_property():
    sim = calibrated_sim()
    x, w = sim.qc_quantize_op_dict["x"], sim.qc_quantize_op_dict["W"]
    encodings = x.encodings
    assert encodings == x.get_encodings()
    x.reset_encoding_stats()
    assert x.encoding is None and not x.is_initialized()
    x.encodings = encodings
    assert x.get_encodings() == encodings
    w.freeze_encodings()
    w.reset_encoding_stats()  # frozen: kept, as in AIMET
    assert w.encoding is not None


def test_quantize_dequantize_against_onnx_reference():
    sim = calibrated_sim()
    x = sim.qc_quantize_op_dict["x"]
    values = np.array([0.3, 5.0, -7.0, 0.0139, 1.23456], np.float32)
    enc = x.encoding
    q = helper.make_node("QuantizeLinear", ["v", "s", "z"], ["q"])
    dq = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])
    graph = helper.make_graph([q, dq], "qdq", [helper.make_tensor_value_info("v", 1, [5])],
                              [helper.make_tensor_value_info("y", 1, [5])],
                              [onnx.numpy_helper.from_array(np.array(enc.scale, np.float32), "s"),
                               onnx.numpy_helper.from_array(np.array(enc.zero_point, np.uint8), "z")])
    reference = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]))
    want = reference.run(None, {"v": values})[0]
    np.testing.assert_array_equal(x.quantize_dequantize(values), want)  # aimet-onnx: [0.306, 3.311, -3.784, 0, ...]
    assert x.quantize_dequantize(values.astype(np.float64)).dtype == np.float64
    x.reset_encoding_stats()
    with pytest.raises(InvalidStateError):
        x.quantize_dequantize(values)


def test_export_encodings_per_quantizer_as_aimet():
    sim = calibrated_sim()
    x = sim.qc_quantize_op_dict["x"]
    assert x.export_encodings("2.0.0") == {"output_dtype": "uint8", "y_scale": pytest.approx(AIMET_X_SCALE, rel=1e-12),
                                           "y_zero_point": 136}
    v1 = x.export_encodings("1.0.0")
    assert {k: v1[k] for k in ("dtype", "bw", "is_sym", "offset", "enc_type")} == {
        "dtype": "INT", "bw": 8, "is_sym": False, "offset": [-136], "enc_type": "PER_TENSOR"}
    (entry,) = x.export_encodings()  # 0.6.1 by default: the list of per-channel dicts
    assert entry["offset"] == -136 and entry["bitwidth"] == 8 and entry["is_symmetric"] == "False"
    w2 = sim.qc_quantize_op_dict["W"].export_encodings("2.0.0")
    assert w2["output_dtype"] == "int8" and w2["axis"] == 0 and len(w2["y_scale"]) == 4
    assert sim.qc_quantize_op_dict["B"].export_encodings("1.0.0") is None  # disabled, as in aimet-onnx


def test_what_has_no_counterpart_says_what_to_use():
    x = calibrated_sim().qc_quantize_op_dict["x"]
    for call in (lambda: x.update_encoding_stats(np.zeros(3, np.float32)), x.compute_encodings,
                 x.get_stats_histogram, lambda: x.set_zero_point_shift(0.5), lambda: x.quant_info,
                 lambda: x.tensor_quantizer_params):
        with pytest.raises(NotSupportedError, match="quantizer 'x'"):
            call()
    assert x.get_zero_point_shift() == 0.0 and x.rounding_mode == "nearest"
    x.set_zero_point_shift(0.0)  # no shift: accepted


def test_update_quantizer_and_load_encodings():
    sim = calibrated_sim()
    source = sim.qc_quantize_op_dict["x"]
    target = sim.qc_quantize_op_dict["y"]
    target.enabled = False
    target.update_quantizer_and_load_encodings(source.get_encodings(), False, False, False,
                                               quantsim.QuantizationDataType.int)
    assert target.enabled and target.get_encodings() == source.get_encodings()
    weight = sim.qc_quantize_op_dict["W"]  # per channel: one encoding for 4 channels fails, and changes nothing
    spec, encodings = weight.spec, weight.get_encodings()
    with pytest.raises(InvalidArgumentError):
        weight.update_quantizer_and_load_encodings(source.get_encodings(), False, False, False,
                                                   quantsim.QuantizationDataType.int)
    assert weight.spec == spec and weight.get_encodings() == encodings


# aimet-onnx itself ----------------------------------------------------------------------------------
def test_every_public_aimet_name_exists_here():
    aimet_quantsim = pytest.importorskip("aimet_onnx.quantsim")
    aimet_op = pytest.importorskip("aimet_onnx.qc_quantize_op")
    for ours, theirs in ((QuantizationSimModel, aimet_quantsim.QuantizationSimModel),
                         (quantsim.QcQuantizeOp, aimet_op.QcQuantizeOp)):
        missing = [n for n in dir(theirs) if not n.startswith("_") and not hasattr(ours, n)]
        assert missing == [], f"{ours.__name__} lacks {missing}"
    assert {m.name: int(m) for m in OpMode} == {m.name: int(m) for m in aimet_op.OpMode.__members__.values()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = aimet_quantsim.QuantizationSimModel(make_model())
        theirs.compute_encodings(batches())
    ours = calibrated_sim()
    for mine, aimets in ((ours, theirs), (ours.qc_quantize_op_dict["x"], theirs.qc_quantize_op_dict["x"])):
        missing = [n for n in vars(aimets) if not n.startswith("_") and n not in dir(mine)]
        assert missing == [], f"{type(mine).__name__} instances lack {missing}"
    for name in ("x", "W"):
        assert [e.offset for e in ours.qc_quantize_op_dict[name].get_encodings()] == \
            [e.offset for e in theirs.qc_quantize_op_dict[name].get_encodings()]
    aimet_quantsim.clamp_activation_encodings(theirs, 1.0)
    clamp_activation_encodings(ours, 1.0)
    (a,), (b,) = ours.qc_quantize_op_dict["x"].get_encodings(), theirs.qc_quantize_op_dict["x"].get_encodings()
    assert (a.delta, a.offset) == (pytest.approx(b.delta, rel=1e-12), b.offset)
