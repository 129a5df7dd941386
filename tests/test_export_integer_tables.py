"""The integer export's lookup tables and kernel probes: all computed by a few merged onnxruntime sessions
(`quantsim.export.integer.code_graphs`, `prefetch`), each table equal to its activation on every code.

Oracle: the real function in float64 numpy on each code's real value, quantized with ties to even. onnxruntime
evaluates tanh, erf, exp, ... with its own float32 approximations, so where the exact real value lies within
a hair of a rounding midpoint the table may sit on the other side: the tables must equal the oracle on every
code except those, and be within one code there.
"""
from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from scipy.special import erf

import quantsim
from quantsim.export.integer import code_graphs
from quantsim.export.integer.code_graphs import CODES, CodeGraphs
from quantsim.export.integer.export import export_integer
from quantsim.graph.session import make_session

FUNCTIONS = {  # op -> (attributes, float64 oracle)
    "Tanh": ({}, np.tanh),
    "Exp": ({}, np.exp),
    "Erf": ({}, erf),
    "Softplus": ({}, lambda x: np.log1p(np.exp(x))),
    "Elu": ({"alpha": 0.7}, lambda x: np.where(x > 0, x, 0.7 * np.expm1(x))),
    "Sin": ({}, np.sin),
    "Softsign": ({}, lambda x: x / (1 + np.abs(x))),
}


def _activation_model() -> onnx.ModelProto:
    """``x`` through a Conv, then each table activation of `FUNCTIONS` and HardSwish (a kernel chain, whose
    probe also runs merged), every output its own graph output."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1])]
    outputs = []
    for op, (attrs, _) in [*FUNCTIONS.items(), ("HardSwish", ({}, None))]:
        nodes.append(helper.make_node(op, ["c"], [op.lower()], name=f"{op.lower()}_node", **attrs))
        outputs.append(helper.make_tensor_value_info(op.lower(), TensorProto.FLOAT, [1, 4, 6, 6]))
    graph = helper.make_graph(nodes, "tables", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              outputs, [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3)
                                                                .astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@functools.cache
def _sim() -> quantsim.QuantizationSimModel:
    """The calibrated sim of `_activation_model` (exports leave it unchanged: built once)."""
    sim = quantsim.QuantizationSimModel(_activation_model(), progress=False)
    rng = np.random.default_rng(6)
    sim.compute_encodings([{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32) * 1.5} for _ in range(3)])
    return sim


def _oracle(entry: dict, function) -> tuple[np.ndarray, np.ndarray]:
    """(codes, near a midpoint) of ``function`` on the entry's grids for the 256 input codes."""
    x = (np.arange(256) - entry["input_zero_point"]) * np.float64(np.float32(entry["input_scale"]))
    steps = function(x) / np.float64(np.float32(entry["output_scale"]))
    codes = np.clip(np.rint(steps) + entry["output_zero_point"], 0, 255)
    return codes.astype(np.int64), np.abs(np.abs(steps - np.floor(steps)) - 0.5) < 1e-4


def _counting(monkeypatch) -> list[bool]:
    """The ``fuse_qdq`` of every session `code_graphs` builds."""
    built: list[bool] = []

    def counted(model, *args, fuse_qdq=False, **kwargs):
        built.append(fuse_qdq)
        return make_session(model, *args, fuse_qdq=fuse_qdq, **kwargs)
    monkeypatch.setattr(code_graphs, "make_session", counted)
    return built


def test_every_table_of_an_export_comes_from_one_session_and_equals_its_function(monkeypatch):
    built = _counting(monkeypatch)
    exported = export_integer(_sim(), weight_codes="auto")
    assert exported.report == []
    # one session computes every table (DQ -> f -> Q, Q/DQ fusion off), one more every kernel probe
    assert built.count(False) == 1 and built.count(True) == 1, built
    entries = {e["function"]: e for e in exported.requant.values() if "function" in e}
    assert set(entries) == {*FUNCTIONS, "HardSwish"}
    for op, (_, function) in FUNCTIONS.items():
        table = np.asarray(entries[op]["table"])
        want, near_midpoint = _oracle(entries[op], function)
        assert entries[op]["op"] == "LUT"
        assert np.array_equal(table[~near_midpoint], want[~near_midpoint]), op
        assert np.abs(table - want).max() <= 1, op


