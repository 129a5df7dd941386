"""Ops of older CNN exports on integer kernels: the variadic ``Sum`` of Caffe2 / early PyTorch residuals
(prepared into ``Add``) and a standalone inference-mode ``BatchNormalization`` preparation cannot fold
(DenseNet's pre-activation BN, lowered to a depthwise 1x1 ``QLinearConv``).

The small models ``sum_residual`` and ``concat_bn`` also run through the model-zoo tests (integer export,
oracle, QDQ export, round trips); here: the preparation rule, placement, the BatchNorm weight/bias fit, other
ranks, and prefixes of the real ResNet-50 and DenseNet-121 graphs that ship inside the onnx wheel
(`light_models`: randomized weights).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import BUILDERS, make_model  # tests/models.py
from onnx import TensorProto, helper, numpy_helper
from test_export_integer import _assert_integer_only, _export_checked, _steps

import quantsim
from benchmarks.suite.light_models import light_model, output_of, prefix, randomized
from quantsim.export.integer.batchnorm import affine_codes
from quantsim.prepare import canonicalize_ops, prepare


def _run(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _exact_session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _calibrated(model: onnx.ModelProto, feeds, batches: int = 3, batch: int = 2, **kwargs):
    sim = quantsim.QuantizationSimModel(model, progress=False, **kwargs)
    sim.compute_encodings([feeds(seed, batch) for seed in range(batches)])
    return sim


# Sum -------------------------------------------------------------------------------------------------------
def _sums_model() -> onnx.ModelProto:
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("a", "b", "c")]
    nodes = [helper.make_node("Sum", ["a", "b"], ["two"], name="two"),
             helper.make_node("Sum", ["two"], ["one"], name="one"),
             helper.make_node("Sum", ["one", "b", "c"], ["three"], name="three")]
    out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("one", "three")]
    return make_model(nodes, vi, out, [])


def test_canonicalize_ops_turns_one_and_two_input_sums_into_identity_and_add():
    model = _sums_model()
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal((2, 3)).astype(np.float32) for n in "abc"}
    work = onnx.ModelProto()
    work.CopyFrom(model)
    result, modified = canonicalize_ops(work)
    assert modified
    assert [(n.name, n.op_type, list(n.output)) for n in result.graph.node] == [
        ("two", "Add", ["two"]), ("one", "Identity", ["one"]), ("three", "Sum", ["three"])]
    for got, want in zip(_run(result, feed), _run(model, feed)):
        np.testing.assert_array_equal(got, want)
    assert canonicalize_ops(result) == (result, False)
    assert [n.op_type for n in prepare(model, cache=False).graph.node] == ["Add", "Identity", "Sum"]


def test_a_sum_residual_is_placed_and_simulated_like_an_add():
    """The Add -> Relu supergroup applies: no quantizer on the Sum's output, same sim outputs as with Add."""
    sums, feeds = BUILDERS["sum_residual"]()
    adds, _ = BUILDERS["residual"]()
    sim_sum, sim_add = _calibrated(sums, feeds), _calibrated(adds, feeds)
    assert {k: q.enabled for k, q in sim_sum.qc_quantize_op_dict.items()} == {
        k: q.enabled for k, q in sim_add.qc_quantize_op_dict.items()}
    assert not sim_sum.qc_quantize_op_dict["add.out"].enabled
    feed = feeds(7, 4)
    np.testing.assert_array_equal(sim_sum.session.run(None, feed)[0], sim_add.session.run(None, feed)[0])


def test_a_sum_of_three_inputs_stays_float_with_its_reason():
    model = _sums_model()
    rng = np.random.default_rng(1)
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings([{n: rng.standard_normal((2, 3)).astype(np.float32) for n in "abc"} for _ in range(3)])
    exported = _export_checked(sim)
    assert [(e.node, e.op_type) for e in exported.report] == [("three", "Sum")]
    assert "Sum of 3 inputs has no integer kernel" in exported.report[0].reason
    feed = {n: rng.standard_normal((2, 3)).astype(np.float32) for n in "abc"}
    for steps in _steps(sim, exported, feed).values():
        assert steps.max() <= 1


def test_the_prepared_cache_returns_the_canonical_model(tmp_path):
    model, _ = BUILDERS["sum_residual"]()
    first = prepare(model, cache_dir=tmp_path)
    again = prepare(model, cache_dir=tmp_path)  # a hit: the stored entry is the canonical graph
    assert [n.op_type for n in again.graph.node] == [n.op_type for n in first.graph.node]
    assert "Sum" not in {n.op_type for n in again.graph.node}
    assert len(list((tmp_path / "prepared").iterdir())) == 1


# BatchNormalization ----------------------------------------------------------------------------------------
def test_affine_codes_are_exact_multipliers_and_shrink_only_to_fit_the_bias():
    a = np.array([0.8, -2.5, 0.0, 1e-3])
    b = np.array([0.1, 3.0, -0.7, 0.0])
    codes, scales = affine_codes(a, b, input_scale=0.02)
    assert codes.dtype == np.int8 and codes.tolist() == [127, -127, 0, 127]
    np.testing.assert_allclose(codes * scales.astype(np.float64), a, rtol=2e-7)
    assert scales[2] == np.float32(2.5 / 127)  # a zero multiplier: code 0 on the largest scale
    # a shift of 10^8 input steps times the multiplier: that channel's code shrinks until its bias fits int32
    codes, scales = affine_codes(np.array([1e-3, 1.0]), np.array([1.0, 0.5]), input_scale=1e-5)
    assert codes[1] == 127 and 1 <= codes[0] < 127
    assert 1.0 / (np.float32(1e-5) * scales[0]) <= np.iinfo(np.int32).max
    np.testing.assert_allclose(codes * scales.astype(np.float64), [1e-3, 1.0], rtol=2e-7)
    assert affine_codes(np.array([1e-6]), np.array([1e6]), input_scale=1e-6) is None  # even code 1 overflows


