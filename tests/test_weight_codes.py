"""``weight_codes="uint8"``: 8-bit weight codes stored as uint8 (code + 128, zero point + 128) in the QDQ and
integer exports.

The shift is exact (the same dequantized weights), so these tests run on every CPU: onnxruntime's uint8 x
uint8 kernels do not saturate on AVX2 without VNNI (unlike its uint8 x int8 ones, `quantsim.graph.int8_kernels`),
and they give the integer and QDQ exports real coverage on such machines. Oracles: the exact sim (float
Q/DQ), numpy dequantization and unfused (float Q/DQ) runs of the int8 model, and the integer reference executor.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import BUILDERS  # tests/models.py
from onnx import TensorProto, numpy_helper

import quantsim
from quantsim.export.reference import compare_with_onnxruntime
from quantsim.export.weight_codes import resolve_weight_codes, shift_weight_codes
from quantsim.graph import int8_kernels

KERNEL_WEIGHT_SLOT = {"QLinearConv": 3, "QLinearMatMul": 3, "QGemm": 3, "ConvInteger": 1, "MatMulInteger": 1}


def _sim(name, *, zero_bias=False, config_file=None):
    model, feeds = BUILDERS[name]()
    if zero_bias:  # the int32 bias is the integer export's only approximation: without it, exact
        for tensor in model.graph.initializer:
            if tensor.name.endswith(".b"):
                tensor.CopyFrom(numpy_helper.from_array(np.zeros(tuple(tensor.dims), np.float32), tensor.name))
    kwargs = {"config_file": config_file} if config_file else {}
    sim = quantsim.QuantizationSimModel(model, progress=False, **kwargs)
    sim.compute_encodings([feeds(i, 4) for i in range(4)])
    return sim, feeds


def _steps(sim, model_or_session, feed) -> np.ndarray:
    session = model_or_session if isinstance(model_or_session, ort.InferenceSession) else ort.InferenceSession(
        model_or_session.SerializeToString(), providers=["CPUExecutionProvider"])
    name = session.get_outputs()[0].name
    got = session.run([name], feed)[0]
    want = sim.session.run([name], feed)[0]
    q = sim.qc_quantize_op_dict[name]
    return np.rint(np.abs(got.astype(np.float64) - want) / float(np.max(q.encoding.scale)))


def _weight_types(model: onnx.ModelProto) -> list[int]:
    """Element types of the weight codes read by integer kernels and by the DequantizeLinear of Conv/MatMul/Gemm
    (int32 bias codes left out)."""
    inits = {t.name: t for t in model.graph.initializer}
    consumers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.op_type)
    types = []
    for node in model.graph.node:
        slot = KERNEL_WEIGHT_SLOT.get(node.op_type)
        if node.op_type == "DequantizeLinear" and set(consumers.get(node.output[0], [])) <= {"Conv", "MatMul", "Gemm"}:
            slot = 0
        if slot is not None and node.input[slot] in inits and inits[node.input[slot]].data_type != TensorProto.INT32:
            types.append(inits[node.input[slot]].data_type)
    return types


def _fused_ops(model: onnx.ModelProto, tmp_path) -> dict[str, int]:
    """Op counts of onnxruntime's optimized graph (what the default session fuses the QDQ model into)."""
    options = ort.SessionOptions()
    path = tmp_path / f"opt{len(list(tmp_path.iterdir()))}.onnx"
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("name", ["conv_relu", "gemm", "matmul"])
def test_uint8_integer_export_equals_the_sim_without_biases(name):
    """Per-channel Conv, Gemm (transB both ways) and MatMul on QLinear*/QGemm kernels: bit for bit."""
    sim, feeds = _sim(name, zero_bias=True)
    exported = sim.export_integer(weight_codes="uint8")
    types = _weight_types(exported.model)
    assert types and set(types) == {TensorProto.UINT8}
    assert _steps(sim, exported.model, feeds(100, 32)).max() == 0


@pytest.mark.parametrize("name", ["conv_relu", "residual", "gemm", "matmul", "pool"])
@pytest.mark.parametrize("config", ["per_channel", "per_tensor"])
def test_uint8_exports_agree_with_the_sim(name, config):
    """With biases: the integer model and the QDQ model in onnxruntime's default (fusing) session stay
    within two steps of the sim, per channel and per tensor (the int8 codes give up to 30 steps here)."""
    sim, feeds = _sim(name, config_file=config)
    feed = feeds(100, 64)
    for model in (sim.export_integer(weight_codes="uint8").model, sim.to_onnx_qdq(weight_codes="uint8")):
        assert set(_weight_types(model)) == {TensorProto.UINT8}
        steps = _steps(sim, model, feed)
        assert steps.max() <= 2 and np.mean(steps > 1) <= 0.001 and np.mean(steps > 0) <= 0.1, (
            steps.max(), np.mean(steps > 0))


def test_uint8_integer_export_agrees_with_the_reference_executor():
    sim, feeds = _sim("concat")
    report = compare_with_onnxruntime(sim.export_integer(weight_codes="uint8").model, feeds(7, 8))
    assert all(r["max_lsb_diff"] <= 1 and r["frac_exact"] >= 0.99 for r in report.values()), report


def _unfused(model: onnx.ModelProto, feed) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # Q/DQ run in float
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feed)


