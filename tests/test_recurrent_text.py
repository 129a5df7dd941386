"""Recurrent text models (embedding + LSTM/GRU/RNN or unrolled cells) through the sim and its exports.

Regressions found by `benchmarks/bench_recurrent.py` on torch-exported text models (the models as users write
them: ``nn.Embedding`` + ``nn.LSTM``/``nn.GRU``/``nn.RNN``, an ``LSTMCell`` loop, a seq2seq decoder):

* the embedding table (a float constant gathered by token ids) had no quantizer, so its rows left the Gather
  in float and every op they reached before the next quantizer stayed float in the integer export (an
  unrolled ``LSTMCell`` loop: all 12 input Gemms). aimet-onnx quantizes the table like any constant input of
  a node: an asymmetric per-tensor grid on the activation type, encoded from its values;
* the QDQ export then wrote the table as its fake-quantized floats: the MatMul reading the gathered rows had no
  DequantizeLinear input, so it kept a float bias where the sim adds it on the int32 grid (the unfused QDQ
  model was no longer the sim bit for bit, a torch-dynamo char RNN 0.017 relative) and onnxruntime ran it in
  float. The table is now codes behind a DequantizeLinear, the gathered rows get derived Q/DQ pairs;
* a greedy decoder's ArgMax stayed float in the integer export (it runs on the codes);
* LSTM/GRU/RNN state inputs and outputs had grids of their own (aimet-onnx ties them), so a step-by-step
  decoder exported with integer I/O returned state codes that the next call read on another grid.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from quantsim import QuantizationSimModel

F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
VOCAB, DIM, STEPS = 50, 8, 4


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _embedding_cell_loop() -> onnx.ModelProto:
    """ids (1, STEPS) -> Gather(table) -> per step Gather(x, t) -> Gemm(W) -> Tanh -> Concat of the steps."""
    rng = np.random.default_rng(0)
    inits = {"table": rng.standard_normal((VOCAB, DIM)).astype(np.float32),
             "W": (0.3 * rng.standard_normal((6, DIM))).astype(np.float32),
             "B": (0.1 * rng.standard_normal(6)).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"])]
    steps = []
    for t in range(STEPS):
        inits[f"t{t}"] = np.array(t, np.int64)
        nodes += [helper.make_node("Gather", ["emb", f"t{t}"], [f"x{t}"], axis=1),
                  helper.make_node("Gemm", [f"x{t}", "W", "B"], [f"g{t}"], transB=1),
                  helper.make_node("Tanh", [f"g{t}"], [f"h{t}"])]
        steps.append(f"h{t}")
    nodes.append(helper.make_node("Concat", steps, ["y"], axis=1))
    return _model(nodes, [helper.make_tensor_value_info("ids", I64, [1, STEPS])],
                  [helper.make_tensor_value_info("y", F, [1, 6 * STEPS])], inits)


def _ids(n: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(0, VOCAB, (1, STEPS)).astype(np.int64)} for _ in range(n)]


def test_embedding_table_is_quantized_like_aimet_and_the_integer_export_keeps_no_float_op():
    model = _embedding_cell_loop()
    sim = QuantizationSimModel(model, quant_scheme="min_max", progress=False)
    feeds = _ids(4)
    sim.compute_encodings(feeds)
    table = numpy_helper.to_array(model.graph.initializer[0])
    q = sim.qc_quantize_op_dict["table"]
    assert q.enabled and not q.use_symmetric_encodings and q.bitwidth == 8
    enc = q.get_encodings()[0]  # min-max of the table's values, asymmetric 8-bit: AIMET's activation grid
    assert abs(enc.delta - (table.max() - table.min()) / 255) < 1e-6 * enc.delta + 1e-9
    assert "ids" not in sim.qc_quantize_op_dict or not sim.qc_quantize_op_dict["ids"].enabled
    integer = sim.export_integer(weight_codes="uint8")
    assert [(e.op_type, e.reason) for e in integer.report] == []
    session = ort.InferenceSession(integer.model.SerializeToString(), providers=["CPUExecutionProvider"])
    step = sim.qc_quantize_op_dict["y"].get_encodings()[0].delta
    for feed in feeds:  # the integer model computes the sim's numbers (within requantization near-ties)
        np.testing.assert_allclose(session.run(None, feed)[0], sim.session.run(None, feed)[0], rtol=0, atol=1.01 * step)


def _greedy_step(select_last: int) -> onnx.ModelProto:
    """A greedy decoder step: x -> Gemm(W) -> logits (quantized) -> ArgMax -> Gather(table) -> next input;
    the token id is an output too."""
    rng = np.random.default_rng(3)
    inits = {"W": (0.5 * rng.standard_normal((VOCAB, DIM))).astype(np.float32),
             "table": rng.standard_normal((VOCAB, DIM)).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "W"], ["logits"], transB=1),
             helper.make_node("ArgMax", ["logits"], ["token"], axis=-1, keepdims=0, select_last_index=select_last),
             helper.make_node("Gather", ["table", "token"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [3, DIM])],
                  [helper.make_tensor_value_info("y", F, [3, DIM]), helper.make_tensor_value_info("token", I64, [3])],
                  inits)


def test_argmax_of_quantized_logits_runs_on_codes_and_picks_the_sims_token_ties_included():
    for select_last in (0, 1):
        sim = QuantizationSimModel(_greedy_step(select_last), quant_scheme="min_max", progress=False)
        rng = np.random.default_rng(4)
        feeds = [{"x": rng.standard_normal((3, DIM)).astype(np.float32)} for _ in range(3)]
        sim.compute_encodings(feeds)
        integer = sim.export_integer(weight_codes="uint8")
        assert [e.op_type for e in integer.report] == []  # ArgMax used to stay float between DQ and its index
        assert [n.op_type for n in integer.model.graph.node].count("DequantizeLinear") == 1  # only y's
        session = ort.InferenceSession(integer.model.SerializeToString(), providers=["CPUExecutionProvider"])
        for feed in feeds + [{"x": np.zeros((3, DIM), np.float32)}]:  # all-zero rows: every logit ties
            got, want = session.run(None, feed), sim.session.run(None, feed)
            np.testing.assert_array_equal(got[1], want[1])  # the token: the same index, ties broken alike
            np.testing.assert_array_equal(got[0], want[0])  # the gathered row: codes of the same table row
        assert session.run(None, {"x": np.zeros((3, DIM), np.float32)})[1].tolist() == [(VOCAB - 1) * select_last] * 3


def _lstm_step(op: str = "LSTM") -> onnx.ModelProto:
    """One decoding step of a stacked-state recurrent layer: x (1, 1, 4), h (2, 1, 8) of which layer 0's slice
    is the initial state, c (1, 1, 8); outputs the head's logits, the new hidden state and (LSTM) cell state."""
    rng = np.random.default_rng(5)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    inits = {"W": (0.4 * rng.standard_normal((1, gates * 8, 4))).astype(np.float32),
             "R": (0.4 * rng.standard_normal((1, gates * 8, 8))).astype(np.float32),
             "B": (0.1 * rng.standard_normal((1, 2 * gates * 8))).astype(np.float32),
             "head": (0.5 * rng.standard_normal((8, 5))).astype(np.float32),
             "starts": np.array([0], np.int64), "ends": np.array([1], np.int64), "axes": np.array([0], np.int64),
             "squeeze_axes": np.array([0, 1], np.int64)}
    state_inputs = ["h0"] + (["c"] if op == "LSTM" else [])
    outputs = ["Y", "h_out"] + (["c_out"] if op == "LSTM" else [])
    nodes = [helper.make_node("Slice", ["h", "starts", "ends", "axes"], ["h0"]),
             helper.make_node(op, ["x", "W", "R", "B", "", *state_inputs], outputs, hidden_size=8),
             helper.make_node("Squeeze", ["Y", "squeeze_axes"], ["y"]),
             helper.make_node("MatMul", ["y", "head"], ["logits"])]
    inputs = [helper.make_tensor_value_info("x", F, [1, 1, 4]), helper.make_tensor_value_info("h", F, [2, 1, 8])]
    graph_outputs = [helper.make_tensor_value_info("logits", F, [1, 5]), helper.make_tensor_value_info("h_out", F, [1, 1, 8])]
    if op == "LSTM":
        inputs.append(helper.make_tensor_value_info("c", F, [1, 1, 8]))
        graph_outputs.append(helper.make_tensor_value_info("c_out", F, [1, 1, 8]))
    return _model(nodes, inputs, graph_outputs, inits)


