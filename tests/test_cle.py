"""Cross-layer equalization: equivalent models, equalized ranges, better low-bit weights."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from adaround import equalize_model
from adaround.cle import find_equalization_pairs


def _model(nodes, inits, x_shape, y_name="y", opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(y_name, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _bn(name, c, rng, beta_shift=0.0):
    return [numpy_helper.from_array(rng.uniform(0.5, 2, c).astype(np.float32), f"{name}.g"),
            numpy_helper.from_array((rng.standard_normal(c) + beta_shift).astype(np.float32), f"{name}.b"),
            numpy_helper.from_array(rng.standard_normal(c).astype(np.float32) * 0.1, f"{name}.m"),
            numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), f"{name}.v")]


def _imbalanced(rng, shape, axis):
    w = rng.standard_normal(shape).astype(np.float32)
    scale = np.exp(rng.uniform(-4, 4, shape[axis])).astype(np.float32)
    view = [1] * len(shape)
    view[axis] = -1
    return w * scale.reshape(view)


def conv_bn_relu_chain(rng, beta_shift=0.0):
    inits = [numpy_helper.from_array(_imbalanced(rng, (8, 3, 3, 3), 0), "w1"),
             numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal((6, 8, 1, 1)).astype(np.float32), "w3"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b3")]
    inits += _bn("bn1", 8, rng, beta_shift) + _bn("bn2", 8, rng, beta_shift)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"),
             helper.make_node("BatchNormalization", ["c1", "bn1.g", "bn1.b", "bn1.m", "bn1.v"], ["n1"], name="bn1"),
             helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="dw", group=8),
             helper.make_node("BatchNormalization", ["c2", "bn2.g", "bn2.b", "bn2.m", "bn2.v"], ["n2"], name="bn2"),
             helper.make_node("Relu", ["n2"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["y"], name="pw")]
    return _model(nodes, inits, [2, 3, 12, 12])


def gemm_chain(rng):
    inits = [numpy_helper.from_array(_imbalanced(rng, (16, 10), 0), "w1"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b2")]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2", alpha=0.5, beta=2.0)]
    return _model(nodes, inits, ["N", 10])


def _run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _weights(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _copy(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


@pytest.mark.parametrize("build,x_shape", [(conv_bn_relu_chain, (2, 3, 12, 12)), (gemm_chain, (5, 10))])
def test_equalized_model_is_equivalent_and_equalized_in_place(build, x_shape):
    rng = np.random.default_rng(0)
    model = build(rng)
    original = _copy(model)
    x = rng.standard_normal(x_shape).astype(np.float32)
    equalized = equalize_model(model, high_bias_fold=False)
    assert equalized is model  # AIMET's equalize_model changes the caller's model; ours also returns it
    onnx.checker.check_model(model)
    assert "BatchNormalization" not in [n.op_type for n in model.graph.node]
    assert model.SerializeToString() != original.SerializeToString()
    np.testing.assert_allclose(_run(model, x), _run(original, x), rtol=1e-4, atol=1e-4)


def test_ranges_are_equalized_across_each_pair():
    rng = np.random.default_rng(1)
    equalized = equalize_model(gemm_chain(rng), high_bias_fold=False, passes=1)
    w = _weights(equalized)
    r0 = np.abs(w["w1"]).max(axis=1)  # fc1 output channels (transB)
    r1 = np.abs(w["w2"]).max(axis=1)  # fc2 input channels (B[K, N])
    np.testing.assert_allclose(r0, r1, rtol=1e-5)


def test_high_bias_absorption_by_hand_and_exact_without_padding():
    rng = np.random.default_rng(2)
    model = gemm_chain(rng)
    # inputs small enough that the BatchNormalization output stays near beta, as its statistics say
    x = 1e-3 * rng.standard_normal((5, 10)).astype(np.float32)
    # a BatchNormalization after fc1 whose beta is far above 3 |gamma|: most of it moves to fc2
    model.graph.initializer.extend([numpy_helper.from_array(np.full(16, 0.1, np.float32), "g"),
                                    numpy_helper.from_array(np.full(16, 5.0, np.float32), "b"),
                                    numpy_helper.from_array(np.zeros(16, np.float32), "m"),
                                    numpy_helper.from_array(np.ones(16, np.float32), "v")])
    fc1 = model.graph.node[0]
    fc1.output[0] = "pre"
    model.graph.node.insert(1, helper.make_node("BatchNormalization", ["pre", "g", "b", "m", "v"], ["h"], name="bn",
                                                epsilon=0.0))
    equalized = equalize_model(_copy(model), passes=1)
    np.testing.assert_allclose(_run(equalized, x), _run(model, x), rtol=1e-4, atol=1e-3)
    without = equalize_model(_copy(model), passes=1, high_bias_fold=False)
    w, w_plain = _weights(equalized), _weights(without)
    # fc1's bias lost max(0, beta - 3 gamma) = 4.7 (scaled like the channel), fc2's bias gained W2 c
    moved = w_plain["b1"] - w["b1"]
    assert np.all(moved > 0)
    np.testing.assert_allclose(w["b2"] - w_plain["b2"], (0.5 / 2.0) * (w_plain["w2"].T @ moved), rtol=1e-4)


def test_relu6_becomes_relu_only_when_asked_and_branches_are_left_alone():
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w3"),
             numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"], name="relu6"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
             helper.make_node("Conv", ["c2", "w3"], ["y"], name="conv3"),
             helper.make_node("Relu", ["c2"], ["side"], name="side")]  # c2 has two readers: no pair (conv2, conv3)
    model = _model(nodes, inits, [1, 3, 4, 4])
    model.graph.output.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, None))
    assert find_equalization_pairs(model) == [("conv1", "relu6", "conv2")]
    as_aimet = equalize_model(_copy(model), clip_pairs="relu")
    ops = [n.op_type for n in as_aimet.graph.node]
    assert "Clip" not in ops and "Min" not in ops and ops.count("Relu") == 2
    skipped = equalize_model(_copy(model), clip_pairs="skip")
    assert [n.op_type for n in skipped.graph.node].count("Clip") == 1
    rescaled = equalize_model(_copy(model))
    ops = [n.op_type for n in rescaled.graph.node]
    assert "Clip" not in ops and ops.count("Min") == 1 and ops.count("Relu") == 2


def test_cle_lowers_per_tensor_weight_quantization_error():
    rng = np.random.default_rng(4)
    model = gemm_chain(rng)
    x = rng.standard_normal((64, 10)).astype(np.float32)

    def quantized_error(m):
        q = onnx.ModelProto()
        q.CopyFrom(m)
        for t in q.graph.initializer:
            w = numpy_helper.to_array(t)
            if w.ndim == 2:
                scale = np.abs(w).max() / 7  # int4 symmetric per tensor
                t.CopyFrom(numpy_helper.from_array((np.clip(np.rint(w / scale), -8, 7) * scale).astype(np.float32),
                                                   t.name))
        return float(np.mean((_run(q, x) - _run(m, x)) ** 2))

    assert quantized_error(equalize_model(_copy(model))) < 0.5 * quantized_error(model)
