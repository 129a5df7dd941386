"""``canonicalize_ops`` on ``Einsum``: a two-input matrix-product equation becomes Transpose + MatMul
(+ Transpose) (`quantsim.prepare.einsum`); ``numpy.einsum`` is the oracle of the rewritten graph.

The sim part: an attention block written with Einsum (batch letters in another order in each operand, the
output permuted) is simulated with MatMul quantizers, exported to integer kernels with no Einsum or MatMul
left float, and its exact QDQ export equals the sim.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import GraphBuilder, make_model  # tests/models.py
from onnx import TensorProto, helper, numpy_helper
from test_export_integer import _steps

import quantsim
from quantsim.export.integer.export import export_integer
from quantsim.prepare import canonicalize_ops, prepare
from quantsim.prepare.einsum import plan_einsum

_SIZES = {c: 2 + i % 5 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
_SIZES.update({c.upper(): 2 + (i + 2) % 5 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")})


def _shape(term: str) -> list[int]:
    return [_SIZES[c] for c in term if not c.isspace()]


def _einsum_model(equation: str, constant: dict[int, np.ndarray] | None = None,
                  inputs: int = 2) -> onnx.ModelProto:
    """One Einsum of ``equation`` (inputs ``x0``, ``x1``, ...; those in ``constant`` are initializers)."""
    constant = constant or {}
    text = "".join(equation.split())
    terms, out = text.split("->")[0].split(","), text.split("->")[1]
    names = [f"x{i}" for i in range(inputs)]
    graph_inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, _shape(t))
                    for i, (n, t) in enumerate(zip(names, terms)) if i not in constant]
    inits = [numpy_helper.from_array(v, names[i]) for i, v in constant.items()]
    node = helper.make_node("Einsum", names, ["y"], name="attn/einsum", equation=equation)
    graph = helper.make_graph([node], "einsum", graph_inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, _shape(out))], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feed(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


def _run(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def _canonical(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    work = onnx.ModelProto()
    work.CopyFrom(model)
    return canonicalize_ops(work)


@pytest.mark.parametrize("equation, transposes", [
    ("B G H I D, B G H J D -> B G H I J", 1),  # MaxViT's q·k^T (spaces and capitals are legal)
    ("B G H I J, B G H J D -> B G H I D", 0),  # MaxViT's attn·v
    ("bhid,bhjd->bhij", 1),
    ("bij,bjk->bik", 0),
    ("ij,jk->ik", 0),
    ("bij,bjk->bki", 1),  # the output permuted
    ("ibk,bkj->bij", 1),  # the batch letter in another place in A
    ("bihd,bjhd->bhij", 2),  # two batch letters, in another order than the output's in both operands
    ("hbij,bhjd->bihd", 2),
    ("hbji,bhdj->bihd", 3),
    ("ji,kj->ki", 3),
    ("btd,de->bte", 0),  # more left letters, no batch letter: a 3-D x 2-D MatMul
    ("bhdi,dk->bkhi", 2),
    ("ij,bjk->bik", 0),  # more right letters
])
def test_matrix_product_einsums_become_matmul_and_match_numpy(equation, transposes):
    model = _einsum_model(equation)
    prepared, modified = _canonical(model)
    assert modified
    ops = [n.op_type for n in prepared.graph.node]
    assert ops.count("MatMul") == 1 and ops.count("Transpose") == transposes and "Einsum" not in ops
    assert prepared.graph.node[-1].output[0] == "y"  # the Einsum's output name stays
    names = [n.name for n in prepared.graph.node]
    assert len(set(names)) == len(names) and all(n.startswith("attn/einsum/") for n in names)
    onnx.checker.check_model(prepared, full_check=True)
    feed = _feed(model)
    want = np.einsum("".join(equation.split()).lower(), *(feed[f"x{i}"].astype(np.float64) for i in range(2)))
    np.testing.assert_allclose(_run(prepared, feed), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(model, feed), want, rtol=1e-5, atol=1e-5)  # the equation as ONNX reads it


@pytest.mark.parametrize("equation", [
    "ii,ij->j",  # a diagonal
    "ij,jk->i",  # k summed over within one operand
    "bij,bjk->bik,",  # malformed output
    "ijk,jkl->il",  # two contracted letters (a Reshape would be needed)
    "ij,ij->i",  # no left / right letter
    "bij,bjk",  # implicit output
    "...ij,...jk->...ik",  # ellipsis
    "ij,jk->iik",  # an output letter twice
    "aij,bjk->abik",  # more letters on both sides: would need an Unsqueeze
    "abij,ajk->abik",  # more left letters beside a batch letter
])
def test_other_equations_have_no_plan(equation):
    assert plan_einsum(equation) is None


def test_refused_einsums_stay_as_they_are():
    for equation in ("ii,ij->j", "ij,jk->i"):
        model = _einsum_model(equation)
        assert _canonical(model)[1] is False
    three = _einsum_model("ij,jk,kl->il", inputs=3)
    prepared, modified = _canonical(three)
    assert not modified and [n.op_type for n in prepared.graph.node] == ["Einsum"]


def test_a_constant_operand_is_kept_only_where_it_needs_no_transpose():
    rng = np.random.default_rng(4)
    weight_kj = rng.standard_normal(_shape("kj")).astype(np.float32)
    needs = _einsum_model("bij,kj->bik", constant={1: weight_kj})  # W would need a Transpose: stays Einsum
    assert _canonical(needs)[1] is False
    weight_jk = np.ascontiguousarray(weight_kj.T)
    plain = _einsum_model("bij,jk->bik", constant={1: weight_jk})
    prepared, modified = _canonical(plain)
    assert modified and [(n.op_type, list(n.input)) for n in prepared.graph.node] == [("MatMul", ["x0", "x1"])]
    feed = _feed(plain, 1)
    np.testing.assert_allclose(_run(prepared, feed), np.einsum("bij,jk->bik", feed["x0"], weight_jk),
                               rtol=1e-5, atol=1e-5)


def test_new_names_avoid_names_already_in_the_graph():
    model = _einsum_model("bhid,bhjd->bhij")
    model.graph.node.insert(0, helper.make_node("Identity", ["x0"], ["attn/einsum/transpose_b"],
                                                name="attn/einsum/matmul"))
    model.graph.node[1].input[0] = "attn/einsum/transpose_b"
    prepared, _ = _canonical(model)
    names = [n.name for n in prepared.graph.node]
    outputs = [o for n in prepared.graph.node for o in n.output]
    assert len(set(names)) == len(names) and len(set(outputs)) == len(outputs)
    feed = _feed(model, 2)
    np.testing.assert_allclose(_run(prepared, feed), _run(model, feed), rtol=1e-5, atol=1e-5)


# sim and exports --------------------------------------------------------------------------------------------
T, H, D = 8, 2, 8
C = H * D


def _attention() -> onnx.ModelProto:
    """x [N,T,C] -> MatMul + position embedding [T,C] -> q/k/v MatMul+bias -> Reshape [N,T,H,D] -> Einsum
    'bihd,bjhd->bhij' + relative position bias [1,H,T,T] (MaxViT's) -> scale -> Softmax -> Einsum
    'bhij,bjhd->bihd' -> Reshape [N,T,C] -> output MatMul+bias. Neither constant Add is a kernel's bias."""
    rng = np.random.default_rng(0)
    graph = GraphBuilder()
    inits, nodes, const, node = graph.inits, graph.nodes, graph.const, graph.node

    heads = const("heads", np.array([0, T, H, D], np.int64))
    w_in = const("w_in", (rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32))
    h = node("Add", [node("MatMul", ["x", w_in], "in.mm"), const("pos", (0.3 * rng.standard_normal((T, C))).astype(np.float32))],
             "h")
    parts = []
    for part in "qkv":
        w = const(f"w_{part}", (rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32))
        b = const(f"b_{part}", (0.1 * rng.standard_normal(C)).astype(np.float32))
        parts.append(node("Reshape", [node("Add", [node("MatMul", [h, w], f"{part}.mm"), b], f"{part}.b"), heads],
                          part))
    scores = node("Einsum", parts[:2], "scores", equation="b i h d, b j h d -> b h i j")
    rel = const("rel_bias", rng.standard_normal((1, H, T, T)).astype(np.float32))
    scores = node("Mul", [node("Add", [scores, rel], "biased"), const("scale", np.float32(D ** -0.5))], "scaled")
    probs = node("Softmax", [scores], "probs", axis=-1)
    attn = node("Einsum", [probs, parts[2]], "attn", equation="bhij,bjhd->bihd")
    flat = node("Reshape", [attn, const("flat_shape", np.array([0, T, C], np.int64))], "flat")
    w_o = const("w_o", (rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32))
    node("Add", [node("MatMul", [flat, w_o], "o.mm"), const("b_o", (0.1 * rng.standard_normal(C)).astype(np.float32))],
         "y")
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", T, C])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", T, C])], inits)