def test_recurrent_state_input_and_outputs_share_one_grid_like_aimet():
    for op in ("LSTM", "GRU", "RNN"):
        sim = QuantizationSimModel(_lstm_step(op), quant_scheme="min_max", progress=False)
        rng = np.random.default_rng(6)
        feeds = [{"x": (2 * rng.standard_normal((1, 1, 4))).astype(np.float32),
                  "h": (0.5 * rng.standard_normal((2, 1, 8))).astype(np.float32),
                  **({"c": rng.standard_normal((1, 1, 8)).astype(np.float32)} if op == "LSTM" else {})} for _ in range(4)]
        sim.compute_encodings(feeds)
        qs = sim.qc_quantize_op_dict
        assert qs["h"] is qs["h_out"] is qs["Y"], op  # the state fed back is read on the grid it was written on
        assert qs["x"] is not qs["Y"], op  # the sequence input keeps its own grid (aimet-onnx ties it too)
        if op == "LSTM":
            assert qs["c"] is qs["c_out"] and qs["c"] is not qs["h"]
        integer = sim.export_integer(integer_io=True, weight_codes="uint8")
        grid = {k: v for k, v in integer.io["h"].items() if k not in ("role", "shape")}
        assert grid and grid == {k: v for k, v in integer.io["h_out"].items() if k not in ("role", "shape")}, op


