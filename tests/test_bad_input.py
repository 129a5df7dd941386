"""Bad input gives a clear error naming the model/node/tensor/file, and leaves the sim as it was."""
from __future__ import annotations

import copy
import json
import os
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_cnn import batch, batches, calibrated_sim, make_model, new_sim, snapshot  # tests/tiny_cnn.py

from quantsim import (
    ConfigError,
    EncodingFormatError,
    EncodingMismatchError,
    load_encodings_to_sim,
)


# --------------------------------------------------------------------------------------------------
# models, data, helpers
# --------------------------------------------------------------------------------------------------
def make_two_input_model() -> onnx.ModelProto:
    """a[N,4] * b[N,4] -> Relu -> out."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["a", "b"], ["m"], name="mul"), helper.make_node("Relu", ["m"], ["out"], name="relu")],
        "two_inputs",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def session_output(sim, seed: int = 123) -> np.ndarray:
    return sim.session.run(None, batch(seed))[0]


def export_file(tmp_path, sim, version: str, prefix: str = "model") -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        sim.export(str(tmp_path), prefix, export_model=False, encoding_version=version)
    return str(tmp_path / f"{prefix}.encodings")


VERSIONS = ["0.6.1", "1.0.0", "2.0.0"]


# --------------------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------------------
def test_text_file_is_not_an_onnx_model(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is a text file, not a protobuf\n" * 20)
    with pytest.raises(ValueError) as info:
        new_sim(str(path))
    assert str(path) in str(info.value)
    assert "onnx" in str(info.value).lower()


def test_missing_model_path(tmp_path):
    path = tmp_path / "does_not_exist.onnx"
    with pytest.raises(FileNotFoundError) as info:
        new_sim(str(path))
    assert str(path) in str(info.value)


def test_directory_instead_of_model(tmp_path):
    with pytest.raises((FileNotFoundError, ValueError)) as info:
        new_sim(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_wrong_model_type():
    with pytest.raises(TypeError, match="ModelProto"):
        new_sim(12345)


def test_model_failing_onnx_checker():
    model = make_model(name="broken_graph")
    model.graph.node[1].input[0] = "undefined_tensor"  # Relu reads a tensor nobody produces
    with pytest.raises(ValueError) as info:
        new_sim(model)
    message = str(info.value)
    assert "broken_graph" in message
    # the checker's "not topologically sorted" gives way to preparation's own diagnosis
    assert 'node "relu" (Relu) reads "undefined_tensor"' in message and "dangling input" in message


def test_a_cycle_is_named_node_by_node():
    model = make_model(name="cyclic")
    model.graph.node[0].input[0] = "f"  # conv reads flatten's output: conv -> relu -> gap -> flatten -> conv
    with pytest.raises(ValueError, match="graph 'cyclic': the graph has a cycle through nodes \"conv\" \\(Conv\\) -> .*flatten"):
        new_sim(model)


def test_a_graph_output_without_type_is_named():
    model = make_model()
    del model.graph.output[:]
    model.graph.output.add(name="y")
    with pytest.raises(ValueError, match="graph input/output 'y' has no type"):
        new_sim(model)


def test_a_graph_output_without_shape_gets_the_inferred_one(tmp_path):
    """onnx-graphsurgeon writes graph outputs with a type and no shape: onnxruntime runs such a model, onnx.checker
    refuses it; the sim takes the shape ONNX inference gives, and leaves the caller's model as it was."""
    model = make_model()
    model.graph.output[0].type.tensor_type.ClearField("shape")
    before = model.SerializeToString()
    path = tmp_path / "shapeless.onnx"
    onnx.save(model, str(path))
    for source in (model, str(path)):
        sim = new_sim(source)
        sim.compute_encodings(batches())
        assert sim.session.run(None, batch())[0].shape[-1] == 5
    assert model.SerializeToString() == before


def test_a_graph_input_without_shape_is_named():
    model = make_model()
    model.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(ValueError, match="graph input/output 'x' is declared without a shape and ONNX shape inference"):
        new_sim(model)


