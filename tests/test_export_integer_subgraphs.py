"""Integer and QDQ exports of If / Loop nodes: their bodies run in float, as in the sim, and read the exported graph's
float value of every enclosing-scope tensor they use (which the export may have turned into integer codes).

Found on torchvision's SSDLite (TorchScript export): an If whose int64 outputs come from a ReduceMax of an
outer box tensor was copied unchanged, so its body named a tensor the integer graph no longer had, and
``onnx.checker`` failed; an If or Loop with float outputs was refused outright.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel
from quantsim.graph.index import rename_outer_references, subgraph_references

RNG = np.random.default_rng(11)
PROVIDERS = ["CPUExecutionProvider"]


def _model(nodes, outputs, inits):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _weight():
    return numpy_helper.from_array(RNG.normal(size=(3, 4)).astype(np.float32), "w")


def _branch(name, node, out, elem_type, shape):
    return helper.make_graph([node], name, [], [helper.make_tensor_value_info(out, elem_type, shape)])


def _condition_nodes():
    return [helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["cond"])]


def _zero():
    return numpy_helper.from_array(np.array(0.0, np.float32), "zero")


def _if_with_index_output():
    """Both branches read the quantized ``h`` and give int64 (like SSDLite's box-offset If); ``h`` itself is
    also an output, so the export keeps it as QLinearMatMul codes."""
    then_graph = _branch("then", helper.make_node("ArgMax", ["h"], ["i1"], axis=1), "i1", TensorProto.INT64, [1, 1])
    else_graph = _branch("else", helper.make_node("ArgMin", ["h"], ["i2"], axis=1), "i2", TensorProto.INT64, [1, 1])
    nodes = [*_condition_nodes(), helper.make_node("If", ["cond"], ["index"], then_branch=then_graph,
                                                   else_branch=else_graph)]
    outputs = [helper.make_tensor_value_info("index", TensorProto.INT64, [1, 1]),
               helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 4])]
    return _model(nodes, outputs, [_weight(), _zero()])


def _if_with_float_output():
    then_graph = _branch("then", helper.make_node("Relu", ["h"], ["b1"]), "b1", TensorProto.FLOAT, [1, 4])
    else_graph = _branch("else", helper.make_node("Neg", ["h"], ["b2"]), "b2", TensorProto.FLOAT, [1, 4])
    nodes = [*_condition_nodes(), helper.make_node("If", ["cond"], ["y"], then_branch=then_graph,
                                                   else_branch=else_graph)]
    return _model(nodes, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [_weight(), _zero()])


def _loop_reading_outer_tensor():
    """A Loop adding the outer ``h`` to its carried value three times, then a Relu on the result."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "h"], ["acc_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Loop", ["trips", "", "start"], ["acc"], body=body),
             helper.make_node("Relu", ["acc"], ["y"])]
    inits = [_weight(), numpy_helper.from_array(np.array(3, np.int64), "trips"),
             numpy_helper.from_array(np.zeros((1, 4), np.float32), "start")]
    return _model(nodes, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)


def _exported(model):
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings([{"x": RNG.normal(size=(1, 3)).astype(np.float32)} for _ in range(8)])
    export = sim.export_integer(weight_codes="uint8")
    onnx.checker.check_model(export.model)
    return sim, export, ort.InferenceSession(export.model.SerializeToString(), providers=PROVIDERS)


def _assert_equal_to_sim(sim, session):
    for _ in range(16):
        feed = {"x": RNG.normal(size=(1, 3)).astype(np.float32)}
        for got, want in zip(session.run(None, feed), sim.session.run(None, feed)):
            np.testing.assert_array_equal(got, want)


def test_if_with_index_outputs_reads_the_dequantized_outer_tensor():
    sim, export, session = _exported(_if_with_index_output())
    assert "QLinearMatMul" in {n.op_type for n in export.model.graph.node}  # h is integer codes there
    _assert_equal_to_sim(sim, session)


def test_if_with_float_outputs_runs_in_float_and_gets_its_quantizer():
    sim, export, session = _exported(_if_with_float_output())
    assert [e.op_type for e in export.report if e.op_type == "If"] == ["If"]
    assert "body runs in float" in next(e.reason for e in export.report if e.op_type == "If")
    _assert_equal_to_sim(sim, session)


def test_loop_body_reads_the_dequantized_outer_tensor():
    sim, export, session = _exported(_loop_reading_outer_tensor())
    assert any(e.op_type == "Loop" for e in export.report)
    _assert_equal_to_sim(sim, session)


def test_rename_outer_references_leaves_names_a_subgraph_defines():
    inner = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "inner", [],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1])])
    middle = helper.make_graph(
        [helper.make_node("Neg", ["a"], ["b"]),  # defines b: the nested Add's b is this one, a is outer
         helper.make_node("If", ["flag"], ["d"], then_branch=inner, else_branch=inner)],
        "middle", [], [helper.make_tensor_value_info("d", TensorProto.FLOAT, [1]),
                       helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])])
    node = helper.make_node("If", ["flag"], ["d_out", "a_out"], then_branch=middle, else_branch=middle)
    assert subgraph_references(node) == {"a", "flag"}
    rename_outer_references(node, {"a": "a2", "b": "b2", "flag": "flag2"})
    assert subgraph_references(node) == {"a2", "flag2"}
    then = node.attribute[0].g
    assert list(then.node[0].input) == ["a2"] and [o.name for o in then.output] == ["d", "a2"]
    nested = then.node[1].attribute[0].g.node[0]
    assert list(nested.input) == ["a2", "b"]


def _if_reading_moved_tensor():
    """``h`` -> Transpose (data movement: the QDQ export gives its output a derived Q/DQ pair) read only by the
    branches of an If (Faster R-CNN's RPN: a Gather read by an If's body)."""
    then_graph = _branch("then", helper.make_node("Relu", ["t"], ["b1"]), "b1", TensorProto.FLOAT, [4, 1])
    else_graph = _branch("else", helper.make_node("Neg", ["t"], ["b2"]), "b2", TensorProto.FLOAT, [4, 1])
    nodes = [*_condition_nodes(), helper.make_node("Transpose", ["h"], ["t"], perm=[1, 0]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph)]
    return _model(nodes, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1])], [_weight(), _zero()])


def test_qdq_export_keeps_what_only_a_subgraph_reads():
    """The QDQ export dropped the derived Q/DQ pair of a tensor read only inside an If body as dead (its reads
    were counted from node inputs alone): onnxruntime refused the model (the body named a missing tensor)."""
    model = _if_reading_moved_tensor()
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings([{"x": RNG.normal(size=(1, 3)).astype(np.float32)} for _ in range(8)])
    exported = sim.to_onnx_qdq(weight_codes="uint8", int32_bias=False)
    assert not exported.graph.value_info  # preparation's shapes stay out of the export (onnxruntime re-infers)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(exported.SerializeToString(), options, providers=PROVIDERS)
    for _ in range(8):
        feed = {"x": RNG.normal(size=(1, 3)).astype(np.float32)}
        np.testing.assert_array_equal(session.run(None, feed)[0], sim.session.run(None, feed)[0])
