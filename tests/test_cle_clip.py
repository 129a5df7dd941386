"""Cross-layer equalization across ReLU6 (Clip): the float function is kept (per-channel bounds), the sim keeps one
output quantizer per activation, and the exports clamp per channel; AIMET's in-place semantics."""
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantsim
from adaround import equalize_model
from adaround.cle import find_equalization_pairs
from quantsim import InvalidArgumentError, QuantsimWarning

X_SHAPE = (4, 3, 10, 10)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def depthwise_chain(act: str, seed: int = 0) -> onnx.ModelProto:
    """Conv 3->8, BN, act, depthwise 3x3, BN, act, pointwise 8->6: a MobileNet block with imbalanced channels."""
    rng = np.random.default_rng(seed)
    inits = [_init("w1", rng.standard_normal((8, 3, 3, 3)) * np.exp(rng.uniform(-2, 2, (8, 1, 1, 1)))),
             _init("w2", rng.standard_normal((8, 1, 3, 3)) * np.exp(rng.uniform(-2, 2, (8, 1, 1, 1)))),
             _init("w3", rng.standard_normal((6, 8, 1, 1))), _init("b3", rng.standard_normal(6)),
             _init("lo", np.float32(0)), _init("hi", np.float32(6))]
    for k in (1, 2):
        inits += [_init(f"g{k}", rng.uniform(0.5, 4, 8)), _init(f"be{k}", rng.standard_normal(8) + 1),
                  _init(f"m{k}", rng.standard_normal(8) * 0.1), _init(f"v{k}", rng.uniform(0.5, 1.5, 8))]

    def activation(name, x, out):
        if act == "Clip":
            return helper.make_node("Clip", [x, "lo", "hi"], [out], name=name)
        return helper.make_node("Relu", [x], [out], name=name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g1", "be1", "m1", "v1"], ["n1"], name="bn1"),
             activation("act1", "n1", "r1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="dw", group=8, pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c2", "g2", "be2", "m2", "v2"], ["n2"], name="bn2"),
             activation("act2", "n2", "r2"),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["y"], name="pw")]
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(n=3, seed=1):
    rng = np.random.default_rng(seed)
    return [{"x": (2 * rng.standard_normal(X_SHAPE)).astype(np.float32)} for _ in range(n)]


def _run(model, feeds, output=None):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run([output] if output else None, f)[0] for f in feeds])


def _copy(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _relative(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(a)))


def test_the_clips_bind_on_this_data():
    """The test model's ReLU6 really clips (else a Relu would pass the equivalence tests below)."""
    model = depthwise_chain("Clip")
    model.graph.output.append(helper.make_tensor_value_info("n1", TensorProto.FLOAT, None))
    model.graph.output.append(helper.make_tensor_value_info("n2", TensorProto.FLOAT, None))
    feeds = _feeds()
    assert np.mean(_run(model, feeds, "n1") > 6) > 0.01 and np.mean(_run(model, feeds, "n2") > 6) > 0.01


@pytest.mark.parametrize("act", ["Clip", "Relu"])
@pytest.mark.parametrize("clip_pairs", ["rescale", "skip"])
def test_float_outputs_are_kept_within_float_rounding(act, clip_pairs):
    model, feeds = depthwise_chain(act), _feeds()
    before = _run(model, feeds)
    # high-bias absorption is exact only within 3 sigma of the BatchNormalization statistics, which these random
    # ones are not: its own test is in test_cle.py
    equalize_model(model, clip_pairs=clip_pairs, high_bias_fold=False)
    assert _relative(before, _run(model, feeds)) < 1e-5


def test_aimets_relu6_to_relu_changes_the_float_function():
    model, feeds = depthwise_chain("Clip"), _feeds()
    before = _run(model, feeds)
    assert _relative(before, _run(equalize_model(model, clip_pairs="relu"), feeds)) > 1e-2


def test_rescaled_bounds_are_six_over_the_channel_scale():
    original = depthwise_chain("Clip")
    folded = quantsim.prepare(original)  # BN folded: the weights equalization starts from
    model = equalize_model(_copy(original))
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w0 = {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}
    mins = {n.input[0]: n for n in model.graph.node if n.op_type == "Min"}
    assert len(mins) == 2

    def shrink(name):  # per output channel, how much a layer's weight range shrank
        return np.abs(w0[name]).reshape(8, -1).max(axis=1) / np.abs(w[name]).reshape(8, -1).max(axis=1)

    # conv1's channels were divided by s1 (it is the first layer of one pair only); the depthwise layer's were
    # multiplied by s1 (second layer of the first pair) and divided by s2 (first layer of the second pair)
    s1 = shrink("w1")
    s2 = shrink("w2") * s1
    for relu_out, s in zip(("r1.cle_lower", "r2.cle_lower"), (s1, s2)):
        node = mins[relu_out]
        assert w[node.input[1]].shape == (8, 1, 1)
        np.testing.assert_allclose(w[node.input[1]].reshape(-1), 6 / s, rtol=1e-5)
        assert not np.allclose(s, 1)


def _enabled_activations(sim):
    return sorted(q.name for q in sim.quantizers if q.enabled and q.role == "activation")


