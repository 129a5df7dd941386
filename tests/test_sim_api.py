"""The AIMET-compatible surface of `QuantizationSimModel` and its quantizer objects.

Small models are built inline with onnx.helper; every sim is built with ``progress=False``.
"""
from __future__ import annotations

import json
import os
import tracemalloc
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_cnn import batch, batches, calibrated_sim, make_model, new_sim, snapshot  # tests/tiny_cnn.py

import quantsim
from quantsim import (
    EncodingMismatchError,
    QuantizationDataType,
    QuantizationSimModel,
    QuantScheme,
    TfEncoding,
    float16,
    int4,
    int8,
    int16,
    load_encodings_to_sim,
)


# --------------------------------------------------------------------------------------------------
# models and data
# --------------------------------------------------------------------------------------------------
def float_run(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def enc_of(sim, name) -> list[TfEncoding]:
    return sim.qc_quantize_op_dict[name].get_encodings()


# --------------------------------------------------------------------------------------------------
# constructor
# --------------------------------------------------------------------------------------------------
def test_constructor_accepts_model_proto_and_path(tmp_path):
    model = make_model()
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    from_proto = new_sim(model)
    from_path = new_sim(str(path))
    from_pathlike = new_sim(path)
    for sim in (from_proto, from_path, from_pathlike):
        sim.compute_encodings(batches())
    assert snapshot(from_proto) == snapshot(from_path) == snapshot(from_pathlike)
    assert str(path) in from_path.summary()


@pytest.mark.parametrize("param_type, activation_type, bits", [
    (int4, int16, (4, 16)), ("int4", "int16", (4, 16)), ("int8", int8, (8, 8)), (int16, "int8", (16, 8)),
])
def test_param_and_activation_types(param_type, activation_type, bits):
    sim = new_sim(param_type=param_type, activation_type=activation_type)
    params, acts = sim.get_all_quantizers()
    assert params and acts
    assert {q.bitwidth for q in params} == {bits[0]}
    assert {q.bitwidth for q in acts} == {bits[1]}
    sim.compute_encodings(batches())
    assert {e.bw for e in enc_of(sim, "W")} == {bits[0]}
    assert {e.bw for e in enc_of(sim, "x")} == {bits[1]}


def test_float16_activation_type():
    sim = new_sim(activation_type="float16")
    q = sim.qc_quantize_op_dict["x"]
    assert q.data_type == QuantizationDataType.float and q.bitwidth == 16
    sim.compute_encodings(batches())
    assert q.get_encodings() is None  # float quantizers have no grid
    out = sim.session.run(None, batch())[0]
    assert np.all(np.isfinite(out))


def test_unknown_type_alias_rejected():
    with pytest.raises(ValueError, match="int5"):
        new_sim(param_type="int5")


@pytest.mark.parametrize("scheme, expected", [
    (QuantScheme.min_max, QuantScheme.min_max),
    ("min_max", QuantScheme.min_max),
    ("tf", QuantScheme.min_max),
    ("tf_enhanced", QuantScheme.post_training_tf_enhanced),
    (QuantScheme.post_training_tf_enhanced, QuantScheme.post_training_tf_enhanced),
    ("percentile", QuantScheme.post_training_percentile),
])
def test_quant_scheme_enum_or_string(scheme, expected):
    sim = new_sim(quant_scheme=scheme)
    assert all(q.quant_scheme is expected for q in sim.quantizers)
    sim.compute_encodings(batches())
    assert enc_of(sim, "x") is not None


def test_quant_schemes_give_different_activation_ranges():
    data = batches(6)
    data[0]["x"][0, 0, 0, 0] = 40.0  # an outlier TF-enhanced / percentile clip away
    sims = {}
    for scheme in ("tf", "tf_enhanced", "percentile"):
        sim = new_sim(quant_scheme=scheme)
        if scheme == "percentile":
            sim.set_percentile_value(99.0)
        sim.compute_encodings(data)
        sims[scheme] = enc_of(sim, "x")[0]
    assert sims["tf"].max >= 39.9
    assert sims["tf_enhanced"].max <= sims["tf"].max  # a lone outlier may be worth keeping (SQNR)
    assert sims["percentile"].max < sims["tf"].max


def test_unknown_quant_scheme_is_value_error():
    with pytest.raises(ValueError, match="bogus"):
        new_sim(quant_scheme="bogus")


def test_legacy_bitwidth_keywords():
    with pytest.warns(DeprecationWarning):
        sim = new_sim(default_param_bw=4, default_activation_bw=16)
    params, acts = sim.get_all_quantizers()
    assert {q.bitwidth for q in params} == {4}
    assert {q.bitwidth for q in acts} == {16}
    sim.compute_encodings(batches())
    assert {e.bw for e in enc_of(sim, "W")} == {4}
    assert enc_of(sim, "x")[0].bw == 16


def test_legacy_positional_arguments():
    # legacy order: dummy_input, quant_scheme, rounding_mode, default_param_bw, default_activation_bw
    with pytest.warns(DeprecationWarning):
        sim = QuantizationSimModel(make_model(), None, "tf_enhanced", "nearest", 4, 16, progress=False)
    assert sim.qc_quantize_op_dict["W"].bitwidth == 4
    assert sim.qc_quantize_op_dict["x"].bitwidth == 16
    assert sim.qc_quantize_op_dict["x"].quant_scheme is QuantScheme.post_training_tf_enhanced


def test_legacy_none_placeholders_mean_default():
    """AIMET's legacy signature defaults are None: None rounding_mode / bitwidths are 'not given'."""
    with pytest.warns(DeprecationWarning):
        sim = QuantizationSimModel(make_model(), None, "tf", None, 4, 16, None, None, None, progress=False)
    assert sim.qc_quantize_op_dict["W"].bitwidth == 4 and sim.qc_quantize_op_dict["x"].bitwidth == 16
    with pytest.warns(DeprecationWarning):
        sim = new_sim(rounding_mode=None, default_param_bw=None, default_activation_bw=16)
    assert sim.qc_quantize_op_dict["W"].bitwidth == 8 and sim.qc_quantize_op_dict["x"].bitwidth == 16
    with pytest.warns(DeprecationWarning):
        sim = new_sim(default_param_bw=None, default_data_type=None, param_type="int4")
    assert sim.qc_quantize_op_dict["W"].bitwidth == 4


def test_legacy_default_data_type_float():
    with pytest.warns(DeprecationWarning):
        sim = new_sim(default_param_bw=16, default_activation_bw=16, default_data_type=QuantizationDataType.float)
    assert sim.qc_quantize_op_dict["x"].data_type == QuantizationDataType.float


def test_legacy_rounding_mode_stochastic_is_type_error():
    with pytest.raises(TypeError, match="stochastic"):
        with pytest.warns(DeprecationWarning):
            new_sim(rounding_mode="stochastic")


def test_legacy_rounding_mode_nearest_accepted():
    with pytest.warns(DeprecationWarning):
        sim = new_sim(rounding_mode="nearest")
    assert sim.qc_quantize_op_dict["W"].bitwidth == 8


def test_mixing_legacy_bitwidth_with_param_type_is_runtime_error():
    with pytest.raises(RuntimeError):
        with pytest.warns(DeprecationWarning):
            new_sim(default_param_bw=4, param_type=int8)
    with pytest.raises(RuntimeError):
        with pytest.warns(DeprecationWarning):
            new_sim(default_activation_bw=16, activation_type="int16")


@pytest.mark.parametrize("legacy", [{"use_cuda": True}, {"use_cuda": True, "device": 0}, {"device": 1}])
def test_use_cuda_with_providers_is_runtime_error(legacy):
    with pytest.raises(RuntimeError, match="providers"):
        with pytest.warns(DeprecationWarning):
            new_sim(providers=["CPUExecutionProvider"], **legacy)


def test_use_symmetric_encodings_legacy_is_ignored():
    with pytest.warns(DeprecationWarning):
        legacy = new_sim(use_symmetric_encodings=True)
    plain = new_sim()
    assert {n: q.use_symmetric_encodings for n, q in legacy.qc_quantize_op_dict.items()} == \
        {n: q.use_symmetric_encodings for n, q in plain.qc_quantize_op_dict.items()}


def test_unknown_keyword_is_type_error():
    with pytest.raises(TypeError, match="not_a_keyword"):
        new_sim(not_a_keyword=1)


def test_constructor_does_not_modify_callers_model():
    model = make_model()
    before = model.SerializeToString()
    sim = new_sim(model)
    sim.compute_encodings(batches())
    sim.session.run(None, batch())
    assert model.SerializeToString() == before


# --------------------------------------------------------------------------------------------------
# compute_encodings call forms
# --------------------------------------------------------------------------------------------------
def test_compute_encodings_iterable_of_feeds():
    sim = new_sim()
    assert enc_of(sim, "x") is None
    sim.compute_encodings(batches())
    expected_min = min(float(b["x"].min()) for b in batches())
    expected_max = max(float(b["x"].max()) for b in batches())
    e = enc_of(sim, "x")[0]
    assert e.min <= expected_min + e.delta and e.max >= expected_max - e.delta
    assert e.min == pytest.approx(expected_min, abs=e.delta)
    assert e.max == pytest.approx(expected_max, abs=e.delta)


def test_compute_encodings_keyword_inputs():
    a, b = new_sim(), new_sim()
    a.compute_encodings(batches())
    b.compute_encodings(inputs=batches())
    assert snapshot(a) == snapshot(b)


def test_compute_encodings_callback_gets_model_outputs():
    model = make_model()
    sim = new_sim(model)
    seen = []

    def callback(session):
        for feed in batches():
            outputs = session.run(None, feed)
            assert isinstance(outputs, list) and len(outputs) == 1
            reference = float_run(model, feed)[0]
            assert outputs[0].shape == reference.shape
            # weights are quantized during calibration, activations are not: close to float
            np.testing.assert_allclose(outputs[0], reference, rtol=0.1, atol=0.1)
            only_y = session.run(["y"], feed)
            assert len(only_y) == 1
            np.testing.assert_array_equal(only_y[0], outputs[0])
            seen.append(feed)

    sim.compute_encodings(callback)
    assert len(seen) == 4
    reference = new_sim(model)
    reference.compute_encodings(batches())
    assert snapshot(sim) == snapshot(reference)


def test_compute_encodings_callback_session_io_metadata():
    sim = new_sim()

    def callback(session):
        assert [i.name for i in session.get_inputs()] == ["x"]
        assert [o.name for o in session.get_outputs()] == ["y"]
        session.run(None, batch())

    sim.compute_encodings(callback)


def test_compute_encodings_legacy_callback_with_args():
    sim = new_sim()
    received = {}

    def callback(session, args):
        received["args"] = args
        for feed in args["data"]:
            session.run(None, feed)

    args = {"data": batches()}
    sim.compute_encodings(callback, args)
    assert received["args"] is args
    reference = new_sim()
    reference.compute_encodings(batches())
    assert snapshot(sim) == snapshot(reference)


def test_compute_encodings_legacy_callback_with_none_args():
    """AIMET passes forward_pass_callback_args through whenever it is given, None included."""
    received = []

    def callback(session, args):
        received.append(args)
        for feed in batches():
            session.run(None, feed)

    sim = new_sim()
    sim.compute_encodings(callback, None)
    sim.compute_encodings(forward_pass_callback=callback, forward_pass_callback_args=None)
    assert received == [None, None]
    reference = new_sim()
    reference.compute_encodings(batches())
    assert snapshot(sim) == snapshot(reference)


def test_compute_encodings_args_with_iterable_is_type_error():
    sim = new_sim()
    with pytest.raises(TypeError):
        sim.compute_encodings(batches(), None)
    assert enc_of(sim, "x") is None


def test_compute_encodings_callback_keywords():
    sim_a, sim_b = new_sim(), new_sim()

    def callback(session, count):
        for feed in batches(count):
            session.run(None, feed)

    sim_a.compute_encodings(forward_pass_callback=callback, forward_pass_callback_args=4)
    sim_b.compute_encodings(forward_pass_callback=lambda s: callback(s, 4))
    assert snapshot(sim_a) == snapshot(sim_b)
    assert enc_of(sim_a, "x") is not None


@pytest.mark.parametrize("bad", [42, 3.5, None, object()])
def test_compute_encodings_non_callable_non_iterable_is_type_error(bad):
    sim = new_sim()
    with pytest.raises(TypeError):
        sim.compute_encodings(bad)
    assert enc_of(sim, "x") is None


def test_compute_encodings_single_dict_is_type_error():
    sim = new_sim()
    with pytest.raises(TypeError):
        sim.compute_encodings(batch())


def test_compute_encodings_dynamic_batch_and_spatial_sizes():
    sim = new_sim()
    data = [batch(0, n=1, hw=8), batch(1, n=3, hw=16), batch(2, n=2, hw=5), batch(3, n=7, hw=11)]
    sim.compute_encodings(data)
    e = enc_of(sim, "x")[0]
    lo = min(float(b["x"].min()) for b in data)
    hi = max(float(b["x"].max()) for b in data)
    assert e.min == pytest.approx(lo, abs=e.delta) and e.max == pytest.approx(hi, abs=e.delta)
    for n, hw in ((1, 4), (5, 9)):
        out = sim.session.run(None, batch(9, n=n, hw=hw))[0]
        assert out.shape == (n, 5)


@pytest.mark.parametrize("scheme", ["tf", "tf_enhanced"])
def test_compute_encodings_generator(scheme):
    consumed = []

    def gen():
        for i in range(5):
            consumed.append(i)
            yield batch(i, n=1 + i % 3, hw=6 + i)

    sim = new_sim(quant_scheme=scheme)
    sim.compute_encodings(gen())
    assert consumed == [0, 1, 2, 3, 4]
    reference = new_sim(quant_scheme=scheme)
    reference.compute_encodings([batch(i, n=1 + i % 3, hw=6 + i) for i in range(5)])
    assert snapshot(sim) == snapshot(reference)


def test_recalibration_replaces_previous_ranges():
    sim = new_sim()
    sim.compute_encodings(batches(scale=10.0))
    wide = enc_of(sim, "x")[0]
    sim.compute_encodings(batches(scale=0.1))
    narrow = enc_of(sim, "x")[0]
    assert narrow.max < wide.max / 10  # fresh statistics, not accumulated with the old run


def _peak_bytes(count: int, scheme: str) -> int:
    sim = new_sim(quant_scheme=scheme)
    sim.compute_encodings(batches(2))  # build the calibration session before measuring

    def gen():
        for i in range(count):
            yield batch(i, n=4, hw=32)  # 48 KiB per batch

    tracemalloc.start()
    try:
        sim.compute_encodings(gen())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("scheme", ["tf", "tf_enhanced"])
def test_calibration_memory_does_not_grow_with_batches(scheme):
    few = _peak_bytes(5, scheme)
    many = _peak_bytes(200, scheme)
    # keeping 200 batches would cost >= 200 * 48 KiB ~ 9.4 MiB
    assert many < few + 2 * 1024 * 1024, (few, many)


@pytest.mark.parametrize("range_health", [False, True])
def test_min_max_calibration_graph_only_adds_small_outputs(range_health, monkeypatch):
    """Min-max adds one value per row or channel of each tensor (numpy finishes the reduction), never the
    activation; the range-health check adds a sample of about RANGE_SAMPLE values and each sampled tensor's
    size (with no tensor fetched whole: `whole_tensors` fetches small ones whole instead)."""
    from quantsim.calibration import whole_tensors

    monkeypatch.setattr(whole_tensors, "WHOLE_BATCH_BYTES", 0)
    sim = new_sim()
    sim.range_health = range_health
    feed = batch()
    sizes = {}

    def callback(session):
        session.run(None, feed)
        inner = session._session  # the onnxruntime session behind the calibration wrapper
        names = [o.name for o in inner.get_outputs()]
        sizes.update({name: value.size for name, value in zip(names, inner.run(names, feed))})

    sim.compute_encodings(callback)
    extra = {name: size for name, size in sizes.items() if name != "y"}
    assert extra, "min/max statistics outputs expected"
    samples = {name for name in extra if name.endswith("calibration_sample")}
    rows = feed["x"].shape[0] * 5  # batch x channels or classes (at most 5 in the tiny CNN): one value per row
    assert all(size <= rows for name, size in extra.items() if name not in samples), extra
    assert bool(samples) == range_health


# --------------------------------------------------------------------------------------------------
# quantizer objects
# --------------------------------------------------------------------------------------------------
def _quantize_nodes(sim, tensor: str) -> list[str]:
    return [n.name for n in sim.sim_model().graph.node if n.op_type == "QuantizeLinear" and tensor in n.output[0]]


def test_enabled_toggle_rebuilds_session_and_graph():
    sim = calibrated_sim()
    feed = batch(42)
    q = sim.qc_quantize_op_dict["r"]
    assert q.enabled
    assert any(n.startswith("r/") for n in _quantize_nodes(sim, "r"))
    quantized = sim.session.run(None, feed)[0]
    q.enabled = False
    assert not any(n.startswith("r/") for n in _quantize_nodes(sim, "r"))
    without_r = sim.session.run(None, feed)[0]
    assert not np.array_equal(quantized, without_r)
    q.enabled = True
    np.testing.assert_array_equal(sim.session.run(None, feed)[0], quantized)


def test_disabling_everything_gives_float_model():
    model = make_model()
    sim = new_sim(model)
    sim.compute_encodings(batches())
    for q in sim.quantizers:
        q.enabled = False
    graph = sim.sim_model().graph
    assert not [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear", "Clip")]
    feed = batch(3)
    np.testing.assert_allclose(sim.session.run(None, feed)[0], float_run(model, feed)[0], rtol=1e-6, atol=1e-6)


def test_disabled_weight_quantizer_restores_float_weights():
    model = make_model()
    sim = new_sim(model)
    sim.compute_encodings(batches())
    def weight():
        return numpy_helper.to_array(next(t for t in sim.sim_model().graph.initializer if t.name == "W"))
    original = numpy_helper.to_array(model.graph.initializer[0])
    assert not np.array_equal(weight(), original)
    sim.qc_quantize_op_dict["W"].enabled = False
    np.testing.assert_array_equal(weight(), original)


def test_set_bitwidth_then_recalibrate():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["x"]
    eight = q.get_encodings()[0]
    q.set_bitwidth(4)
    assert q.bitwidth == 4
    sim.compute_encodings(batches())
    four = q.get_encodings()[0]
    assert four.bw == 4
    assert -15 <= four.offset <= 0
    assert four.delta == pytest.approx((four.max - four.min) / 15)
    assert four.delta > eight.delta * 10


def test_bitwidth_property_setter_on_weight():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["W"]
    q.bitwidth = 4
    assert q.bitwidth == 4
    sim.compute_encodings(batches())
    encs = q.get_encodings()
    assert len(encs) == 4 and {e.bw for e in encs} == {4}
    assert {e.offset for e in encs} == {-8.0}  # symmetric signed 4-bit


def test_data_type_switch_to_float_and_back():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["x"]
    assert q.data_type == QuantizationDataType.int
    q.data_type = QuantizationDataType.float
    assert q.data_type == QuantizationDataType.float and q.bitwidth == 16
    sim.compute_encodings(batches())
    assert q.get_encodings() is None
    names = [n.op_type for n in sim.sim_model().graph.node]
    assert "Cast" in names
    q.data_type = QuantizationDataType.int
    assert q.bitwidth == 8
    sim.compute_encodings(batches())
    assert q.get_encodings()[0].bw == 8


def test_set_precision_float16():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["r"]
    q.set_precision("float16")
    assert q.precision() == float16
    sim.compute_encodings(batches())
    assert q.get_encodings() is None
    assert any(n.name.startswith("r/cast") for n in sim.sim_model().graph.node)
    feed = batch(1)
    assert np.all(np.isfinite(sim.session.run(None, feed)[0]))


def test_use_symmetric_encodings_toggle():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["x"]
    assert not q.use_symmetric_encodings
    q.use_symmetric_encodings = True
    assert q.use_symmetric_encodings
    sim.compute_encodings(batches())
    e = q.get_encodings()[0]
    assert e.offset == -128
    assert e.min == pytest.approx(-128 * e.delta) and e.max == pytest.approx(127 * e.delta)
    q.use_symmetric_encodings = False
    sim.compute_encodings(batches())
    assert q.get_encodings()[0].offset != -128


def test_use_strict_symmetric():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["W"]
    assert q.use_symmetric_encodings
    q.use_strict_symmetric = True
    assert q.use_strict_symmetric
    sim.compute_encodings(batches())
    for e in q.get_encodings():
        assert e.offset == -127
        assert e.min == pytest.approx(-e.max)
        assert e.max == pytest.approx(127 * e.delta)


def test_use_unsigned_symmetric_on_non_negative_tensor():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["r"]  # Relu output: >= 0
    q.use_symmetric_encodings = True
    q.use_unsigned_symmetric = True
    assert q.use_unsigned_symmetric
    sim.compute_encodings(batches())
    e = q.get_encodings()[0]
    assert e.offset == 0 and e.min == 0
    q.use_unsigned_symmetric = False
    sim.compute_encodings(batches())
    assert q.get_encodings()[0].offset == -128


def test_enable_per_channel_quantization_toggle():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["W"]
    assert len(q.get_encodings()) == 4
    q.enable_per_channel_quantization(False)
    sim.compute_encodings(batches())
    per_tensor = q.get_encodings()
    assert len(per_tensor) == 1
    weights = numpy_helper.to_array(make_model().graph.initializer[0])
    assert per_tensor[0].max == pytest.approx(np.abs(weights).max(), rel=1e-2)
    q.enable_per_channel_quantization(True)
    sim.compute_encodings(batches())
    assert len(q.get_encodings()) == 4
    with pytest.raises(ValueError):
        sim.qc_quantize_op_dict["x"].enable_per_channel_quantization(True)


def test_freeze_encodings_survives_recalibration():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["x"]
    before = q.get_encodings()
    q.freeze_encodings()
    assert q.is_encoding_frozen()
    sim.compute_encodings(batches(seed=100, scale=25.0))
    assert q.get_encodings() == before
    assert enc_of(sim, "r")[0].max > 5 * before[0].max  # unfrozen ones did move
    with pytest.raises(RuntimeError):
        q.bitwidth = 4
    assert q.bitwidth == 8
    with pytest.raises(RuntimeError):
        q.load_encodings(before)


def test_freeze_uncalibrated_raises():
    sim = new_sim()
    with pytest.raises(RuntimeError):
        sim.qc_quantize_op_dict["x"].freeze_encodings()


def test_get_encodings_is_aimet_tf_encoding_list():
    sim = calibrated_sim()
    for name in ("W", "x", "r", "y"):
        encs = sim.qc_quantize_op_dict[name].get_encodings()
        assert isinstance(encs, list) and encs
        for e in encs:
            assert isinstance(e, TfEncoding)
            assert e.offset <= 0
            assert e.min <= 0 <= e.max
            assert e.bw == 8
            assert e.delta > 0
            assert e.min == pytest.approx(e.offset * e.delta, rel=1e-6, abs=1e-9)
            assert e.max == pytest.approx((e.offset + 255) * e.delta, rel=1e-6, abs=1e-9)
    assert len(enc_of(sim, "W")) == 4 and len(enc_of(sim, "x")) == 1


def test_load_encodings_roundtrip_and_custom():
    sim = calibrated_sim()
    other = calibrated_sim()
    for name in ("W", "x"):
        other.qc_quantize_op_dict[name].load_encodings(enc_of(sim, name))
        assert enc_of(other, name) == enc_of(sim, name)
    q = other.qc_quantize_op_dict["x"]
    q.load_encodings([TfEncoding(min=-1.0, max=254 / 255 * 2 - 1.0 + 1 / 255 * 2, delta=2 / 255, offset=-128, bw=8)])
    e = q.get_encodings()[0]
    assert e.delta == pytest.approx(2 / 255) and e.offset == -128
    # and the session uses it: inputs beyond the range saturate at max
    feed = {"x": np.full((1, 3, 4, 4), 50.0, dtype=np.float32)}
    q.load_encodings([TfEncoding(min=-128 * 0.01, max=127 * 0.01, delta=0.01, offset=-128, bw=8)])
    for other_q in other.quantizers:
        if other_q is not q:
            other_q.enabled = False
    clipped = other.session.run(None, feed)[0]
    feed_clipped = {"x": np.full((1, 3, 4, 4), 1.27, dtype=np.float32)}
    np.testing.assert_allclose(clipped, other.session.run(None, feed_clipped)[0], rtol=1e-6)


def test_load_encodings_wrong_channel_count_rejected():
    sim = calibrated_sim()
    q = sim.qc_quantize_op_dict["W"]
    before = q.get_encodings()
    with pytest.raises(ValueError, match="W"):
        q.load_encodings(before[:3])
    assert q.get_encodings() == before


# --------------------------------------------------------------------------------------------------
# names, session, summary
# --------------------------------------------------------------------------------------------------
def test_names_and_qc_quantize_op_dict():
    sim = new_sim()
    assert set(sim.param_names) == {"W", "B", "W2", "B2"}
    assert sim.activation_names[0] == "x"
    assert {"x", "c", "r", "g", "y"} <= set(sim.activation_names)
    assert not set(sim.param_names) & set(sim.activation_names)
    assert set(sim.qc_quantize_op_dict) == set(sim.param_names) | set(sim.activation_names)
    assert sim.get_qc_quantize_op() is sim.qc_quantize_op_dict
    params, acts = sim.get_all_quantizers()
    assert {q.role for q in params} == {"param"} and {q.role for q in acts} == {"activation"}


def test_session_keeps_model_output_names():
    sim = calibrated_sim()
    assert [o.name for o in sim.session.get_outputs()] == ["y"]
    assert [i.name for i in sim.session.get_inputs()] == ["x"]
    assert [o.name for o in sim.sim_model().graph.output] == ["y"]
    assert [o.name for o in sim.to_onnx_qdq().graph.output] == ["y"]


def test_session_output_is_quantized_on_output_grid():
    sim = calibrated_sim()
    out = sim.session.run(None, batch(7))[0]
    e = enc_of(sim, "y")[0]
    codes = out / e.delta - e.offset
    np.testing.assert_allclose(codes, np.round(codes), atol=1e-3)


def test_summary_and_str_list_tensors():
    sim = calibrated_sim()
    text = sim.summary()
    assert str(sim) == text
    for name in ("W", "B", "W2", "x", "r", "y"):
        assert any(line.split()[0] == name for line in text.splitlines()[1:]), name
    assert "tiny_cnn" in text


# --------------------------------------------------------------------------------------------------
# loading and freezing from files
# --------------------------------------------------------------------------------------------------
def _exported(tmp_path, version="1.0.0", **sim_kwargs):
    sim = calibrated_sim(**sim_kwargs)
    sim.export(str(tmp_path), "src", export_model=False, encoding_version=version)
    return sim, tmp_path / "src.encodings"


@pytest.mark.parametrize("version", ["0.6.1", "1.0.0", "2.0.0"])
def test_set_and_freeze_param_encodings(tmp_path, version):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        source, path = _exported(tmp_path, version, param_type="int4")
    sim = new_sim()
    sim.compute_encodings(batches(seed=50, scale=3.0))
    acts_before = {n: snapshot(sim)[n] for n in sim.activation_names}
    with pytest.warns(UserWarning, match="bitwidth is 8 in the sim but 4 in the file"):
        sim.set_and_freeze_param_encodings(str(path))
    after = snapshot(sim)
    for name in ("W", "W2"):
        q = sim.qc_quantize_op_dict[name]
        assert q.is_encoding_frozen()
        assert q.bitwidth == 4
        assert enc_of(sim, name) == enc_of(source, name)
    assert {n: after[n] for n in sim.activation_names} == acts_before
    assert not any(sim.qc_quantize_op_dict[n].is_encoding_frozen() for n in sim.activation_names)
    # frozen params survive a new calibration, activations still follow the data
    sim.compute_encodings(batches(seed=70, scale=9.0))
    assert enc_of(sim, "W") == enc_of(source, "W")
    assert enc_of(sim, "x")[0].max > acts_before["x"][5][0][1]


def test_set_and_freeze_param_encodings_bare_param_dict(tmp_path):
    source, path = _exported(tmp_path, "1.0.0")
    data = json.loads(path.read_text())
    bare = tmp_path / "params_only.encodings"
    bare.write_text(json.dumps(data["param_encodings"]))
    sim = calibrated_sim()
    sim.set_and_freeze_param_encodings(str(bare))
    assert sim.qc_quantize_op_dict["W"].is_encoding_frozen()


def test_load_encodings_to_sim_allow_overwrite_false_freezes(tmp_path):
    source, path = _exported(tmp_path)
    sim = new_sim()
    mismatches = load_encodings_to_sim(sim, str(path), strict=True, allow_overwrite=False)
    assert mismatches == []
    for name, q in sim.qc_quantize_op_dict.items():
        if q.enabled:
            assert q.is_encoding_frozen(), name
            assert q.get_encodings() == enc_of(source, name)
    before = snapshot(sim)
    sim.compute_encodings(batches(seed=9, scale=4.0))
    assert snapshot(sim) == before


def test_load_encodings_to_sim_allow_overwrite_true_not_frozen(tmp_path):
    source, path = _exported(tmp_path)
    sim = new_sim()
    load_encodings_to_sim(sim, str(path))
    assert not any(q.is_encoding_frozen() for q in sim.quantizers)
    feed = batch(11)
    np.testing.assert_array_equal(sim.session.run(None, feed)[0], source.session.run(None, feed)[0])


def test_load_encodings_to_sim_disable_missing_quantizers(tmp_path):
    source, path = _exported(tmp_path)
    data = json.loads(path.read_text())
    data["activation_encodings"] = [e for e in data["activation_encodings"] if e["name"] != "r"]
    trimmed = tmp_path / "trimmed.encodings"
    trimmed.write_text(json.dumps(data))

    sim = calibrated_sim()
    load_encodings_to_sim(sim, str(trimmed), strict=False, disable_missing_quantizers=True)
    assert not sim.qc_quantize_op_dict["r"].enabled
    assert sim.qc_quantize_op_dict["x"].enabled

    kept = calibrated_sim()
    load_encodings_to_sim(kept, str(trimmed), strict=False, disable_missing_quantizers=False)
    assert kept.qc_quantize_op_dict["r"].enabled


def test_load_encodings_to_sim_strict_bitwidth_mismatch(tmp_path):
    source, path = _exported(tmp_path, param_type="int4")
    sim = calibrated_sim()
    before = snapshot(sim)
    with pytest.raises(EncodingMismatchError) as info:
        load_encodings_to_sim(sim, str(path), strict=True)
    message = str(info.value)
    assert "'W'" in message or "W:" in message
    assert "bitwidth" in message
    assert snapshot(sim) == before
    assert issubclass(quantsim.EncodingMismatchError, Exception)

    with pytest.warns(UserWarning):
        mismatches = load_encodings_to_sim(sim, str(path), strict=False)
    named = {(m.name, m.field) for m in mismatches}
    assert ("W", "bitwidth") in named and ("W2", "bitwidth") in named
    by_name = {m.name: m for m in mismatches if m.field == "bitwidth"}
    assert by_name["W"].sim_value == 8 and by_name["W"].file_value == 4
    assert sim.qc_quantize_op_dict["W"].bitwidth == 4  # the file wins on a lenient load
    assert enc_of(sim, "W") == enc_of(source, "W")


def test_load_encodings_to_sim_accepts_dict(tmp_path):
    source, path = _exported(tmp_path, "2.0.0")
    sim = new_sim()
    load_encodings_to_sim(sim, json.loads(path.read_text()), strict=False)
    assert enc_of(sim, "W") == enc_of(source, "W")
    assert enc_of(sim, "x") == enc_of(source, "x")


# --------------------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.6.1", "1.0.0", "2.0.0"])
def test_export_round_trip(tmp_path, version):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        sim = calibrated_sim()
        sim.export(str(tmp_path), "model", encoding_version=version)
    assert sorted(os.listdir(tmp_path)) == ["model.encodings", "model.onnx"]
    data = json.loads((tmp_path / "model.encodings").read_text())
    assert data["version"] == version
    exported = onnx.load(str(tmp_path / "model.onnx"))
    onnx.checker.check_model(exported)
    assert [o.name for o in exported.graph.output] == ["y"]
    assert not [n for n in exported.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    fresh = new_sim()
    load_encodings_to_sim(fresh, str(tmp_path / "model.encodings"), strict=False)
    feed = batch(5)
    np.testing.assert_array_equal(fresh.session.run(None, feed)[0], sim.session.run(None, feed)[0])


def test_export_leaves_no_temp_files(tmp_path):
    sim = calibrated_sim()
    for _ in range(3):
        sim.export(str(tmp_path), "model")
    assert sorted(os.listdir(tmp_path)) == ["model.encodings", "model.onnx"]


def _exported_then_recalibrated(tmp_path):
    """A sim exported to ``tmp_path/model.*``, then changed (4-bit input) and recalibrated: the sim and the
    bytes of the old encodings and model files, which a failed export must leave in place."""
    sim = calibrated_sim()
    sim.export(str(tmp_path), "model")
    old_encodings = (tmp_path / "model.encodings").read_bytes()
    old_model = (tmp_path / "model.onnx").read_bytes()
    sim.qc_quantize_op_dict["x"].set_bitwidth(4)
    sim.compute_encodings(batches())
    return sim, old_encodings, old_model


def test_export_serialisation_failure_keeps_old_files(tmp_path, monkeypatch):
    sim, old_encodings, old_model = _exported_then_recalibrated(tmp_path)

    import quantsim.encodings.jsonio as jsonio

    def broken_dumps(*args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(jsonio.json, "dumps", broken_dumps)
    with pytest.raises(OSError, match="simulated"):
        sim.export(str(tmp_path), "model")
    monkeypatch.undo()
    assert (tmp_path / "model.encodings").read_bytes() == old_encodings
    assert (tmp_path / "model.onnx").read_bytes() == old_model
    assert sorted(os.listdir(tmp_path)) == ["model.encodings", "model.onnx"]


def test_export_write_failure_mid_file_keeps_old_file(tmp_path, monkeypatch):
    sim, old_encodings, _ = _exported_then_recalibrated(tmp_path)

    import quantsim.encodings.jsonio as jsonio

    real_fsync = os.fsync

    def failing_fsync(fd):
        raise OSError("I/O error (simulated)")

    monkeypatch.setattr(jsonio.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="simulated"):
        sim.export(str(tmp_path), "model")
    monkeypatch.setattr(jsonio.os, "fsync", real_fsync)
    assert (tmp_path / "model.encodings").read_bytes() == old_encodings
    assert sorted(os.listdir(tmp_path)) == ["model.encodings", "model.onnx"]



def test_export_model_serialisation_failure_keeps_both_old_files(tmp_path, monkeypatch):
    sim, old_encodings, old_model = _exported_then_recalibrated(tmp_path)

    def broken_serialise(self, **kwargs):
        raise ValueError("Message onnx.ModelProto exceeds maximum protobuf size of 2GB (simulated)")

    monkeypatch.setattr(onnx.ModelProto, "SerializeToString", broken_serialise)
    with pytest.raises(ValueError, match="simulated"):
        sim.export(str(tmp_path), "model")
    monkeypatch.undo()
    # nothing was replaced: the pair on disk is still the consistent old one
    assert (tmp_path / "model.onnx").read_bytes() == old_model
    assert (tmp_path / "model.encodings").read_bytes() == old_encodings
    assert sorted(os.listdir(tmp_path)) == ["model.encodings", "model.onnx"]
    sim.export(str(tmp_path), "model")
    assert json.loads((tmp_path / "model.encodings").read_text())["activation_encodings"][0]["bw"] == 4


def test_export_model_write_failure_keeps_old_model(tmp_path, monkeypatch):
    import quantsim.graph.file_set as file_set
    import quantsim.graph.model_io as model_io

    sim = calibrated_sim()
    sim.export(str(tmp_path), "model")
    old_model = (tmp_path / "model.onnx").read_bytes()

    def failing_fsync(fd):
        raise OSError("I/O error (simulated)")

    monkeypatch.setattr(file_set.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="simulated"):
        model_io.save_model_atomic(sim.model, tmp_path / "model.onnx")
    monkeypatch.undo()
    assert (tmp_path / "model.onnx").read_bytes() == old_model
    assert sorted(os.listdir(tmp_path)) == ["model.encodings", "model.onnx"]


def test_set_encoding_checks_bitwidth_and_frozen_state():
    from quantsim.core.numerics import encoding_from_range

    sim = calibrated_sim()
    q = next(q for q in sim.quantizers if q.role == "activation" and q.enabled)
    before = q.encoding
    with pytest.raises(ValueError, match="16-bit"):
        q.set_encoding(encoding_from_range(-1.0, 1.0, 16, symmetric=False))
    assert q.encoding is before
    q.freeze_encodings()
    with pytest.raises(RuntimeError, match="frozen"):
        q.set_encoding(encoding_from_range(-1.0, 1.0, 8, symmetric=False))
    assert q.encoding is before


def test_config_encoding_constraints_fix_the_output_range(tmp_path):
    """An op type's encoding_constraints (HTP configs: Sigmoid [0, 1]) replace the observed range."""
    import json as _json

    from onnx import TensorProto, helper

    from quantsim.sim.config import CONFIG_DIR

    config = _json.loads((CONFIG_DIR / "default_config_per_channel.json").read_text())
    config["op_type"]["Sigmoid"] = {"encoding_constraints": {"min": 0.0, "max": 1.0}}
    path = tmp_path / "config.json"
    path.write_text(_json.dumps(config))
    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "sig",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sim = QuantizationSimModel(model, config_file=str(path), progress=False)
    sim.compute_encodings([{"x": np.array([-0.1, 0.0, 0.2, 0.3], np.float32)}])  # sigmoid in ~[0.47, 0.58]
    enc = sim.qc_quantize_op_dict["y"].encoding
    assert float(enc.min) == 0.0 and abs(float(enc.max) - 1.0) < 1e-9
    q = sim.qc_quantize_op_dict["x"]
    q.set_fixed_encoding_range((-2.0, 2.0))
    sim.compute_encodings([{"x": np.array([-0.1, 0.0, 0.2, 0.3], np.float32)}])
    assert q.encoding.symmetric and abs(float(q.encoding.max) - 2.0) < 1e-9  # scale max(2/127, 2/128)


def test_fold_batchnorm_false_keeps_batchnorm_with_its_own_precision():
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.uniform(0.5, 2, 4).astype(np.float32), "g"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 0.1, "m"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), "v")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"], name="bn")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    folded = QuantizationSimModel(model, progress=False)
    assert "BatchNormalization" not in [n.op_type for n in folded.model.graph.node]
    kept = QuantizationSimModel(model, progress=False, fold_batchnorm=False)
    assert [n.op_type for n in kept.model.graph.node] == ["Conv", "BatchNormalization"]
    feeds = [{"x": rng.standard_normal((2, 3, 6, 6)).astype(np.float32)} for _ in range(2)]
    kept.qc_quantize_op_dict["y"].set_precision("float16")
    kept.compute_encodings(feeds)
    assert "g" in kept.param_names and kept.qc_quantize_op_dict["y"].encoding is None
    fp32 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    out = kept.session.run(None, feeds[0])[0]
    assert np.abs(out - fp32).max() < 0.1 * np.abs(fp32).max()


def test_aimet_arguments_without_effect_warn_once_and_name_why():
    import warnings as _warnings

    from tiny_cnn import batch, make_model

    from quantsim import QuantizationSimModel as Sim
    with pytest.warns(UserWarning, match="dummy_input has no effect"):
        Sim(make_model(), dummy_input=batch(0), progress=False)
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        Sim(make_model(), default_param_bw=8, use_symmetric_encodings=True, progress=False)
    said = [str(w.message) for w in caught]
    assert any("use_symmetric_encodings has no effect" in m for m in said)
