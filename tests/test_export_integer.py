"""Integer export: onnx.checker, onnxruntime, and agreement with the sim in output steps.

Tolerances are in steps of the output grid (``|integer - sim| / scale``). Data movement, lookup tables,
clamps, QLinearSigmoid/LeakyRelu and float fallbacks agree exactly. The int32 bias: the kernel adds
``round(b / (s_in s_w))`` on the accumulator grid; a float-bias sim (``int32_bias=False``, AIMET's) is up to
``0.5 * M`` output steps (``M = s_in s_w / s_out``) away, which moves values lying that close to a rounding
midpoint by one step. The default sim adds the same int32 biases (`test_sim_int32_bias`), leaving the
kernels' float32 requantization; with zero biases the models below match the sim bit for bit
(`test_without_biases_...`). The figures below were measured with the float-bias sim. QLinearSoftmax adds
its own one-step differences (about 1% of probabilities on identical inputs).

Observed with biases (ORT 1.32, seeded data, batch 64, fraction of elements off by >= 1 step / max):
concat 0.44% / 1, conv_relu 0.27% / 1, conv_bn_relu 0.05% / 1, conv_relu6 0.41% / 2 (0.03% at 2),
residual 0.50% / 2 (0.01% at 2), resize 0.10% / 1, matmul 0.26% / 1, gemm 0 / 0, pool (AveragePool,
GAP, 256 elements) 2.7% / 1, softmax 4.1% / 1, mixed embedding 0.47% / 1 and probs 8.9% / 3 (a one-step
logit change moves a whole row of probabilities). The asserted bounds: max <= 2 steps, > 1 step on
<= 0.1% and >= 1 step on <= 3% of elements (Softmax outputs: max <= 3, > 1 on <= 2%, >= 1 on <= 10%).
"""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import BUILDERS  # tests/models.py
from onnx import TensorProto, helper, numpy_helper

import quantsim
from quantsim.core.numerics import Encoding, encoding_from_range
from quantsim.export.integer.export import IntegerExportError
from quantsim.export.integer.export import export_integer as _export_integer
from quantsim.export.reference import compare_with_onnxruntime

INTEGER_OPS = frozenset(
    """QLinearConv QLinearMatMul QGemm QLinearAdd QLinearMul QLinearConcat QLinearAveragePool
    QLinearGlobalAveragePool QLinearSigmoid QLinearLeakyRelu QLinearSoftmax MaxPool Reshape Flatten Transpose
    Squeeze Unsqueeze Slice Split Pad Resize Concat Clip Cast Gather GatherElements Identity Shape DepthToSpace""".split()
)
FLOAT_COMPUTE = frozenset({"Conv", "MatMul", "Gemm", "Add", "Mul", "Sub", "Div", "Relu", "Sigmoid", "Softmax",
                           "AveragePool", "GlobalAveragePool", "Tanh", "Erf", "HardSwish", "HardSigmoid"})


def export_integer(sim, **kwargs):
    """The integer export with ``weight_codes="auto"``: int8 weight codes where this CPU's uint8 x int8
    kernels are exact, uint8 codes (the same values) where they saturate, so these comparisons with
    onnxruntime's kernels run on every CPU."""
    return _export_integer(sim, weight_codes="auto", **kwargs)


# helpers -------------------------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "m", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = {17: 8, 21: 10}[opset]
    onnx.checker.check_model(model)
    return model


