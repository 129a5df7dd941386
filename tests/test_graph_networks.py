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
    assert [(d.rule, d.tensors) for d in sim.decisions] == [("constant fill", ("identity", "lowest"))]
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


def _scatter_model(op: str, reduction: str, fill: float):
    """Node features scattered onto a ``fill``-initialised table by ``op`` with ``reduction`` (by edge
    destination), then a Gemm; torch's ``index_put_`` / ``scatter_`` / ``scatter_reduce`` as the exporters spell
    them."""
    index_shape = [NODES, FEATURES] if op == "ScatterElements" else [NODES, 1]
    extra = {"axis": 0} if op == "ScatterElements" else {}
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"]),
        helper.make_node(op, ["table", "index", "h"], ["scattered"], reduction=reduction, **extra),
        helper.make_node("Gemm", ["scattered", "head_w"], ["logits"]),
    ]
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.normal(size=(FEATURES, FEATURES)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(FEATURES,)).astype(np.float32), "b"),
             numpy_helper.from_array(np.full((6, FEATURES), fill, np.float32), "table"),
             numpy_helper.from_array(rng.normal(size=(FEATURES, 3)).astype(np.float32), "head_w")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [NODES, FEATURES]),
                              helper.make_tensor_value_info("index", TensorProto.INT64, index_shape)],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [6, 3])], inits, opset=18)


def _scatter_feeds(op: str, count: int, seed: int):
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        rows = np.concatenate([np.arange(6), rng.integers(0, 6, NODES - 6)])  # every row written, some twice
        index = np.repeat(rows[:, None], FEATURES, 1) if op == "ScatterElements" else rows[:, None]
        feeds.append({"x": rng.normal(size=(NODES, FEATURES)).astype(np.float32), "index": index.astype(np.int64)})
    return feeds


def _integer_against_sim(model, feeds):
    sim = QuantizationSimModel(model, quant_scheme="min_max", progress=False)
    sim.compute_encodings(feeds)
    integer = sim.export_integer(weight_codes="uint8")
    session = ort.InferenceSession(integer.model.SerializeToString())
    for feed in feeds:
        np.testing.assert_array_equal(session.run(None, feed)[0], sim.session.run(None, feed)[0])
    return integer


def test_selecting_scatters_run_on_codes_exactly():
    for op, reduction, fill in (("ScatterElements", "max", -1e9), ("ScatterElements", "min", 0.0),
                                ("ScatterND", "none", 0.0), ("ScatterElements", "none", 0.0)):
        integer = _integer_against_sim(_scatter_model(op, reduction, fill), _scatter_feeds(op, 3, 0))
        assert not list(integer.report), (op, reduction, integer.report)  # every node on integer kernels
        assert [n.op_type for n in integer.model.graph.node].count(op) == 1


def test_summing_scatters_stay_float_in_the_integer_export():
    integer = _integer_against_sim(_scatter_model("ScatterND", "add", 0.0), _scatter_feeds("ScatterND", 3, 1))
    assert [e.op_type for e in integer.report] == ["ScatterND"]


def test_scatter_max_after_its_fill_identity_runs_on_codes():
    integer = _integer_against_sim(_scatter_max_readout_model(), _graph_feeds(3, 2))
    # the min-scatter building the identity from two constants stays float; the max-scatter of the features
    # reads the identity quantized onto its output grid (saturating, as the sim's output quantizer does)
    assert [e.op_type for e in integer.report] == ["ScatterElements"], integer.report
    scatters = [n for n in integer.model.graph.node if n.op_type == "ScatterElements"]
    on_codes = [n for n in scatters if n.output[0].endswith("codes")]
    assert [helper.get_attribute_value(a) for n in on_codes for a in n.attribute if a.name == "reduction"] == [b"max"]


def _knn_model(largest: int):
    """EdgeConv's neighbour choice: TopK over a quantized score table, the neighbours gathered by its indices."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["scores"]),
        helper.make_node("TopK", ["scores", "k"], ["best", "picked"], axis=-1, largest=largest),
        helper.make_node("GatherElements", ["scores", "picked"], ["neighbours"], axis=1),
        helper.make_node("Add", ["best", "neighbours"], ["total"]),
    ]
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.normal(size=(FEATURES, NODES)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([5], np.int64), "k")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [NODES, FEATURES])],
                      [helper.make_tensor_value_info("total", TensorProto.FLOAT, [NODES, 5]),
                       helper.make_tensor_value_info("picked", TensorProto.INT64, [NODES, 5])], inits, opset=18)


def test_topk_runs_on_codes_with_the_sims_choice_among_ties():
    rng = np.random.default_rng(4)
    # coarse inputs: many scores share a grid point, so the choice among ties decides the indices
    feeds = [{"x": rng.integers(-2, 3, (NODES, FEATURES)).astype(np.float32)} for _ in range(3)]
    for largest in (1, 0):
        model = _knn_model(largest)
        sim = QuantizationSimModel(model, quant_scheme="min_max", progress=False)
        sim.compute_encodings(feeds)
        integer = sim.export_integer(weight_codes="uint8")
        assert "TopK" not in [e.op_type for e in integer.report], integer.report
        session = ort.InferenceSession(integer.model.SerializeToString())
        for feed in feeds:
            got, expected = session.run(None, feed), sim.session.run(None, feed)
            np.testing.assert_array_equal(got[1], expected[1])
            np.testing.assert_array_equal(got[0], expected[0])


def _dense_attention_model(fill: float):
    """A dense GAT layer: scores masked by ``Where(adj == 0, fill, scores)`` (torch's ``masked_fill``), a Softmax
    over each node's neighbours, the features aggregated by a MatMul."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("MatMul", ["h", "att"], ["scores"]),
        helper.make_node("Equal", ["adj", "zero"], ["absent"]),
        helper.make_node("Where", ["absent", "fill", "scores"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["alpha"], axis=-1),
        helper.make_node("MatMul", ["alpha", "h"], ["y"]),
    ]
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array(rng.normal(size=(FEATURES, 8)).astype(np.float32), "w"),
             numpy_helper.from_array((rng.normal(size=(8, NODES)) * 0.3).astype(np.float32), "att"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(fill, np.float32), "fill")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [NODES, FEATURES]),
                              helper.make_tensor_value_info("adj", TensorProto.FLOAT, [NODES, NODES])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [NODES, 8])], inits, opset=18)


