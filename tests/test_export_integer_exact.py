"""``export_integer(exact=True)`` (the default): no accepted approximation, HardSwish / HardSigmoid as exact tables.

With ``exact=False`` HardSwish and HardSigmoid run as QLinearAdd/QLinearMul chains accepted within one output
step of the exact table (`quantsim.export.integer.piecewise.TOLERANCE`); those one-step errors then grow
through the layers after them. By default they keep the table, so the integer model equals the (int32-bias) sim.
Oracle for the tables: the function in float64 numpy on each code's real value, rounded ties-to-even.
"""
from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import quantsim


def _model() -> onnx.ModelProto:
    """Conv(3->8) -> HardSwish -> Conv(8->8) -> HardSigmoid, plus the HardSwish output as a graph output."""
    rng = np.random.default_rng(21)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * k).astype(np.float32), n)
             for n, s, k in [("w1", (8, 3, 3, 3), 0.6), ("b1", (8,), 0.5), ("w2", (8, 8, 3, 3), 0.3), ("b2", (8,), 0.5)]]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c1"], ["h"], name="hswish"),
             helper.make_node("Conv", ["h", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSigmoid", ["c2"], ["y"], name="hsigmoid", alpha=0.2, beta=0.5)]
    graph = helper.make_graph(nodes, "hs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 16, 16]),
                               helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 8, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds(seed: int, n: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((4, 3, 16, 16)) * 1.5).astype(np.float32)} for _ in range(n)]


@functools.cache
def _sim() -> quantsim.QuantizationSimModel:
    sim = quantsim.QuantizationSimModel(_model(), progress=False)
    sim.compute_encodings(_feeds(1, 3))
    return sim


def _steps(sim, exported) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    steps: dict[str, list] = {"y": [], "h": []}
    for feed in _feeds(2, 3):
        for k, (ours, theirs) in enumerate(zip(sim.session.run(None, feed), session.run(None, feed))):
            name = ("y", "h")[k]
            scale = float(sim.qc_quantize_op_dict[name].encoding.scale)
            steps[name].append(np.rint(np.abs(ours.astype(np.float64) - theirs) / scale))
    return {k: np.concatenate([s.reshape(-1) for s in v]) for k, v in steps.items()}


def _entry(exported, function: str) -> dict:
    return next(e for e in exported.requant.values() if e.get("function") == function)


def test_default_is_bit_exact_and_the_chains_are_within_one_step():
    sim = _sim()
    chain = sim.export_integer(weight_codes="uint8", exact=False)
    exact = sim.export_integer(weight_codes="uint8")
    assert _entry(chain, "HardSwish")["op"] != "LUT" and _entry(exact, "HardSwish")["op"] == "LUT"
    assert _entry(exact, "HardSigmoid")["op"] == "LUT"
    before, after = _steps(sim, chain), _steps(sim, exact)
    # before: the chain's accepted one-step errors on HardSwish outputs (measured: 1.5% of them), which the
    # next Conv and HardSigmoid's steep slope grow (measured: 3% of outputs off, by up to 12 steps)
    assert before["h"].max() == 1 and np.mean(before["h"] > 0.5) > 0.001
    assert before["y"].max() > 1
    # after: bit for bit, HardSwish and what follows it
    assert after["h"].max() == 0 and after["y"].max() == 0
    assert "HardSwish/HardSigmoid: 2; export_integer keeps exact tables" in str(sim)


def test_exact_tables_equal_the_hand_computed_functions():
    exact = _sim().export_integer(weight_codes="uint8")
    for function, f in [("HardSwish", lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
                        ("HardSigmoid", lambda x: np.clip(0.2 * x + 0.5, 0, 1))]:
        entry = _entry(exact, function)
        x = (np.arange(256) - entry["input_zero_point"]) * np.float64(np.float32(entry["input_scale"]))
        steps = f(x) / np.float64(np.float32(entry["output_scale"]))
        want = np.clip(np.rint(steps) + entry["output_zero_point"], 0, 255)
        near_midpoint = np.abs(np.abs(steps - np.floor(steps)) - 0.5) < 1e-4
        table = np.asarray(entry["table"])
        assert np.array_equal(table[~near_midpoint], want[~near_midpoint]), function
        assert np.abs(table - want).max() <= 1, function