def _x(seed: int, batch: int = 4) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal((batch, T, C)).astype(np.float32)}


def test_einsum_attention_is_simulated_and_exported_on_integer_kernels():
    model = _attention()
    prepared = prepare(model, cache=False)
    assert [n.op_type for n in prepared.graph.node].count("MatMul") == 7
    assert "Einsum" not in {n.op_type for n in prepared.graph.node}
    feed = _x(9)
    np.testing.assert_allclose(_run(prepared, feed), _run(model, feed), rtol=1e-5, atol=1e-5)

    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings([_x(seed) for seed in range(3)])
    quantizers = sim.qc_quantize_op_dict
    assert quantizers["scores"].enabled  # the Einsum's output, now the MatMul's (the position bias is no bias)
    assert quantizers["attn/matmul"].enabled  # the MatMul before the Transpose to the output's order
    assert quantizers["in.mm"].enabled and not quantizers["q.mm"].enabled  # a [T, C] Add is no bias either
    exported = export_integer(sim, weight_codes="uint8")
    assert exported.report == [], exported.report
    ops = {n.op_type for n in exported.model.graph.node}
    assert "QLinearMatMul" in ops and not ops & {"Einsum", "MatMul"}
    for steps in _steps(sim, exported, feed).values():
        assert steps.max() <= 1 and np.mean(steps > 0) <= 0.2  # rounding of Softmax and the chained kernels
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    exact = ort.InferenceSession(sim.to_onnx_qdq().SerializeToString(), options,  # MatMul biases int32 on both sides
                                 providers=["CPUExecutionProvider"])
    for seed in (10, 11):
        np.testing.assert_array_equal(exact.run(None, _x(seed))[0], sim.session.run(None, _x(seed))[0])