def test_masked_scores_keep_their_fill_in_the_integer_export():
    """The sim keeps the masked scores float (-inf where there is no edge); the integer export used to select
    the fill's saturated code, the lowest score, so absent edges got Softmax weight."""
    rng = np.random.default_rng(6)
    feeds = []
    for _ in range(3):
        adj = (rng.random((NODES, NODES)) < 0.25).astype(np.float32)
        np.fill_diagonal(adj, 1.0)
        feeds.append({"x": rng.normal(size=(NODES, FEATURES)).astype(np.float32), "adj": adj})
    for fill in (float("-inf"), -1e9):
        model = _dense_attention_model(fill)
        sim = QuantizationSimModel(model, quant_scheme="min_max", progress=False)
        sim.compute_encodings(feeds)
        integer = sim.export_integer(weight_codes="uint8")
        session = ort.InferenceSession(integer.model.SerializeToString())
        assert "Softmax" in [e.op_type for e in integer.report]  # over the float masked scores, as in the sim
        for feed in feeds:
            np.testing.assert_array_equal(session.run(None, feed)[0], sim.session.run(None, feed)[0])


def _gathered_messages_model(op: str):
    """Messages gathered from node features by edge source (``GatherND`` as the dynamo exporter writes
    ``x[src]``, or ``GatherElements``), then a Linear with a bias; or a ``ReduceMax`` over the neighbours."""
    index_input = {"GatherND": helper.make_tensor_value_info("src", TensorProto.INT64, [NODES * 2, 1]),
                   "GatherElements": helper.make_tensor_value_info("src", TensorProto.INT64, [NODES * 2, FEATURES]),
                   "ReduceMax": None}[op]
    moved = {"GatherND": helper.make_node("GatherND", ["x", "src"], ["messages"]),
             "GatherElements": helper.make_node("GatherElements", ["x", "src"], ["messages"], axis=0),
             "ReduceMax": helper.make_node("ReduceMax", ["x", "axes"], ["messages"], keepdims=1)}[op]
    rng = np.random.default_rng(12)
    inits = [numpy_helper.from_array(rng.normal(size=(FEATURES, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(8,)).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([0], np.int64), "axes")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [NODES, FEATURES])]
    rows = 1 if op == "ReduceMax" else NODES * 2
    return make_model([moved, helper.make_node("Gemm", ["messages", "w", "b"], ["y"])],
                      inputs + ([index_input] if index_input is not None else []),
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 8])], inits, opset=18)


def test_selections_carry_their_input_grid_to_the_next_linear_op():
    """A Gemm after GatherND / GatherElements / ReduceMax reads values on its input's grid: the QDQ export gives
    the selection a derived Q/DQ (else onnxruntime leaves that Gemm in float), and the sim adds the int32 bias
    the integer export's QGemm adds (it added the float bias: one output step apart on near-ties)."""
    rng = np.random.default_rng(13)
    for op in ("GatherND", "GatherElements", "ReduceMax"):
        feeds = []
        for _ in range(3):
            feed = {"x": rng.normal(size=(NODES, FEATURES)).astype(np.float32)}
            src = rng.integers(0, NODES, NODES * 2)
            if op != "ReduceMax":
                feed["src"] = (src[:, None] if op == "GatherND" else np.repeat(src[:, None], FEATURES, 1)).astype(np.int64)
            feeds.append(feed)
        sim = QuantizationSimModel(_gathered_messages_model(op), quant_scheme="min_max", progress=False)
        sim.compute_encodings(feeds)
        qdq = sim.to_onnx_qdq(weight_codes="uint8")
        producer = {o: n.op_type for n in qdq.graph.node for o in n.output}
        gemm = next(n for n in qdq.graph.node if n.op_type == "Gemm")
        assert producer[gemm.input[0]] == "DequantizeLinear", op
        assert producer[gemm.input[2]] == "DequantizeLinear", op  # the int32 bias
        integer = sim.export_integer(weight_codes="uint8")
        session = ort.InferenceSession(integer.model.SerializeToString())
        for feed in feeds:
            np.testing.assert_array_equal(session.run(None, feed)[0], sim.session.run(None, feed)[0])
