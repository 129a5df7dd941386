"""Message-passing graph networks as torch's exporters write them (scatter / gather by edge index): the
defects `benchmarks/bench_graph.py` found, each on a small built model."""
import numpy as np
import onnxruntime as ort
from models import make_model  # tests/models.py
from onnx import TensorProto, helper, numpy_helper

import quantsim
from quantsim import QuantizationSimModel

NODES, GRAPHS, FEATURES = 12, 3, 4
FLOAT32_LOWEST = float(np.finfo(np.float32).min)


def _voxel_pool_model():
    """Point-cloud grid pooling: each point's cell ``Cast(Floor(pos / size), int64)``, the points' features
    max-pooled per cell by a ScatterElements; the cell index is also an output."""
    nodes = [
        helper.make_node("Div", ["pos", "size"], ["scaled"]),
        helper.make_node("Floor", ["scaled"], ["cell"]),
        helper.make_node("Cast", ["cell"], ["cell_index"], to=TensorProto.INT64),
        helper.make_node("Gemm", ["x", "w"], ["feat"]),
        helper.make_node("Expand", ["cell_index", "feat_shape"], ["index"]),
        helper.make_node("ScatterElements", ["zeros", "index", "feat"], ["pooled"], axis=0, reduction="max"),
    ]
    inits = [numpy_helper.from_array(np.array([0.25], np.float32), "size"),
             numpy_helper.from_array(np.random.default_rng(5).normal(size=(3, FEATURES)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([NODES, FEATURES], np.int64), "feat_shape"),
             numpy_helper.from_array(np.zeros((8, FEATURES), np.float32), "zeros")]
    return make_model(nodes, [helper.make_tensor_value_info("pos", TensorProto.FLOAT, [NODES, 1]),
                              helper.make_tensor_value_info("x", TensorProto.FLOAT, [NODES, 3])],
                      [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [8, FEATURES]),
                       helper.make_tensor_value_info("cell_index", TensorProto.INT64, [NODES, 1])], inits, opset=18)


def test_float_values_cast_to_indices_are_never_quantized():
    model = _voxel_pool_model()
    sim = QuantizationSimModel(model, quant_scheme="min_max", progress=False)
    for name in ("pos", "scaled", "cell", "size"):
        assert name not in sim.qc_quantize_op_dict, name
    assert sim.qc_quantize_op_dict["feat"].enabled and sim.qc_quantize_op_dict["x"].enabled
    rng = np.random.default_rng(0)
    sim.compute_encodings([{"pos": rng.uniform(0, 1.99, (NODES, 1)).astype(np.float32),
                            "x": rng.normal(size=(NODES, 3)).astype(np.float32)} for _ in range(4)])
    # cells land on whole numbers: 0.25 * k / 0.25 = k; on a quantized grid k - ulp truncates to k - 1
    feed = {"pos": (np.arange(NODES, dtype=np.float32) % 8 * 0.25).reshape(NODES, 1),
            "x": rng.normal(size=(NODES, 3)).astype(np.float32)}
    expected = ort.InferenceSession(model.SerializeToString()).run(["cell_index"], feed)[0]
    np.testing.assert_array_equal(sim.session.run(["cell_index"], feed)[0], expected)
    integer = sim.export_integer(weight_codes="uint8")
    got = ort.InferenceSession(integer.model.SerializeToString()).run(["cell_index"], feed)[0]
    np.testing.assert_array_equal(got, expected)


def _scatter_max_readout_model():
    """Per-graph max pooling the way the dynamo exporter writes ``scatter_reduce("amax", include_self=False)``:
    the touched rows reset to float32's lowest value by a min-scatter of a ConstantOfShape fill, then a
    max-scatter of the node features."""
    fill = helper.make_tensor("fill", TensorProto.FLOAT, [1], [FLOAT32_LOWEST])
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"]),
        helper.make_node("Relu", ["h"], ["act"]),
        helper.make_node("Unsqueeze", ["batch", "axis_last"], ["batch_col"]),
        helper.make_node("Expand", ["batch_col", "act_shape"], ["index"]),
        helper.make_node("Shape", ["act"], ["act_dims"]),
        helper.make_node("ConstantOfShape", ["act_dims"], ["lowest"], value=fill),
        helper.make_node("ScatterElements", ["zeros", "index", "lowest"], ["identity"], axis=0, reduction="min"),
        helper.make_node("ScatterElements", ["identity", "index", "act"], ["pooled"], axis=0, reduction="max"),
        helper.make_node("Gemm", ["pooled", "head_w"], ["logits"]),
    ]
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(size=(FEATURES, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(8,)).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([-1], np.int64), "axis_last"),
             numpy_helper.from_array(np.array([NODES, 8], np.int64), "act_shape"),
             numpy_helper.from_array(np.zeros((GRAPHS, 8), np.float32), "zeros"),
             numpy_helper.from_array(rng.normal(size=(8, 5)).astype(np.float32), "head_w")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [NODES, FEATURES]),
                              helper.make_tensor_value_info("batch", TensorProto.INT64, [NODES])],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [GRAPHS, 5])], inits, opset=18)


def _graph_feeds(count: int, seed: int):
    rng = np.random.default_rng(seed)
    batch = np.repeat(np.arange(GRAPHS), NODES // GRAPHS).astype(np.int64)
    return [{"x": rng.normal(size=(NODES, FEATURES)).astype(np.float32), "batch": batch} for _ in range(count)]


def test_scatter_max_identity_fill_stays_float_and_encodings_round_trip(tmp_path):
    model = _scatter_max_readout_model()
    sim = QuantizationSimModel(model, quant_scheme="min_max", progress=False)
    assert "lowest" not in sim.qc_quantize_op_dict and "identity" not in sim.qc_quantize_op_dict
    assert sim.qc_quantize_op_dict["pooled"].enabled
    feeds = _graph_feeds(4, 0)
    sim.compute_encodings(feeds)  # evaluated on the calibration graphs: rounding, no clipping
    float_session = ort.InferenceSession(model.SerializeToString())
    for feed in feeds:
        ref, got = float_session.run(None, feed)[0], sim.session.run(None, feed)[0]
        assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max()
    sim.export(str(tmp_path), "readout")  # the file's scales must be ones its reader takes back
    fresh = QuantizationSimModel(model, quant_scheme="min_max", progress=False)
    quantsim.load_encodings_to_sim(fresh, str(tmp_path / "readout.encodings"))
    for feed in feeds:
        np.testing.assert_array_equal(fresh.session.run(None, feed)[0], sim.session.run(None, feed)[0])