def test_a_declared_output_rank_that_differs_from_the_real_one_warns_and_calibrates():
    model = make_model()
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 1  # declared [N, 5, 1], computes [N, 5]
    with pytest.warns(UserWarning, match="output 'y' is declared with rank 3 but computes rank 2"):
        sim = new_sim(model)
    sim.compute_encodings(batches())
    assert sim.qc_quantize_op_dict["y"].encoding is not None


def test_a_wrong_channel_count_names_the_batch_and_axis():
    sim = new_sim()
    bad = {"x": np.zeros((2, 2, 8, 8), np.float32)}
    with pytest.raises(ValueError, match=r"calibration batch 1: input 'x' has shape \(2, 2, 8, 8\).*axis 1: 2 instead of 3"):
        sim.compute_encodings([batch(0), bad])


def test_an_opset_newer_than_onnxruntimes_quantize_kernels_is_converted_down_or_refused_up_front():
    """onnxruntime may load a model at an opset it has no QuantizeLinear for (the newest exporters): the model
    is converted down to onnxruntime's maximum with a warning, and the sim computes what the float model does.
    An onnx that does not know that opset cannot convert it: then a clear error up front."""
    from quantsim import PrepareWarning
    from quantsim.prepare.opset import runtime_limits

    newest = runtime_limits()[0]
    model = make_model()
    model.opset_import[0].version = newest + 1
    model.ir_version = 10
    if onnx.defs.onnx_opset_version() <= newest:
        with pytest.raises(ValueError, match=f"opset {newest + 1}.*supports at most opset {newest}"):
            new_sim(model)
        return
    with pytest.warns(PrepareWarning, match=f"opset {newest + 1}.*converted down to opset {newest}"):
        sim = new_sim(model)
    assert next(o.version for o in sim.model.opset_import if o.domain == "") == newest
    reference = make_model()
    reference.opset_import[0].version = newest
    want = new_sim(reference)
    sim.compute_encodings(batches(2))
    want.compute_encodings(batches(2))
    np.testing.assert_array_equal(sim.session.run(None, batch(5))[0], want.session.run(None, batch(5))[0])


def test_an_opset_no_onnx_knows_is_refused_up_front():
    from quantsim.prepare.opset import runtime_limits

    model = make_model()
    model.opset_import[0].version = onnx.defs.onnx_opset_version() + 5
    model.ir_version = 10
    with pytest.raises(ValueError, match=f"supports at most opset {runtime_limits()[0]}.*converter cannot"):
        new_sim(model)


@pytest.mark.parametrize("kind", ["encodings", "config", "overrides"])
def test_deeply_nested_json_is_a_format_error(tmp_path, kind):
    from quantsim import QuantsimError

    path = tmp_path / f"deep.{kind}.json"
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(QuantsimError, match="nested too deeply"):
        if kind == "encodings":
            load_encodings_to_sim(calibrated_sim(), str(path))
        elif kind == "config":
            new_sim(config_file=str(path))
        else:
            from mixed_precision import load_overrides

            load_overrides(path)


def test_model_failing_onnx_checker_from_file(tmp_path):
    model = make_model()
    model.graph.node[0].op_type = "NoSuchOperator"
    path = tmp_path / "bad_op.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ValueError) as info:
        new_sim(str(path))
    assert str(path) in str(info.value)
    assert "NoSuchOperator" in str(info.value)