def _vi(name, *dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


def _w(rng, *shape, scale=None):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return numpy_helper.from_array((rng.standard_normal(shape) * (scale or 1 / np.sqrt(fan_in))).astype(np.float32))


def _named(tensor, name):
    tensor.name = name
    return tensor


def _feeds(shape, seed, spread=1.0):
    rng = np.random.default_rng(seed)
    return {"x": (rng.standard_normal(shape) * spread).astype(np.float32)}


def _sim(model, shape, spread=1.0, **kwargs):
    kwargs.setdefault("depthwise_supergroups", True)  # see _FUSED_DEPTHWISE
    sim = quantsim.QuantizationSimModel(model, progress=False, **kwargs)
    sim.compute_encodings([_feeds(shape, seed, spread) for seed in range(4)])
    return sim


def _steps(sim, exported, feed) -> dict[str, np.ndarray]:
    """Per output: |integer - sim| in steps of the output's grid (absolute difference if not quantized)."""
    session = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, feed)
    want = sim.session.run(None, feed)
    result = {}
    for info, g, w in zip(session.get_outputs(), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        q = sim.qc_quantize_op_dict.get(info.name)
        scale = float(q.encoding.scale) if q is not None and q.enabled and q.encoding is not None else 1.0
        result[info.name] = np.round(np.abs(g.astype(np.float64) - w) / scale)
    return result


def _assert_integer_only(model: onnx.ModelProto) -> None:
    uint8_constants = {t.name for t in model.graph.initializer if t.data_type == TensorProto.UINT8}
    ops = [n.op_type for n in model.graph.node  # uint8 Sub(255, codes) negates codes (Sub of two activations)
           if not (n.op_type == "Sub" and n.input[0] in uint8_constants)]
    inner = [op for op in ops if op not in ("QuantizeLinear", "DequantizeLinear")]
    assert set(inner) <= INTEGER_OPS, sorted(set(inner) - INTEGER_OPS)
    assert not FLOAT_COMPUTE & set(ops)
    assert ops.count("QuantizeLinear") == len(model.graph.input)
    assert ops.count("DequantizeLinear") == len(model.graph.output)
    for node in model.graph.node:
        if node.op_type == "Cast":  # codes to int32 (tables), or shape arithmetic (int32 <-> int64): never to float
            assert node.attribute[0].i in (TensorProto.INT32, TensorProto.INT64)


def _export_checked(sim, **kwargs):
    exported = export_integer(sim, **kwargs)
    onnx.checker.check_model(exported.model, full_check=True)
    return exported


def _cnn():
    """Conv+Relu, depthwise Conv+Clip, residual Add(+Relu), MaxPool, Concat, GlobalAveragePool, Flatten, Gemm."""
    rng = np.random.default_rng(21)
    inits = [_named(_w(rng, 8, 3, 3, 3), "c1.w"), _named(_w(rng, 8, scale=0.1), "c1.b"),
             _named(_w(rng, 8, 1, 3, 3, scale=0.5), "dw.w"), _named(_w(rng, 8, scale=0.1), "dw.b"),
             _named(_w(rng, 8, 8, 1, 1), "pw.w"), _named(_w(rng, 8, scale=0.1), "pw.b"),
             _named(_w(rng, 10, 16), "fc.w"), _named(_w(rng, 10, scale=0.1), "fc.b"),
             numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [
        helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
        helper.make_node("Conv", ["r1", "dw.w", "dw.b"], ["dw"], name="dw", pads=[1, 1, 1, 1], group=8),
        helper.make_node("Clip", ["dw", "lo", "hi"], ["d6"], name="d6"),
        helper.make_node("Conv", ["d6", "pw.w", "pw.b"], ["pw"], name="pw"),
        helper.make_node("Add", ["pw", "r1"], ["add"], name="add"),
        helper.make_node("Relu", ["add"], ["r2"], name="r2"),
        helper.make_node("MaxPool", ["r2"], ["mp"], name="mp", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("MaxPool", ["r1"], ["mp1"], name="mp1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Concat", ["mp", "mp1"], ["cat"], name="cat", axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flat"),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["y"], name="fc", transB=1),
    ]
    return _model(nodes, [_vi("x", "N", 3, 16, 16)], [_vi("y", "N", 10)], inits), ("x", 3, 16, 16)


# the small CNN ---------------------------------------------------------------------------------------------
def test_small_cnn_is_fully_integer_and_within_one_step():
    model, _ = _cnn()
    sim = _sim(model, (4, 3, 16, 16))
    exported = _export_checked(sim)
    assert exported.report == []
    _assert_integer_only(exported.model)
    ops = {n.op_type for n in exported.model.graph.node}
    assert {"QLinearConv", "QLinearAdd", "QGemm", "QLinearGlobalAveragePool", "MaxPool", "Flatten"} <= ops
    steps = _steps(sim, exported, _feeds((16, 3, 16, 16), 99))["y"]
    assert steps.max() <= 1 and np.mean(steps > 0) < 0.05, (steps.max(), np.mean(steps > 0))
    # every requantization has its fixed-point form: int32 mantissa in [2^30, 2^31)
    assert set(exported.requant) == {"c1", "dw", "pw", "add", "cat", "gap", "fc"}
    mantissas = []
    for entry in exported.requant.values():
        for record in [entry, *entry.get("input_multipliers", [])]:
            if "mantissa" in record:
                mantissas += np.atleast_1d(record["mantissa"]).tolist()
                np.testing.assert_allclose(np.ldexp(np.asarray(record["mantissa"], float),
                                                    np.asarray(record["shift"]) - 31),
                                           record["multiplier"], rtol=2**-30)
    assert len(mantissas) >= 3 * 8 + 2 + 2 + 1 + 10 and all(2**30 <= m < 2**31 for m in mantissas)


#: These tests bound integer/sim differences in output steps: one quantizer after a depthwise Conv and its Clip.
#: AIMET's placement gives the depthwise output its own grid (up to 5x coarser than the Relu6 output's here), where
#: one requantization step is several output steps.
_FUSED_DEPTHWISE = {"depthwise_supergroups": True}


@pytest.mark.parametrize("name", sorted(set(BUILDERS) - {"layernorm"}))
def test_model_zoo_integer(name):
    model, feeds = BUILDERS[name]()
    sim = quantsim.QuantizationSimModel(model, progress=False, **_FUSED_DEPTHWISE)
    sim.compute_encodings([feeds(i, 4) for i in range(4)])
    exported = _export_checked(sim)
    assert exported.report == []
    _assert_integer_only(exported.model)
    for output, steps in _steps(sim, exported, feeds(100, 64)).items():
        if sim.model.graph.node[-1].op_type == "Softmax" and output == sim.model.graph.node[-1].output[0]:
            # a 1-step change of one logit moves a whole row of probabilities
            assert steps.max() <= 3 and np.mean(steps > 1) <= 0.02, (output, steps.max(), np.mean(steps > 1))
            assert np.mean(steps > 0) <= 0.1, (output, np.mean(steps > 0))
        else:
            assert steps.max() <= 2 and np.mean(steps > 1) <= 0.001, (output, steps.max(), np.mean(steps > 1))
            assert np.mean(steps > 0) <= 0.03, (output, np.mean(steps > 0))


@pytest.mark.parametrize("name", ["conv_relu", "conv_relu6", "residual", "sum_residual", "concat", "gemm", "matmul", "pool",
                                  "resize"])
def test_without_biases_the_integer_model_equals_the_sim(name):
    """The int32 bias is the only approximation: with zero biases every kernel reproduces the sim exactly."""
    model, feeds = BUILDERS[name]()
    for tensor in model.graph.initializer:
        if tensor.name.endswith(".b"):
            tensor.CopyFrom(numpy_helper.from_array(np.zeros(tuple(tensor.dims), np.float32), tensor.name))
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings([feeds(i, 4) for i in range(4)])
    exported = _export_checked(sim)
    for output, steps in _steps(sim, exported, feeds(100, 32)).items():
        assert steps.max() == 0, (output, np.mean(steps > 0))


def test_unsupported_op_is_reported_and_exact():
    model, feeds = BUILDERS["layernorm"]()
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings([feeds(i, 4) for i in range(4)])
    exported = _export_checked(sim)
    assert [(r.node, r.op_type) for r in exported.report] == [("ln", "LayerNormalization")]
    assert "no integer LayerNorm kernel" in exported.report[0].reason
    assert "QLinearMatMul" in {n.op_type for n in exported.model.graph.node}
    assert _steps(sim, exported, feeds(7, 8))["y"].max() == 0


# lookup tables ------------------------------------------------------------------------------------------------
def _unary_zoo(opset=17):
    consts = {"half": 0.5, "three": 3.0, "six": 6.0, "two": 2.0}
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
    specs = [("HardSigmoid", ["x"], {}), ("HardSwish", ["x"], {}), ("Tanh", ["x"], {}), ("Erf", ["x"], {}),
             ("Exp", ["x"], {}), ("Softplus", ["x"], {}), ("Elu", ["x"], {"alpha": 0.7}),
             ("Mul", ["x", "half"], {}), ("Add", ["three", "x"], {}), ("Div", ["x", "six"], {}),
             ("Sub", ["three", "x"], {}), ("Pow", ["x", "two"], {})]
    if opset >= 20:
        specs.append(("Gelu", ["x"], {"approximate": "tanh"}))
    nodes, outputs = [], []
    for i, (op, inputs, attrs) in enumerate(specs):
        out = f"{op.lower()}_{i}"
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        outputs.append(_vi(out, "N", 4, 6))
    return _model(nodes, [_vi("x", "N", 4, 6)], outputs, inits, opset=opset)


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("exact", [True, False])
def test_lookup_tables_are_exact(opset, exact):
    sim = _sim(_unary_zoo(opset), (8, 4, 6), spread=2.0)
    exported = _export_checked(sim, exact=exact)
    assert exported.report == []
    _assert_integer_only(exported.model)
    entries = {e["output"]: e for e in exported.requant.values()}
    assert len(entries) == len(exported.model.graph.output) and all(len(e["table"]) == 256 for e in entries.values())
    kernels = {e["function"]: e["op"] for e in entries.values() if e["op"] != "LUT"}
    chains = {"HardSigmoid": "QLinearAdd+Clip", "HardSwish": "QLinearAdd+QLinearMul", "Mul": "QLinearMul",
              "Add": "QLinearAdd", "Div": "QLinearMul"}
    steps = {entries[output]["function"]: s.max() for output, s in
             _steps(sim, exported, _feeds((64, 4, 6), 5, spread=2.5)).items()}
    if exact:  # the default: a chain only where it equals the table on all 256 codes, so the sim bit for bit
        assert "HardSwish" not in kernels and kernels.items() <= chains.items(), kernels
        assert max(steps.values()) == 0, steps
        return
    # exact=False: piecewise-linear functions run on QLinear kernels, the others stay exact tables
    assert kernels == chains, kernels
    for function, worst in steps.items():
        assert worst <= (1 if function in ("HardSwish", "HardSigmoid") else 0), (function, worst)


# elementwise kernels ---------------------------------------------------------------------------------------------
def test_elementwise_kernels():
    rng = np.random.default_rng(3)
    inits = [_named(_w(rng, 4, 3, 3, 3), "c.w"), _named(_w(rng, 4, scale=0.1), "c.b"),
             numpy_helper.from_array(rng.uniform(0.5, 2, (1, 4, 1, 1)).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.uniform(-1, 1, (1, 4, 1, 1)).astype(np.float32), "beta")]
    nodes = [
        helper.make_node("Conv", ["x", "c.w", "c.b"], ["c"], name="c", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["sig"], name="sig"),
        helper.make_node("Mul", ["c", "sig"], ["silu"], name="silu"),
        helper.make_node("Mul", ["silu", "gamma"], ["scaled"], name="scaled"),
        helper.make_node("Add", ["scaled", "beta"], ["shifted"], name="shifted"),
        helper.make_node("LeakyRelu", ["shifted"], ["leaky"], name="leaky", alpha=0.1),
        helper.make_node("AveragePool", ["leaky"], ["avg"], name="avg", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("MaxPool", ["c"], ["mp"], name="mp", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Concat", ["avg", "mp"], ["y"], name="cat", axis=1),
    ]
    model = _model(nodes, [_vi("x", "N", 3, 8, 8)], [_vi("y", "N", 8, 4, 4), _vi("c", "N", 4, 8, 8)], inits)
    sim = _sim(model, (4, 3, 8, 8))
    exported = _export_checked(sim)
    assert exported.report == []
    _assert_integer_only(exported.model)
    ops = {n.op_type for n in exported.model.graph.node}
    assert {"QLinearSigmoid", "QLinearMul", "QLinearAdd", "QLinearLeakyRelu", "QLinearAveragePool",
            "QLinearConcat"} <= ops
    steps = _steps(sim, exported, _feeds((32, 3, 8, 8), 11))
    for output, s in steps.items():
        assert s.max() <= 2 and np.mean(s > 1) <= 0.002 and np.mean(s > 0) <= 0.05, (output, s.max(), np.mean(s > 0))


# data movement ------------------------------------------------------------------------------------------------------
def test_data_movement_is_exact():
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in {
        "pads": [0, 0, 1, 1, 0, 0, 1, 1], "shape": [0, 4, -1], "starts": [1], "ends": [7], "axes": [2],
        "split": [2, 2], "ax0": [0]}.items()]
    inits += [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
              numpy_helper.from_array(np.array([0.0], np.float32), "zero")]
    nodes = [
        helper.make_node("Pad", ["x", "pads", "zero"], ["pad"], name="pad"),
        helper.make_node("MaxPool", ["pad"], ["mp"], name="mp", kernel_shape=[3, 3], strides=[1, 1]),
        helper.make_node("Transpose", ["mp"], ["tr"], name="tr", perm=[0, 1, 3, 2]),
        helper.make_node("Slice", ["tr", "starts", "ends", "axes"], ["sl"], name="sl"),
        helper.make_node("Split", ["sl", "split"], ["s1", "s2"], name="split", axis=1),
        helper.make_node("Resize", ["s1", "", "scales"], ["up"], name="up", mode="nearest"),
        helper.make_node("Unsqueeze", ["s2", "ax0"], ["us"], name="us"),
        helper.make_node("Squeeze", ["us", "ax0"], ["sq"], name="sq"),
        helper.make_node("Reshape", ["sq", "shape"], ["rs"], name="rs"),
        helper.make_node("Flatten", ["s2"], ["fl"], name="fl", axis=2),
        helper.make_node("Relu", ["x"], ["relu"], name="relu"),
        helper.make_node("Identity", ["relu"], ["ident"], name="ident"),
    ]
    outputs = [_vi("up", "N", 2, 12, 16), _vi("rs", "N", 4, 24), _vi("fl", "M", 48), _vi("ident", "N", 4, 8, 8)]
    model = _model(nodes, [_vi("x", "N", 4, 8, 8)], outputs, inits)
    sim = _sim(model, (4, 4, 8, 8))
    exported = _export_checked(sim)
    assert exported.report == []
    _assert_integer_only(exported.model)
    for output, steps in _steps(sim, exported, _feeds((8, 4, 8, 8), 3)).items():
        assert steps.max() == 0, output


def test_relu_clip_fold_or_clamp():
    model, feeds = BUILDERS["conv_relu6"]()
    sim = quantsim.QuantizationSimModel(model, progress=False, **_FUSED_DEPTHWISE)
    sim.compute_encodings([feeds(i, 4) for i in range(4)])
    folded = _export_checked(sim)
    assert "Clip" not in {n.op_type for n in folded.model.graph.node}  # the grids already imply [0, 6]
    # a wider output grid for the first Relu6: the clamp must become a uint8 Clip on codes
    sim.qc_quantize_op_dict["clip1.out"].set_encoding(encoding_from_range(-1.0, 9.0, 8, symmetric=False))
    clamped = _export_checked(sim)
    clips = [n for n in clamped.model.graph.node if n.op_type == "Clip"]
    assert len(clips) == 1 and clamped.report == []
    entry = clamped.requant["conv"]
    assert entry["clamp"][0] > 0 and entry["clamp"][1] < 255
    steps = _steps(sim, clamped, feeds(5, 16))["y"]
    assert steps.max() <= 2 and np.mean(steps > 1) <= 0.001


# float fallbacks -------------------------------------------------------------------------------------------------------
def test_int16_activations_fall_back_exactly():
    model, feeds = BUILDERS["residual"]()
    sim = quantsim.QuantizationSimModel(model, progress=False, activation_type="int16")
    sim.compute_encodings([feeds(i, 4) for i in range(4)])
    exported = _export_checked(sim)
    assert {r.node for r in exported.report} == {n.name for n in sim.model.graph.node}
    assert all("16-bit" in r.reason for r in exported.report if r.node == "conv1")
    steps = _steps(sim, exported, feeds(3, 8))["y"]
    assert steps.max() == 0
    kept = export_integer(sim, integer_io=True)  # 16-bit I/O cannot be uint8: kept float and reported
    assert [(r.node, r.op_type) for r in kept.report if r.op_type.startswith("graph")] == [
        ("x", "graph input"), ("y", "graph output")]
    assert kept.io == {} and kept.model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT


def test_float16_layer_and_disabled_quantizer_are_reported():
    model, _ = _cnn()
    sim = _sim(model, (4, 3, 16, 16))
    sim.qc_quantize_op_dict["d6"].set_precision("float16")
    exported = _export_checked(sim)
    reasons = {r.node: r.reason for r in exported.report}
    assert "float16" in reasons["dw"] and "pw" in reasons and "c1" not in reasons
    steps = _steps(sim, exported, _feeds((8, 3, 16, 16), 4))["y"]
    assert steps.max() <= 1

    model, feeds = BUILDERS["conv_relu"]()
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings([feeds(i, 4) for i in range(4)])
    sim.qc_quantize_op_dict["relu1.out"].enabled = False
    exported = _export_checked(sim)
    assert [r.node for r in exported.report] == ["conv1", "relu1", "conv2"]
    assert "no quantizer" in exported.report[0].reason or "no enabled quantizer" in exported.report[0].reason
    assert _steps(sim, exported, feeds(2, 8))["y"].max() <= 1


def test_sub_8bit_activations_run_on_integer_kernels():
    """6-bit codes ride in uint8 with the same scale and zero point: integer kernels plus a code clamp."""
    model, feeds = BUILDERS["conv_relu"]()
    sim = quantsim.QuantizationSimModel(model, progress=False, activation_type=quantsim.qtype.int(6))
    sim.compute_encodings([feeds(i, 4) for i in range(4)])
    exported = _export_checked(sim)
    assert exported.report == []
    assert [n.op_type for n in exported.model.graph.node].count("QLinearConv") == 2
    grid = sim.qc_quantize_op_dict["x"].encoding
    shift = 128 if grid.signed else 0
    assert exported.requant["conv1"]["input_zero_point"] == int(grid.zero_point) + shift
    io = export_integer(sim, integer_io=True).io  # integer inputs must stay inside the 6-bit code range
    assert io["x"]["code_range"] == [grid.qmin + shift, grid.qmax + shift]
    assert _steps(sim, exported, feeds(2, 8))["y"].max() <= 1


def test_w4a4_integer_model_agrees_with_the_reference_executor():
    """A W4A4 CNN (clamped 4-bit codes in uint8) run by onnxruntime and by the fixed-point executor."""
    model, shape = _cnn()
    sim = _sim(model, (4, 3, 16, 16), param_type="int4", activation_type="int4")
    exported = _export_checked(sim)
    assert exported.report == []
    clamps = [n for n in exported.model.graph.node if n.op_type == "Clip"]
    assert clamps  # every kernel's uint8 codes are clamped to the 16 codes of the 4-bit grid
    feed = _feeds((2, 3, 16, 16), 7)
    for name, result in compare_with_onnxruntime(exported.model, feed).items():
        assert result["max_lsb_diff"] <= 1 and result["frac_within_1_lsb"] == 1.0, (name, result)
    assert _steps(sim, exported, feed)["y"].max() <= 1


@pytest.mark.parametrize("weight_bits", range(2, 9))
def test_every_precision_combination_loads_and_matches_the_sim(weight_bits):
    """W2..W8 x A2..A16 on a CNN with every lowering family: the model loads in onnxruntime (4-bit codes
    never reach a Cast), sub-8-bit grids stay integer, wider ones fall back exactly, all within 2 steps."""
    model, shape = _cnn()
    rng = np.random.default_rng(weight_bits)
    calibration = [{"x": rng.standard_normal((2, *shape[1:])).astype(np.float32)} for _ in range(2)]
    feed = {"x": rng.standard_normal((4, *shape[1:])).astype(np.float32)}
    for activation_bits in (2, 3, 4, 5, 6, 8, 12, 16):
        sim = quantsim.QuantizationSimModel(model, progress=False, param_type=quantsim.qtype.int(weight_bits),
                                            activation_type=quantsim.qtype.int(activation_bits))
        sim.compute_encodings(calibration)
        exported = export_integer(sim)
        ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
        assert (exported.report == []) == (activation_bits <= 8), (activation_bits, str(exported.report))
        steps = _steps(sim, exported, feed)["y"]
        assert steps.max() <= 2, (weight_bits, activation_bits, steps.max())


def test_export_refuses_a_model_onnxruntime_cannot_load(monkeypatch):
    """The load check runs before anything is returned or saved (here a 4-bit Cast is forced in)."""
    from quantsim.export.integer import export as export_module
    model, _ = _cnn()
    sim = _sim(model, (4, 3, 16, 16))
    original = export_module.helper.make_graph

    def with_int4_cast(nodes, *args, **kwargs):
        graph = original(nodes, *args, **kwargs)
        graph.initializer.append(helper.make_tensor("bad4", TensorProto.UINT4, [1], [3]))
        graph.node.append(helper.make_node("Cast", ["bad4"], ["bad4/float"], name="bad_cast", to=TensorProto.FLOAT))
        return graph

    monkeypatch.setattr(export_module.helper, "make_graph", with_int4_cast)
    with pytest.raises(IntegerExportError, match="does not load in onnxruntime.*bad_cast"):
        export_integer(sim)


# integer I/O, requant table, files, errors ------------------------------------------------------------------------
def test_integer_io_gives_uint8_graph_boundaries():
    model, _ = _cnn()
    sim = _sim(model, (4, 3, 16, 16))
    exported = _export_checked(sim, integer_io=True)
    ops = [n.op_type for n in exported.model.graph.node]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    assert [i.type.tensor_type.elem_type for i in exported.model.graph.input] == [TensorProto.UINT8]
    assert [o.type.tensor_type.elem_type for o in exported.model.graph.output] == [TensorProto.UINT8]
    meta = json.loads({p.key: p.value for p in exported.model.metadata_props}["quantsim.io"])
    assert meta == exported.io and set(meta) == {"x", "y"}
    x_io, y_io = exported.io["x"], exported.io["y"]
    feed = _feeds((8, 3, 16, 16), 6)
    codes = np.clip(np.rint(feed["x"] / np.float32(x_io["scale"])) + x_io["zero_point"], 0, 255).astype(np.uint8)
    session = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": codes})
    assert out.dtype == np.uint8
    real = (out.astype(np.float32) - y_io["zero_point"]) * np.float32(y_io["scale"])
    (want,) = sim.session.run(None, feed)
    assert np.abs(real - want).max() <= 1.01 * y_io["scale"]


def _one_conv():
    rng = np.random.default_rng(8)
    inits = [_named(_w(rng, 16, 8, 3, 3), "w"), _named(_w(rng, 16, scale=0.2), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, [_vi("x", "N", 8, 6, 6)], [_vi("y", "N", 16, 6, 6)], inits)


def test_requant_table_reproduces_onnxruntime_conv():
    from quantsim.core import fixed_point as fp

    sim = _sim(_one_conv(), (4, 8, 6, 6))
    exported = _export_checked(sim, integer_io=True)
    entry = exported.requant["conv"]
    mantissa, shift = np.array(entry["mantissa"]), np.array(entry["shift"])
    assert np.all((mantissa >= 2**30) & (mantissa < 2**31)) and np.all(shift < 0)
    want = np.float32(entry["input_scale"]) * np.array(entry["weight_scale"], np.float32) / entry["output_scale"]
    np.testing.assert_allclose(entry["multiplier"], want, rtol=1e-6)
    # integer-only recomputation: int32 accumulator, fixed-point multiplier, zero point, clamp
    inits = {t.name: numpy_helper.to_array(t) for t in exported.model.graph.initializer}
    conv = next(n for n in exported.model.graph.node if n.op_type == "QLinearConv")
    w_zero_point = inits[conv.input[5]].astype(np.int64).reshape(-1, 1, 1, 1)  # 0 for int8 codes, 128 for uint8
    w = inits[conv.input[3]].astype(np.int64) - w_zero_point
    bias = inits[conv.input[8]].astype(np.int64)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (2, 8, 6, 6)).astype(np.uint8)
    padded = np.pad(x.astype(np.int64) - entry["input_zero_point"], ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((2, 16, 6, 6), np.int64) + bias[None, :, None, None]
    for dy in range(3):
        for dx in range(3):
            acc += np.einsum("nchw,oc->nohw", padded[:, :, dy:dy + 6, dx:dx + 6], w[:, :, dy, dx])
    ours = fp.requantize(acc, mantissa[None, :, None, None], shift[None, :, None, None],
                         entry["output_zero_point"], *entry["clamp"])
    session = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    (theirs,) = session.run(None, {"x": x})
    diff = np.abs(ours - theirs.astype(np.int64))
    assert diff.max() <= 1 and np.mean(diff > 0) < 0.01


def test_save_writes_model_and_table_atomically(tmp_path):
    sim = _sim(_one_conv(), (4, 8, 6, 6))
    exported = export_integer(sim)
    onnx_path, json_path = exported.save(tmp_path / "sub" / "net")
    assert onnx_path.name == "net.onnx" and json_path.name == "net.requant.json"
    assert sorted(os.listdir(tmp_path / "sub")) == ["net.onnx", "net.requant.json"]
    onnx.checker.check_model(onnx.load(str(onnx_path)))
    document = json.loads(json_path.read_text())
    assert document["format"] == "quantsim.requant/1" and "conv" in document["requant"]
    assert document["requant"]["conv"]["mantissa"] == exported.requant["conv"]["mantissa"]


def test_uncalibrated_and_zero_scale_errors_name_the_tensor():
    sim = quantsim.QuantizationSimModel(_one_conv(), progress=False)
    with pytest.raises(IntegerExportError, match="'x'.*compute_encodings"):
        export_integer(sim)
    sim = _sim(_one_conv(), (4, 8, 6, 6))
    sim.qc_quantize_op_dict["y"].set_encoding(Encoding(np.float64(1e-46), 0, 8, False, 0, 255))  # 0 in float32
    with pytest.raises(IntegerExportError, match="'y'.*scale"):
        export_integer(sim)


def test_tensor_calibration_left_without_encoding_stays_float_like_the_sim():
    """Sqrt of values with negatives is NaN in every batch: calibration warns and leaves its quantizer without an
    encoding, the sim passes the tensor through in float, and both exports do the same (with a warning)."""
    model = _model([helper.make_node("Sqrt", ["x"], ["s"], name="sqrt"), helper.make_node("Relu", ["x"], ["r"], name="relu")],
                   [_vi("x", 2, 8)], [_vi("s", 2, 8), _vi("r", 2, 8)], [])
    with pytest.warns(RuntimeWarning, match="non-finite"):
        sim = _sim(model, (2, 8))
    assert sim.qc_quantize_op_dict["s"].encoding is None and sim.qc_quantize_op_dict["r"].encoding is not None
    with pytest.warns(RuntimeWarning, match=r"no encoding.*\['s'\]"):
        exported = export_integer(sim)
    assert [(entry.node, entry.op_type) for entry in exported.report] == [("sqrt", "Sqrt")]
    feed = _feeds((2, 8), 9)
    session = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    got, want = session.run(None, feed), sim.session.run(None, feed)
    np.testing.assert_array_equal(got[0], want[0])  # NaN where x < 0, else sqrt of the dequantized x: bit for bit
    assert np.isnan(got[0]).any()
    assert np.abs(got[1] - want[1]).max() <= float(sim.qc_quantize_op_dict["r"].encoding.scale) * 1.01
    with pytest.warns(RuntimeWarning, match="no encoding"):
        sim.to_onnx_qdq()


def test_gemm_and_matmul_variants():
    rng = np.random.default_rng(5)
    inits = [_named(_w(rng, 6, 5), "g.w"), numpy_helper.from_array(np.float32(0.3), "g.b"),
             _named(_w(rng, 5, 3), "m.w"), _named(_w(rng, 3, scale=0.2), "m.b")]
    nodes = [
        helper.make_node("Gemm", ["x", "g.w", "g.b"], ["g"], name="gemm", alpha=0.5, beta=2.0, transA=1),
        helper.make_node("Transpose", ["g"], ["gt"], name="gt"),
        helper.make_node("MatMul", ["g", "gt"], ["gram"], name="gram"),  # two activations
        helper.make_node("Unsqueeze", ["g", "axis"], ["g3"], name="g3"),
        helper.make_node("MatMul", ["g3", "m.w"], ["mm"], name="mm"),  # rank 3, bias below
        helper.make_node("Add", ["m.b", "mm"], ["y"], name="bias"),
    ]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "axis"))
    model = _model(nodes, [_vi("x", 6, "N")], [_vi("gram", "N", "N"), _vi("y", 1, "N", 3)], inits)
    sim = _sim(model, (6, 7))
    exported = _export_checked(sim)
    assert exported.report == []
    _assert_integer_only(exported.model)
    ops = [n.op_type for n in exported.model.graph.node]
    assert ops.count("QGemm") == 2 and ops.count("QLinearMatMul") == 1
    for output, steps in _steps(sim, exported, _feeds((6, 40), 8)).items():
        assert steps.max() <= 1 and np.mean(steps > 0) <= 0.02, (output, steps.max(), np.mean(steps > 0))


def test_signed_int8_activations_become_uint8():
    model, feeds = BUILDERS["residual"]()
    sim = quantsim.QuantizationSimModel(model, progress=False)
    for q in sim.quantizers:
        if q.role == "activation":
            q.use_symmetric_encodings = True
    sim.compute_encodings([feeds(i, 4) for i in range(4)])
    assert sim.qc_quantize_op_dict["x"].encoding.signed
    exported = _export_checked(sim, integer_io=True)
    assert exported.report == [] and exported.io["x"]["zero_point"] == 128 and exported.io["x"]["code_range"] == [0, 255]
    assert exported.model.graph.input[0].type.tensor_type.elem_type == TensorProto.UINT8


@pytest.mark.parametrize("opset", [13, 14])
def test_paddle_hardswish_chain_is_one_hardswish(opset):
    """Paddle's x * clip(x + 3, 0, 6) / 6 after a Conv: preparation fuses it (HardSwish at opset 14,
    x * HardSigmoid(x) below), and the integer export applies it as one HardSwish table either way."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "three"], ["c3"]),
             helper.make_node("Clip", ["c3", "zero", "six"], ["r6"]),
             helper.make_node("Mul", ["c", "r6"], ["cr6"]),
             helper.make_node("Div", ["cr6", "six"], ["y"])]
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w")] + [
        numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("three", 3.0), ("zero", 0.0), ("six", 6.0))]
    graph = helper.make_graph(nodes, "hswish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    sim = _sim(model, (1, 3, 8, 8))
    assert sum(q.enabled for q in sim.quantizers if q.role == "activation") == 3  # x, conv output, y
    for exact, op, worst in [(True, "LUT", 0), (False, "QLinearAdd+QLinearMul", 1)]:
        exported = export_integer(sim, exact=exact)
        assert exported.report == []
        hardswish = [e for e in exported.requant.values() if e.get("function") == "HardSwish"]
        assert [e["op"] for e in hardswish] == [op]  # exact=False: gate = saturating add, then one product
        steps = _steps(sim, exported, _feeds((1, 3, 8, 8), 99))
        assert max(float(s.max()) for s in steps.values()) <= worst


def test_requant_table_can_travel_in_the_encodings_file(tmp_path):
    sim = _sim(_one_conv(), (2, 8, 6, 6))
    sim.export(str(tmp_path), "m", requant_table=True)
    data = json.loads((tmp_path / "m.encodings").read_text())
    table = data["quantsim_requantization"]
    mantissas = [e["mantissa"] for e in table["requant"].values() if "mantissa" in e]
    assert mantissas and all(2**30 <= int(np.max(m)) < 2**31 for m in mantissas)
    fresh = quantsim.QuantizationSimModel(_one_conv(), progress=False)
    quantsim.load_encodings_to_sim(fresh, str(tmp_path / "m.encodings"))  # readers ignore the extra key


def test_hardswish_pair_falls_back_to_float_when_not_tabulable():
    """With 16-bit activations there is no 8-bit table: the pair is exported in float, not dropped."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSigmoid", ["c"], ["g"], alpha=1.0 / 6.0, beta=0.5),
             helper.make_node("Mul", ["c", "g"], ["y"])]
    rng = np.random.default_rng(12)
    graph = helper.make_graph(nodes, "hs16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    sim = _sim(model, (1, 3, 8, 8), activation_type="int16")
    exported = export_integer(sim)
    assert {entry.op_type for entry in exported.report} >= {"Mul"}
    steps = _steps(sim, exported, _feeds((1, 3, 8, 8), 5))
    assert max(float(s.max()) for s in steps.values()) <= 1


def _lcnet_like():
    """PP-LCNet-like block: Conv+HardSwish, depthwise+HardSwish, SE (GAP, Conv, Relu, Conv, HardSigmoid, Mul);
    a LeakyRelu and ``x * 0.5`` branch; Tanh of the input (a true table)."""
    rng = np.random.default_rng(17)
    inits = [_named(_w(rng, 8, 3, 3, 3), "c1.w"), _named(_w(rng, 8, scale=0.1), "c1.b"),
             _named(_w(rng, 8, 1, 3, 3, scale=0.5), "dw.w"), _named(_w(rng, 8, scale=0.1), "dw.b"),
             _named(_w(rng, 2, 8, 1, 1), "se1.w"), _named(_w(rng, 2, scale=0.1), "se1.b"),
             _named(_w(rng, 8, 2, 1, 1), "se2.w"), _named(_w(rng, 8, scale=0.1), "se2.b"),
             numpy_helper.from_array(np.float32(0.5), "half")]
    nodes = [helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c1"], ["h1"]),
             helper.make_node("Conv", ["h1", "dw.w", "dw.b"], ["dw"], pads=[1, 1, 1, 1], group=8),
             helper.make_node("HardSwish", ["dw"], ["h2"]),
             helper.make_node("GlobalAveragePool", ["h2"], ["g"]),
             helper.make_node("Conv", ["g", "se1.w", "se1.b"], ["s1"]),
             helper.make_node("Relu", ["s1"], ["s1r"]),
             helper.make_node("Conv", ["s1r", "se2.w", "se2.b"], ["s2"]),
             helper.make_node("HardSigmoid", ["s2"], ["gate"], alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["h2", "gate"], ["se"]),
             helper.make_node("LeakyRelu", ["h2"], ["lr"], alpha=0.1),
             helper.make_node("Mul", ["lr", "half"], ["m"]),
             helper.make_node("Tanh", ["x"], ["t"])]
    outputs = [_vi("se", "N", 8, 12, 12), _vi("m", "N", 8, 12, 12), _vi("t", "N", 3, 12, 12)]
    return _model(nodes, [_vi("x", "N", 3, 12, 12)], outputs, inits)


def test_piecewise_linear_activations_run_on_qlinear_kernels():
    """With ``exact=False``, HardSwish, HardSigmoid, LeakyRelu and scalar Mul become QLinear kernels (no table); the one true
    table (Tanh) is a GatherElements; within one step per op of the sim, and within one LSB of the
    fixed-point reference executor."""
    sim = _sim(_lcnet_like(), (4, 3, 12, 12), spread=2.0)
    exported = _export_checked(sim, exact=False)  # the default keeps HardSwish's exact table
    assert exported.report == []
    _assert_integer_only(exported.model)
    ops = [n.op_type for n in exported.model.graph.node]
    assert "Gather" not in ops and ops.count("GatherElements") == 1
    kinds = {e.get("function"): e["op"] for e in exported.requant.values() if "table" in e}
    assert kinds == {"HardSwish": "QLinearAdd+QLinearMul", "HardSigmoid": "QLinearAdd+Clip", "Mul": "QLinearMul",
                     "Tanh": "LUT"}, kinds
    feed = _feeds((8, 3, 12, 12), 3, spread=2.0)
    # each HardSwish is within one step of the sim (checked on all 256 codes at export); two of them, the SE
    # product and a x2 rescale compound: measured 3.1% / 1.8% one-step and 0.6% two-or-more-step outputs,
    # max 3 (exact tables: 0.08% / 0.05%, 0.03%, max 3)
    for output, steps in _steps(sim, exported, feed).items():
        assert steps.max() <= 3 and np.mean(steps > 1) <= 0.01 and np.mean(steps > 0) <= 0.05, (
            output, steps.max(), np.mean(steps > 1), np.mean(steps > 0))
    for name, result in compare_with_onnxruntime(exported.model, feed).items():  # the executor's >= 99.9% bar
        assert result["max_lsb_diff"] <= 3 and result["frac_within_1_lsb"] >= 0.999, (name, result)


def test_standalone_clip_onto_another_grid_is_a_requantizing_kernel():
    """A Relu6 whose output has its own grid: one exact requantizing kernel plus a code clamp, no table."""
    lo, hi = numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Clip", ["a", "lo", "hi"], ["y"])]
    sim = _sim(_model(nodes, [_vi("x", "N", 4, 6)], [_vi("y", "N", 4, 6)], [lo, hi]), (8, 4, 6), spread=3.0)
    assert sim.qc_quantize_op_dict["a"].encoding.scale != sim.qc_quantize_op_dict["y"].encoding.scale
    exported = _export_checked(sim)
    ops = [n.op_type for n in exported.model.graph.node]
    assert exported.report == [] and "GatherElements" not in ops and "Gather" not in ops, ops
    assert _steps(sim, exported, _feeds((64, 4, 6), 8, spread=4.0))["y"].max() == 0


def test_per_channel_input_normalisation_runs_on_integer_kernels():
    """``(x - mean) / std`` with [1, 3, 1, 1] constants in front of the stem: QLinearAdd with the exactly
    negated mean codes and QLinearMul by the reciprocal std (it used to stay float)."""
    rng = np.random.default_rng(0)
    inits = [_named(_w(rng, 8, 3, 3, 3), "c.w"), _named(_w(rng, 8, scale=0.1), "c.b"),
             numpy_helper.from_array(np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1), "mean"),
             numpy_helper.from_array(np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1), "std")]
    nodes = [helper.make_node("Sub", ["x", "mean"], ["xc"]), helper.make_node("Div", ["xc", "std"], ["xn"]),
             helper.make_node("Conv", ["xn", "c.w", "c.b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = _model(nodes, [_vi("x", "N", 3, 8, 8)], [_vi("y", "N", 8, 8, 8), _vi("xn", "N", 3, 8, 8)], inits)
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings([{"x": rng.random((2, 3, 8, 8)).astype(np.float32)} for _ in range(3)])
    exported = _export_checked(sim)
    assert exported.report == []
    _assert_integer_only(exported.model)
    assert [n.op_type for n in exported.model.graph.node][1:3] == ["QLinearAdd", "QLinearMul"]
    feed = {"x": rng.random((8, 3, 8, 8)).astype(np.float32)}
    steps = _steps(sim, exported, feed)
    assert steps["xn"].max() <= 1 and np.mean(steps["xn"] > 0) <= 0.03, (steps["xn"].max(), np.mean(steps["xn"] > 0))
    assert steps["y"].max() <= 2 and np.mean(steps["y"] > 1) <= 0.001, (steps["y"].max(), np.mean(steps["y"] > 1))
    for name, result in compare_with_onnxruntime(exported.model, feed).items():
        assert result["max_lsb_diff"] <= 1 and result["frac_within_1_lsb"] == 1.0, (name, result)


def test_decomposed_leaky_relu_runs_as_qlinear_leaky_relu():
    """``Max(x, 0.1 x)`` after a Conv: preparation spells it LeakyRelu, the export a QLinearLeakyRelu."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "slope"], ["cs"]), helper.make_node("Max", ["c", "cs"], ["y"])]
    inits = [_named(_w(rng, 4, 3, 3, 3), "w"), numpy_helper.from_array(np.float32(0.1), "slope")]
    sim = _sim(_model(nodes, [_vi("x", "N", 3, 6, 6)], [_vi("y", "N", 4, 6, 6)], inits), (4, 3, 6, 6))
    exported = _export_checked(sim)
    assert exported.report == [] and "QLinearLeakyRelu" in {n.op_type for n in exported.model.graph.node}
    assert _steps(sim, exported, _feeds((16, 3, 6, 6), 9))["y"].max() == 0
