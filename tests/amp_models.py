"""A three-layer MLP whose layers differ in how much 4-bit weights hurt them, and its scoring callback,
for the AMP tests (module level, so worker processes can unpickle them)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel

WIDTH = 8


def mlp(outliers: tuple[float, ...] = (12.0, 4.0, 1.0), seed: int = 0) -> onnx.ModelProto:
    """x[N,8] -> Gemm(W1) -> Relu -> Gemm(W2) -> Relu -> Gemm(W3) -> y[N,8]; layer i's weights hold one
    outlier of ``outliers[i]`` times their spread, so a 4-bit grid loses the rest of layer 0 first."""
    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "x"
    for i, outlier in enumerate(outliers):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        w[0, 0] = outlier * float(np.abs(w).max())
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(np.zeros(WIDTH, np.float32), f"B{i}")]
        out = f"h{i}" if i < len(outliers) - 1 else "y"
        nodes.append(helper.make_node("Gemm", [x, f"W{i}", f"B{i}"], [f"g{i}" if out != "y" else "y"], name=f"fc{i}"))
        if out != "y":
            nodes.append(helper.make_node("Relu", [f"g{i}"], [out], name=f"relu{i}"))
        x = out
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", WIDTH])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def feeds(count: int = 3, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((16, WIDTH)).astype(np.float32)} for _ in range(count)]


def new_sim(**kwargs) -> QuantizationSimModel:
    kwargs.setdefault("progress", False)
    return QuantizationSimModel(mlp(), **kwargs)


def _expected() -> list[np.ndarray]:
    reference = QuantizationSimModel(mlp(), progress=False)
    for q in reference.quantizers:
        q.enabled = False
    return [reference.session.run(None, f)[0] for f in feeds(2, seed=7)]


_EXPECTED: list[np.ndarray] = []


def score(session) -> float:
    """Negative mean squared error against the float model on held-out batches (higher is better)."""
    if not _EXPECTED:
        _EXPECTED.extend(_expected())
    got = [session.run(None, f)[0] for f in feeds(2, seed=7)]
    return -float(np.mean([np.mean((e - g) ** 2) for e, g in zip(_EXPECTED, got)]))


def misleading_score(session) -> float:
    """`score` upside down: a phase-1 callback that ranks the most harmful flips as the least harmful."""
    return -score(session)


def masked_matmuls(fill: float = -1e4) -> onnx.ModelProto:
    """x[4,8] -> MatMul(w1) -> Add(mask: 0 or ``fill`` per column) -> MatMul(w2) -> y[4,8]: the masked tensor's
    8-bit grid collapses, so calibration's range health gives it 16 bits whatever AMP asks (with a fill of
    -1e9 16 bits collapse too: an 8-bit request leaves it float)."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) / 3 for _ in range(2))
    mask = np.zeros((1, WIDTH), np.float32)
    mask[0, 6:] = fill
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
         helper.make_node("Add", ["a", "mask"], ["m"], name="add"),
         helper.make_node("MatMul", ["m", "w2"], ["y"], name="mm2")], "masked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, WIDTH])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(mask, "mask")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def masked_feeds(count: int = 3, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, WIDTH)).astype(np.float32)} for _ in range(count)]


def output_score(model: onnx.ModelProto, data: list[dict]):
    """A callback scoring a sim of ``model``: minus the mean squared error of its output against the float
    model's on ``data`` (higher is better)."""
    reference = QuantizationSimModel(model, progress=False)
    for q in reference.quantizers:
        q.enabled = False
    expected = [reference.session.run(None, f)[0] for f in data]

    def scored(session) -> float:
        return -float(np.mean([np.mean((e - session.run(None, f)[0]) ** 2) for e, f in zip(expected, data)]))

    return scored


#: step of `coarse_score`: mean squared errors below it score as the float model does
COARSE_STEP = 0.01


def coarse_score(session) -> float:
    """`score` counted in whole steps of `COARSE_STEP` (``-floor(mse / step) * step``), like a task metric
    against FP32 (agreement, CER) that cannot see small errors: the float model and a group whose error stays
    under one step both score 0, the ceiling AMP's saturation rule looks for."""
    return -float(np.floor(-score(session) / COARSE_STEP)) * COARSE_STEP
