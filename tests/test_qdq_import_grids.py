"""from_onnx_qdq reads back the grid a weight was quantized on, not the container the export stored it in.

The QDQ export keeps an 8-bit MatMul/Gemm weight behind 16-bit activations in a 16-bit container (onnxruntime
would otherwise rewrite it into MatMulNBits). Oracle: the sim that wrote the file (its quantizers' precisions)
and its outputs."""
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
