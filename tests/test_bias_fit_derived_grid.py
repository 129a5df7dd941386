"""An int32 bias behind data movement: the weight scale is widened on the grid the input is really on.

A Conv reading one output of a Split has no input quantizer of its own: its input is on the grid of the
Split's input. At 16 bits ``s_in * s_w`` is about 1e-10, so a bias of 2 overflows int32 there. Unwidened, the
sim and the QDQ export kept that bias float, and onnxruntime's BiasQuantization (every default session)
rewrote it to ``Cast<int32>(round(b / (s_in s_w)))`` without a range check: the deployed model added another
bias (YOLOv8n at W16A16: 44 dB in the sim, 19 dB in onnxruntime). The oracles: the float model (the sim and
the export must both stay close to it) and the export run with QDQ optimizations off (exactly the sim).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantsim import QuantizationSimModel

BIAS = np.array([2.0, -2.5, 1.5, 3.0], np.float32)


def split_conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w0 = (0.3 * rng.standard_normal((8, 3, 3, 3))).astype(np.float32)
    w1 = (0.05 * rng.standard_normal((4, 4, 3, 3))).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["y0"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Split", ["y0", "halves"], ["a", "b"], axis=1, name="split"),
        helper.make_node("Conv", ["b", "w1", "b1"], ["y1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Add", ["y1", "a"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes, "split_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
        [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(BIAS, "b1"),
         numpy_helper.from_array(np.array([4, 4], np.int64), "halves")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


FEEDS = [{"x": np.random.default_rng(s).standard_normal((1, 3, 16, 16)).astype(np.float32)} for s in range(3)]


def _session(model: onnx.ModelProto, qdq_optimizations: bool = True) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if not qdq_optimizations:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _sqnr(ref: np.ndarray, out: np.ndarray) -> float:
    ref, out = ref.astype(np.float64), out.astype(np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - out) ** 2), 1e-30)))


@pytest.mark.parametrize("bits", [16, 8])
def test_the_deployed_model_adds_the_bias_the_sim_adds(bits):
    model = split_conv_model()
    sim = QuantizationSimModel(model, param_type=f"int{bits}", activation_type=f"int{bits}", progress=False)
    sim.compute_encodings(FEEDS)
    assert sim.qc_quantize_op_dict.get("b") is None or not sim.qc_quantize_op_dict["b"].enabled  # a derived grid
    x_scale = float(sim.qc_quantize_op_dict["y0"].encoding.scale)
    w_scale = np.asarray(sim.qc_quantize_op_dict["w1"].encoding.scale, np.float64)
    assert np.all(np.abs(BIAS.astype(np.float64)) / (x_scale * w_scale) <= 2 ** 31 - 1)  # widened to fit int32

    qdq = sim.to_onnx_qdq(weight_codes="uint8")
    biases = [n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "b1"]
    assert len(biases) == 1  # the bias is exported as int32 codes on s_in * s_w, not left float

    out_shape = sim.qc_quantize_op_dict["y"].encoding.scale
    float_session = _session(model)
    for feed in FEEDS:
        ref = float_session.run(None, feed)[0]
        simulated = sim.session.run(None, feed)[0]
        deployed = _session(qdq).run(None, feed)[0]
        np.testing.assert_array_equal(_session(qdq, qdq_optimizations=False).run(None, feed)[0], simulated)
        assert np.max(np.abs(deployed - simulated)) <= 1.01 * float(out_shape)  # at most one output step
        assert _sqnr(ref, deployed) > (60 if bits == 16 else 25)


def test_a_frozen_narrow_weight_encoding_warns_that_onnxruntime_will_cast_its_bias():
    """A weight encoding frozen before the widening (loaded from a file, set by hand) keeps its overflowing
    bias float; the QDQ export cannot store it on s_in * s_w, and onnxruntime would cast it: it says so."""
    import dataclasses
    import warnings

    from quantsim.errors import QuantsimWarning

    sim = QuantizationSimModel(split_conv_model(), param_type="int16", activation_type="int16", progress=False)
    sim.compute_encodings(FEEDS)
    with warnings.catch_warnings(record=True) as none:
        warnings.simplefilter("always")
        sim.to_onnx_qdq()
    assert not [w for w in none if "BiasQuantization" in str(w.message)]  # widened: nothing to say
    q = sim.qc_quantize_op_dict["w1"]
    q.set_encoding(dataclasses.replace(q.encoding, scale=np.asarray(q.encoding.scale) / 64))  # unwidened
    q.freeze_encodings()
    sim.compute_encodings(FEEDS)  # a frozen encoding is never widened
    with pytest.warns(QuantsimWarning, match=r"bias of conv1 overflows int32.*BiasQuantization"):
        sim.to_onnx_qdq()
