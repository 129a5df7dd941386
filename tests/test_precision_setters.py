"""AIMET's precision setters: sim.set_tensor_precision, set_param_type, set_blockwise_quantization_for_weights."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_cnn import batch, batches, make_model  # tests/tiny_cnn.py

from quantsim import (
    InvalidArgumentError,
    PerBlock,
    QuantizationSimModel,
    set_blockwise_quantization_for_weights,
    set_param_type,
)


def _sim(**kwargs):
    sim = QuantizationSimModel(make_model(channels=8, **kwargs), progress=False)
    sim.compute_encodings(batches())
    return sim


def _state(sim):
    return [(q.name, q.spec, q.enabled) for q in sim.quantizers]


def test_set_tensor_precision_walks_up_to_the_deciding_quantizer():
    sim = _sim()
    # the tiny CNN's Relu output shares the Conv's output quantizer; 'f' (Flatten) shares GAP's grid
    changed = sim.set_tensor_precision(["r", "f"], "float16")
    deciding = {q.name for q in changed}
    assert sim.qc_quantize_op_dict["r"] in changed
    assert all(q.precision().is_float for q in changed) and len(deciding) == len(changed)
    sim.compute_encodings(batches())
    out = sim.session.run(None, batch(9))[0]
    assert np.isfinite(out).all()


def test_set_tensor_precision_errors_name_the_tensor_and_change_nothing():
    sim = _sim()
    before = _state(sim)
    with pytest.raises(InvalidArgumentError, match="'nope' is not a tensor"):
        sim.set_tensor_precision(["r", "nope"], "int16")
    sim.qc_quantize_op_dict["x"].enabled = False
    before = _state(sim)
    with pytest.raises(InvalidArgumentError, match=r"no enabled quantizer decides \['x'\]"):
        sim.set_tensor_precision(["r", "x"], "int16")
    assert _state(sim) == before
    with pytest.warns(UserWarning, match="skipped"):
        changed = sim.set_tensor_precision(["r", "x"], "int16", strict=False)
    assert [q.precision().bits for q in changed] == [16]


def test_set_param_type_changes_weights_but_not_biases():
    sim = _sim()
    changed = set_param_type(sim, "int4", op_types=["Conv", "Gemm"])
    assert {q.name for q in changed} == {"W", "W2"}
    assert sim.qc_quantize_op_dict["W"].bitwidth == 4
    assert all(q.param_type != "bias" for q in changed)
    changed = set_param_type(sim, "int16", nodes_to_include=["fc"])
    assert [q.name for q in changed] == ["W2"] and sim.qc_quantize_op_dict["W"].bitwidth == 4
    with pytest.raises(InvalidArgumentError, match="unknown node name"):
        set_param_type(sim, "int8", nodes_to_include=["fcc"])
    with pytest.raises(InvalidArgumentError, match="node 'relu' .* has no parameter quantizer"):
        set_param_type(sim, "int8", nodes_to_include=["relu"])
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        set_param_type(sim, "int8")


def test_blockwise_weights_get_one_scale_per_channel_and_block():
    sim = _sim()
    changed = set_blockwise_quantization_for_weights(sim, ["Gemm"], 4, True, 4)  # W2 is [5 classes, 8 channels]
    assert [q.name for q in changed] == ["W2"]
    q = sim.qc_quantize_op_dict["W2"]
    assert q.spec.granularity == PerBlock(0, 1, 4) and q.bitwidth == 4 and q.spec.symmetric
    sim.compute_encodings(batches())
    assert q.encoding.scale.shape == (5, 2)
    # oracle: each (row, block) of the fake-quantized weight lies on its own symmetric 4-bit grid
    from quantsim import fake_quantize

    weight = sim.get_weight("W2")
    rounded = fake_quantize(weight, q.encoding)
    for row in range(5):
        for block in range(2):
            step = float(q.encoding.scale[row, block])
            part = rounded[row, block * 4:(block + 1) * 4] / step
            assert np.allclose(part, np.round(part), atol=1e-4) and np.abs(part).max() <= 8


def test_blockwise_refuses_block_sizes_that_do_not_divide():
    sim = _sim()
    before = _state(sim)
    with pytest.raises(InvalidArgumentError, match="block size 3 does not divide"):
        set_blockwise_quantization_for_weights(sim, "Gemm", 4, True, 3, strict=True)
    assert _state(sim) == before
    with pytest.warns(UserWarning, match="left as they were"):
        assert set_blockwise_quantization_for_weights(sim, "Gemm", 4, True, 3) == []
    with pytest.raises(InvalidArgumentError, match="positive integer"):
        set_blockwise_quantization_for_weights(sim, "Gemm", 4, True, 0)