@pytest.mark.parametrize("op_type", ["QuantizeLinear", "DequantizeLinear"])
def test_model_with_qdq_points_to_from_onnx_qdq(op_type):
    scale = numpy_helper.from_array(np.array(0.1, dtype=np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, dtype=np.uint8), "z")
    if op_type == "QuantizeLinear":
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q_node"),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq_node")]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])]
    else:
        nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], name="dq_node")]
        inputs = [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4])]
    graph = helper.make_graph(nodes, "qdq_graph", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [scale, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    with pytest.raises((ValueError, RuntimeError)) as info:
        new_sim(model)
    message = str(info.value)
    assert "from_onnx_qdq" in message
    assert "qdq_graph" in message
    assert "q_node" in message or "dq_node" in message


# --------------------------------------------------------------------------------------------------
# calibration feeds
# --------------------------------------------------------------------------------------------------
def _assert_feed_error_leaves_sim(sim, bad_feeds, exc_type, *fragments):
    before = snapshot(sim)
    out_before = None
    try:
        out_before = sim.session.run(None, {i.name: np.ones([d if isinstance(d, int) else 2 for d in i.shape],
                                                            dtype=np.float32) for i in sim.session.get_inputs()})
    except Exception:  # noqa: BLE001 - only a sanity reference
        pass
    with pytest.raises(exc_type) as info:
        sim.compute_encodings(bad_feeds)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert snapshot(sim) == before
    if out_before is not None:
        after = sim.session.run(None, {i.name: np.ones([d if isinstance(d, int) else 2 for d in i.shape],
                                                       dtype=np.float32) for i in sim.session.get_inputs()})
        np.testing.assert_array_equal(after[0], out_before[0])
    return message


def _two_input_feed(seed=0, n=3):
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((n, 4)).astype(np.float32), "b": rng.standard_normal((n, 4)).astype(np.float32)}


def _calibrated_two_input_sim():
    sim = new_sim(make_two_input_model())
    sim.compute_encodings([_two_input_feed(i) for i in range(3)])
    return sim


def test_feed_missing_input_name():
    sim = _calibrated_two_input_sim()
    good = [_two_input_feed(10), _two_input_feed(11)]
    bad = {"a": _two_input_feed(12)["a"]}
    message = _assert_feed_error_leaves_sim(sim, good + [bad], ValueError, "missing", "'b'")
    assert "batch 2" in message  # which batch


def test_feed_unknown_input_name():
    sim = calibrated_sim()
    feed = dict(batch(5), extra_input=np.zeros((1, 3), dtype=np.float32))
    _assert_feed_error_leaves_sim(sim, batches(2, seed=20, scale=5.0) + [feed], ValueError, "unknown", "extra_input")


def test_feed_misspelled_input_name():
    sim = calibrated_sim()
    feed = {"X": batch(5)["x"]}
    _assert_feed_error_leaves_sim(sim, [feed], ValueError, "'X'", "'x'")


def test_feed_wrong_dtype_float64():
    sim = calibrated_sim()
    feed = {"x": batch(5, scale=9.0)["x"].astype(np.float64)}
    _assert_feed_error_leaves_sim(sim, batches(2, seed=30, scale=9.0) + [feed], TypeError, "'x'", "float64", "float32")


def test_feed_wrong_rank():
    sim = calibrated_sim()
    feed = {"x": np.zeros((3, 8, 8), dtype=np.float32)}
    _assert_feed_error_leaves_sim(sim, batches(2, seed=40, scale=9.0) + [feed], ValueError, "'x'", "rank 3", "4")


def test_feed_wrong_fixed_dimension():
    sim = calibrated_sim()
    feed = {"x": np.zeros((2, 4, 8, 8), dtype=np.float32)}  # 4 channels, the model has 3
    _assert_feed_error_leaves_sim(sim, batches(2, seed=45, scale=9.0) + [feed], Exception, "x")


def test_feed_int_dtype():
    sim = calibrated_sim()
    feed = {"x": np.zeros((2, 3, 8, 8), dtype=np.int64)}
    _assert_feed_error_leaves_sim(sim, [feed], TypeError, "'x'", "int64", "float32")


def test_feed_not_a_dict():
    sim = calibrated_sim()
    _assert_feed_error_leaves_sim(sim, [batch(1), batch(2)["x"]], TypeError, "dict")


def test_feed_errors_in_callback_session():
    sim = calibrated_sim()

    def callback(session):
        session.run(None, batch(1, scale=7.0))
        session.run(None, {"x": batch(2)["x"].astype(np.float64)})

    _assert_feed_error_leaves_sim(sim, callback, TypeError, "float64")


def test_bad_feed_on_uncalibrated_sim_leaves_it_uncalibrated():
    sim = new_sim()
    before = snapshot(sim)
    assert all(entry[-1] is None for entry in before.values())
    with pytest.raises(TypeError):
        sim.compute_encodings([batch(1), {"x": batch(2)["x"].astype(np.float64)}])
    assert snapshot(sim) == before


@pytest.mark.parametrize("empty", [[], (), iter([])])
def test_empty_calibration_data(empty):
    sim = calibrated_sim()
    before = snapshot(sim)
    with pytest.raises(ValueError) as info:
        sim.compute_encodings(empty)
    assert "empty" in str(info.value) or "no usable batch" in str(info.value)
    assert snapshot(sim) == before


def test_empty_calibration_on_fresh_sim():
    sim = new_sim()
    before = snapshot(sim)
    with pytest.raises(ValueError):
        sim.compute_encodings([])
    assert snapshot(sim) == before


def test_callback_that_runs_nothing():
    sim = calibrated_sim()
    before = snapshot(sim)
    with pytest.raises(ValueError, match="no usable batch"):
        sim.compute_encodings(lambda session: None)
    assert snapshot(sim) == before


@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("scheme", ["tf", "tf_enhanced"])
def test_nonfinite_batch_is_skipped_with_warning(bad_value, scheme):
    good = batches(3)
    poisoned = batch(99, scale=50.0)
    poisoned["x"][0, 1, 2, 3] = bad_value
    sim = new_sim(quant_scheme=scheme)
    with pytest.warns(RuntimeWarning, match="NaN/Inf"):
        sim.compute_encodings(good[:2] + [poisoned] + good[2:])
    reference = new_sim(quant_scheme=scheme)
    reference.compute_encodings(good)
    assert snapshot(sim) == snapshot(reference)
    assert np.all(np.isfinite(session_output(sim)))


def test_all_nan_calibration_data_is_an_error():
    sim = calibrated_sim()
    before = snapshot(sim)
    data = batches(3)
    for feed in data:
        feed["x"][...] = np.nan
    with pytest.warns(RuntimeWarning):
        with pytest.raises(ValueError) as info:
            sim.compute_encodings(data)
    assert "NaN" in str(info.value) and "3" in str(info.value)
    assert snapshot(sim) == before


def test_all_nan_on_fresh_sim_is_an_error():
    sim = new_sim()
    before = snapshot(sim)
    with pytest.warns(RuntimeWarning):
        with pytest.raises(ValueError):
            sim.compute_encodings([{"x": np.full((1, 3, 4, 4), np.nan, dtype=np.float32)}])
    assert snapshot(sim) == before


@pytest.mark.parametrize("scheme", ["tf", "tf_enhanced", "percentile"])
def test_overflow_inside_the_network_is_ignored_for_that_tensor(scheme):
    """A finite input that overflows inside the network: the affected tensors ignore that batch, with a
    warning, whatever the scheme (same statistics as calibrating without it). The input's own range does
    hold 3e38: with the range-health rule on, its collapsed grid is left float (checked at the end)."""
    overflow = batch(50)
    overflow["x"][0] = 3e38  # first sample overflows in the Conv, the second is ordinary
    sim = new_sim(quant_scheme=scheme, range_health=False)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        sim.compute_encodings(batches(2) + [overflow] + batches(1, seed=2))
    reference = new_sim(quant_scheme=scheme, range_health=False)
    reference.compute_encodings(batches(3))
    ours, theirs = snapshot(sim), snapshot(reference)
    for name in ("r", "g", "y"):
        assert ours[name] == theirs[name], name
    for name in ("x", "r", "y"):
        for e in sim.qc_quantize_op_dict[name].get_encodings():
            assert np.isfinite(e.min) and np.isfinite(e.max) and np.isfinite(e.delta), name
    checked = new_sim(quant_scheme=scheme)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        checked.compute_encodings(batches(2) + [overflow] + batches(1, seed=2))
    assert not checked.qc_quantize_op_dict["x"].enabled
    assert [d.tensors for d in checked.decisions] == [("x",)]


class _Boom(Exception):
    pass


@pytest.mark.parametrize("scheme", ["tf", "tf_enhanced"])
def test_exception_in_callback_midway_propagates_and_keeps_encodings(scheme):
    sim = calibrated_sim(quant_scheme=scheme)
    before = snapshot(sim)
    out_before = session_output(sim)
    calls = []

    def callback(session):
        for i, feed in enumerate(batches(5, seed=60, scale=20.0)):
            if i == 3:
                raise _Boom("user code failed at batch 3")
            session.run(None, feed)
            calls.append(i)

    with pytest.raises(_Boom, match="batch 3"):
        sim.compute_encodings(callback)
    assert calls == [0, 1, 2]
    assert snapshot(sim) == before
    np.testing.assert_array_equal(session_output(sim), out_before)


def test_exception_in_legacy_callback_with_args():
    sim = calibrated_sim()
    before = snapshot(sim)

    def callback(session, args):
        session.run(None, args[0])
        raise KeyError("missing label")

    with pytest.raises(KeyError, match="missing label"):
        sim.compute_encodings(callback, [batch(3, scale=30.0)])
    assert snapshot(sim) == before


def test_exception_in_generator_midway():
    sim = calibrated_sim()
    before = snapshot(sim)

    def gen():
        yield batch(1, scale=40.0)
        yield batch(2, scale=40.0)
        raise _Boom("data loader crashed")

    with pytest.raises(_Boom, match="data loader"):
        sim.compute_encodings(gen())
    assert snapshot(sim) == before


def test_keyboard_interrupt_midway_keeps_encodings():
    sim = calibrated_sim()
    before = snapshot(sim)

    def callback(session):
        session.run(None, batch(1, scale=40.0))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sim.compute_encodings(callback)
    assert snapshot(sim) == before


def test_failed_calibration_keeps_frozen_and_changed_settings():
    sim = calibrated_sim()
    sim.qc_quantize_op_dict["x"].freeze_encodings()
    sim.qc_quantize_op_dict["r"].set_bitwidth(4)  # drops r's encoding until the next calibration
    before = snapshot(sim)
    with pytest.raises(_Boom):
        sim.compute_encodings(lambda session: (session.run(None, batch(1)), (_ for _ in ()).throw(_Boom())))
    assert snapshot(sim) == before
    sim.compute_encodings(batches())
    assert sim.qc_quantize_op_dict["r"].get_encodings()[0].bw == 4


# --------------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------------
def _default_config() -> dict:
    from quantsim.sim.config import CONFIG_DIR

    return json.loads((CONFIG_DIR / "default_config_per_channel.json").read_text())


def test_config_unknown_top_level_key(tmp_path):
    cfg = _default_config()
    cfg["not_a_section"] = {}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as info:
        new_sim(config_file=str(path))
    assert "not_a_section" in str(info.value)
    assert str(path) in str(info.value)


def test_config_unknown_nested_key():
    cfg = _default_config()
    cfg["defaults"]["ops"]["is_outptu_quantized"] = "True"
    with pytest.raises(ConfigError) as info:
        new_sim(config_file=cfg)
    assert "is_outptu_quantized" in str(info.value)


def test_config_bad_boolean_value(tmp_path):
    cfg = _default_config()
    cfg["defaults"]["params"]["is_symmetric"] = "yes"
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as info:
        new_sim(config_file=path)
    assert "is_symmetric" in str(info.value)


def test_config_bad_op_type_value():
    cfg = _default_config()
    cfg["op_type"]["Conv"]["per_channel_quantization"] = "maybe"
    with pytest.raises(ConfigError) as info:
        new_sim(config_file=cfg)
    message = str(info.value)
    assert "per_channel_quantization" in message and "Conv" in message


def test_config_unknown_supergroup_pass():
    cfg = _default_config()
    cfg["supergroup_pass_list"] = ["NoSuchPass"]
    with pytest.raises(ConfigError, match="NoSuchPass"):
        new_sim(config_file=cfg)


def test_config_unknown_alias_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="htp_v99"):
        new_sim(config_file="htp_v99")
    missing = tmp_path / "nope.json"
    with pytest.raises((ConfigError, FileNotFoundError)) as info:
        new_sim(config_file=str(missing))
    assert "nope.json" in str(info.value)


