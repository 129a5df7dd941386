"""The exact sim leaves out Q/DQ pairs that map every value to itself, and its outputs stay bit-identical.

A quantizer on the output of a value-selecting op (nearest Resize, MaxPool, Concat, Transpose, Relu, ...)
whose data inputs are already on exactly the same grid is an identity; `build_sim_model` drops it from the
``weights="fake"`` graph (the exact sim) and keeps it in the QDQ form.
"""
from __future__ import annotations

import numpy as np
import pytest
from models import image_feeds, make_model
from onnx import TensorProto, helper, numpy_helper

import quantsim
from quantsim.core.numerics import Encoding
from quantsim.graph.session import make_session
from quantsim.sim.build import build_sim_model
from quantsim.sim.redundant import selects_values


def _model():
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "c1.w"),
        numpy_helper.from_array((rng.standard_normal(4) * 0.1).astype(np.float32), "c1.b"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        numpy_helper.from_array(np.array([0, -1], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["c1.out"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1.out"], ["r1.out"], name="r1"),
        helper.make_node("Resize", ["r1.out", "", "scales"], ["up.out"], name="up", mode="nearest"),
        helper.make_node("Resize", ["r1.out", "", "scales"], ["lin.out"], name="lin", mode="linear"),
        helper.make_node("MaxPool", ["up.out"], ["mp.out"], name="mp", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["up.out", "mp.out"], ["cat.out"], name="cat", axis=1),
        helper.make_node("Transpose", ["cat.out"], ["tr.out"], name="tr", perm=[0, 2, 3, 1]),
        helper.make_node("Relu", ["lin.out"], ["y2"], name="r2"),
        helper.make_node("Reshape", ["tr.out", "shape"], ["y"], name="flat"),
    ]
    model = make_model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 512]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["N", 4, 8, 8])], inits,
    )
    feeds = image_feeds("x", 3, 4)
    return model, [feeds(seed, 2) for seed in range(3)], [feeds(seed, 3) for seed in (10, 11)]


def _quantized(model) -> set[str]:
    """Tensors the sim quantizes (a model input's quantized copy is ``<input>/quantized``)."""
    outs = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {o.removesuffix("/quantized") for o in outs}


def _run(model, feeds):
    session = make_session(model)
    return [session.run(None, f) for f in feeds]


def _assert_bit_identical(a, b):
    for outs_a, outs_b in zip(a, b):
        for x, y in zip(outs_a, outs_b):
            assert x.dtype == y.dtype and np.array_equal(x, y)


def _sim(activation_type: str = "int8"):
    model, calib, _ = _model()
    sim = quantsim.QuantizationSimModel(model, activation_type=activation_type)
    sim.progress = False
    sim.compute_encodings(calib)
    return sim


@pytest.fixture()
def sim():
    return _sim()


def test_identity_pairs_are_dropped_and_outputs_stay_bit_identical(sim):
    _, _, evals = _model()
    full = build_sim_model(sim.model, sim.quantizers, skip_redundant=False)
    pruned = sim.sim_model()
    assert {"x", "r1.out", "up.out", "lin.out", "y2", "cat.out"} <= _quantized(full)
    # up.out: nearest Resize of r1.out (same quantizer); y2: Relu of lin.out (same quantizer); cat.out: Concat
    # of up.out and MaxPool(up.out) on the same grid. lin.out (linear Resize) interpolates: kept.
    assert _quantized(full) - _quantized(pruned) == {"up.out", "y2", "cat.out"}
    assert {"x", "r1.out", "lin.out"} <= _quantized(pruned)
    _assert_bit_identical(_run(full, evals), _run(pruned, evals))
    _assert_bit_identical(_run(full, evals), [sim.session.run(None, f) for f in evals])


