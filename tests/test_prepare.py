"""Tests for quantsim.prepare: every pass keeps outputs equal (through onnxruntime), the caller's model is
never mutated, and bad models fail with errors that name what is wrong."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper, parser

from quantsim.graph import edit, large_models
from quantsim.prepare import PrepareError, PrepareWarning, default_passes, prepare
from quantsim.prepare import passes as qp
from quantsim.prepare.batchnorm import find_batchnorm_folds
from quantsim.prepare.opset import runtime_limits

RNG = np.random.default_rng(0)
ALL_PASSES = [qp.check_graph, qp.upgrade_opset, qp.name_nodes, qp.constants_to_initializers, qp.infer_shapes,
              qp.fold_batchnorm, qp.fold_constants, qp.optimize_with_ort]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTSIM_CACHE_DIR", str(tmp_path / "cache"))


# helpers ----------------------------------------------------------------------------------------
def f32(*shape, low=None):
    if low is not None:
        return RNG.uniform(low, 2.0, size=shape).astype(np.float32)
    return RNG.normal(size=shape).astype(np.float32)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def model_of(nodes, inputs, outputs, inits=(), opset=17, ir=8):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, 1, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, 1, None) for n in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


def run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def feeds_for(model):
    feeds = {}
    for value in model.graph.input:
        if value.name in {t.name for t in model.graph.initializer}:
            continue
        shape = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = f32(*shape)
    return feeds


def assert_same(original, prepared, feeds=None, rtol=1e-5):
    """Outputs equal within ``rtol`` of each output's largest magnitude."""
    feeds = feeds or feeds_for(original)
    wanted, got_all = run(original, feeds), run(prepared, feeds)
    assert len(got_all) == len(wanted)
    for want, got in zip(wanted, got_all):
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= rtol * max(np.abs(want).max(), 1e-30)


def checked_prepare(model, **kwargs):
    """``prepare`` that also proves the caller's model was not touched and the outputs are unchanged."""
    before = model.SerializeToString()
    prepared = prepare(model, cache=False, **kwargs)
    assert model.SerializeToString() == before
    assert_same(model, prepared)
    onnx.checker.check_model(prepared)
    return prepared


def ops(model):
    return [n.op_type for n in model.graph.node]


def bn_nodes(channels, source, output, prefix="bn", epsilon=1e-3):
    inits = [init(f"{prefix}_scale", f32(channels)), init(f"{prefix}_b", f32(channels)),
             init(f"{prefix}_mean", f32(channels)), init(f"{prefix}_var", f32(channels, low=0.5))]
    node = helper.make_node("BatchNormalization", [source] + [t.name for t in inits], [output],
                            name=f"{prefix}", epsilon=epsilon)
    return node, inits


