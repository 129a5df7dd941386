"""The tiny CNN the API and bad-input tests share, its calibration batches and sim helpers."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel


def make_model(channels: int = 4, classes: int = 5, seed: int = 0, *, prefix: str = "",
               name: str = "tiny_cnn") -> onnx.ModelProto:
    """x[N,3,H,W] -> Conv(W,B) -> Relu -> GlobalAveragePool -> Flatten -> Gemm(W2,B2) -> y[N,classes].

    ``prefix`` renames every tensor (a structurally identical model with other tensor names).
    """
    p = prefix
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype(np.float32), f"{p}W"),
        numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), f"{p}B"),
        numpy_helper.from_array(rng.standard_normal((classes, channels)).astype(np.float32), f"{p}W2"),
        numpy_helper.from_array(rng.standard_normal(classes).astype(np.float32), f"{p}B2"),
    ]
    nodes = [
        helper.make_node("Conv", [f"{p}x", f"{p}W", f"{p}B"], [f"{p}c"], name=f"{p}conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", [f"{p}c"], [f"{p}r"], name=f"{p}relu"),
        helper.make_node("GlobalAveragePool", [f"{p}r"], [f"{p}g"], name=f"{p}gap"),
        helper.make_node("Flatten", [f"{p}g"], [f"{p}f"], name=f"{p}flatten"),
        helper.make_node("Gemm", [f"{p}f", f"{p}W2", f"{p}B2"], [f"{p}y"], name=f"{p}fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(f"{p}x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info(f"{p}y", TensorProto.FLOAT, ["N", classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def batch(seed: int = 0, n: int = 2, hw: int = 8, scale: float = 1.0) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": (scale * rng.standard_normal((n, 3, hw, hw))).astype(np.float32)}


def batches(count: int = 4, seed: int = 0, **kwargs) -> list[dict]:
    return [batch(seed + i, **kwargs) for i in range(count)]


def new_sim(model=None, **kwargs) -> QuantizationSimModel:
    kwargs.setdefault("progress", False)
    return QuantizationSimModel(make_model() if model is None else model, **kwargs)


def calibrated_sim(**kwargs) -> QuantizationSimModel:
    sim = new_sim(**kwargs)
    sim.compute_encodings(batches())
    return sim


def snapshot(sim) -> dict:
    """Everything a quantizer holds, by tensor, for before/after comparisons."""
    out = {}
    for name, q in sim.qc_quantize_op_dict.items():
        encs = q.get_encodings()
        out[name] = (
            q.enabled, q.is_encoding_frozen(), q.bitwidth, q.data_type, q.use_symmetric_encodings,
            None if encs is None else [(e.min, e.max, e.delta, e.offset, e.bw) for e in encs],
        )
    return out
