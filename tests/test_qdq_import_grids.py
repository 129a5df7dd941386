"""from_onnx_qdq reads back what the QDQ export's onnxruntime-specific spellings stand for.

* The export keeps an 8-bit MatMul/Gemm weight behind 16-bit activations in a 16-bit container (onnxruntime
  would otherwise rewrite it into MatMulNBits): read back as the 8-bit grid it is.
* An op with a float weight (float16 or disabled quantizer) reads its quantized input through
  Cast -> Sub -> Mul (onnxruntime's WeightBiasQuantization leaves that alone): read back as the
  DequantizeLinear it spells.

Oracle: the sim that wrote the file (its quantizers) and its outputs."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from models import BUILDERS
from onnx import TensorProto

from quantsim import QuantizationSimModel, int8, int16
from quantsim.export.legality import qdq_report


def _sim(name: str, **kwargs) -> tuple[QuantizationSimModel, dict]:
    model, feeds = BUILDERS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, progress=False, **kwargs)
        sim.compute_encodings([feeds(i, 2) for i in range(3)])
    return sim, feeds(7, 2)


@pytest.mark.parametrize("name, weight", [("gemm", "fc1.w"), ("layernorm", "mm.w")])
def test_an_8_bit_weight_in_a_16_bit_container_is_read_back_as_8_bits(name, weight):
    """It was read as a 16-bit weight: the imported sim differed from the file's (re-calibrating it, or
    exporting its encodings, gave a 16-bit grid), and the target report saw int16 x int16 products."""
    sim, feed = _sim(name, activation_type=int16)
    qdq = sim.to_onnx_qdq()
    containers = {t.name: t.data_type for t in qdq.graph.initializer}
    assert TensorProto.INT16 in containers.values()  # the export's container, which this test is about
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = QuantizationSimModel.from_onnx_qdq(qdq, progress=False)
    assert back.qc_quantize_op_dict[weight].precision() == sim.qc_quantize_op_dict[weight].precision() == int8
    np.testing.assert_array_equal(back.session.run(None, feed)[0], sim.session.run(None, feed)[0])
    assert not [f for f in qdq_report(qdq, "generic-npu").warnings if f.rule == "accumulator"]


def test_a_16_bit_weight_stays_16_bits():
    sim, feed = _sim("gemm", activation_type=int16, param_type=int16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = QuantizationSimModel.from_onnx_qdq(sim.to_onnx_qdq(), progress=False)
    assert back.qc_quantize_op_dict["fc1.w"].precision() == int16
    np.testing.assert_array_equal(back.session.run(None, feed)[0], sim.session.run(None, feed)[0])


@pytest.mark.parametrize("name, weight", [("gemm", "fc1.w"), ("matmul", "mm1.w")])
@pytest.mark.parametrize("change", ["float16", "disabled"])
def test_a_float_weights_input_read_through_cast_sub_mul_is_imported(name, weight, change):
    """The import refused such a file ('already contains quantization nodes'): the QuantizeLinear's codes went
    to a Cast, not a DequantizeLinear."""
    model, feeds = BUILDERS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, progress=False)
        if change == "float16":
            sim.qc_quantize_op_dict[weight].set_precision("float16")
        else:
            sim.qc_quantize_op_dict[weight].enabled = False
        sim.compute_encodings([feeds(i, 2) for i in range(3)])
        qdq = sim.to_onnx_qdq()
        assert "Cast" in [n.op_type for n in qdq.graph.node]  # the float read this test is about
        back = QuantizationSimModel.from_onnx_qdq(qdq, progress=False)
    x_in, x_back = sim.qc_quantize_op_dict["x"], back.qc_quantize_op_dict["x"]
    assert x_back.enabled and np.allclose(x_back.encoding.scale, x_in.encoding.scale, rtol=1e-7)
    for seed in (7, 8):
        feed = feeds(seed, 2)
        np.testing.assert_array_equal(back.session.run(None, feed)[0], sim.session.run(None, feed)[0])


@pytest.mark.parametrize("name, weight, axis", [("layernorm", "mm.w", 1), ("softmax", "mm.w", 1), ("gemm", "fc2.w", 1),
                                                ("matmul", "mm1.w", 1), ("conv_relu", "conv2.w", 0)])
def test_aimets_form_per_channel_weights_keep_their_axis(name, weight, axis):
    """AIMET's to_onnx_qdq form (prequantize_constants=False, aimet-onnx's default): a weight is a float constant
    behind QuantizeLinear(axis) -> DequantizeLinear. The import read that axis modulo 1 (no shape given), i.e.
    always 0: a square MatMul weight (16 x 16) got its column scales on the rows, in silence (the imported
    layernorm model's output off by 20% of its range, softmax's by 61%); other shapes were refused."""
    sim, feed = _sim(name)
    qdq = sim.to_onnx_qdq(prequantize_constants=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = QuantizationSimModel.from_onnx_qdq(qdq, progress=False)
    q_in, q_back = sim.qc_quantize_op_dict[weight], back.qc_quantize_op_dict[weight]
    assert q_in.spec.granularity.axis == q_back.spec.granularity.axis == axis
    np.testing.assert_allclose(q_back.encoding.scale, q_in.encoding.scale, rtol=1e-6)
    np.testing.assert_array_equal(back.session.run(None, feed)[0], sim.session.run(None, feed)[0])


@pytest.mark.parametrize("name", ["gemm", "conv_relu"])
def test_lpbq_weights_in_aimets_form_round_trip(name):
    """prequantize_constants=False turned an LPBQ weight's integer block scales into a float Q -> DQ pair, so
    the weight's scale was no longer a DequantizeLinear of constants and from_onnx_qdq refused the file."""
    from quantsim import set_lpbq_for_params
    model, feeds = BUILDERS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, progress=False)
        changed = set_lpbq_for_params(sim, 4, 4, op_types=("Conv", "Gemm"))
        sim.compute_encodings([feeds(i, 2) for i in range(3)])
        back = QuantizationSimModel.from_onnx_qdq(sim.to_onnx_qdq(prequantize_constants=False), progress=False)
    assert changed
    for q in changed:
        assert back.qc_quantize_op_dict[q.name].spec == q.spec
    feed = feeds(7, 2)
    np.testing.assert_array_equal(back.session.run(None, feed)[0], sim.session.run(None, feed)[0])
