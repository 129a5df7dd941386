"""The model and data every parity step uses, and the read-outs a user would look at.

The model is a small depthwise CNN with unfolded BatchNormalization (as exported from a training framework):
Conv-BN-Relu, depthwise Conv-BN-Relu, pointwise Conv-Relu, a residual Add, global pooling and a Gemm
classifier. Its BN statistics are far from identity so that folding matters numerically.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INPUT = "input"
BATCHES = 8
BATCH = 4
SIZE = 16


def _bn(rng: np.random.Generator, prefix: str, channels: int) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(a.astype(np.float32), f"{prefix}.{n}") for n, a in (
        ("scale", rng.uniform(0.3, 2.5, channels)), ("bias", rng.normal(0, 0.3, channels)),
        ("mean", rng.normal(0, 0.4, channels)), ("var", rng.uniform(0.2, 3.0, channels)))]


def build_model(seed: int = 0) -> onnx.ModelProto:
    """Conv(3->8)-BN-Relu -> depthwise Conv-BN-Relu -> Conv 1x1(8->16)-Relu -> + Conv 1x1 shortcut ->
    GlobalAveragePool -> Flatten -> Gemm(16->10), opset 17, dynamic batch."""
    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:])) or 1
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32), name)

    inits = [w("conv1.weight", 8, 3, 3, 3), numpy_helper.from_array(rng.normal(0, .1, 8).astype(np.float32), "conv1.bias"),
             *_bn(rng, "bn1", 8), w("dw.weight", 8, 1, 3, 3), *_bn(rng, "bn2", 8),
             w("pw.weight", 16, 8, 1, 1), numpy_helper.from_array(rng.normal(0, .1, 16).astype(np.float32), "pw.bias"),
             w("short.weight", 16, 8, 1, 1), w("fc.weight", 10, 16),
             numpy_helper.from_array(rng.normal(0, .1, 10).astype(np.float32), "fc.bias")]
    bn_inputs = ["scale", "bias", "mean", "var"]
    nodes = [
        helper.make_node("Conv", [INPUT, "conv1.weight", "conv1.bias"], ["conv1_out"], "conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv1_out"] + [f"bn1.{n}" for n in bn_inputs], ["bn1_out"], "bn1"),
        helper.make_node("Relu", ["bn1_out"], ["relu1_out"], "relu1"),
        helper.make_node("Conv", ["relu1_out", "dw.weight"], ["dw_out"], "dw", pads=[1, 1, 1, 1], group=8),
        helper.make_node("BatchNormalization", ["dw_out"] + [f"bn2.{n}" for n in bn_inputs], ["bn2_out"], "bn2"),
        helper.make_node("Relu", ["bn2_out"], ["relu2_out"], "relu2"),
        helper.make_node("Conv", ["relu2_out", "pw.weight", "pw.bias"], ["pw_out"], "pw"),
        helper.make_node("Relu", ["pw_out"], ["relu3_out"], "relu3"),
        helper.make_node("Conv", ["relu1_out", "short.weight"], ["short_out"], "short"),
        helper.make_node("Add", ["relu3_out", "short_out"], ["add_out"], "add"),
        helper.make_node("GlobalAveragePool", ["add_out"], ["pool_out"], "pool"),
        helper.make_node("Flatten", ["pool_out"], ["flat_out"], "flatten"),
        helper.make_node("Gemm", ["flat_out", "fc.weight", "fc.bias"], ["logits"], "fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "parity_cnn",
                              [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["N", 3, SIZE, SIZE])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def calibration(seed: int = 1) -> list[dict[str, np.ndarray]]:
    """`BATCHES` batches of `BATCH` images."""
    rng = np.random.default_rng(seed)
    return [{INPUT: rng.standard_normal((BATCH, 3, SIZE, SIZE)).astype(np.float32)} for _ in range(BATCHES)]


def probe() -> dict[str, np.ndarray]:
    """Held-out inputs the outputs are compared on."""
    rng = np.random.default_rng(99)
    return {INPUT: rng.standard_normal((16, 3, SIZE, SIZE)).astype(np.float32)}


def float_outputs(model: onnx.ModelProto) -> np.ndarray:
    """The float model's logits on the probe."""
    import onnxruntime as ort
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, probe())[0]


def sim_outputs(sim) -> np.ndarray:
    """The sim's logits on the probe (first output: aimet renames it ``logits_updated``)."""
    return np.asarray(sim.session.run(None, probe())[0])


def read_encodings(path: str | Path) -> dict:
    """The exported encodings file, summarised per version: section -> {tensor: (bitwidth, dtype, symmetric,
    channels)}."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict) and data.get("version") == "2.0.0":
        out: dict[str, dict] = {"encodings": {}}
        for e in data.get("encodings", []):
            scale = e.get("y_scale", e.get("per_channel_float_scale"))
            n = len(scale) if isinstance(scale, list) else 1
            out["encodings"][e["name"]] = (e.get("output_dtype"), n, "block_size" in e)
        return out
    summary: dict[str, dict] = {}
    for section in ("activation_encodings", "param_encodings"):
        entries = data.get(section, {})
        items = entries.items() if isinstance(entries, dict) else ((e["name"], e) for e in entries)
        sec = {}
        for name, e in items:
            first = e[0] if isinstance(e, list) else e
            n = len(e) if isinstance(e, list) else len(first.get("scale", [0]))
            sec[name] = (first.get("bitwidth"), first.get("dtype"), str(first.get("is_symmetric")), n)
        summary[section] = sec
    return summary
