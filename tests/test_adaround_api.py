"""AIMET's AdaRound call forms on small built models: ``Adaround.apply_adaround`` in its 2.x form (on a
sim, identical to the function) and its 1.x form (on a model), told apart by argument type; batches in
every form AIMET takes; arguments with no effect warn exactly once; bad calls are named."""
import warnings
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_adaround import _cnn, _data

import quantsim
from adaround import Adaround, AdaroundParameters, apply_adaround
from adaround.feeds import as_feed, as_feeds
from quantsim import QuantizationSimModel


def _calibrated(model=None):
    sim = QuantizationSimModel(_cnn() if model is None else model, param_type="int4", progress=False)
    sim.compute_encodings(_data(2))
    return sim


def _state(sim):
    weights = {layer.weight: sim.get_weight(layer.weight) for layer in sim.weighted_layers()}
    scales = {layer.weight: layer.weight_quantizer.encoding.scale for layer in sim.weighted_layers()}
    return weights, scales


def _assert_same(a, b):
    for left, right in zip(_state(a), _state(b)):
        assert left.keys() == right.keys()
        for name in left:
            np.testing.assert_array_equal(left[name], right[name])


def _recorded(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [w for w in caught if issubclass(w.category, (quantsim.QuantsimWarning, DeprecationWarning))]


def test_class_form_on_a_sim_is_the_function():
    by_function, by_class, by_keywords = _calibrated(), _calibrated(), _calibrated()
    reports = apply_adaround(by_function, _data(2), num_iterations=40)
    from_class = Adaround.apply_adaround(by_class, _data(2), num_iterations=40)
    assert [replace(r, seconds=0) for r in from_class] == [replace(r, seconds=0) for r in reports]
    Adaround.apply_adaround(sim=by_keywords, inputs=_data(2), num_iterations=40, nodes_to_include=None)
    assert {r.status for r in reports} == {"rounded"}
    _assert_same(by_function, by_class)
    _assert_same(by_function, by_keywords)
    assert any(not np.array_equal(w, _state(_calibrated())[0][k]) for k, w in _state(by_class)[0].items())
    for layer in by_class.weighted_layers():  # in place: the sim's weights and frozen encodings changed
        assert layer.weight_quantizer.is_encoding_frozen()


def test_batches_in_every_form_aimet_takes_give_the_same_result():
    as_dicts, as_arrays, as_tuples = _calibrated(), _calibrated(), _calibrated()
    apply_adaround(as_dicts, _data(2), num_iterations=30)
    apply_adaround(as_arrays, [d["x"] for d in _data(2)], num_iterations=30)
    Adaround.apply_adaround(as_tuples, [(d["x"],) for d in _data(2)], 30)
    _assert_same(as_dicts, as_arrays)
    _assert_same(as_dicts, as_tuples)


def test_feed_forms_map_to_the_inputs_in_order_and_miscounts_are_named():
    a, b = np.zeros(2, np.float32), np.ones(2, np.float32)
    assert as_feed([a, b], ["p", "q"], "here")["q"] is b
    assert as_feed((a, b), ["p", "q"], "here")["p"] is a
    assert as_feed({"q": b, "p": a}, ["p", "q"], "here")["q"] is b
    with pytest.raises(quantsim.InvalidArgumentError, match=r"batch 1: 2 array\(s\) for the model's 1 input"):
        as_feeds([(a,), (a, b)], ["x"], "apply_adaround inputs")
    with pytest.raises(quantsim.InvalidTypeError, match="got str"):
        as_feed("x.npy", ["x"], "here")
    with pytest.raises(quantsim.InvalidTypeError, match="single dict"):
        as_feeds({"x": a}, ["x"], "here")
    with pytest.raises(quantsim.InvalidArgumentError, match="at least one"):
        apply_adaround(_calibrated(), [], num_iterations=5)


def test_legacy_form_positional_and_keyword(tmp_path):
    params = AdaroundParameters([d["x"] for d in _data(2)], num_batches=2, default_num_iterations=20)
    original = _cnn()
    positional = Adaround.apply_adaround(original, params, tmp_path, "pos", 4)
    assert original.SerializeToString() == _cnn().SerializeToString()  # as in AIMET: the caller's model untouched
    keywords = Adaround.apply_adaround(model=_cnn(), params=params, path=tmp_path, filename_prefix="kw",
                                       default_param_bw=4)
    assert isinstance(positional, onnx.ModelProto)
    assert (tmp_path / "pos.encodings").read_text() == (tmp_path / "kw.encodings").read_text()
    for a, b in zip(positional.graph.initializer, keywords.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


def test_wrong_call_forms_are_named(tmp_path):
    params = AdaroundParameters(_data(1), num_batches=1, default_num_iterations=5)
    with pytest.raises(quantsim.InvalidTypeError, match="first argument must be a QuantizationSimModel"):
        Adaround.apply_adaround(42, _data(1))
    with pytest.raises(quantsim.InvalidTypeError, match="Adaround.apply_adaround\\(model, params"):
        apply_adaround(_cnn(), params, tmp_path, "x")
    with pytest.raises(quantsim.InvalidArgumentError, match="unexpected argument.*num_iterations"):
        Adaround.apply_adaround(_cnn(), params, tmp_path, "x", num_iterations=5)
    with pytest.raises(quantsim.InvalidTypeError, match="params must be AdaroundParameters"):
        Adaround.apply_adaround(_cnn(), {"num_batches": 1}, tmp_path, "x")
    with pytest.raises(quantsim.InvalidArgumentError, match="user_onnx_libs"):
        Adaround.apply_adaround(_cnn(), params, tmp_path, "x", user_onnx_libs=["custom_ops.so"])
    with pytest.raises(quantsim.InvalidArgumentError, match="data_loader of length 1"):
        AdaroundParameters(_data(1), num_batches=2)


def test_forward_fn_warns_once_and_is_never_called(tmp_path):
    def forward_fn(session, args):
        raise AssertionError("forward_fn must not run")

    params, caught = _recorded(lambda: AdaroundParameters(_data(1), 1, default_num_iterations=5,
                                                          forward_fn=forward_fn, forward_pass_callback_args=(1, 2)))
    assert len(caught) == 1 and "forward_fn and forward_pass_callback_args have no effect" in str(caught[0].message)
    assert caught[0].filename == __file__  # attributed to the caller's line
    _, again = _recorded(lambda: Adaround.apply_adaround(_cnn(), params, tmp_path, "fwd"))
    assert again == []
    _, plain = _recorded(lambda: AdaroundParameters(_data(1), 1))
    assert plain == []


def test_use_cuda_and_device_warn_once_that_there_is_no_gpu_path(tmp_path):
    params = AdaroundParameters(_data(1), 1, default_num_iterations=5)
    on_gpu, caught = _recorded(lambda: Adaround.apply_adaround(_cnn(), params, tmp_path, "gpu", use_cuda=True,
                                                               device=3))
    assert len(caught) == 1
    assert "use_cuda and device have no effect: there is no GPU path" in str(caught[0].message)
    on_cpu, quiet = _recorded(lambda: Adaround.apply_adaround(_cnn(), params, tmp_path, "cpu", use_cuda=False))
    assert quiet == []
    for a, b in zip(on_gpu.graph.initializer, on_cpu.graph.initializer):  # same result either way
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


def test_deprecated_node_names_to_optimize_warns_once_and_works():
    alias, by_name = _calibrated(), _calibrated()
    reports, caught = _recorded(lambda: Adaround.apply_adaround(alias, _data(1), 20, node_names_to_optimize=["pw"]))
    assert [w.category for w in caught] == [DeprecationWarning]
    apply_adaround(by_name, _data(1), 20, nodes_to_include=["pw"])
    _assert_same(alias, by_name)
    assert {r.node for r in reports if r.status == "rounded"} == {"pw"}


def test_two_input_model_takes_tuples_in_input_order():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Sub", ["a", "b"], ["s"], name="sub"), helper.make_node("MatMul", ["s", "w"], ["y"], name="mm")],
        "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    batches = [(rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32) * 5)
               for _ in range(2)]
    dict_batches = [{"a": a, "b": b} for a, b in batches]
    tuples, dicts = (QuantizationSimModel(model, param_type="int4", progress=False) for _ in range(2))
    for sim in (tuples, dicts):
        sim.compute_encodings(dict_batches)
    apply_adaround(tuples, batches, 30)
    apply_adaround(dicts, dict_batches, 30)
    _assert_same(tuples, dicts)
    with pytest.raises(quantsim.InvalidArgumentError, match=r"2 input\(s\) \['a', 'b'\]"):
        apply_adaround(tuples, [batches[0][0]], 30)