def conv_bn_model(op="Conv", group=1, cin=4, cout=6, bias=True):
    shape = (cout, cin // group, 3, 3) if op == "Conv" else (cin, cout // group, 3, 3)
    inits = [init("w", f32(*shape))] + ([init("b", f32(cout))] if bias else [])
    conv = helper.make_node(op, ["x", "w"] + (["b"] if bias else []), ["y"], name="conv", group=group,
                            pads=[1, 1, 1, 1])
    bn, bn_inits = bn_nodes(cout, "y", "z")
    relu = helper.make_node("Relu", ["z"], ["out"], name="relu")
    return model_of([conv, bn, relu], [("x", [2, cin, 5, 5])], ["out"], inits + bn_inits)


# batchnorm folding ------------------------------------------------------------------------------
@pytest.mark.parametrize("op,group,cin,cout,bias", [
    ("Conv", 1, 4, 6, True), ("Conv", 1, 4, 6, False), ("Conv", 6, 6, 6, True),  # depthwise
    ("Conv", 2, 4, 6, False), ("ConvTranspose", 1, 4, 6, True), ("ConvTranspose", 2, 4, 6, False),
    ("ConvTranspose", 4, 4, 4, True),
])
def test_conv_batchnorm_is_folded(op, group, cin, cout, bias):
    prepared = checked_prepare(conv_bn_model(op, group, cin, cout, bias))
    assert ops(prepared) == [op, "Relu"]
    assert len(prepared.graph.node[0].input) == 3
    assert prepared.graph.node[0].output[0] == "z"
    assert not {"bn_scale", "bn_b", "bn_mean", "bn_var"} & {t.name for t in prepared.graph.initializer}


@pytest.mark.parametrize("trans_b,with_c", [(0, True), (1, True), (1, False), (0, False)])
def test_gemm_batchnorm_is_folded(trans_b, with_c):
    weight = f32(6, 8) if trans_b else f32(8, 6)
    inits = [init("w", weight)] + ([init("c", f32(6))] if with_c else [])
    gemm = helper.make_node("Gemm", ["x", "w"] + (["c"] if with_c else []), ["y"], transB=trans_b, alpha=0.7,
                            beta=1.3)
    bn, bn_inits = bn_nodes(6, "y", "out")
    prepared = checked_prepare(model_of([gemm, bn], [("x", [3, 8])], ["out"], inits + bn_inits))
    assert ops(prepared) == ["Gemm"]


def test_model_without_default_domain_gets_the_quantizers_domain_imported():
    """A model of ai.onnx.ml ops only (sklearn-onnx style) imports no default domain: preparation imports it
    (nothing to convert) so the sim's QuantizeLinear/DequantizeLinear have a domain, instead of failing to
    convert "from opset 0"."""
    import quantsim

    node = helper.make_node("Binarizer", ["x"], ["y"], name="binarize", domain="ai.onnx.ml", threshold=0.25)
    graph = helper.make_graph([node], "ml_only", [helper.make_tensor_value_info("x", 1, [2, 3])],
                              [helper.make_tensor_value_info("y", 1, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)], ir_version=8)
    prepared = checked_prepare(model)
    assert {(o.domain, o.version) for o in prepared.opset_import} == {("ai.onnx.ml", 1), ("", 13)}
    sim = quantsim.QuantizationSimModel(model, progress=False)
    feed = {"x": f32(2, 3)}
    sim.compute_encodings([feed])
    (got,) = sim.session.run(None, feed)
    assert set(np.unique(got)) <= {0.0, 1.0}


def test_batchnorm_parameters_from_constant_subgraphs_fold_without_warning():
    """Exporters without constant folding (e.g. the onnx package's Caffe2 model tests) compute a BatchNorm's
    parameters with ConstantOfShape: constants are folded first, so the BatchNorm folds and nothing warns."""
    model = conv_bn_model()
    nodes = list(model.graph.node)
    for index, name in enumerate(("bn_scale", "bn_mean")):
        value = 1.5 if name == "bn_scale" else 0.25
        model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == name))
        model.graph.initializer.append(init(f"{name}_shape", np.array([6], np.int64)))
        nodes.insert(index, helper.make_node("ConstantOfShape", [f"{name}_shape"], [name], name=f"make_{name}",
                                             value=numpy_helper.from_array(np.array([value], np.float32))))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrepareWarning)
        prepared = checked_prepare(model)
    assert ops(prepared) == ["Conv", "Relu"]


def test_batchnorm_fold_refused_on_shared_weight():
    conv1 = helper.make_node("Conv", ["x", "w"], ["y1"], name="conv1", pads=[1, 1, 1, 1])
    conv2 = helper.make_node("Conv", ["x", "w"], ["y2"], name="conv2", pads=[1, 1, 1, 1])
    bn1, inits1 = bn_nodes(4, "y1", "z1", "bn1")
    bn2, inits2 = bn_nodes(4, "y2", "z2", "bn2")
    model = model_of([conv1, conv2, bn1, bn2], [("x", [1, 4, 5, 5])], ["z1", "z2"],
                     [init("w", f32(4, 4, 3, 3))] + inits1 + inits2)
    decisions = find_batchnorm_folds(model)
    assert len(decisions) == 2 and all("shared" in d.reason and "conv" in d.reason for d in decisions)
    with pytest.warns(PrepareWarning, match="not folded.*shared"):
        prepared = checked_prepare(model)
    assert ops(prepared).count("BatchNormalization") == 2