def test_sim_keeps_one_output_quantizer_after_the_per_channel_clip():
    original, feeds = depthwise_chain("Clip"), _feeds()
    model = equalize_model(_copy(original))
    config = str(Path(quantsim.__file__).parent / "sim" / "configs" / "default_config.json")
    plain = quantsim.QuantizationSimModel(original, config_file=config, progress=False)
    sim = quantsim.QuantizationSimModel(model, config_file=config, progress=False)
    assert len(_enabled_activations(sim)) == len(_enabled_activations(plain))
    for node in (n for n in model.graph.node if n.op_type == "Min"):
        assert not sim.qc_quantize_op_dict[node.input[0]].enabled  # the Relu's output: inside the activation
        bound = sim.qc_quantize_op_dict.get(node.input[1])
        assert bound is None or not bound.enabled  # the bound stays float
        assert sim.qc_quantize_op_dict[node.output[0]].enabled
    # per-tensor int8 weights: equalization lowers the sim's error against the float model
    sim.compute_encodings(feeds)
    plain.compute_encodings(feeds)
    reference = _run(original, feeds)

    def error(s):
        return float(np.mean((np.concatenate([s.session.run(None, f)[0] for f in feeds]) - reference) ** 2))

    assert error(sim) < error(plain)


def test_relu_then_scalar_min_is_one_activation():
    """ReLU6 spelled ``Min(Relu(x), 6)`` keeps Conv + Clip's single output quantizer."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Min", ["r", "six"], ["y"], name="min")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_init("w", rng.standard_normal((4, 3, 1, 1))), _init("six", np.float32(6))])
    sim = quantsim.QuantizationSimModel(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                          ir_version=8), progress=False)
    assert _enabled_activations(sim) == ["x", "y"]
    # a Relu output read twice is a tensor of its own: quantized
    nodes.append(helper.make_node("Neg", ["r"], ["z"], name="neg"))
    graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    del graph.node[:]
    graph.node.extend(nodes)
    sim = quantsim.QuantizationSimModel(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                          ir_version=8), progress=False)
    assert "r" in _enabled_activations(sim)


def test_exports_clamp_per_channel_and_match_the_sim():
    feeds = _feeds()
    model = equalize_model(depthwise_chain("Clip"))
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings(feeds)
    expected = np.concatenate([sim.session.run(None, f)[0] for f in feeds])
    step = float(sim.qc_quantize_op_dict["y"].encoding.scale)
    integer = sim.export_integer(weight_codes="uint8").model
    ops = [n.op_type for n in integer.graph.node]
    assert ops.count("QLinearConv") == 3 and "Conv" not in ops and ops.count("Min") == 2
    inits = {t.name: t for t in integer.graph.initializer}
    for node in (n for n in integer.graph.node if n.op_type == "Min"):
        assert inits[node.input[1]].data_type == TensorProto.UINT8 and tuple(inits[node.input[1]].dims) == (8, 1, 1)
    got, qdq = _run(integer, feeds), _run(sim.to_onnx_qdq(weight_codes="uint8"), feeds)
    np.testing.assert_array_equal(got, qdq)  # the QDQ model clamps the dequantized values in float: same codes
    # onnxruntime's fused kernels round intermediate results apart from the sim by an LSB now and then, and a
    # 3-layer net carries a few of those to the output (6 steps at most here, 2 without equalization)
    steps = np.abs(got - expected) / step
    assert np.mean(steps > 0.5) < 0.02 and steps.max() <= 8.01


def test_dummy_input_checks_the_function_and_input_shapes_warns():
    feeds = _feeds(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        equalize_model(depthwise_chain("Clip"), dummy_input=feeds[0])
    with pytest.warns(QuantsimWarning, match="differ from the original"):
        equalize_model(depthwise_chain("Clip"), dummy_input=feeds[0], clip_pairs="relu")
    with pytest.warns(QuantsimWarning, match="input_shapes has no effect"):
        equalize_model(depthwise_chain("Relu"), (1, 3, 10, 10))
    with pytest.raises(InvalidArgumentError, match="dummy_input"):
        equalize_model(depthwise_chain("Relu"), dummy_input={"nope": feeds[0]["x"]})


def test_wrapper_and_bad_arguments():
    class Wrapper:  # onnxruntime's ONNXModel (what AIMET accepts) holds the ModelProto as .model
        def __init__(self, model):
            self.model = model

    model = depthwise_chain("Clip")
    wrapped = Wrapper(model)
    assert equalize_model(wrapped) is model and "Min" in [n.op_type for n in model.graph.node]
    with pytest.raises(InvalidArgumentError, match="clip_pairs"):
        equalize_model(depthwise_chain("Clip"), clip_pairs="drop")
    with pytest.raises(InvalidArgumentError, match="ModelProto"):
        equalize_model("model.onnx")
    untouched = depthwise_chain("Clip")
    before = untouched.SerializeToString()
    with pytest.raises(InvalidArgumentError, match="passes"):
        equalize_model(untouched, passes=0)
    assert untouched.SerializeToString() == before  # a failed call leaves the model as it was


PPOCR_CLS = Path.home() / ".cache" / "quantsim" / "models" / "ppocr" / "cls.onnx"


@pytest.mark.skipif(not PPOCR_CLS.exists(), reason="PP-OCR cls model not fetched (benchmarks/suite/fetch.py)")
def test_real_depthwise_cnn_with_relu6_keeps_its_float_function():
    """PP-OCR's mobile classifier (real weights, depthwise) with the Relu between its equalizable layers made
    ReLU6: the equalized model computes what it did."""
    model = quantsim.prepare(onnx.load(str(PPOCR_CLS)))
    acts = {a for _, a, _ in find_equalization_pairs(model) if a}
    model.graph.initializer.extend([_init("r6.lo", np.float32(0)), _init("r6.hi", np.float32(6))])
    for node in model.graph.node:
        if node.name in acts and node.op_type == "Relu":
            node.op_type = "Clip"
            node.input.extend(["r6.lo", "r6.hi"])
    assert len(acts) >= 10
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.uniform(-1, 1, (4, 3, 48, 192)).astype(np.float32)}]
    before = _run(model, feeds)
    equalize_model(model)
    assert sum(n.op_type == "Min" for n in model.graph.node) >= 10
    assert _relative(before, _run(model, feeds)) < 1e-4