def _bn_model(rank: int) -> tuple[onnx.ModelProto, object]:
    """Graph input (rank 2 or 3) -> BatchNormalization -> Relu -> Gemm / Conv."""
    rng = np.random.default_rng(rank)
    c = 6
    bn = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
        ("s", 1 + 0.4 * rng.standard_normal(c)), ("b", 0.3 * rng.standard_normal(c)),
        ("m", 0.3 * rng.standard_normal(c)), ("v", 0.5 + rng.random(c)))]
    if rank == 2:
        layer = helper.make_node("Gemm", ["r", "w"], ["y"], name="fc", transB=1)
        weight = numpy_helper.from_array((rng.standard_normal((4, c)) / np.sqrt(c)).astype(np.float32), "w")
        dims, out = ["N", c], ["N", 4]
    else:
        layer = helper.make_node("Conv", ["r", "w"], ["y"], name="conv", kernel_shape=[3], pads=[1, 1])
        weight = numpy_helper.from_array((rng.standard_normal((4, c, 3)) / np.sqrt(3 * c)).astype(np.float32), "w")
        dims, out = ["N", c, 10], ["N", 4, 10]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["r"], name="relu"), layer]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], [*bn, weight])

    def feeds(seed: int, batch: int) -> dict:
        shape = (batch, c) if rank == 2 else (batch, c, 10)
        return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}

    return model, feeds


@pytest.mark.parametrize("rank", [2, 3])
def test_batchnorm_of_rank_2_and_3_runs_on_a_qlinear_conv(rank):
    model, feeds = _bn_model(rank)
    sim = _calibrated(model, feeds, batch=16)
    exported = _export_checked(sim)
    assert exported.report == []
    _assert_integer_only(exported.model)
    kernels = [n for n in exported.model.graph.node if n.op_type == "QLinearConv" and n.name == "bn"]
    assert len(kernels) == 1 and helper.get_attribute_value(kernels[0].attribute[0]) == 6  # group = C
    steps = _steps(sim, exported, feeds(50, 64))["y"]
    assert steps.max() <= 1 and np.mean(steps > 0) <= 0.03, (steps.max(), np.mean(steps > 0))


def test_batchnorm_in_training_mode_stays_float():
    model, feeds = _bn_model(3)
    model.opset_import[0].version = 17
    bn = model.graph.node[0]
    bn.attribute.append(helper.make_attribute("training_mode", 1))
    bn.output.extend(["running_mean", "running_var"])
    sim = _calibrated(model, feeds, fold_batchnorm=False)
    exported = _export_checked(sim)
    assert [(e.node, e.op_type) for e in exported.report] == [("bn", "BatchNormalization")]
    assert "training mode" in exported.report[0].reason


# real architectures ----------------------------------------------------------------------------------------
def _light_prefix(name: str, op_type: str, count: int, then: str | None) -> onnx.ModelProto:
    model = light_model(name)
    if model is None:
        pytest.skip(f"this onnx wheel ships no light_{name}.onnx")
    model = randomized(model)
    return prefix(model, output_of(model, op_type, count, then=then), size=40)


@pytest.mark.parametrize("name, op_type, count, then, legacy", [
    ("resnet50", "Sum", 1, "Relu", "Sum"),  # the stem and the first bottleneck with its projection shortcut
    ("densenet121", "Concat", 3, "BatchNormalization", "BatchNormalization"),  # BNs after the pool and Concats
])
def test_real_cnn_prefixes_are_fully_integer_and_their_exports_match_the_sim(name, op_type, count, then, legacy):
    """One-step differences (bias rounding, float32 requantization) spread and grow through deep stacks of
    random He-initialised layers: on ResNet-50 at 40x40 the integer model is within 2 steps of the sim on 0.65%
    of the first block's outputs, 4 steps / 15% after three blocks (the same with the residuals written as
    Add before this rule existed), so the prefixes stay short."""
    model = _light_prefix(name, op_type, count, then)
    assert legacy in {n.op_type for n in model.graph.node}
    constants = {t.name for t in model.graph.initializer}
    image = next(i.name for i in model.graph.input if i.name not in constants)

    def feeds(seed: int, batch: int) -> dict:
        return {image: np.random.default_rng(seed).standard_normal((batch, 3, 40, 40)).astype(np.float32)}

    sim = _calibrated(model, feeds)
    exported = _export_checked(sim)
    assert exported.report == [], str(exported.report)
    _assert_integer_only(exported.model)
    feed = feeds(100, 2)
    for output, steps in _steps(sim, exported, feed).items():
        assert steps.max() <= 2 and np.mean(steps > 0) <= 0.03, (output, steps.max(), np.mean(steps > 0))
    exact = _exact_session(sim.to_onnx_qdq())  # the QDQ model, every Q/DQ as written (int32 biases, as the sim)
    for got, want in zip(exact.run(None, feed), sim.session.run(None, feed)):
        np.testing.assert_array_equal(got, want)
    default = _run(sim.to_onnx_qdq(weight_codes="auto"), feed)[0]  # fused integer kernels, int32 biases
    step = float(sim.qc_quantize_op_dict[model.graph.output[0].name].encoding.scale)
    steps = np.round(np.abs(default.astype(np.float64) - sim.session.run(None, feed)[0]) / step)
    assert steps.max() <= 2 and np.mean(steps > 0) <= 0.03, ("qdq", steps.max(), np.mean(steps > 0))