def test_batchnorm_fold_refused_when_layer_output_has_other_consumers():
    model = conv_bn_model()
    model.graph.node.append(helper.make_node("Sigmoid", ["y"], ["side"], name="side"))
    model.graph.output.append(helper.make_tensor_value_info("side", 1, None))
    with pytest.warns(PrepareWarning, match='also feeds "side"'):
        prepared = checked_prepare(model)
    assert "BatchNormalization" in ops(prepared)
    assert find_batchnorm_folds(conv_bn_model())[0].reason is None


def test_overridable_initializers_are_not_folded_but_ir3_initializers_are():
    model = conv_bn_model()
    model.graph.input.append(helper.make_tensor_value_info("w", 1, [6, 4, 3, 3]))  # IR >= 4: an overridable input
    with pytest.warns(PrepareWarning, match='weight "w" of the layer is not a constant initializer'):
        assert "BatchNormalization" in ops(checked_prepare(model))
    old = conv_bn_model()
    old.ir_version, old.opset_import[0].version = 3, 7  # IR 3 lists every initializer as a graph input
    old.graph.input.extend(helper.make_tensor_value_info(t.name, 1, list(t.dims)) for t in old.graph.initializer)
    prepared = checked_prepare(old)
    assert ops(prepared) == ["Conv", "Relu"] and [i.name for i in prepared.graph.input] == ["x"]


# constants, opset, constant folding ---------------------------------------------------------------
def test_paddle_style_constant_weights_become_initializers_and_fold():
    const = lambda name, array: helper.make_node("Constant", [], [name], value=init(name, array))  # noqa: E731
    nodes = [const("w", f32(6, 4, 3, 3)), const("b", f32(6)), const("s", f32(6)), const("bb", f32(6)),
             const("m", f32(6)), const("v", f32(6, low=0.5)),
             helper.make_node("Constant", [], ["k"], value_float=0.5),
             helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["y", "s", "bb", "m", "v"], ["z"]),
             helper.make_node("Mul", ["z", "k"], ["out"])]
    prepared = checked_prepare(model_of(nodes, [("x", [1, 4, 5, 5])], ["out"]))
    assert ops(prepared) == ["Conv"]  # the BatchNormalization and then the scalar Mul fold into the Conv
    assert "w" in {t.name for t in prepared.graph.initializer} and prepared.graph.node[0].output[0] == "out"


OPSET11 = """
<ir_version: 6, opset_import: ["" : 11]>
g (float[2,4] x) => (float[2,2] y, float[2] z) {
  a, b = Split<axis=1, split=[2,2]>(x)
  c = Add(a, b)
  y = Relu(c)
  s = ReduceSum<axes=[1], keepdims=0>(c)
  u = Unsqueeze<axes=[0]>(s)
  z = Squeeze<axes=[0]>(u)
}
"""


def test_opset11_model_is_upgraded_to_13():
    prepared = checked_prepare(parser.parse_model(OPSET11))
    assert edit.default_opset(prepared) == 13
    assert "Constant" not in ops(prepared)  # the converter's axes constants became initializers