def _embedding_matmul() -> onnx.ModelProto:
    """ids (2, STEPS) -> Gather(table) -> Transpose -> MatMul(W) + b -> Tanh: torch-dynamo's spelling of an
    RNN's input projection over an embedding."""
    rng = np.random.default_rng(8)
    inits = {"table": rng.standard_normal((VOCAB, DIM)).astype(np.float32),
             "W": (0.3 * rng.standard_normal((DIM, 6))).astype(np.float32),
             "b": (0.1 * rng.standard_normal(6)).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]),
             helper.make_node("Transpose", ["emb"], ["t"], perm=[1, 0, 2]),
             helper.make_node("MatMul", ["t", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Tanh", ["a"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("ids", I64, [2, STEPS])],
                  [helper.make_tensor_value_info("y", F, [STEPS, 2, 6])], inits)


def test_qdq_export_of_a_gathered_table_is_the_sim_bit_for_bit_and_fuses():
    sim = QuantizationSimModel(_embedding_matmul(), quant_scheme="min_max", progress=False)
    feeds = [{"ids": f["ids"].reshape(1, -1).repeat(2, 0)} for f in _ids(3)]
    sim.compute_encodings(feeds)
    qdq = sim.to_onnx_qdq()
    producers = {o: n for n in qdq.graph.node for o in n.output}
    gather = next(n for n in qdq.graph.node if n.op_type == "Gather")
    matmul = next(n for n in qdq.graph.node if n.op_type == "MatMul")
    assert producers[gather.input[0]].op_type == "DequantizeLinear"  # the table's codes
    assert producers[matmul.input[0]].op_type == "DequantizeLinear"  # the gathered rows reach the MatMul on the grid
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    exact = ort.InferenceSession(qdq.SerializeToString(), options, providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(sim.sim_model().SerializeToString(), options, providers=["CPUExecutionProvider"])
    for feed in feeds:
        np.testing.assert_array_equal(exact.run(None, feed)[0], reference.run(None, feed)[0])
    back = QuantizationSimModel.from_onnx_qdq(qdq)  # the table's encoding reads back
    read, written = (s.qc_quantize_op_dict["table"].get_encodings()[0] for s in (back, sim))
    assert np.float32(read.delta) == np.float32(written.delta) and read.offset == written.offset