def test_merged_tables_equal_one_session_per_table():
    """The merge changes no value: each table equals its DQ -> f -> Q graph run in a session of its own."""
    exported = export_integer(_sim(), weight_codes="auto")
    for entry in exported.requant.values():
        if entry.get("function") in (None, "HardSwish"):
            continue
        attrs = FUNCTIONS[entry["function"]][0]
        graph = helper.make_graph(
            [helper.make_node("DequantizeLinear", ["codes", "s", "z"], ["x"]),
             helper.make_node(entry["function"], ["x"], ["y"], **attrs),
             helper.make_node("QuantizeLinear", ["y", "t", "u"], ["q"])],
            "alone", [helper.make_tensor_value_info("codes", TensorProto.UINT8, [256])],
            [helper.make_tensor_value_info("q", TensorProto.UINT8, [256])],
            [numpy_helper.from_array(np.float32(entry["input_scale"]), "s"),
             numpy_helper.from_array(np.uint8(entry["input_zero_point"]), "z"),
             numpy_helper.from_array(np.float32(entry["output_scale"]), "t"),
             numpy_helper.from_array(np.uint8(entry["output_zero_point"]), "u")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        (alone,) = make_session(model).run(None, {"codes": CODES})
        assert np.array_equal(np.asarray(entry["table"]), alone), entry["function"]


def test_a_table_onnxruntime_cannot_compute_names_its_node_and_the_others_stay_merged(monkeypatch):
    built = _counting(monkeypatch)
    counted = code_graphs.make_session

    def refuse_tanh(model, *args, **kwargs):
        if any(n.op_type == "Tanh" for n in model.graph.node):
            raise RuntimeError("no Tanh kernel here\nsecond line")
        return counted(model, *args, **kwargs)
    monkeypatch.setattr(code_graphs, "make_session", refuse_tanh)
    sim = _sim()
    exported = export_integer(sim, weight_codes="auto")
    assert [(e.node, e.op_type) for e in exported.report] == [("tanh_node", "Tanh")]
    assert exported.report[0].reason == "cannot tabulate Tanh: no Tanh kernel here"
    # the failing graph is found by halving: a few sessions, not one per table
    assert len(built) <= 6, built
    entries = {e["function"]: e for e in exported.requant.values() if "function" in e}
    want, near = _oracle(entries["Exp"], np.exp)
    assert np.array_equal(np.asarray(entries["Exp"]["table"])[~near], want[~near])


def _identity(scale: float, name: str = "lut") -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["codes", "s", "z"], ["x"]),
         helper.make_node("QuantizeLinear", ["x", "t", "z"], ["y"])], name,
        [helper.make_tensor_value_info("codes", TensorProto.UINT8, [256])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [256])],
        [numpy_helper.from_array(np.float32(1.0), "s"), numpy_helper.from_array(np.uint8(0), "z"),
         numpy_helper.from_array(np.float32(scale), "t")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return model


def test_code_graphs_plan_merge_and_answer_misses_alone(monkeypatch):
    built = _counting(monkeypatch)
    graphs = CodeGraphs(planning=True)
    for scale in (1.0, 2.0, 4.0, 2.0):  # the repeated graph is recorded once
        assert np.array_equal(graphs.evaluate(_identity(scale))[0], np.zeros(256, np.uint8))
    assert graphs.pending == 3 and built == []
    graphs.compute()
    assert len(built) == 1 and graphs.pending == 0
    for scale in (1.0, 2.0, 4.0):  # y = round(c / scale), ties to even, from the merged session
        (got,) = graphs.evaluate(_identity(scale))
        assert np.array_equal(got, np.rint(np.arange(256) / scale).astype(np.uint8))
    assert len(built) == 1
    (got,) = graphs.evaluate(_identity(8.0))  # not planned: evaluated alone
    assert np.array_equal(got, np.rint(np.arange(256) / 8.0).astype(np.uint8)) and len(built) == 2


def test_an_unloadable_graph_fails_alone_with_its_own_error():
    broken = _identity(2.0)
    broken.graph.node[1].op_type = "NoSuchOp"
    graphs = CodeGraphs(planning=True)
    for model in (_identity(1.0), broken, _identity(4.0)):
        graphs.evaluate(model)
    graphs.compute()
    assert np.array_equal(graphs.evaluate(_identity(4.0))[0], np.rint(np.arange(256) / 4.0).astype(np.uint8))
    with pytest.raises(Exception) as merged_error:
        graphs.evaluate(broken)
    with pytest.raises(Exception) as alone_error:
        CodeGraphs().evaluate(broken)
    assert str(merged_error.value) == str(alone_error.value) and "NoSuchOp" in str(alone_error.value)