def test_config_not_json(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text("{ this is not json")
    with pytest.raises(ConfigError) as info:
        new_sim(config_file=str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("scheme", ["bogus", "tf-enhanced-ish", ""])
def test_unknown_quant_scheme(scheme):
    with pytest.raises(ValueError) as info:
        new_sim(quant_scheme=scheme)
    assert repr(scheme) in str(info.value)
    assert "tf_enhanced" in str(info.value)


def test_quantizer_set_quant_scheme_unknown():
    sim = new_sim()
    with pytest.raises(ValueError, match="bogus"):
        sim.qc_quantize_op_dict["x"].set_quant_scheme("bogus")


# --------------------------------------------------------------------------------------------------
# encodings files
# --------------------------------------------------------------------------------------------------
LOADERS = {
    "load_encodings_to_sim": lambda sim, path: load_encodings_to_sim(sim, path),
    "load_encodings_to_sim_lenient": lambda sim, path: load_encodings_to_sim(sim, path, strict=False),
    "set_and_freeze_param_encodings": lambda sim, path: sim.set_and_freeze_param_encodings(path),
}


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_encodings_file_of_unknown_version(tmp_path, loader):
    sim = calibrated_sim()
    data = json.loads(open(export_file(tmp_path, sim, "1.0.0")).read())
    data["version"] = "3.0.0"
    path = tmp_path / "future.encodings"
    path.write_text(json.dumps(data))
    target = calibrated_sim()
    target.compute_encodings(batches(seed=7, scale=3.0))
    before = snapshot(target)
    with pytest.raises(EncodingFormatError) as info:
        LOADERS[loader](target, str(path))
    message = str(info.value)
    assert str(path) in message and "3.0.0" in message
    assert snapshot(target) == before


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_encodings_file_not_json(tmp_path, loader):
    path = tmp_path / "garbage.encodings"
    path.write_text("not json at all")
    sim = calibrated_sim()
    before = snapshot(sim)
    with pytest.raises(EncodingFormatError) as info:
        LOADERS[loader](sim, str(path))
    assert str(path) in str(info.value)
    assert snapshot(sim) == before


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_encodings_file_missing(tmp_path, loader):
    sim = calibrated_sim()
    before = snapshot(sim)
    with pytest.raises(FileNotFoundError) as info:
        LOADERS[loader](sim, str(tmp_path / "absent.encodings"))
    assert "absent.encodings" in str(info.value)
    assert snapshot(sim) == before


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_encodings_file_for_another_model(tmp_path, version, loader):
    other = new_sim(make_model(prefix="other_", name="other_model"))
    other.compute_encodings([{"other_x": b["x"]} for b in batches()])
    path = export_file(tmp_path, other, version)
    sim = calibrated_sim()
    before = snapshot(sim)
    with pytest.raises(ValueError) as info:
        LOADERS[loader](sim, path)
    message = str(info.value)
    assert path in message
    assert "other_" in message  # names the tensors it could not find
    assert "tiny_cnn" in message  # and the model it was loaded into
    assert snapshot(sim) == before


def _drop_channel(data: dict, version: str, tensor: str) -> dict:
    data = copy.deepcopy(data)
    if version == "0.6.1":
        data["param_encodings"][tensor] = data["param_encodings"][tensor][:3]
    elif version == "1.0.0":
        entry = next(e for e in data["param_encodings"] if e["name"] == tensor)
        entry["scale"], entry["offset"] = entry["scale"][:3], entry["offset"][:3]
    else:
        entry = next(e for e in data["encodings"] if e["name"] == tensor)
        entry["y_scale"] = entry["y_scale"][:3]
        if "y_zero_point" in entry:
            entry["y_zero_point"] = entry["y_zero_point"][:3]
    return data


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_encodings_wrong_channel_count(tmp_path, version, loader):
    sim = calibrated_sim()
    assert len(sim.qc_quantize_op_dict["W"].get_encodings()) == 4
    data = json.loads(open(export_file(tmp_path, sim, version)).read())
    path = tmp_path / "three_channels.encodings"
    path.write_text(json.dumps(_drop_channel(data, version, "W")))
    target = new_sim()
    target.compute_encodings(batches(seed=5, scale=2.0))
    before = snapshot(target)
    with pytest.raises(ValueError) as info:
        LOADERS[loader](target, str(path))
    message = str(info.value)
    assert "'W'" in message
    assert "3" in message and "4" in message
    assert "channel" in message
    assert str(path) in message
    assert snapshot(target) == before


@pytest.mark.parametrize("version", VERSIONS)
def test_encodings_wrong_channel_count_in_dict(version, tmp_path):
    sim = calibrated_sim()
    data = _drop_channel(json.loads(open(export_file(tmp_path, sim, version)).read()), version, "W")
    before = snapshot(sim)
    with pytest.raises(ValueError, match="'W'"):
        load_encodings_to_sim(sim, data, strict=False)
    assert snapshot(sim) == before


@pytest.mark.parametrize("version", VERSIONS)
def test_strict_mismatch_leaves_sim_unchanged(tmp_path, version):
    source = calibrated_sim(param_type="int4")
    path = export_file(tmp_path, source, version)
    sim = calibrated_sim()
    before = snapshot(sim)
    with pytest.raises(EncodingMismatchError) as info:
        load_encodings_to_sim(sim, path, strict=True)
    assert "W" in str(info.value) and "bitwidth" in str(info.value)
    assert snapshot(sim) == before


def test_encodings_naming_an_unquantized_tensor_strict(tmp_path):
    sim = calibrated_sim()
    data = json.loads(open(export_file(tmp_path, sim, "1.0.0")).read())
    data["activation_encodings"].append({**data["activation_encodings"][0], "name": "no_such_tensor"})
    before = snapshot(sim)
    with pytest.raises(EncodingMismatchError, match="no_such_tensor"):
        load_encodings_to_sim(sim, data, strict=True)
    assert snapshot(sim) == before


def test_encodings_corrupt_entry_names_tensor(tmp_path):
    sim = calibrated_sim()
    data = json.loads(open(export_file(tmp_path, sim, "1.0.0")).read())
    entry = next(e for e in data["activation_encodings"] if e["name"] == "r")
    entry["scale"] = [-1.0]
    path = tmp_path / "negative_scale.encodings"
    path.write_text(json.dumps(data))
    before = snapshot(sim)
    with pytest.raises(EncodingFormatError) as info:
        load_encodings_to_sim(sim, str(path))
    assert "'r'" in str(info.value) and str(path) in str(info.value)
    assert snapshot(sim) == before


# --------------------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------------------
def test_export_before_calibration(tmp_path):
    sim = new_sim()
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="compute_encodings"):
        sim.export(str(out), "model")
    assert not out.exists() or os.listdir(out) == []


def test_export_without_activation_calibration_warns(tmp_path):
    sim = new_sim()
    sim.session.run(None, batch())  # computes weight encodings lazily, activations stay uncalibrated
    with pytest.warns(RuntimeWarning, match="no encoding"):
        sim.export(str(tmp_path), "model", export_model=False)
    data = json.loads((tmp_path / "model.encodings").read_text())
    assert data["activation_encodings"] == []
    assert {e["name"] for e in data["param_encodings"]} == {"W", "W2"}


def test_export_unknown_version(tmp_path):
    sim = calibrated_sim()
    with pytest.raises(ValueError, match="3.0.0"):
        sim.export(str(tmp_path), "model", encoding_version="3.0.0")
    assert os.listdir(tmp_path) == []


def test_export_bad_force_activation_as(tmp_path):
    sim = calibrated_sim()
    with pytest.raises(ValueError, match="force_activation_as"):
        sim.export(str(tmp_path), "model", encoding_version="2.0.0", force_activation_as="sideways")
    assert os.listdir(tmp_path) == []
