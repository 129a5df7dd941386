"""`quantsim.batch_norm_fold.fold_all_batch_norms_to_weight`: AIMET's pairs and names, in place, the float
model unchanged (onnxruntime before/after), the refusals, and aimet-onnx itself behind a skip."""
from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantsim import InvalidTypeError
from quantsim.batch_norm_fold import BNLayer, fold_all_batch_norms_to_weight
from tests.bn_models import AIMET_FOLDS, MODELS, bn_conv, conv_bn_relu, input_feed


def _run(model: onnx.ModelProto, feed) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


@pytest.mark.parametrize("name", sorted(AIMET_FOLDS))
def test_fold_gives_aimets_pairs_and_nodes_and_keeps_the_outputs(name):
    model = MODELS[name]()
    before = copy.deepcopy(model)
    after_pairs, before_pairs = fold_all_batch_norms_to_weight(model)
    want_after, want_before, want_nodes = AIMET_FOLDS[name]
    assert [(layer.name, bn.bn_layer.name) for layer, bn in after_pairs] == want_after
    assert [(layer.name, bn.bn_layer.name) for layer, bn in before_pairs] == want_before
    assert [(n.op_type, n.name) for n in model.graph.node] == want_nodes
    feed = input_feed(before)
    np.testing.assert_allclose(_run(model, feed), _run(before, feed), rtol=1e-5, atol=2e-5)
    for layer, bn in after_pairs + before_pairs:  # the returned node is the one in the caller's graph
        assert any(node is layer for node in model.graph.node)
        assert bn.gamma.shape == bn.beta.shape and bn.bn_layer.op_type == "BatchNormalization"


def test_the_layer_keeps_its_output_name_and_bn_parameters_are_returned():
    model = conv_bn_relu()
    gamma = onnx.numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "bn.scale")).copy()
    [(conv, bn)], _ = fold_all_batch_norms_to_weight(model)
    assert isinstance(bn, BNLayer) and bn.bn_layer.op_type == "BatchNormalization"
    np.testing.assert_array_equal(bn.gamma, gamma)
    assert conv.output[0] == "conv_out" and model.graph.node[1].input[0] == "conv_out"  # AIMET's name survives
    assert not {"bn.scale", "bn.B", "bn.mean", "bn.var"} & {t.name for t in model.graph.initializer}


def test_a_wrapper_holding_the_model_is_folded_in_place():
    class Wrapper:  # onnxruntime's / AIMET's ONNXModel keep the ModelProto as .model
        def __init__(self, model):
            self.model = model

    wrapped = Wrapper(conv_bn_relu())
    assert len(fold_all_batch_norms_to_weight(wrapped)[0]) == 1
    assert [n.op_type for n in wrapped.model.graph.node] == ["Conv", "Relu"]
    with pytest.raises(InvalidTypeError, match="ModelProto"):
        fold_all_batch_norms_to_weight("model.onnx")


def test_bn_before_a_padded_conv_is_not_folded_but_rewritten_to_mean_0_var_1():
    model = bn_conv(pads=1)
    before = copy.deepcopy(model)
    assert fold_all_batch_norms_to_weight(model) == ([], [])
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    values = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(values[bn.input[3]], 0.0)
    np.testing.assert_array_equal(values[bn.input[4]], 1.0)
    assert next(a.f for a in bn.attribute if a.name == "epsilon") == 0.0
    old = {t.name: onnx.numpy_helper.to_array(t) for t in before.graph.initializer}
    np.testing.assert_allclose(values[bn.input[1]], old["bn.scale"] / np.sqrt(old["bn.var"] + 1e-5), rtol=1e-6)
    feed = input_feed(before)
    np.testing.assert_allclose(_run(model, feed), _run(before, feed), rtol=1e-5, atol=2e-5)


def test_a_layer_output_read_by_another_node_too_is_not_folded():
    model = conv_bn_relu()
    model.graph.node.append(onnx.helper.make_node("Relu", ["conv_out"], ["w"], name="relu3"))
    model.graph.output.append(onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, None))
    before = copy.deepcopy(model)
    assert fold_all_batch_norms_to_weight(model) == ([], [])
    assert [n.op_type for n in model.graph.node] == ["Conv", "BatchNormalization", "Relu", "Relu"]
    feed = input_feed(before)
    np.testing.assert_allclose(_run(model, feed), _run(before, feed), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("name", sorted(AIMET_FOLDS))
def test_same_weights_as_aimet_onnx(name):
    aimet_fold = pytest.importorskip("aimet_onnx.batch_norm_fold")
    ours, theirs = MODELS[name](), MODELS[name]()
    fold_all_batch_norms_to_weight(ours)
    aimet_fold.fold_all_batch_norms_to_weight(theirs)
    assert [(n.op_type, n.name, list(n.input), list(n.output)) for n in ours.graph.node] == \
        [(n.op_type, n.name, list(n.input), list(n.output)) for n in theirs.graph.node]
    mine = {t.name: onnx.numpy_helper.to_array(t) for t in ours.graph.initializer}
    aimet = {t.name: onnx.numpy_helper.to_array(t) for t in theirs.graph.initializer}
    assert mine.keys() == aimet.keys()
    for key in mine:
        np.testing.assert_allclose(mine[key], aimet[key].reshape(mine[key].shape), rtol=1e-5, atol=1e-6, err_msg=key)
    ours_pairs, theirs_pairs = fold_all_batch_norms_to_weight(MODELS[name]()), aimet_fold.fold_all_batch_norms_to_weight(
        MODELS[name]())
    for mine_list, aimet_list in zip(ours_pairs, theirs_pairs):
        for (_, a), (_, b) in zip(mine_list, aimet_list, strict=True):
            np.testing.assert_allclose(a.gamma, b.gamma, rtol=1e-6)
            np.testing.assert_allclose(a.beta, b.beta, rtol=1e-6)


@pytest.mark.parametrize("shape", [[2, 6, 6], [1, 6, 3, 6]])
def test_bn_before_a_matmul_on_a_higher_rank_input_is_not_folded(shape):
    """BatchNormalization scales axis 1; a MatMul on a rank > 2 input contracts the last axis. With those two
    the same size the fold's shape checks passed: the MatMul became a Gemm on a rank-3/4 input (a model
    onnxruntime refuses), with the per-channel scale applied along the wrong axis."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    params = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
        ("g", rng.uniform(0.5, 2, 6)), ("b", rng.normal(size=6)), ("m", rng.normal(size=6)),
        ("v", rng.uniform(0.5, 2, 6)), ("w", rng.normal(size=(6, 5))))]
    graph = helper.make_graph(
        [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["t"], name="bn"),
         helper.make_node("MatMul", ["t", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], params)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                                ir_version=8))
    before = copy.deepcopy(model)
    assert fold_all_batch_norms_to_weight(model) == ([], [])
    assert [n.op_type for n in model.graph.node] == ["BatchNormalization", "MatMul"]
    feed = {"x": rng.normal(size=shape).astype(np.float32)}
    np.testing.assert_allclose(_run(model, feed), _run(before, feed), rtol=1e-5, atol=2e-5)