def test_constant_subgraphs_are_folded():
    model = parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,8] x) => (float[2,6] y, float[3,4] r) {
      s2 = Unsqueeze(scale, one)
      ws = Mul(w_raw, s2)
      wt = Transpose<perm=[1,0]>(ws)
      h = MatMul(x, wt)
      flat = Reshape(h, minus_one)
      shape = Slice(dims, zero, two)
      y = Reshape(flat, shape)
      r = RandomNormal<shape=[3,4], seed=1.0>()
    }
    """)
    ints = lambda *v: np.array(v, np.int64)  # noqa: E731
    model.graph.initializer.extend([init("w_raw", f32(6, 8)), init("scale", f32(6)), init("one", ints(1)),
                                    init("minus_one", ints(-1)), init("dims", ints(2, 6, 7)),
                                    init("zero", ints(0)), init("two", ints(2))])
    before = model.SerializeToString()
    prepared = prepare(model, cache=False)
    assert model.SerializeToString() == before
    assert ops(prepared) == ["MatMul", "Reshape", "Reshape", "RandomNormal"]
    feeds = feeds_for(model)
    got, want = run(prepared, feeds)[0], run(model, feeds)[0]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_constant_folding_skips_huge_outputs_and_graph_outputs():
    model = parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1] x) => (float[1] y, float[2] c) {
      big = ConstantOfShape<value = float[1] {1.0}>(shape)
      red = ReduceMax<keepdims=0>(big)
      y = Add(x, red)
      c = Neg(two)
    }
    """)
    model.graph.initializer.extend([init("shape", np.array([5000, 5000], np.int64)), init("two", f32(2))])
    prepared = prepare(model, cache=False)
    assert ops(prepared) == ["ConstantOfShape", "ReduceMax", "Add", "Neg"]
    small, _ = qp.fold_constants(qp.infer_shapes(_copy(model))[0], max_output_bytes=10**9)
    assert ops(small) == ["Add", "Neg"]


# every pass on its own ----------------------------------------------------------------------------
def rich_model():
    const = helper.make_node("Constant", [], ["k"], value=init("k", f32(6)), name="")
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="dup", pads=[1, 1, 1, 1])
    bn, bn_inits = bn_nodes(6, "y", "z")
    relu = helper.make_node("Relu", ["z"], ["r"])
    k4 = helper.make_node("Reshape", ["k", "kshape"], ["k4"])
    add = helper.make_node("Add", ["r", "k4"], ["out"])
    inits = [init("w", f32(6, 4, 3, 3)), init("kshape", np.array([1, 6, 1, 1], np.int64))] + bn_inits
    # unsorted on purpose: "add" reads k4 before the node producing it
    return model_of([const, conv, bn, relu, add, k4], [("x", [1, 4, 5, 5])], ["out"], inits)


@pytest.mark.parametrize("run_pass", ALL_PASSES, ids=lambda p: p.__name__)
def test_each_pass_keeps_outputs(run_pass):
    model = rich_model()
    work = _copy(model)
    result, modified = run_pass(work)
    assert isinstance(modified, bool)
    assert_same(model, result)


def test_each_default_pass_reports_modified_only_when_it_changed_something():
    model = prepare(rich_model(), cache=False)
    for run_pass in default_passes():
        before = model.SerializeToString()
        model, modified = run_pass(model)
        assert not modified and model.SerializeToString() == before, run_pass.__name__


def test_name_nodes_unique_and_stable():
    model = rich_model()
    model.graph.node[3].name = "dup"  # the Relu repeats the Conv's name
    first, modified = qp.name_nodes(_copy(model))
    second, _ = qp.name_nodes(_copy(model))
    names = [n.name for n in first.graph.node]
    assert modified and all(names) and len(set(names)) == len(names)
    assert names == [n.name for n in second.graph.node]
    assert names[1] == "dup" and names[3] == "/Relu"


def test_optional_ort_optimisation_keeps_outputs():
    prepared = checked_prepare(rich_model(), optimize=True)
    assert "BatchNormalization" not in ops(prepared)
    with pytest.raises(ValueError, match="not both"):
        prepare(rich_model(), passes=[qp.name_nodes], optimize=True)


def test_large_model_paths_use_files(monkeypatch):
    model = conv_bn_model(cin=16, cout=16)
    small = qp.infer_shapes(_copy(model))[0]
    monkeypatch.setattr(large_models, "LARGE_MODEL_BYTES", 1000)  # everything takes the > 2 GiB route
    real, used = onnx.shape_inference.infer_shapes_path, []
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes_path", lambda *a, **k: used.append(a) or real(*a, **k))
    large = qp.infer_shapes(_copy(model))[0]
    assert used and large_models.is_large(large)
    assert [v.SerializeToString() for v in large.graph.value_info] == \
        [v.SerializeToString() for v in small.graph.value_info]
    prepared = checked_prepare(model, optimize=True)
    assert ops(prepared) == ["Conv", "Relu"]
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in prepared.graph.initializer)