def _dequantized_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """``{DequantizeLinear node: (codes - zero point) * scale}`` of constant codes, computed in numpy."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            continue
        codes = inits[node.input[0]].astype(np.int64)
        scale = inits[node.input[1]].astype(np.float64)
        zero_point = inits[node.input[2]].astype(np.int64) if len(node.input) > 2 and node.input[2] else np.int64(0)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % max(codes.ndim, 1)
        shape = [-1 if i == axis else 1 for i in range(codes.ndim)] if scale.ndim else []
        values[node.name] = (codes - np.reshape(zero_point, shape)) * np.reshape(scale, shape)
    return values


@pytest.mark.parametrize("name", ["conv_relu", "gemm", "matmul", "mixed"])
def test_shift_is_exact_and_keeps_onnxruntime_fusion(name, tmp_path):
    """The uint8 model holds the same dequantized weights and computes the same numbers as the int8 one
    (Q/DQ run in float, no fusion), and onnxruntime fuses it into the same kernels."""
    sim, feeds = _sim(name)
    int8_model = sim.to_onnx_qdq()
    uint8_model = sim.to_onnx_qdq(weight_codes="uint8")
    want, got = _dequantized_weights(int8_model), _dequantized_weights(uint8_model)
    assert want.keys() == got.keys() and set(_weight_types(uint8_model)) == {TensorProto.UINT8}
    for key in want:
        np.testing.assert_array_equal(want[key], got[key])
    feed = feeds(3, 4)
    for w, g in zip(_unfused(int8_model, feed), _unfused(uint8_model, feed)):
        np.testing.assert_array_equal(w, g)
    assert _fused_ops(int8_model, tmp_path) == _fused_ops(uint8_model, tmp_path)
    assert any(op.startswith(("QLinear", "QGemm")) for op in _fused_ops(uint8_model, tmp_path))


def test_per_channel_zero_points_match_the_scales():
    """An absent (all-zero) per-channel zero point becomes a vector of 128 shaped like the scale."""
    sim, _ = _sim("conv_relu", config_file="per_channel")
    model = sim.to_onnx_qdq(weight_codes="uint8")
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    checked = 0
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in inits and inits[node.input[0]].dtype == np.uint8:
            scale, zero_point = inits[node.input[1]], inits[node.input[2]]
            assert zero_point.shape == scale.shape == (inits[node.input[0]].shape[0],)
            assert np.all(zero_point == 128)
            checked += 1
    assert checked == 2


def test_default_artefacts_keep_int8_codes(tmp_path):
    """weight_codes defaults to int8 in every file export; the encodings file never depends on it."""
    sim, _ = _sim("conv_relu")
    default = sim.to_onnx_qdq()
    assert set(_weight_types(default)) == {TensorProto.INT8}
    assert default.SerializeToString() == sim.to_onnx_qdq(weight_codes="int8").SerializeToString()
    assert set(_weight_types(sim.export_integer().model)) == {TensorProto.INT8}
    sim.export(tmp_path, "a", qdq=True)
    sim.export(tmp_path, "b", qdq=True, weight_codes="uint8")
    assert json.loads((tmp_path / "a.encodings").read_text()) == json.loads((tmp_path / "b.encodings").read_text())
    assert set(_weight_types(onnx.load(str(tmp_path / "a.qdq.onnx")))) == {TensorProto.INT8}
    assert set(_weight_types(onnx.load(str(tmp_path / "b.qdq.onnx")))) == {TensorProto.UINT8}


def test_auto_follows_the_probe_and_fused_session_is_exact_here(monkeypatch):
    for saturates, expected in ((True, "uint8"), (False, "int8")):
        monkeypatch.setattr(int8_kernels, "uint8_int8_kernels_saturate",
                            lambda provider="CPUExecutionProvider", s=saturates: s)
        monkeypatch.setattr("quantsim.export.weight_codes.uint8_int8_kernels_saturate",
                            lambda provider="CPUExecutionProvider", s=saturates: s)
        assert resolve_weight_codes("auto") == expected
    monkeypatch.undo()
    sim, feeds = _sim("conv_relu", zero_bias=True)
    steps = _steps(sim, sim.fused_session(), feeds(100, 16))  # "auto": exact kernels on this machine
    assert steps.max() <= 1 and np.mean(steps > 0) <= 0.01


def test_shared_weight_read_elsewhere_is_copied():
    """An int8 initializer that a non-kernel node reads too keeps its int8 original for that node."""
    w = numpy_helper.from_array(np.arange(-6, 6, dtype=np.int8).reshape(3, 4), "w")
    scale = numpy_helper.from_array(np.float32(0.5), "s")
    nodes = [onnx.helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], name="dq"),
             onnx.helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm"),
             onnx.helper.make_node("Cast", ["w"], ["z"], to=TensorProto.FLOAT, name="cast")]
    graph = onnx.helper.make_graph(nodes, "g", [onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                                   [onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
                                    onnx.helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 4])], [w, scale])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    want = _unfused(model, x)
    shifted, count = shift_weight_codes(onnx.ModelProto.FromString(model.SerializeToString()))
    assert count == 1
    onnx.checker.check_model(shifted, full_check=True)
    for a, b in zip(want, _unfused(shifted, x)):
        np.testing.assert_array_equal(a, b)
    assert {t.name: t.data_type for t in shifted.graph.initializer}["w"] == TensorProto.INT8


@pytest.mark.parametrize("call", ["to_onnx_qdq", "export_integer", "fused_session", "export"])
def test_bad_weight_codes_name_the_option(call, tmp_path):
    sim, _ = _sim("gemm")
    kwargs = {"path": tmp_path, "filename_prefix": "m"} if call == "export" else {}
    with pytest.raises(quantsim.QuantsimError, match="weight_codes.*'int8'.*'int4'"):
        getattr(sim, call)(weight_codes="int4", **kwargs)
    assert not list(tmp_path.iterdir())