@pytest.mark.parametrize("activation_type", ["int2", "int4", "int16", "float16"])
def test_other_activation_grids_stay_bit_identical(activation_type):
    sim = _sim(activation_type)
    _, _, evals = _model()
    full = build_sim_model(sim.model, sim.quantizers, skip_redundant=False)
    pruned = sim.sim_model()
    assert len(pruned.graph.node) < len(full.graph.node)
    _assert_bit_identical(_run(full, evals), _run(pruned, evals))


def test_qdq_form_keeps_every_quantizer(sim):
    full = build_sim_model(sim.model, sim.quantizers, skip_redundant=False)
    qdq = build_sim_model(sim.model, sim.quantizers, weights="qdq")
    assert _quantized(full) <= _quantized(qdq)


def test_a_different_grid_is_kept(sim):
    _, _, evals = _model()
    q = sim.qc_quantize_op_dict["cat.out"]
    enc = q.encoding
    q.set_encoding(Encoding(scale=enc.scale * 1.5, zero_point=enc.zero_point, bits=enc.bits, signed=enc.signed,
                            qmin=enc.qmin, qmax=enc.qmax, symmetric=enc.symmetric))
    pruned = sim.sim_model()
    assert "cat.out" in _quantized(pruned) and "up.out" not in _quantized(pruned)
    full = build_sim_model(sim.model, sim.quantizers, skip_redundant=False)
    _assert_bit_identical(_run(full, evals), _run(pruned, evals))


@pytest.mark.parametrize(
    "op, attrs, selects",
    [
        ("MaxPool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, True),
        ("MaxPool", {"kernel_shape": [3, 3], "ceil_mode": 1}, False),
        ("MaxPool", {"kernel_shape": [2, 2], "pads": [2, 0, 0, 0]}, False),
        ("MaxPool", {"kernel_shape": [3, 3], "dilations": [2, 2]}, False),
        ("Resize", {}, True),
        ("Resize", {"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize"}, False),
        ("Resize", {"mode": "cubic"}, False),
        ("Upsample", {"mode": "linear"}, False),
        ("Concat", {"axis": 0}, True),
        ("AveragePool", {"kernel_shape": [2, 2]}, False),
        ("Clip", {}, False),
    ],
)
def test_value_selecting_ops(op, attrs, selects):
    node = helper.make_node(op, ["a"], ["b"], **attrs)
    assert selects_values(node, 0) is selects


def test_maxpool_indices_output_does_not_select():
    node = helper.make_node("MaxPool", ["a"], ["b", "i"], kernel_shape=[2, 2])
    assert selects_values(node, 0) and not selects_values(node, 1)


def test_sim_and_calibration_sessions_share_one_copy_of_big_weights():
    from tiny_cnn import batches, make_model

    from quantsim import QuantizationSimModel

    sim = QuantizationSimModel(make_model(channels=16), progress=False)
    sim.compute_encodings(batches())
    first = {name: id(entry[1]) for name, entry in sim._constant_memo.items()}
    assert "W" in first  # the 16x3x3x3 weight is big enough to stay out of the model
    sim.session.run(None, batches(1)[0])
    assert {name: id(entry[1]) for name, entry in sim._constant_memo.items()} == first
    sim.replace_weight("W", sim.get_weight("W") * 2)
    assert "W" not in sim._constant_memo or id(sim._constant_memo["W"][1]) != first["W"]


def test_big_models_release_their_calibration_session(monkeypatch):
    import numpy as np
    from tiny_cnn import batches, make_model

    import quantsim.sim.calibrate as sim_model
    from quantsim import QuantizationSimModel

    monkeypatch.setattr(sim_model, "RELEASE_CALIBRATION_SESSION_BYTES", 0)
    sim = QuantizationSimModel(make_model(channels=16), progress=False)
    sim.compute_encodings(batches())
    assert sim._calibration_cache is None
    before = sim.session.run(None, batches(1)[0])[0]
    sim.compute_encodings(batches())  # rebuilt on demand, same result
    assert np.array_equal(sim.session.run(None, batches(1)[0])[0], before)