# bad input ------------------------------------------------------------------------------------------
def test_cycle_is_reported_with_its_nodes():
    nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="A"), helper.make_node("Relu", ["a"], ["b"], name="B"),
             helper.make_node("Neg", ["b"], ["c"], name="C"), helper.make_node("Relu", ["a"], ["y"], name="D")]
    with pytest.raises(PrepareError, match=r'cycle through nodes .*"A" \(Add\).*"B" \(Relu\).*"C" \(Neg\)'):
        prepare(model_of(nodes, [("x", [2])], ["y"]), cache=False)


def test_dangling_input_is_reported():
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")]
    with pytest.raises(PrepareError, match='"adder" \\(Add\\) reads "ghost".*dangling'):
        prepare(model_of(nodes, [("x", [2])], ["y"]), cache=False)


def test_two_nodes_writing_one_value_are_named():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="first"), helper.make_node("Neg", ["x"], ["y"], name="second")]
    with pytest.raises(PrepareError, match='"y" is written by two nodes: "first" \\(Relu\\) and "second" \\(Neg\\)'):
        prepare(model_of(nodes, [("x", [2])], ["y"]), cache=False)
    duplicate_output = model_of([nodes[0]], [("x", [2])], ["y", "y"])
    with pytest.raises(PrepareError, match='graph output "y" is listed 2 times'):
        prepare(duplicate_output, cache=False)


def test_unsorted_graph_is_sorted():
    nodes = [helper.make_node("Neg", ["a"], ["y"], name="second"), helper.make_node("Relu", ["x"], ["a"], name="first")]
    model = model_of(nodes, [("x", [2])], ["y"])
    result, modified = qp.check_graph(_copy(model))
    assert modified and [n.name for n in result.graph.node] == ["first", "second"]


def test_unsupported_opset_names_onnxruntime_maximum():
    model = model_of([helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], ["y"], opset=30)
    with pytest.raises(PrepareError, match=f"opset 30.*onnxruntime.*at most opset {runtime_limits()[0]}"):
        prepare(model, cache=False)
    model = model_of([helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], ["y"], ir=99)
    with pytest.raises(PrepareError, match="IR version 99"):
        prepare(model, cache=False)


def test_opset_conversion_failure_names_the_opset():
    model = parser.parse_model("""
    <ir_version: 3, opset_import: ["" : 1]>
    g (float[2,4] x) => (float[2,4] y) {
      y = Upsample<scales=[1.0,1.0]>(x)
    }
    """)
    with pytest.raises(PrepareError, match="default-domain opset 1; converting it to opset 13"):
        prepare(model, cache=False)


def test_shapes_that_cannot_be_inferred_warn_and_continue():
    model = model_of([helper.make_node("Add", ["x", "w"], ["y"])], [("x", [2]), ("w", [2])], ["y"])
    model.graph.initializer.append(init("w", np.ones(2, np.int64)))  # conflicts with the float input "w"
    with pytest.warns(PrepareWarning, match="shape inference failed, continuing without inferred shapes"):
        prepared = prepare(model, cache=False)
    assert ops(prepared) == ["Add"]
    custom = model_of([helper.make_node("Foo", ["x"], ["t"], domain="com.example"),
                       helper.make_node("Relu", ["t"], ["y"])], [("x", [2])], ["y"])
    custom.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.warns(PrepareWarning, match='without a type \\(first: "t" from node "/Foo" \\(Foo\\)\\)'):
        prepared = prepare(custom, cache=False)
    assert ops(prepared) == ["Foo", "Relu"]


# surface and size ------------------------------------------------------------------------------------
def test_public_surface_and_line_budget():
    package = sys.modules["quantsim.prepare"]  # the attribute quantsim.prepare is the function
    for module in (package, qp, edit, large_models):
        for name in module.__all__:
            assert hasattr(module, name), name
    for path in Path(package.__file__).parent.glob("*.py"):
        assert len(path.read_text().splitlines()) < 400, path.name


