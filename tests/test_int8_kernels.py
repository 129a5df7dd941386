"""The probe of onnxruntime's uint8 x int8 kernels, against a second, independent check, and its warning."""
import logging

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import quantsim
from quantsim.graph import int8_kernels


def _qlinear_matmul_is_exact() -> bool:
    """A QLinearMatMul (another kernel than the probe's MatMulInteger) with large codes on unit scales, compared
    with numpy's exact integer product."""
    rng = np.random.default_rng(0)
    a = rng.integers(200, 256, (8, 96)).astype(np.uint8)
    b = rng.integers(100, 128, (96, 6)).astype(np.int8)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    out_scale = float(np.abs(exact).max()) / 100.0
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "sa"), numpy_helper.from_array(np.array(0, np.uint8), "za"),
             numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(1.0, np.float32), "sb"),
             numpy_helper.from_array(np.array(0, np.int8), "zb"),
             numpy_helper.from_array(np.array(out_scale, np.float32), "sy"), numpy_helper.from_array(np.array(0, np.uint8), "zy")]
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    expected = np.clip(np.rint(exact / out_scale), 0, 255)
    return bool(np.abs(got.astype(np.int64) - expected).max() <= 1)


def test_probe_agrees_with_an_independent_kernel_check():
    assert int8_kernels.uint8_int8_kernels_saturate() == (not _qlinear_matmul_is_exact())


def _calibrated_sim():
    w = numpy_helper.from_array(np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sim = quantsim.QuantizationSimModel(model, progress=False)
    sim.compute_encodings([{"x": np.random.default_rng(2).normal(size=(2, 4)).astype(np.float32)}])
    return sim


def test_exports_warn_once_where_the_kernels_saturate(monkeypatch, caplog):
    monkeypatch.setattr(int8_kernels, "uint8_int8_kernels_saturate", lambda provider="CPUExecutionProvider": True)
    monkeypatch.setattr(int8_kernels, "_warned", set())
    sim = _calibrated_sim()
    with caplog.at_level(logging.WARNING, logger="quantsim.graph.int8_kernels"):
        sim.to_onnx_qdq()
        sim.fused_session()
    notes = [r.getMessage() for r in caplog.records if "saturate" in r.getMessage()]
    assert len(notes) == 1 and notes[0].startswith("to_onnx_qdq: ")


def test_exports_are_quiet_where_the_kernels_are_exact(monkeypatch, caplog):
    monkeypatch.setattr(int8_kernels, "uint8_int8_kernels_saturate", lambda provider="CPUExecutionProvider": False)
    monkeypatch.setattr(int8_kernels, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="quantsim.graph.int8_kernels"):
        _calibrated_sim().to_onnx_qdq()
    assert not [r for r in caplog.records if "saturate" in r.getMessage()]