def _copy(model):
    work = onnx.ModelProto()
    work.CopyFrom(model)
    return work



def _hard_activation_chain(opset: int, divide: bool = True) -> onnx.ModelProto:
    """Paddle's HardSwish: x * clip(x + 3, 0, 6) / 6, plus a HardSigmoid gate clip(y + 3, 0, 6) * (1/6)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Add", ["x", "three"], ["x3"]),
        helper.make_node("Clip", ["x3", "zero", "six"], ["r6"]),
        helper.make_node("Mul", ["x", "r6"], ["xr6"]),
        helper.make_node("Div" if divide else "Mul", ["xr6", "six" if divide else "sixth"], ["hswish"]),
        helper.make_node("Add", ["hswish", "three"], ["h3"]),
        helper.make_node("Clip", ["h3", "zero", "six"], ["g6"]),
        helper.make_node("Mul", ["g6", "sixth"], ["gate"]),
        helper.make_node("Mul", ["hswish", "gate"], ["y"]),
    ]
    consts = {"three": 3.0, "zero": 0.0, "six": 6.0, "sixth": 1.0 / 6.0}
    graph = helper.make_graph(
        nodes, "hard", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 5, 5])],
        [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("opset, divide", [(13, True), (14, True), (17, False)])
def test_fuse_activations_replaces_hard_chains_and_keeps_outputs(opset, divide):
    import importlib

    import onnxruntime as ort

    fuse = importlib.import_module("quantsim.prepare.activations").fuse_activations
    model = _hard_activation_chain(opset, divide)
    work = onnx.ModelProto()
    work.CopyFrom(model)
    fused, modified = fuse(work)
    assert modified
    ops = [n.op_type for n in fused.graph.node]
    assert "Clip" not in ops and "Div" not in ops and ops.count("HardSigmoid") >= 1
    assert ("HardSwish" in ops) == (opset >= 14)
    x = np.linspace(-8, 8, 200, dtype=np.float32).repeat(1).tolist()
    feed = {"x": np.resize(np.array(x, np.float32), (2, 4, 5, 5))}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feed)[0]
    got = ort.InferenceSession(fused.SerializeToString()).run(None, feed)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_fuse_activations_turns_max_of_scaled_input_into_leaky_relu():
    """``Max(x, 0.2 x)`` (either operand order) -> LeakyRelu(0.2), same outputs; a slope >= 1, a tensor
    slope or a product used elsewhere stays as it is."""
    import importlib

    fuse = importlib.import_module("quantsim.prepare.activations").fuse_activations
    nodes = [helper.make_node("Mul", ["x", "a"], ["ax"], name="scale"),
             helper.make_node("Max", ["ax", "x"], ["y"], name="max"),
             helper.make_node("Mul", ["x", "big"], ["bx"]), helper.make_node("Max", ["x", "bx"], ["z"]),
             helper.make_node("Mul", ["x", "a"], ["kept"]), helper.make_node("Max", ["x", "kept"], ["w"])]
    graph = helper.make_graph(nodes, "leaky", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2, 4])
                               for n in ("y", "z", "w", "kept")],
                              [numpy_helper.from_array(np.float32(0.2), "a"),
                               numpy_helper.from_array(np.float32(1.5), "big")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    work = onnx.ModelProto()
    work.CopyFrom(model)
    fused, modified = fuse(work)
    assert modified
    leaky = [n for n in fused.graph.node if n.op_type == "LeakyRelu"]
    assert [(n.output[0], n.name, n.attribute[0].f) for n in leaky] == [("y", "max", pytest.approx(0.2))]
    assert [n.op_type for n in fused.graph.node].count("Max") == 2  # slope 1.5 and the shared product stay
    feed = {"x": np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)}
    for got, want in zip(ort.InferenceSession(fused.SerializeToString()).run(None, feed),
                         ort.InferenceSession(model.SerializeToString()).run(None, feed)):
        np.testing.assert_array_equal(got, want)


# per-channel affine (Mul / Add by a constant) folding ----------------------------------------------
def _affine_model(layer="Conv", mul_shape=(), add_shape=(), swap=False, cout=6):
    """layer -> Mul(k) -> Add(c) -> Relu; an empty shape tuple is a scalar, None leaves that op out."""
    if layer == "Gemm":
        inits, node = [init("w", f32(cout, 8)), init("b", f32(cout))], helper.make_node(
            "Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=0.5, beta=2.0)
        inputs = [("x", [3, 8])]
    else:
        shape = (cout, 4, 3, 3) if layer == "Conv" else (4, cout // 2, 3, 3)
        inits = [init("w", f32(*shape))]
        node = helper.make_node(layer, ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=1 if layer == "Conv" else 2)
        inputs = [("x", [2, 4, 5, 5])]
    nodes, last = [node], "y"
    for op, shape in (("Mul", mul_shape), ("Add", add_shape)):
        if shape is None:
            continue
        inits.append(init(f"k_{op}", f32(*shape) if shape else np.float32(RNG.normal()).reshape(())))
        operands = [f"k_{op}", last] if swap else [last, f"k_{op}"]
        nodes.append(helper.make_node(op, operands, [f"{op}_out"], name=op.lower()))
        last = f"{op}_out"
    nodes.append(helper.make_node("Relu", [last], ["out"], name="relu"))
    return model_of(nodes, inputs, ["out"], inits)


@pytest.mark.parametrize("layer,mul_shape,add_shape,swap", [
    ("Conv", (), (), False), ("Conv", (1,), (6, 1, 1), True), ("Conv", (1, 6, 1, 1), None, False),
    ("Conv", None, (1, 6, 1, 1), True), ("ConvTranspose", (6, 1, 1), (), False),
    ("Gemm", (6,), (1, 6), True), ("Gemm", (), None, False),
])
def test_per_channel_mul_add_fold_into_layer(layer, mul_shape, add_shape, swap):
    prepared = checked_prepare(_affine_model(layer, mul_shape, add_shape, swap))
    assert ops(prepared) == [layer, "Relu"]
    assert not {"k_Mul", "k_Add"} & {t.name for t in prepared.graph.initializer}


def test_mul_without_shift_adds_no_bias_and_add_keeps_the_weight():
    prepared = checked_prepare(_affine_model(mul_shape=(), add_shape=None))
    assert len(prepared.graph.node[0].input) == 2  # no zero bias invented
    model = _affine_model(mul_shape=None, add_shape=(6, 1, 1))
    prepared = checked_prepare(model)
    assert numpy_helper.to_array(prepared.graph.initializer[0]).tobytes() == \
        numpy_helper.to_array(model.graph.initializer[0]).tobytes()


@pytest.mark.parametrize("edit", ["spatial", "rank", "input", "shared_output", "both_operands"])
def test_affine_fold_refusals_leave_the_graph_as_is(edit):
    model = _affine_model(mul_shape=(), add_shape=None)
    mul = model.graph.node[1]
    k = next(t for t in model.graph.initializer if t.name == "k_Mul")
    if edit == "spatial":  # varies over H and W: not a per-channel scale
        k.CopyFrom(init("k_Mul", f32(1, 1, 5, 5)))
    elif edit == "rank":  # would broadcast the output to rank 5
        k.CopyFrom(init("k_Mul", f32(1, 1, 1, 1, 1)))
    elif edit == "input":  # an overridable graph input, not a constant
        model.graph.input.append(helper.make_tensor_value_info("k_Mul", 1, []))
    elif edit == "shared_output":
        model.graph.node.append(helper.make_node("Sigmoid", ["y"], ["side"], name="side"))
        model.graph.output.append(helper.make_tensor_value_info("side", 1, None))
    elif edit == "both_operands":
        mul.input[1] = "y"
    prepared = checked_prepare(model)
    assert "Mul" in ops(prepared)
